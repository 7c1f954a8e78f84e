"""labkit.model.onnx: export folders appear whole or not at all, and folding constant transposes keeps the result."""
from __future__ import annotations

import pytest

from labkit.model import onnx


def test_atomic_dir_renames_on_success_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(KeyError):
        with onnx._atomic_dir(target) as tmp:
            (tmp / "model.onnx").write_text("half")
            raise KeyError("interrupted")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with onnx._atomic_dir(target) as tmp:
        (tmp / "model.onnx").write_text("x")
        (tmp / "config.json").write_text("{}")
    assert onnx._complete(target) and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_fold_constant_transposes_keeps_the_result():
    import numpy as np
    import onnx as onnx_proto
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.ones((2, 4), np.float32)
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert onnx.fold_constant_transposes(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    onnx_proto.checker.check_model(model)
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-6)

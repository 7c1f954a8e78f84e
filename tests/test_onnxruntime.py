"""labkit.engines.onnxruntime: optimisation levels by name, and session options that save the optimised graph
(whose operators show the fusion)."""
from __future__ import annotations

import pytest

from labkit.engines import onnxruntime
from labkit.model import onnx


def test_ort_levels_and_graph_ops(tmp_path):
    import numpy as np
    import onnx as onnx_proto
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    assert onnxruntime.ort_level("all") == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(ValueError, match="choose one of"):
        onnxruntime.ort_level("max")
    # MatMul followed by Add of a constant bias: the basic level fuses it
    w = numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "w")
    b = numpy_helper.from_array(np.ones((3,), dtype=np.float32), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w, b])
    src = tmp_path / "g.onnx"
    onnx_proto.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    counts = {}
    for level in ("disable_all", "all"):
        out = tmp_path / f"{level}.onnx"
        ort.InferenceSession(str(src), onnxruntime.session_options(level, out), providers=["CPUExecutionProvider"])
        counts[level] = onnx.graph_ops(out)
    assert counts["disable_all"] == {"MatMul": 1, "Add": 1}
    assert sum(counts["all"].values()) == 1  # one fused operator instead of two
    assert onnx.fused_ops(counts["disable_all"], counts["all"]) == counts["all"]

"""labkit.engines: the static-cache decoder (eager and compiled) gives the reference's tokens, ORT levels,
graph operator counts, calibration, and GPU engines that say why they cannot run here."""
from __future__ import annotations

import pytest

from labkit import engines, quality


def _prompt(tok, text="Write a haiku about a cup of coffee."):
    from labkit import models

    return models.chat_inputs(tok, text)["input_ids"]


def _greedy(model, ids, n):
    import torch

    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_static_decoder_matches_generate_and_reference(tiny_llama):
    model, tok = tiny_llama
    ids = _prompt(tok)
    dec = engines.StaticDecoder(model, max_cache_len=96)
    timing, tokens, _ = dec.generate(ids, 8)
    assert tokens == _greedy(model, ids, 8)
    assert timing.n_out == 8 and 0 < timing.ttft_s <= timing.e2e_s and timing.n_prompt == ids.shape[1]
    again, tokens2, _ = dec.generate(ids, 8)  # the cache is reset between runs
    assert tokens2 == tokens
    ref = quality.reference(model, tok, ["Hi there", "Name a colour."], new_tokens=6)
    q = engines.decoder_quality(dec, ref)
    assert q.agreement == 1.0 and q.kl < 1e-6 and q.n_tokens == 12
    with pytest.raises(ValueError, match="max_cache_len"):
        dec.generate(ids, 200)
    with pytest.raises(ValueError, match="max_cache_len"):
        engines.StaticDecoder(model, max_cache_len=1)


def test_measure_decoder_and_eager_op_count(tiny_llama):
    model, tok = tiny_llama
    ids = _prompt(tok)
    m = engines.measure_decoder(engines.StaticDecoder(model, max_cache_len=96), ids, new_tokens=6, repeats=2)
    assert m["decode_tokens_per_s"] > 0 and m["repeats"] == 2 and m["build_s"] is None and len(m["tokens"]) == 6
    n_ops = engines.count_eager_ops(model, ids, max_cache_len=96)
    assert n_ops > 20 * model.config.num_hidden_layers  # dozens of operators per layer per token
    with pytest.raises(ValueError, match="at least 2"):
        engines.measure_decoder(engines.StaticDecoder(model, max_cache_len=96), ids, new_tokens=1)


def test_compiled_decoder_gives_eager_tokens(tiny_llama):
    """torch.compile of the decode step (inductor, CPU): same greedy tokens, kernels counted, build timed."""
    if not engines.capability("torch.compile").available:
        pytest.skip(engines.capability("torch.compile").reason)
    model, tok = tiny_llama
    ids = _prompt(tok)
    eager = engines.StaticDecoder(model, max_cache_len=64).generate(ids, 6)[1]
    dec = engines.StaticDecoder(model, max_cache_len=64, compile=True, fresh_cache=False)
    _, tokens, _ = dec.generate(ids, 6)
    assert tokens == eager
    assert dec.build_s is not None and dec.build_s > 0
    _, tokens_b, _ = dec.generate(_prompt(tok, "Name a colour."), 6)  # another prompt: no rebuild needed
    assert tokens_b == engines.StaticDecoder(model, max_cache_len=64).generate(_prompt(tok, "Name a colour."), 6)[1]


def test_ort_levels_and_graph_ops(tmp_path):
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    assert engines.ort_level("all") == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(ValueError, match="choose one of"):
        engines.ort_level("max")
    # MatMul followed by Add of a constant bias: the basic level fuses it
    w = numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "w")
    b = numpy_helper.from_array(np.ones((3,), dtype=np.float32), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w, b])
    src = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    counts = {}
    for level in ("disable_all", "all"):
        out = tmp_path / f"{level}.onnx"
        ort.InferenceSession(str(src), engines.session_options(level, out), providers=["CPUExecutionProvider"])
        counts[level] = engines.graph_ops(out)
    assert counts["disable_all"] == {"MatMul": 1, "Add": 1}
    assert sum(counts["all"].values()) == 1  # one fused operator instead of two
    assert engines.fused_ops(counts["disable_all"], counts["all"]) == counts["all"]


def test_calibration_on_one_layer(tiny_llama):
    model, tok = tiny_llama
    cal = engines.calibrate_layer(model, tok, ["Hello there", "Explain the water cycle."], ["Name a colour."],
                                  layer="model.layers.0.mlp.down_proj", percentile=99.0)
    assert cal.calibration_values > 0 and 0 < cal.percentile_value <= cal.absmax
    assert len(cal.errors) == 3 and all(0 <= e < 1 for e in cal.errors.values())
    with pytest.raises(ValueError, match="no layer"):
        engines.calibrate_layer(model, tok, ["a"], ["b"], layer="model.nope")
    with pytest.raises(ValueError, match="percentile"):
        engines.calibrate_layer(model, tok, ["a"], ["b"], percentile=100)


def test_gpu_engines_say_why_not_here():
    import torch

    caps = {c.name: c for c in engines.capabilities()}
    assert {"torch.compile", "onnxruntime", "torch-tensorrt", "tensorrt-llm", "vllm", "ort-tensorrt"} <= set(caps)
    if not torch.cuda.is_available():
        for name in ("torch-tensorrt", "tensorrt-llm", "vllm", "ort-tensorrt"):
            assert not caps[name].available and caps[name].reason
        with pytest.raises(ValueError, match="vLLM cannot run here"):
            engines.vllm_offline("some/model", ["hi"])
        with pytest.raises(ValueError, match="vLLM cannot run here"):
            with engines.vllm_server("some/model"):
                pass
        rows = engines.tensorrt_rows()
        assert len(rows) == 2 and all(r["status"] != "ok" for r in rows)
    with pytest.raises(ValueError, match="choose one of"):
        engines.capability("tvm")

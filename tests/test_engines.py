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


def test_calibration_scores_outputs_per_prompt(tiny_llama):
    import torch

    model, tok = tiny_llama
    held_out = ["Name a colour.", "Write a long sentence about the sea and the wind and the ships."]
    cal = engines.calibrate_layer(model, tok, ["Hello there", "Explain the water cycle."], held_out,
                                  layer="model.layers.0.mlp.down_proj", percentile=99.0)
    assert cal.calibration_values > 0 and 0 < cal.percentile_value < cal.absmax
    rows = cal.frame()
    assert len(rows) == 4 * len(held_out) and set(rows.prompt) == set(held_out)
    # the layer's input, captured independently, for each held-out prompt
    seen = {}
    layer = model.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda m, args, out: seen.update(x=args[0].detach(), y=out.detach()))
    try:
        for p in held_out:
            with torch.inference_mode():
                model(**__import__("labkit").models.chat_inputs(tok, p))
            x, y = seen["x"], seen["y"]
            by = rows[rows.prompt == p].set_index("method")
            dyn = by.loc["dynamic, per-prompt scale"]
            assert dyn.scale == pytest.approx(float(x.abs().max()) / 127)  # this prompt's own scale
            assert dyn.clipped_fraction == 0
            assert dyn.max_at_token == int(x.abs().amax(-1).flatten().argmax())  # the token holding the largest |x|
            tok_scale = by.loc["dynamic, per-token scale"]
            assert tok_scale.scale == pytest.approx(float(x.abs().amax(-1).mean()) / 127, rel=1e-5)
            assert tok_scale.clipped_fraction == 0 and tok_scale.layer_error <= dyn.layer_error
            static = by.loc["static, absmax scale"]
            assert static.scale == pytest.approx(cal.absmax / 127)
            with torch.inference_mode():  # the score is the layer's output error, not the activations'
                want = float((layer(engines.fake_int8(x, static.scale)) - y).norm() / y.norm())
            assert static.layer_error == pytest.approx(want, rel=1e-4)
            assert (by.kl >= 0).all() and by.kl.max() > 0
    finally:
        hook.remove()
    summary = cal.summary()
    assert set(summary) == set(rows.method) and all(v["prompts"] == len(held_out) for v in summary.values())
    clipped = rows[rows.method == "static, p99 scale"].clipped_fraction
    assert (clipped > 0).any()  # the percentile scale clips the largest held-out values
    with pytest.raises(ValueError, match="no layer"):
        engines.calibrate_layer(model, tok, ["a"], ["b"], layer="model.nope")
    with pytest.raises(ValueError, match="percentile"):
        engines.calibrate_layer(model, tok, ["a"], ["b"], percentile=100)


def test_fake_int8_rounds_and_clips():
    import torch

    x = torch.tensor([0.0, 0.26, -0.74, 20.0, -30.0])
    assert engines.fake_int8(x, 0.5).tolist() == [0.0, 0.5, -0.5, 20.0, -30.0]
    assert engines.fake_int8(x, 0.1).tolist() == pytest.approx([0.0, 0.3, -0.7, 12.7, -12.7])  # ±127 steps at most
    rows = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    q = engines.fake_int8(rows, rows.abs().amax(-1, keepdim=True) / 127)  # per-row scales, one of them 0
    assert q[0].tolist() == [0.0, 0.0] and q[1, 1] == -2.0 and not q.isnan().any()


def test_rms_norm_is_the_models_rmsnorm():
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = torch.randn(3, 7, 48)
    torch.testing.assert_close(engines.rms_norm(x, norm.weight, 1e-5), norm(x))
    assert engines.eager_ops(engines.rms_norm, x, norm.weight, 1e-5) == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    assert engines.rms_norm_traffic(4, 8, 2) == (7 * 64, 2 * 64)
    with pytest.raises(ValueError, match="rows"):
        engines.rms_norm_traffic(0, 8, 2)


def test_explain_counts_graphs_and_breaks():
    import torch

    x, w = torch.randn(4, 8), torch.ones(8)
    whole = engines.explain(engines.rms_norm, x, w, 1e-6)
    assert whole["graphs"] == 1 and whole["graph_breaks"] == 0 and whole["graph_ops"] == 6

    def with_a_host_read(x, w, eps):
        if x.abs().max().item() > 1e4:  # the Python branch needs the value on the host: the graph ends here
            x = x.clamp(-1e4, 1e4)
        return engines.rms_norm(x, w, eps)

    broken = engines.explain(with_a_host_read, x, w, 1e-6)
    assert broken["graph_breaks"] >= 1 and broken["graphs"] >= 2 and broken["break_reasons"][0]


def test_compile_fuses_the_chain_into_fewer_kernels():
    if not engines.capability("torch.compile").available:
        pytest.skip(engines.capability("torch.compile").reason)
    import torch

    x, w = torch.randn(16, 64), torch.randn(64)
    fused = engines.compile_fused(engines.rms_norm, x, w, 1e-6)
    assert fused.first_call_s > 0 and fused.cache_entries_before >= 0
    assert 1 <= len(fused.kernels) < len(engines.eager_ops(engines.rms_norm, x, w, 1e-6))
    assert all(k in fused.code for k in fused.kernels)
    rows = engines.fusion_rows(engines.rms_norm, {"x": fused}, {"x": (x, w, 1e-6)}, repeats=2)
    assert rows[0]["eager_ops"] == 6 and rows[0]["fused_kernels"] == len(fused.kernels)
    assert rows[0]["max_abs_diff"] < 1e-5 and rows[0]["eager_us"] > 0 and rows[0]["compiled_us"] > 0
    m = engines.time_per_call(engines.rms_norm, x, w, 1e-6, repeats=3)
    assert m.n == 3 and m.median > 0 and m.meta["calls_per_sample"] >= 1
    with pytest.raises(ValueError, match="repeats"):
        engines.time_per_call(engines.rms_norm, x, w, repeats=0)


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

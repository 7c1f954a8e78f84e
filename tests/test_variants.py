"""labkit.variants: names and errors, the ONNX cache, int8 helpers, and every backend on a tiny model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from labkit import env, variants


def test_names_and_unknown_variant():
    assert variants.names()[0] == "fp32"
    for required in ("fp16", "bf16", "bnb-int8", "bnb-nf4", "ort-fp32", "ort-int8-tensor", "ort-int8-channel"):
        assert required in variants.names()
    with pytest.raises(ValueError, match="ort-int8-channel") as err:
        variants.load_variant("fp8")
    assert "fp32" in str(err.value)


def test_unknown_options_name_the_valid_ones():
    with pytest.raises(ValueError, match="none"):
        variants.load_variant("fp32", double_quant=True)
    with pytest.raises(ValueError, match="double_quant"):
        variants.load_variant("bnb-nf4", group_size=32)


def test_predictions_follow_sizing():
    fp32 = variants.predicted_weight_bytes("fp32", "default")
    assert variants.predicted_weight_bytes("fp16", "default") * 2 == fp32
    assert variants.predicted_weight_bytes("bnb-nf4", "default") <= 0.30 * fp32
    # ORT int8: one byte per parameter plus the tied lm_head's own int8 copy
    assert fp32 / 4 < variants.predicted_weight_bytes("ort-int8-tensor", "default") < 0.35 * fp32


def test_missing_backend_becomes_a_status_not_a_crash(monkeypatch):
    missing = env.Capability("bitsandbytes", False, "", "not installed: pip install bitsandbytes")
    monkeypatch.setattr(env, "capability", lambda name: missing)
    v = variants.load_variant("bnb-nf4", "default", device="cpu")
    assert not v.ok and v.status == missing.reason and v.model is None
    row = variants.measure_variant(v, inputs=None)  # nothing to measure: the row carries the reason
    assert row["status"] == missing.reason and "ttft_s" not in row


def test_backend_error_while_loading_becomes_a_status(monkeypatch):
    def broken(v, model_name):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(variants, "_load_torch", broken)
    v = variants.load_variant("fp16", "default", device="cpu")
    assert v.status.startswith("cannot run here: RuntimeError: no kernel image")


@pytest.mark.parametrize("raise_it", [
    lambda: variants.check_name("no-such-variant"),  # a ValueError raised by labkit's own code
    lambda: len(42),  # a TypeError: a wrong call is a bug wherever it happens
    lambda: exec("assert False, 'broken invariant'"),
])
def test_labkit_bugs_surface_instead_of_becoming_a_capability_gap(monkeypatch, raise_it):
    def buggy(v, model_name):
        raise_it()

    monkeypatch.setattr(variants, "_load_torch", buggy)
    with pytest.raises((ValueError, TypeError, AssertionError)):
        variants.load_variant("fp16", "default", device="cpu")


def test_what_counts_as_a_backend_failure():
    class Fail(Exception):  # how onnxruntime's pybind errors look: their module is onnxruntime's
        pass

    Fail.__module__ = "onnxruntime.capi.onnxruntime_pybind11_state"
    assert env.backend_failure(Fail("ep failed")) and env.backend_failure(ImportError("no bitsandbytes"))
    assert env.backend_failure(env.Unavailable("no GPU")) and env.backend_failure(variants.ProviderFallback("cpu"))
    assert env.backend_failure(RuntimeError("raised by a library, no labkit frame"))
    assert not env.backend_failure(TypeError("wrong call")) and not env.backend_failure(AssertionError("invariant"))
    try:
        variants.check_name("nope")
    except ValueError as exc:
        assert not env.backend_failure(exc), "a ValueError from labkit's own code is a bug or bad input"


def test_atomic_dir_renames_on_success_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(KeyError):
        with variants._atomic_dir(target) as tmp:
            (tmp / "model.onnx").write_text("half")
            raise KeyError("interrupted")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with variants._atomic_dir(target) as tmp:
        (tmp / "model.onnx").write_text("x")
        (tmp / "config.json").write_text("{}")
    assert variants._complete(target) and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_fold_constant_transposes_keeps_the_result():
    import numpy as np
    import onnx
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
    assert variants.fold_constant_transposes(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    onnx.checker.check_model(model)
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-6)


def test_per_channel_scales_keep_small_rows_that_per_tensor_scales_erase():
    w = torch.tensor([[0.001, -0.002, 0.003], [100.0, -50.0, 25.0]])
    per_tensor = variants._fake_quant_weight(w, per_channel=False, reduce_range=False)
    per_channel = variants._fake_quant_weight(w, per_channel=True, reduce_range=False)
    assert torch.equal(per_tensor[0], torch.zeros(3))  # the small row rounds to 0 with the big row's scale
    assert torch.allclose(per_channel[0], w[0], rtol=0.01)
    x = torch.linspace(-3, 5, 200)
    xq = variants._fake_quant_activation(x)
    assert (xq - x).abs().max() <= (8 / 255) / 2 + 1e-6  # half a uint8 step of the range


def test_ort_matmul_error_is_small_for_plain_weights():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(32, 64, generator=g) * 0.05, torch.randn(16, 64, generator=g)
    assert variants.ort_matmul_error(w, x, per_channel=False, reduce_range=True) < 0.05
    assert variants.ort_matmul_error(w, x, per_channel=True, reduce_range=True) < 0.05


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random Llama with the default tokenizer, saved like any HF model directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from labkit import models

    tok = models.load_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


TINY = variants.Settings(new_tokens=4, repeats=1, answer_tokens=4, n_questions=1, ppl_window_tokens=32,
                         ppl_stride_tokens=32, ppl_max_tokens=64, ref_prompts=2, ref_new_tokens=4)


def test_every_variant_runs_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    names = ["fp32", "fp16", "bnb-int8", "bnb-nf4", "ort-fp32", "ort-int8-tensor", "ort-int8-channel"]
    rows = {r["variant"]: r for r in variants.run(names, TINY, model_name=str(tiny_model_dir), device="cpu",
                                                  progress=False)}
    assert list(rows) == names
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["status"])
        for col in ("weight_bytes", "ttft_s", "decode_tokens_per_s", "perplexity", "agreement", "kl"):
            assert row[col] is not None and row[col] >= 0, (name, col)
    assert rows["fp32"]["agreement"] == 1.0 and rows["fp32"]["kl"] == 0.0
    # the same fp32 weights through ONNX Runtime: same predictions up to float rounding
    assert rows["ort-fp32"]["kl"] < 1e-3 and rows["ort-fp32"]["agreement"] >= 0.9
    assert abs(rows["ort-fp32"]["perplexity"] / rows["fp32"]["perplexity"] - 1) < 1e-3
    # ONNX weight bytes are the files on disk: fp32 4 bytes per parameter, int8 1 byte per parameter
    # plus the tied lm_head's own int8 copy; both as predicted to within the graph's small overhead
    # (a tiny model's per-channel scales are a larger share than a real model's: 10 % tolerance)
    for name in ("ort-fp32", "ort-int8-tensor", "ort-int8-channel"):
        assert abs(rows[name]["weight_bytes"] / rows[name]["predicted_weight_bytes"] - 1) < 0.10, name
    assert rows["ort-int8-tensor"]["weight_bytes"] < 0.55 * rows["ort-fp32"]["weight_bytes"]
    assert rows["bnb-nf4"]["weight_bytes"] < rows["bnb-int8"]["weight_bytes"] < rows["fp32"]["weight_bytes"]


def test_onnx_files_are_cached_and_reused(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    first = variants.load_variant("ort-int8-tensor", str(tiny_model_dir), device="cpu")
    assert first.ok and first.prepare_s is not None and first.prepare_s > 0
    first.release()
    again = variants.load_variant("ort-int8-tensor", str(tiny_model_dir), device="cpu")
    assert again.ok and again.prepare_s is None  # nothing exported or quantised the second time
    assert again.weight_bytes == sum(Path(p).stat().st_size for p in again.files)
    assert not list((tmp_path / "cache" / "onnx").rglob(".*"))  # no temporary folders left behind


def test_a_missing_model_is_an_error_not_a_status(tmp_path):
    from labkit import models

    with pytest.raises(ValueError):
        variants.load_variant("fp32", str(tmp_path / "no-such-model"))
    assert issubclass(models.ModelNotFound, ValueError)


def test_an_unavailable_provider_names_the_available_ones():
    with pytest.raises(ValueError, match="CPUExecutionProvider"):
        variants.load_variant("ort-fp32", "default", device="cpu", provider="NoSuchExecutionProvider")


# ------------------------------------------------------------------ the quantisers written out, against the libraries


def _weight() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(64, 128, generator=gen) * torch.linspace(0.01, 1.0, 64)[:, None]  # rows: a multiple of 32, as NF4 repacking needs


def test_hand_written_int8_is_onnx_runtimes_int8():
    w = _weight()
    for per_channel in (False, True):
        for reduce_range in (False, True):
            qmax = 64 if reduce_range else 127
            q, w_hat = variants.int8_round_trip(w, variants.absmax_scale(w, per_channel, qmax), qmax)
            oq, oscale = variants.ort_quantized_weight(w, per_channel, reduce_range)
            assert oq.dtype == torch.int8 and torch.equal(q, oq)
            assert torch.allclose(oscale, variants.absmax_scale(w, per_channel, qmax))
            assert w_hat.dtype == torch.float32 and (w_hat - w).abs().max() <= oscale.max() / 2 + 1e-7


def test_hand_written_int8_and_nf4_are_bitsandbytes_own():
    if not env.capability("bitsandbytes").available:
        pytest.skip(env.capability("bitsandbytes").reason)
    import bitsandbytes.functional as F

    w = _weight()
    cb, scb, _ = F.int8_vectorwise_quant(w.half())
    w16 = w.half().float()
    q, _ = variants.int8_round_trip(w16, variants.absmax_scale(w16, per_channel=True))
    assert (q != cb).float().mean() < 1e-3  # equal but for values on a rounding tie (w/s vs w·(127/absmax))
    code = F.get_4bit_type("nf4", device="cpu")
    assert torch.allclose(code, torch.tensor(variants.NF4_CODE))
    idx, amax = variants.nf4_quantize(w.reshape(-1, 64), code)
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert torch.equal((code[idx] * amax).reshape(w.shape), F.dequantize_4bit(packed, state))


def test_bnb_route_reads_the_operators_that_ran():
    assert "_int_mm" in variants.bnb_route("int8", ["bitsandbytes::int8_linear_matmul", "aten::_int_mm"], "cpu")
    assert "fp32" in variants.bnb_route("int8", ["bitsandbytes::int8_linear_matmul", "aten::mm"], "cpu")
    assert "CUDA" in variants.bnb_route("int8", ["bitsandbytes::int8_linear_matmul"], "cuda:0")
    cuda_other = variants.bnb_route("int8", ["aten::mm", "aten::matmul"], "cuda:0")  # the label follows what ran
    assert "CUDA" not in cuda_other and cuda_other.startswith("no bitsandbytes int8 operator seen")
    assert "dequantised" in variants.bnb_route("nf4", ["bitsandbytes::dequantize_4bit", "aten::mm"], "cpu")
    assert "fused" in variants.bnb_route("nf4", ["bitsandbytes::gemv_4bit"], "cpu")
    with pytest.raises(ValueError, match="int8"):
        variants.bnb_route("fp8", [], "cpu")


def test_bnb_layer_reports_the_kernel_this_machine_runs():
    if not env.capability("bitsandbytes").available:
        pytest.skip(env.capability("bitsandbytes").reason)
    w = _weight()
    for kind in ("int8", "nf4"):
        ops = variants.ops_called(variants.bnb_layer(w, kind), torch.randn(1, 1, 128))
        assert any(o.startswith("bitsandbytes::") for o in ops), ops
    cond = variants.bnb_cpu_conditions()
    int8_ops = variants.ops_called(variants.bnb_layer(w, "int8"), torch.randn(1, 1, 128))
    assert ("aten::_int_mm" in int8_ops) == (cond["torch >= 2.6"] and cond["torch CPU capability"] == "AVX512")

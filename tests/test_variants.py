"""labkit.precision.variants: names and errors, backend failures as statuses, the ONNX cache, and every backend on a tiny model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from labkit.core import env
from labkit.precision import measure, variants


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
    row = measure.measure_variant(v, inputs=None)  # nothing to measure: the row carries the reason
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


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random Llama with the default tokenizer, saved like any HF model directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from labkit.model import models

    tok = models.load_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


TINY = measure.Settings(new_tokens=4, repeats=1, answer_tokens=4, n_questions=1, ppl_window_tokens=32,
                        ppl_stride_tokens=32, ppl_max_tokens=64, ref_prompts=2, ref_new_tokens=4)


def test_every_variant_runs_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    names = ["fp32", "fp16", "bnb-int8", "bnb-nf4", "ort-fp32", "ort-int8-tensor", "ort-int8-channel"]
    rows = {r["variant"]: r for r in measure.run(names, TINY, model_name=str(tiny_model_dir), device="cpu",
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
    from labkit.model import models

    with pytest.raises(ValueError):
        variants.load_variant("fp32", str(tmp_path / "no-such-model"))
    assert issubclass(models.ModelNotFound, ValueError)


def test_an_unavailable_provider_names_the_available_ones():
    with pytest.raises(ValueError, match="CPUExecutionProvider"):
        variants.load_variant("ort-fp32", "default", device="cpu", provider="NoSuchExecutionProvider")


def test_an_onnxruntime_error_mid_sweep_becomes_a_row_and_a_bug_still_surfaces(monkeypatch):
    class Fail(Exception):  # ONNX Runtime's pybind errors derive from Exception, not RuntimeError
        pass

    Fail.__module__ = "onnxruntime.capi.onnxruntime_pybind11_state"
    monkeypatch.setattr(variants, "load_variant", lambda n, *a, **k: variants.Variant(n, backend="onnxruntime"))
    inputs = measure.Inputs(reference=None, eval_ids=[], questions=[], settings=TINY)

    def ort_fails(v, inputs):
        raise Fail("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code")

    monkeypatch.setattr(measure, "measure_variant", ort_fails)
    rows = list(measure.run(["ort-fp32", "fp16"], inputs=inputs))
    assert [r["status"].split(":")[0] for r in rows] == ["failed while measuring"] * 2
    assert "Fail: [ONNXRuntimeError]" in rows[0]["status"]

    def bug(v, inputs):
        raise TypeError("measure_variant() got an unexpected keyword argument")

    monkeypatch.setattr(measure, "measure_variant", bug)
    with pytest.raises(TypeError):
        list(measure.run(["fp16"], inputs=inputs))


def test_every_variant_is_one_spec_and_every_table_is_derived_from_it():
    from labkit.model import dtypes

    for name, spec in variants.SPECS.items():
        assert spec.name == name and callable(getattr(variants, spec.loader)), name
        sized = dtypes.normalize_dtype(spec.sizing_dtype)
        if sized in dtypes.QUANTIZED:
            assert dtypes.layout(sized).bits in (4, 8), name
        assert variants.VARIANTS[name] == spec.description and variants.SIZING_DTYPE[name] == spec.sizing_dtype
        assert variants.OPTIONS.get(name, {}) == spec.options
    assert variants.names() == list(variants.SPECS)


def test_a_new_variant_is_one_entry_and_the_traps_are_gone(monkeypatch):
    """A name starting with "fp" passed the Apple-GPU check as a plain float, and sizing called every quantised dtype
    but int8 NF4. A new entry now says where it runs, and a quantised dtype without a layout cannot be sized."""
    from labkit.model import dtypes, sizing

    spec = variants.Spec("fp8-weight-only", "FP8 E4M3 weights, upcast at the matmul", "fp16", "_load_torch",
                         devices=("cpu", "cuda"))
    monkeypatch.setitem(variants.SPECS, spec.name, spec)
    assert "no Apple-GPU kernels" in variants._unavailable_reason(spec.name, "mps")
    assert variants._unavailable_reason(spec.name, "cpu") == ""
    with pytest.raises(ValueError, match="no quantised layout"):
        dtypes.layout("fp16")
    monkeypatch.setattr(sizing, "QUANTIZED", (*dtypes.QUANTIZED, "fp16"))  # a quantised dtype nobody gave a layout
    with pytest.raises(ValueError, match="LAYOUTS"):
        sizing.weight_bytes(sizing.shape("default"), "fp16")


def test_a_one_time_quantisation_peak_is_kept_apart_from_the_decode_peak(monkeypatch):
    """An ONNX Runtime int8 load may quantise the model first (once; later runs reuse the file): its RSS peak is
    the load's, and the row reports it apart from the peak of the runs after it."""
    import psutil

    from labkit.core import memory

    class Sampler:  # the resident set each phase reached, set by the fake load and by the test
        made: list = []

        def __init__(self, *a, **kw):
            self.peak_bytes = 0
            Sampler.made.append(self)

        def start(self):
            return self

        def stop(self):
            pass

        def describe(self):
            return "scripted"

    base = psutil.Process().memory_info().rss
    mib = 2**20

    def load(v, model_name):  # quantising now: a transient 900 MiB above the start, then the model alone
        Sampler.made[-1].peak_bytes = base + 900 * mib
        v.model, v.tokenizer, v.backend, v.prepare_s = object(), object(), "onnxruntime", 12.0

    monkeypatch.setattr(memory, "RSSSampler", Sampler)
    monkeypatch.setattr(variants, "_load_torch", load)
    v = variants.load_variant("fp32", device="cpu")
    assert len(Sampler.made) == 2, "the runs get a sampler of their own after the load"
    Sampler.made[-1].peak_bytes = base + 300 * mib  # decoding: the model and its buffers
    phases = measure._peak_phases(v)
    peak, _ = measure._peak_memory(v)
    assert phases["load_peak_memory_bytes"] == pytest.approx(900 * mib, abs=64 * mib)
    assert phases["run_peak_memory_bytes"] == pytest.approx(300 * mib, abs=64 * mib)
    assert peak == phases["load_peak_memory_bytes"], "the overall peak is the higher of the two"
    v.device = "cuda:0"
    assert measure._peak_phases(v) == {"load_peak_memory_bytes": None, "run_peak_memory_bytes": None}


def test_best_of_ranks_by_kl_not_by_agreement_over_few_tokens():
    """The recorded quick run: per-channel agreed on 14 of 24 tokens (58 %) with KL 1.14, per-tensor on 12 (50 %)
    with KL 1.13: agreement over 24 tokens moves in 4 % steps; KL picks per-tensor."""
    from labkit.precision import variants

    rows = [{"variant": "ort-int8-channel", "status": "ok", "agreement": 0.58, "kl": 1.14},
            {"variant": "ort-int8-tensor", "status": "ok", "agreement": 0.50, "kl": 1.13},
            {"variant": "fp32", "status": "ok", "agreement": 1.0, "kl": 0.0}]
    assert measure.best_of(rows, ["ort-int8-tensor", "ort-int8-channel"])["variant"] == "ort-int8-tensor"
    assert measure.best_of(rows[:1] + [{**rows[1], "status": "failed"}], ["ort-int8-tensor", "ort-int8-channel"])[
       "variant"] == "ort-int8-channel"
    assert measure.best_of(rows, ["bnb-int8"]) is None


def test_rounded_formats_run_on_a_tiny_model_with_stored_bytes_as_sized_and_no_timing(tiny_model_dir, tmp_path,
                                                                                       monkeypatch):
    """FP8, NVFP4, MXFP4 and int4 as rounded fp32 weights: quality measured, speed not (fp32 arithmetic would time
    fp32), stored bytes as labkit.model.sizing predicts them, and the weight errors in the formats' known order."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    names = ["fp32", "fp8-tensor", "fp8-channel", "nvfp4", "mxfp4", "int4-g64"]
    rows = {r["variant"]: r for r in measure.run(names, TINY, model_name=str(tiny_model_dir), device="cpu",
                                                 progress=False)}
    for name in names[1:]:
        row = rows[name]
        assert row["status"] == "ok", (name, row["status"])
        assert row["decode_tokens_per_s"] is None and row["ttft_s"] is None and "no timing" in row["note"]
        assert 0 <= row["agreement"] <= 1 and row["kl"] >= 0 and row["perplexity"] > 0
        assert abs(row["weight_bytes"] / row["predicted_weight_bytes"] - 1) < 0.02, name
    err = {n: rows[n]["weight_error"] for n in names[1:]}
    assert err["fp8-channel"] <= err["fp8-tensor"] < err["nvfp4"] < err["mxfp4"], err
    assert rows["fp32"]["weight_error"] is None
    assert rows["nvfp4"]["weight_bytes"] > rows["mxfp4"]["weight_bytes"]  # a byte per 16 weights against per 32

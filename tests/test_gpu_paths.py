"""The GPU paths' logic on a CPU: ONNX Runtime rows labelled from the providers their session really got,
dynamic int8 on the CPU provider, TensorRT counted only when it loads (with shape profiles and an engine
cache), torch-tensorrt's options and partition report, one vLLM engine at a time, the roofline's launch-bound
explanation, and GPU reference files read and written under their GPU's name."""
from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import pytest
from test_devices import mock_gpu

from labkit.core import env, results, tensorrt_libs
from labkit.model import hardware, onnx
from labkit.precision import measure, variants
from labkit.engines import onnxruntime, tensorrt
from labkit.serve.vllm import offline as vllm
from labkit.core.env import Capability
from labkit.lessons import references

# -------------------------------------------------------------------------------- ONNX Runtime providers


class FakeSession:
    def __init__(self, providers: list[str]) -> None:
        self.providers = providers

    def get_providers(self) -> list[str]:
        return list(self.providers)


class FakeORTModel:
    """What OrtCausalLM.from_pretrained returns, with a session on ``got`` providers."""

    def __init__(self, got: list[str]) -> None:
        import torch

        self.session = FakeSession(got)
        self.device = torch.device("cuda", 0) if got[0] != "CPUExecutionProvider" else torch.device("cpu")
        self.generation_config = types.SimpleNamespace(pad_token_id=0)


@pytest.fixture
def fake_ort(monkeypatch, tmp_path):
    """ONNX Runtime that lists CUDA, an export that is already there, and sessions whose providers the test sets:
    ``fake_ort["got"]`` (None: the first provider asked for, as a working GPU gives). Records what was asked."""
    import onnxruntime as ort
    from labkit.model.ort_decoder import OrtCausalLM

    folder = tmp_path / "onnx"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"not read")
    state: dict = {"got": None, "asked": []}

    def from_pretrained(path, provider="CPUExecutionProvider", providers=None, **kw):
        asked = list(providers or [provider])
        state["asked"].append(asked)
        return FakeORTModel(state["got"] or [asked[0], "CPUExecutionProvider"])

    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(OrtCausalLM, "from_pretrained", staticmethod(from_pretrained))
    monkeypatch.setattr(onnx, "export_onnx", lambda model_name=None, force=False: (folder, None))
    monkeypatch.setattr(onnx, "quantize_onnx", lambda per_channel, reduce_range=None, model_name=None, force=False:
                        (folder, None))
    return state


def test_a_provider_fallback_is_a_failed_row_with_its_reason(fake_ort):
    fake_ort["got"] = ["CPUExecutionProvider"]  # CUDA's libraries did not load
    v = variants.load_variant("ort-fp32", device="cuda")
    assert not v.ok and v.model is None
    assert "asked ONNX Runtime for CUDAExecutionProvider, the session got ['CPUExecutionProvider']" in v.status


def test_rows_are_labelled_from_the_session_providers(fake_ort):
    v = variants.load_variant("ort-fp32", device="cuda")
    assert v.ok and v.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"] and v.device == "cuda:0"
    assert v.summary()["providers"][0] == "CUDAExecutionProvider"


def test_dynamic_int8_runs_on_the_cpu_provider_on_a_gpu_and_says_so(fake_ort):
    v = variants.load_variant("ort-int8-channel", device="cuda")
    assert fake_ort["asked"][-1] == ["CPUExecutionProvider"]
    assert v.ok and v.device == "cpu" and v.providers[0] == "CPUExecutionProvider"
    assert "no CUDA kernels" in v.note and "bitsandbytes" in v.note and "TensorRT" in v.note
    with pytest.raises(ValueError, match="CPUExecutionProvider' only"):
        variants.load_variant("ort-int8-tensor", device="cuda", provider="CUDAExecutionProvider")


def test_load_ort_refuses_numbers_from_another_provider(fake_ort, monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cuda")
    fake_ort["got"] = ["CPUExecutionProvider"]
    with pytest.raises(onnx.ProviderFallback, match="session got"):
        onnxruntime.load_ort("basic")
    fake_ort["got"] = None
    built = onnxruntime.load_ort("basic")
    assert built["providers"][0] == "CUDAExecutionProvider" == built["provider"]


def test_tensorrt_provider_counts_only_when_tensorrt_loads(monkeypatch):
    """onnxruntime-gpu lists TensorrtExecutionProvider without TensorRT installed: the capability asks a session."""
    mock_gpu(monkeypatch, "NVIDIA L4", (8, 9))
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    probe = tensorrt_libs.provider_reason  # cached per process: start and end clean
    if probe is not None:
        probe.cache_clear()
    try:
        cap = env.capability("ort-tensorrt")  # this onnxruntime cannot give a TensorRT session
        assert not cap.available and "TensorRT" in cap.reason
        assert tensorrt.tensorrt_rows()[0]["status"] == cap.reason
    finally:
        if probe is not None:
            probe.cache_clear()


def _decoder_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "past_sequence_length + sequence_length"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT,
                                            ["batch_size", 3, "past_sequence_length", 64])]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", 10])
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "decoder", inputs, [out])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tensorrt_profiles_cover_every_input_and_length(tmp_path):
    model = _decoder_onnx(tmp_path / "model.onnx")
    p = onnxruntime.tensorrt_shape_profiles(model, max_batch=2, max_len=256)
    assert p["trt_profile_min_shapes"] == ("input_ids:1x1,attention_mask:1x1,position_ids:1x1,"
                                           "past_key_values.0.key:1x3x0x64")
    assert p["trt_profile_opt_shapes"] == ("input_ids:1x1,attention_mask:1x1,position_ids:1x1,"
                                           "past_key_values.0.key:1x3x128x64")
    assert p["trt_profile_max_shapes"] == ("input_ids:2x256,attention_mask:2x256,position_ids:2x256,"
                                           "past_key_values.0.key:2x3x255x64")
    opts = onnxruntime.tensorrt_provider_options(model, cache_dir=tmp_path / "engines")
    assert opts["trt_engine_cache_enable"] == "True" and Path(opts["trt_engine_cache_path"]).is_dir()
    assert opts["trt_timing_cache_enable"] == "True" and opts["trt_fp16_enable"] == "True"
    with pytest.raises(ValueError, match="max_len"):
        onnxruntime.tensorrt_shape_profiles(model, max_len=1)


# ---------------------------------------------------------------------------------------- torch-tensorrt


def test_torch_tensorrt_options_follow_the_installed_version(monkeypatch):
    import dataclasses

    import torch

    def install(fields: dict) -> None:
        settings = dataclasses.make_dataclass("CompilationSettings", [(k, type(v), v) for k, v in fields.items()])
        dynamo = types.ModuleType("torch_tensorrt.dynamo")
        dynamo.CompilationSettings = settings
        monkeypatch.setitem(sys.modules, "torch_tensorrt", types.ModuleType("torch_tensorrt"))
        monkeypatch.setitem(sys.modules, "torch_tensorrt.dynamo", dynamo)

    install({"enabled_precisions": frozenset(), "min_block_size": 5, "pass_through_build_failures": False})
    assert tensorrt.torch_tensorrt_options(torch.float16) == {
        "enabled_precisions": {torch.float16}, "min_block_size": 1, "pass_through_build_failures": False}
    install({"min_block_size": 5, "pass_through_build_failures": False})  # strongly typed: precision is the model's
    assert tensorrt.torch_tensorrt_options(torch.float16, min_block_size=3) == {
        "min_block_size": 3, "pass_through_build_failures": False}
    with pytest.raises(ValueError, match="min_block_size"):
        tensorrt.torch_tensorrt_options(torch.float16, min_block_size=0)


def test_partition_stats_count_engines_and_what_stayed_in_pytorch():
    import torch
    from torch import fx

    class Fallback(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x) + 1

    class Partitioned(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._run_on_acc_0 = torch.nn.Linear(4, 4)  # stands for a TensorRT engine
            self._run_on_gpu_1 = fx.symbolic_trace(Fallback())

        def forward(self, x):
            return torch.relu(self._run_on_gpu_1(self._run_on_acc_0(x)))

    class Leaves(fx.Tracer):
        def is_leaf_module(self, m, name):
            return name.startswith("_run_on") or super().is_leaf_module(m, name)

    root = Partitioned()
    gm = fx.GraphModule(root, Leaves().trace(root))
    assert tensorrt.partition_stats(gm) == {"trt_engines": 1, "torch_ops": 3}  # relu + sin + add
    assert tensorrt.partition_stats(fx.symbolic_trace(Fallback())) == {"trt_engines": 0, "torch_ops": 2}


# ------------------------------------------------------------------------------------------------ vLLM


@pytest.fixture
def fake_vllm(monkeypatch):
    """A vllm module that records engines starting and shutting down, and a GPU count of two."""
    events: list[tuple] = []

    class LLM:
        prompts: list = []  # each generate call's token ids

        def __init__(self, model, **kw):
            live = [e for e in events if e[0] in ("start", "shutdown")]
            assert not live or live[-1][0] == "shutdown", "an engine started while another was alive"
            events.append(("start", kw["tensor_parallel_size"], kw["gpu_memory_utilization"]))
            self.llm_engine = types.SimpleNamespace(
                engine_core=types.SimpleNamespace(shutdown=lambda: events.append(("shutdown",))))

        def generate(self, prompts, params, use_tqdm=False):
            assert all(isinstance(p["prompt_token_ids"][0], int) for p in prompts), "token ids, made before the clock"
            LLM.prompts.append([list(p["prompt_token_ids"]) for p in prompts])
            out = types.SimpleNamespace(token_ids=[1] * params.max_tokens, text="ok")
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    real = env.capability
    monkeypatch.setattr(env, "capability",
                        lambda name: Capability(name, True, "test", "") if name == "vllm-offline" else real(name))
    monkeypatch.setattr(vllm, "gpu_count", lambda: 2)
    return events


def test_vllm_offline_passes_the_memory_share_and_shuts_down(fake_vllm):
    row = vllm.vllm_offline("some/model", [[1, 2], [3, 4, 5]], max_tokens=3, gpu_memory_utilization=0.4)
    assert fake_vllm == [("start", 1, 0.4), ("shutdown",)]
    assert row["output_tokens"] == 6 and row["gpu_memory_utilization"] == 0.4
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        vllm.vllm_offline("some/model", [[1]], gpu_memory_utilization=0.95 + 0.1)


def test_vllm_rows_run_one_engine_at_a_time(fake_vllm, monkeypatch):
    from labkit.serve import loadgen

    model = types.SimpleNamespace(to=lambda device: fake_vllm.append(("hf model to", device)))
    from labkit.model import models

    lm = types.SimpleNamespace(model=model, device="cuda", name="some/model", tokenizer=models.load_tokenizer(),
                               dtype="fp16")
    monkeypatch.setattr(vllm, "hf_offline", lambda lm, prompts, max_tokens: fake_vllm.append(("hf",)) or
                        {"engine": "transformers generate (fp16)", "output_tokens_per_s": 1.0})

    @contextlib.contextmanager
    def server(path, gpu_memory_utilization):
        fake_vllm.append(("serve", gpu_memory_utilization))
        yield "http://127.0.0.1:1"
        fake_vllm.append(("serve stopped",))

    monkeypatch.setattr(vllm, "serve_here", server)
    monkeypatch.setattr(vllm, "models_path", lambda lm: "some/model")
    served = {}
    monkeypatch.setattr(loadgen, "run", lambda url, prompts, **kw: served.update(prompts=prompts, **kw) or
                        types.SimpleNamespace(summary=lambda: {"completed": 2}))
    rows = vllm.vllm_rows(lm, ["a", "b"], max_tokens=2, gpu_memory_utilization=0.4)
    offline = sys.modules["vllm"].LLM.prompts  # per engine: a warmup call, then every prompt
    assert len(offline) == 4 and offline[1] == offline[3] and len(offline[1]) == 2
    assert [list(p) for p in served["prompts"]] == offline[1], "vllm serve gets the offline rows' chat token ids"
    assert served["endpoint"] == "completions"
    assert fake_vllm == [("hf",), ("hf model to", "cpu"), ("start", 1, 0.4), ("shutdown",), ("start", 2, 0.4),
                         ("shutdown",), ("serve", 0.4), ("serve stopped",)]
    assert lm.device == "cpu" and len(rows) == 4 and all("texts" not in r for r in rows)


# ------------------------------------------------------------------------------------- roofline on a GPU


def test_decode_gap_explains_a_launch_bound_gpu():
    gap = hardware.decode_gap(tpot_s=0.006, bytes_per_step=270e6, bandwidth_gbs=4000, ops_per_step=900,
                              device="cuda:0")
    assert gap["bound"] == "launch" and gap["bytes_share"] < 0.02
    assert "launch-bound" in gap["explanation"] and "LABKIT_MODEL=" in gap["explanation"]
    assert "900 operators" in gap["explanation"] and gap["overhead_us_per_op"] == pytest.approx(6.6, rel=0.01)
    mem = hardware.decode_gap(tpot_s=0.1, bytes_per_step=270e6, bandwidth_gbs=3.0, ops_per_step=900, device="cpu")
    assert mem["bound"] == "bandwidth" and "memory-bound" in mem["explanation"]
    cpu = hardware.decode_gap(tpot_s=0.4, bytes_per_step=270e6, bandwidth_gbs=7.0, ops_per_step=1800, device="cpu")
    assert cpu["bound"] == "overhead" and "kernel launch" not in cpu["explanation"]
    with pytest.raises(ValueError):
        hardware.decode_gap(0.0, 1.0, 1.0, 1, "cpu")
    with pytest.raises(ValueError):
        hardware.decode_gap(1.0, 1.0, 1.0, 0, "cpu")


def test_decode_gap_splits_a_step_three_ways_on_recorded_numbers():
    """Notebook 01's recorded run: a 65.7 ms step, 532 MB at the probe's 27 GB/s, nn.Linear's GEMV at 11.6 GB/s,
    1653 operators. Two pieces called it overhead-bound; the GEMV's shortfall is the largest piece."""
    gap = hardware.decode_gap(0.0657, 532e6, 27.0, 1653, "cpu", gemv_gbs=11.6)
    assert gap["bytes_s"] == pytest.approx(0.0197, abs=1e-4)
    assert gap["kernel_s"] == pytest.approx(532e6 / 11.6e9 - 532e6 / 27e9, rel=1e-6)
    assert gap["bytes_s"] + gap["kernel_s"] + gap["overhead_s"] == pytest.approx(0.0657)
    assert gap["bound"] == "kernel" and gap["matmul_gbs"] == 11.6
    assert "11.6 GB/s" in gap["explanation"] and "43% of the bandwidth probe's" in gap["explanation"]
    assert "overhead-bound" not in gap["explanation"]
    # notebooks 05 and 10: the profiler's matmul time instead of the probe; 85 % of a step in matmul
    prof = hardware.decode_gap(0.0657, 532e6, 27.0, 1653, "cpu", matmul_s=0.85 * 0.0657)
    assert prof["bytes_s"] + prof["kernel_s"] == pytest.approx(0.85 * 0.0657)
    assert prof["matmul_gbs"] == pytest.approx(532e6 / (0.85 * 0.0657) / 1e9)
    assert "from the profiler's matmul time" in prof["explanation"]
    # a kernel slower than the whole step never makes the pieces exceed it
    capped = hardware.decode_gap(0.01, 100e6, 20.0, 10, "cpu", gemv_gbs=1.0)
    assert capped["overhead_s"] == 0 and capped["bytes_s"] + capped["kernel_s"] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="gemv_gbs"):
        hardware.decode_gap(0.0657, 532e6, 27.0, 1653, "cpu", gemv_gbs=0)


# ------------------------------------------------------------------------------------- GPU reference files


@pytest.fixture
def reference_dir(tmp_path, monkeypatch):
    from labkit.core import config

    monkeypatch.setattr(config, "DATA_DIR", tmp_path)
    (tmp_path / "reference").mkdir()
    return tmp_path / "reference"


def test_gpu_references_are_shown_with_provenance(reference_dir, capsys):
    assert references.show("02_fp16_bf16", "variants", source="gpu") == 0
    assert "make reference NOTEBOOKS=02" in capsys.readouterr().out
    env = {"device": "cuda", "hardware": {"gpu": "NVIDIA L4"}, "date": "2030-01-01", "command": "make reference",
           "versions": {"torch": "2.13.0"}}
    res = results.Results("02_fp16_bf16", env=env)
    res.add("variants", variant="fp16", decode_tokens_per_s=300.0, extra=1)
    res.save(reference_dir / f"{results.reference_name('02_fp16_bf16', env)}.json")
    assert references.show("02_fp16_bf16", ["variants", "matmul"], ["variant", "decode_tokens_per_s"],
                           source="gpu") == 1
    out = capsys.readouterr().out
    assert "NVIDIA L4" in out and "2030-01-01" in out and "make reference" in out and "extra" not in out
    with pytest.raises(ValueError, match="section"):
        references.show("02_fp16_bf16", [], source="gpu")


def test_gpu_reference_tables_leave_out_what_cannot_be_scanned(reference_dir, capsys):
    env = {"device": "cuda", "hardware": {"gpu": "NVIDIA H200"}, "date": "2030-01-01", "command": "make reference"}
    res = results.Results("05_kv_cache", env=env)
    res.add("attention", attn_implementation="sdpa", tpot_s=0.026, samples={"tpot_s": [0.02, 0.03]},
            peak_memory_source="cuda_peak above resident: a long sentence", answers=["a", "b"])
    res.save(reference_dir / f"{results.reference_name('05_kv_cache', env)}.json")
    assert references.show("05_kv_cache", "attention", source="gpu") == 1
    out = capsys.readouterr().out
    assert "sdpa" in out and "tpot_s" in out
    assert "samples" not in out and "peak_memory_source" not in out and "answers" not in out


def test_kv_reference_on_a_gpu_keeps_the_cpu_file(reference_dir, monkeypatch):
    from labkit.core import env
    from labkit.model import models
    from labkit.decoding import kv

    monkeypatch.setattr(models, "load", lambda *a, **k: types.SimpleNamespace(model=None, tokenizer=None))
    monkeypatch.setattr(kv, "compare_cache_variants", lambda *a, **k: [{"variant": "dynamic", "tpot_s": 0.01}])
    gpu_env = {"device": "cuda", "hardware": {"gpu": "NVIDIA H100 80GB HBM3"}, "date": "2030", "versions": {},
               "command": "python -m labkit.decoding.kv reference"}
    monkeypatch.setattr(env, "environment", lambda: dict(gpu_env))
    path = kv.write_compile_reference()
    assert path.name == "05_kv_cache_compile.nvidia-h100-80gb-hbm3.json"
    assert not (reference_dir / "05_kv_cache_compile.json").exists()


# ----------------------------------------------------------------------- memory of one server at a time


def test_a_stopped_server_lets_its_model_go():
    """Notebook 09 measures each server with only its own model loaded: once a server stopped and the caller
    dropped the model, memory.free() must really free it (aiohttp's middleware cache kept every stopped
    server, and its model, alive until stopping a server cleared it)."""
    import gc
    import weakref

    from labkit.core import memory
    from labkit.serve import launch, loadgen, server

    lm = server.tiny_random_model()
    model = weakref.ref(lm.model)
    with launch.start_server(lm, max_batch_size=2) as srv:
        loadgen.run(srv.url, ["hi", "there"], num_requests=2, max_concurrency=2, max_tokens=3, endpoint="chat")
    del lm, srv
    gc.collect()
    memory.free()
    assert model() is None, "the stopped server's model is still alive"


# ----------------------------------------------------------------------------------- memory on a GPU


def _allocator(monkeypatch, resident_bytes: int) -> dict:
    """torch.cuda's allocator counters as a GPU with ``resident_bytes`` already allocated reports them; a load
    adds to ``state["allocated"]`` and raises the peak."""
    import torch

    state = {"allocated": resident_bytes, "peak": resident_bytes}
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: state.__setitem__("peak", state["allocated"]))
    return state


def test_a_variant_peak_on_a_gpu_leaves_out_what_was_already_resident(monkeypatch):
    """Notebook 03 keeps its fp32 model on the GPU while the variants load: their allocator peak must be read
    above what was allocated before each load, and say so."""
    mock_gpu(monkeypatch)
    resident, weights, transient = 513 * 2**20, 270 * 2**20, 30 * 2**20
    state = _allocator(monkeypatch, resident)

    def load(v, model_name):  # a load that allocates its weights and a short-lived buffer on the GPU
        state["peak"] = max(state["peak"], state["allocated"] + weights + transient)
        state["allocated"] += weights
        v.model, v.tokenizer, v.backend = object(), object(), "torch"

    monkeypatch.setattr(variants, "_load_torch", load)
    v = variants.load_variant("fp16", device="cuda:0")
    v.rss_sampler.stop()
    peak, source = measure._peak_memory(v)
    assert peak == weights + transient, f"peak {peak / 2**20:.0f} MiB counts the {resident / 2**20:.0f} MiB resident"
    assert "above resident" in source and "513 MiB" in source
    assert v.ok and v.summary()["cuda_resident_bytes"] == resident  # the row says what was left out


def test_notebook_03_moves_its_fp32_model_off_the_gpu_before_the_sweep():
    src = (Path(__file__).parents[1] / "notebooks" / "src" / "03_int8_int4.py").read_text(encoding="utf-8")
    assert "models.release_gpu(lm)" in src, "sections 1-3's fp32 model must leave the GPU before the variants load"
    assert src.index("models.release_gpu(lm)") < src.index("rounds.run(")


# ------------------------------------------------------------------------- torch.compile in quick mode


def _compile_capable(monkeypatch) -> None:
    real = env.capability
    monkeypatch.setattr(env, "capability", lambda name: Capability(name, True, "test", "") if name == "torch.compile"
                        else real(name))


def test_quick_mode_on_a_gpu_compiles_for_real(monkeypatch):
    """Quick mode skips the whole-model compile only on a CPU (minutes there); on a GPU it takes about a minute and
    runs, so no CPU reference row ever stands beside the GPU's own rows."""
    from labkit.decoding import cache_variants

    _compile_capable(monkeypatch)
    monkeypatch.setenv("LABKIT_QUICK", "1")
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    run, why = cache_variants.compile_here()
    assert not run and "quick mode on a CPU" in why
    mock_gpu(monkeypatch)  # LABKIT_DEVICE=cuda
    assert cache_variants.compile_here() == (True, "")
    monkeypatch.delenv("LABKIT_QUICK")
    assert cache_variants.compile_here("cpu") == (True, "")  # full mode compiles everywhere


def test_a_gpu_never_reads_the_cpu_compile_reference(monkeypatch, reference_dir):
    from labkit.core import results
    from labkit.decoding import cache_variants

    rows = [{"section": "cache_variants", "variant": "static", "new_tokens": 64, "first_call_s": 0.5,
             "decode_tokens_per_s": 40.0},
            {"section": "cache_variants", "variant": "static+compile", "new_tokens": 64, "first_call_s": 50.0,
             "decode_tokens_per_s": 120.0, "agreement": 1.0}]
    cpu = results.Results("05_kv_cache_compile", rows=rows)
    cpu.env = {"device": "cpu", "hardware": {"cpu": "Some CPU", "gpu": None}}
    cpu.save(reference_dir / "05_kv_cache_compile.json")
    mock_gpu(monkeypatch)
    assert cache_variants.compile_reference() is None and cache_variants.compile_story() is None
    gpu = results.Results("05_kv_cache_compile", rows=rows)
    gpu.env = {"device": "cuda", "hardware": {"gpu": "Tesla T4"}}
    gpu.save(reference_dir / f"{results.reference_name('05_kv_cache_compile', gpu.env)}.json")
    assert cache_variants.compile_story().gain == pytest.approx(3.0)
    assert "Tesla T4" in cache_variants.compile_story().provenance
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert "Some CPU" in cache_variants.compile_story().provenance


def test_notebooks_decide_the_compile_with_compile_here():
    src = Path(__file__).parents[1] / "notebooks" / "src"
    for nb in ("04_warmup.py", "05_kv_cache.py", "08_tensorrt.py"):
        text = (src / nb).read_text(encoding="utf-8")
        assert "compile_here()" in text, f"{nb}: quick mode on a GPU must compile for real"
        assert "= not config.quick()" not in text and "too slow for quick mode on a CPU)" not in text, nb


def test_a_profiled_step_says_its_rest_is_the_other_operators_without_python():
    """Notebook 05's profiled step: 62.7 ms of operator self time, 51.7 ms in matmul, 1442 other operators."""
    gap = hardware.decode_gap(0.0627, 544e6, 26.3, 1442, "cpu", matmul_s=0.0517, profiled=True)
    assert "is the other 1442 operators' own time" in gap["explanation"] and "leaves Python out" in gap["explanation"]
    assert "Python, dispatch" not in gap["explanation"]
    assert gap["overhead_s"] == pytest.approx(0.0627 - 0.0517) and gap["overhead_us_per_op"] == pytest.approx(11e-3 / 1442 * 1e6)

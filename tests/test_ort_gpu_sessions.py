"""ONNX Runtime sessions on a GPU, checked on a CPU through a mocked ``torch.cuda`` and mocked sessions: every GPU
session runs on the GPU the lab names (``device_id``), fp32 rows stay IEEE fp32 on the CUDA provider
(``use_tf32=0``), GPU sessions bind their inputs and KV cache on the device (IO binding, the TensorRT provider
included), a row is labelled from the providers its session got, and the preflight fails on the CPU build of
onnxruntime instead of passing on the CPU provider."""
from __future__ import annotations

import io
import types
from pathlib import Path

import pytest
from test_devices import mock_gpu

from labkit import gpu_check, preflight
from labkit.engines import cpu, onnxruntime
from labkit.model import onnx
from labkit.precision import variants

REPO = Path(__file__).resolve().parent.parent
ALL_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class FakeSession:
    def __init__(self, providers: list[str], options: list[dict]) -> None:
        self.providers = providers
        self.options = options

    def get_providers(self) -> list[str]:
        return list(self.providers)


class FakeORTModel:
    """What OrtCausalLM.from_pretrained returns: a session on the providers asked for (or ``got``), its
    device read from the first provider's ``device_id`` as OrtCausalLM reads it."""

    def __init__(self, got: list[str], options: list[dict]) -> None:
        import torch

        self.session = FakeSession(got, options)
        first = options[0] if options else {}
        self.device = (torch.device("cuda", int(first.get("device_id", 0))) if got[0] != "CPUExecutionProvider"
                       else torch.device("cpu"))
        self.generation_config = types.SimpleNamespace(pad_token_id=0)


@pytest.fixture
def sessions(monkeypatch, tmp_path):
    """onnxruntime-gpu's provider list, an export already on disk, and from_pretrained recording its keyword
    arguments; ``sessions["got"]`` overrides the providers a session gets (None: what was asked for)."""
    import onnxruntime as ort
    from labkit.model.ort_decoder import OrtCausalLM

    folder = tmp_path / "onnx"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"not read")
    state: dict = {"got": None, "calls": [], "available": list(ALL_PROVIDERS)}

    def from_pretrained(path, provider="CPUExecutionProvider", providers=None, provider_options=None, **kw):
        asked = list(providers or [provider])
        state["calls"].append({"providers": asked, "provider_options": provider_options, **kw})
        return FakeORTModel(state["got"] or asked + ["CPUExecutionProvider"], list(provider_options or [{}]))

    monkeypatch.setattr(ort, "get_available_providers", lambda: list(state["available"]))
    monkeypatch.setattr(OrtCausalLM, "from_pretrained", staticmethod(from_pretrained))
    monkeypatch.setattr(onnx, "export_onnx", lambda model_name=None, force=False: (folder, None))
    state["folder"] = folder
    return state


def gpu(monkeypatch, count: int = 1):
    """``mock_gpu`` plus the allocator calls a variant's load reads (peak memory)."""
    torch = mock_gpu(monkeypatch, "NVIDIA H200", (9, 0), count=count)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    return torch


@pytest.fixture
def two_gpus(monkeypatch):
    torch = gpu(monkeypatch, count=2)
    monkeypatch.setenv("LABKIT_DEVICE", "cuda:1")
    return torch


def test_cuda_provider_sessions_run_ieee_fp32_on_the_gpu_named(sessions, two_gpus):
    v = variants.load_variant("ort-fp32", device="cuda:1")
    call = sessions["calls"][-1]
    assert call["providers"] == ["CUDAExecutionProvider"]
    assert call["provider_options"] == [{"device_id": "1", "use_tf32": "0"}], call
    assert call["use_io_binding"] is True
    assert v.ok and v.device == "cuda:1" and v.providers[0] == "CUDAExecutionProvider"

    built = onnxruntime.load_ort("basic")  # notebook 08's optimisation levels: fp32 rows too
    call = sessions["calls"][-1]
    assert call["provider_options"] == [{"device_id": "1", "use_tf32": "0"}] and call["use_io_binding"] is True
    assert built["providers"][0] == "CUDAExecutionProvider"


def test_tensorrt_provider_sessions_bind_their_inputs_on_the_gpu(sessions, two_gpus, monkeypatch):
    monkeypatch.setattr(onnxruntime, "tensorrt_provider_options", lambda path, **kw: {"trt_fp16_enable": "True"})
    built = onnxruntime.load_ort("all", provider="TensorrtExecutionProvider")
    call = sessions["calls"][-1]
    assert call["providers"] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    assert call["use_io_binding"] is True, "without IO binding every decode step copies the KV cache host↔device"
    trt, cuda = call["provider_options"]
    assert trt == {"device_id": "1", "trt_fp16_enable": "True"}
    assert cuda == {"device_id": "1", "use_tf32": "0"}
    assert built["providers"][0] == "TensorrtExecutionProvider"


def test_cpu_provider_sessions_get_no_gpu_options(sessions, monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    variants.load_variant("ort-fp32", device="cpu")
    call = sessions["calls"][-1]
    assert call["providers"] == ["CPUExecutionProvider"] and call["provider_options"] == [{}]
    assert "use_io_binding" not in call
    with pytest.raises(ValueError, match="must start with"):
        onnx.session_arguments("CUDAExecutionProvider", "cuda", providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------- the preflight's ONNX Runtime check


def _ort_check():
    return next(c for c in gpu_check.checks() if c.name == "onnxruntime CUDA provider")


def test_preflight_fails_on_the_cpu_build_of_onnxruntime(sessions, monkeypatch):
    """What `make gpu-check` met with a .venv made by `make setup` ([cpu]): a session asked for the GPU ran
    on the CPU provider and the check passed. Now it fails and says how to install the GPU build."""
    gpu(monkeypatch)
    sessions["available"] = ["CPUExecutionProvider"]
    ctx = gpu_check.Context(device="cuda")
    done = preflight.run_checks([_ort_check()], ctx, out=io.StringIO())
    assert done[0].status == "FAIL", done[0].line()
    assert "no CUDAExecutionProvider" in done[0].detail and "pip install -e '.[gpu]'" in done[0].detail
    assert not sessions["calls"], "no session may be built on the CPU provider for a GPU check"


def test_preflight_fails_when_the_session_falls_back_to_the_cpu(sessions, monkeypatch):
    gpu(monkeypatch)
    sessions["got"] = ["CPUExecutionProvider"]  # CUDA listed, its libraries did not load
    done = preflight.run_checks([_ort_check()], gpu_check.Context(device="cuda"), out=io.StringIO())
    assert done[0].status == "FAIL" and "session got ['CPUExecutionProvider']" in done[0].detail


# ------------------------------------------------------------------------ rows labelled from the session


def test_ort_rows_are_labelled_from_the_session_and_a_fallback_is_a_failed_row(sessions, monkeypatch):
    gpu(monkeypatch)
    measured = []

    def fake_measure(engine, fmt, model, *args):
        measured.append(model)
        return {"engine": engine, "format": fmt, "status": "ok", "decode_tokens_per_s": 10.0}

    monkeypatch.setattr(cpu, "measure_hf", fake_measure)
    row = cpu.ort_row("MatMulNBits 4-bit b32", sessions["folder"], None, "cuda", "Hi", 4, 1, None)
    assert row["status"] == "ok" and row["providers"][0] == "CUDAExecutionProvider"

    sessions["got"] = ["CPUExecutionProvider"]  # the session fell back at load: a failed row, not a crash
    row = cpu.ort_row("MatMulNBits 4-bit b32", sessions["folder"], None, "cuda", "Hi", 4, 1, None)
    assert row["status"].startswith("asked ONNX Runtime for CUDAExecutionProvider") and "decode_tokens_per_s" not in row

    model = FakeORTModel(["CUDAExecutionProvider"], [{}])
    monkeypatch.setattr(cpu, "measure_hf", lambda *a: model.session.providers.insert(0, "CPUExecutionProvider") or
                        {"status": "ok"})  # falls back while it runs
    row = cpu.measure_ort("int8", model, "CUDAExecutionProvider", None, "Hi", 4, 1, None)
    assert row["status"].startswith("failed while measuring: asked ONNX Runtime for CUDAExecutionProvider")


def test_every_onnx_runtime_engine_row_checks_its_providers():
    """Notebook 10 and bench/beyond.py measured ONNX Runtime rows with measure_hf, which never asks the session
    what ran: a fallback to the CPU would have been a GPU number."""
    for path in (REPO / "notebooks" / "src" / "10_beyond.py", REPO / "bench" / "beyond.py"):
        text = path.read_text(encoding="utf-8")
        assert 'measure_hf("ONNX Runtime"' not in text, f"{path.name}: an ONNX Runtime row skips check_providers"
        assert "onnx.load_ort(" not in text, f"{path.name}: load ONNX Runtime rows through cpu.ort_row"
        assert "cpu.ort_row(" in text and "cpu.measure_ort(" in text, path.name

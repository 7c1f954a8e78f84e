"""What the lab says it ran on, on a GPU, checked on a CPU through mocked ``torch.cuda``, bitsandbytes and NVML:
the cuda row names the GPU in use, bitsandbytes claims CUDA kernels only when its CUDA library loaded, NVML
finds a MIG instance by its ``MIG-`` UUID, a benchmark run on a GPU is labelled with the GPU, ``info`` lists
both TensorRT paths, and an out-of-memory row frees memory once the failed frames are gone."""
from __future__ import annotations

import gc
import importlib.machinery
import json
import sys
import types
import weakref

from test_devices import fake_nvml, mock_gpu  # noqa: F401  (fake_nvml is a fixture)

from bench import engines as engines_bench
from labkit import __main__ as cli
from labkit.core import env, memory
from labkit.serve.experiments import batching


def two_named_gpus(monkeypatch):
    torch = mock_gpu(monkeypatch, "NVIDIA L4", (8, 9), count=2)
    names = {0: "NVIDIA L4", 1: "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: names[0 if index is None else index])
    return torch


def test_cuda_row_names_the_gpu_in_use(monkeypatch):
    torch = two_named_gpus(monkeypatch)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    _fake_bitsandbytes(monkeypatch, _CudaLibrary())  # capabilities() asks every backend; none is real here
    monkeypatch.setenv("LABKIT_DEVICE", "cuda:1")
    cap = env.capability("cuda")
    assert cap.available and "NVIDIA H200" in cap.detail and "NVIDIA L4" not in cap.detail, cap.detail
    monkeypatch.setenv("LABKIT_DEVICE", "cuda:2")
    cap = env.capability("cuda")
    assert not cap.available and "cuda:2 does not exist" in cap.reason


def _fake_bitsandbytes(monkeypatch, lib) -> None:
    """bitsandbytes as imported on a CUDA machine: ``bitsandbytes.cextension.lib`` is what it loaded."""
    package = types.ModuleType("bitsandbytes")
    package.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None, is_package=True)
    package.__path__ = []
    cext = types.ModuleType("bitsandbytes.cextension")
    cext.lib = lib
    package.cextension = cext
    monkeypatch.setitem(sys.modules, "bitsandbytes", package)
    monkeypatch.setitem(sys.modules, "bitsandbytes.cextension", cext)


class _MockLibrary:
    """bitsandbytes' stand-in when no CUDA library fits: it fails on first use, not at import."""

    compiled_with_cuda = False

    def __init__(self, error_msg: str) -> None:
        self.error_msg = error_msg


class _CudaLibrary:
    compiled_with_cuda = True


def test_bitsandbytes_claims_cuda_kernels_only_when_its_cuda_library_loaded(monkeypatch):
    torch = mock_gpu(monkeypatch, "NVIDIA H200", (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    _fake_bitsandbytes(monkeypatch, _MockLibrary("No compatible CUDA binary found at libbitsandbytes_cuda130.so"))
    cap = env.capability("bitsandbytes")
    assert not cap.available and "CUDA kernels" not in cap.detail, cap
    assert "libbitsandbytes_cuda130.so" in cap.reason
    _fake_bitsandbytes(monkeypatch, _CudaLibrary())
    cap = env.capability("bitsandbytes")
    assert cap.available and cap.detail.endswith("(CUDA kernels)")


def test_nvml_finds_a_mig_instance_by_its_mig_uuid(fake_nvml, monkeypatch):  # noqa: F811
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = types.SimpleNamespace(name="NVIDIA A100-SXM4-40GB MIG 1g.5gb", uuid="1c2d3e4f-0000-1111-2222-333344445555")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    memory.nvml_used("cuda:0")
    assert fake_nvml.asked == [("uuid", "MIG-1c2d3e4f-0000-1111-2222-333344445555")]


def test_bench_engines_labels_a_gpu_run_with_the_gpu(monkeypatch, capsys):
    torch = mock_gpu(monkeypatch, "NVIDIA H200", (9, 0))
    bench = engines_bench
    lm = types.SimpleNamespace(name="tiny", device="cuda:0", model=None, tokenizer=None)
    row = {"tokens_per_s": 10.0, "mean_latency_short_s": 1.0, "outputs_match_alone": True}
    monkeypatch.setattr(bench.models, "load", lambda *a, **kw: lm)
    monkeypatch.setattr(bench, "batching_rows", lambda *a: [row, row, row])
    monkeypatch.setattr(sys, "argv", ["engines.py", "--skip-compile"])
    assert bench.main() == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["device"] == "cuda:0" and summary["hardware"] == "NVIDIA H200", summary
    assert torch.cuda.get_device_name(0) == "NVIDIA H200"


def test_info_lists_both_tensorrt_paths(capsys):
    """README: `python -m labkit info` shows ONNX Runtime's TensorRT provider and torch-tensorrt, with a reason
    where they cannot run."""
    assert cli.main(["info"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "ort-tensorrt" in rows and "torch-tensorrt" in rows


def test_oom_row_frees_memory_once_the_failed_frames_are_gone(monkeypatch):
    """The out-of-memory handler used to empty the cache inside its except block, where the traceback still
    held the failed call's frames and so the batch's tensors: nothing could be handed back."""
    import torch

    held: list[weakref.ref] = []
    freed_with_batch_alive: list[bool] = []

    def generate(model, tokenizer, prompts, **kw):
        batch = torch.empty(1 << 16)  # what the failed batch had allocated, held by this frame
        held.append(weakref.ref(batch))
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def free_memory():
        gc.collect()
        freed_with_batch_alive.append(any(r() is not None for r in held))

    model = types.SimpleNamespace(parameters=lambda: iter([torch.zeros(1)]))
    monkeypatch.setattr(batching.generation, "generate", generate)
    monkeypatch.setattr(batching, "_free_memory", free_memory)
    rows = batching.static_sweep(model, None, batch_sizes=[2], new_tokens=2, prompts=["a", "b"], progress=False)
    assert rows == [] or all(r["status"] == "oom" for r in rows)
    assert freed_with_batch_alive == [False], "memory was freed while the traceback still held the batch"

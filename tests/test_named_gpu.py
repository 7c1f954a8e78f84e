"""LABKIT_DEVICE=cuda:1 on a CPU: ``torch.cuda`` answers as a machine with two GPUs whose current device is
per thread (cuda:0 in every new thread, as CUDA's is), and each test checks that the lab waits on, reads
and runs on the GPU it names, from whichever thread it runs in. Also: vLLM's check runs in a process of its
own, in that process's main thread."""
from __future__ import annotations

import io
import os
import threading
import types

import pytest
from test_devices import mock_gpu

from labkit import gpu_check, preflight
from labkit.core import memory, timing
from labkit.lessons.nb09 import runs as nb09_runs
from labkit.serve import batchers, launch
from labkit.serve.experiments import scheduler
from labkit.serve.vllm import offline as vllm
from labkit.serve.metrics import Metrics
from labkit.serve.protocol import server_config


@pytest.fixture
def cuda_threads(monkeypatch):
    """Two mocked GPUs, CUDA in use, LABKIT_DEVICE=cuda:1. ``calls`` records (call, device index) for
    synchronize, max_memory_allocated and reset_peak_memory_stats; an unnamed call reads the calling thread's
    current device."""
    torch = mock_gpu(monkeypatch, "NVIDIA H200", (9, 0), count=2)
    monkeypatch.setenv("LABKIT_DEVICE", "cuda:1")
    local = threading.local()
    calls: list[tuple[str, int]] = []

    def current() -> int:
        return getattr(local, "index", 0)

    def index_of(device) -> int:
        if device is None:
            return current()
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        return current() if dev.index is None else dev.index

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", current)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(local, "index", index_of(device)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", index_of(device))))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated",
                        lambda device=None: calls.append(("peak", index_of(device))) or 7 * 2**20)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: calls.append(("reset", index_of(device))))
    return calls


def test_preflight_threads_synchronise_the_gpu_they_check(cuda_threads):
    """Each check runs in a thread of its own, whose current device CUDA starts at cuda:0."""
    check = preflight.Check("sync", lambda ctx: timing.sync(None) or "synchronised")
    done = preflight.run_checks([check], gpu_check.Context(device="cuda:1"), out=io.StringIO())
    assert done[0].status == "PASS", done[0].line()
    assert cuda_threads == [("sync", 1)], f"the check's thread waited on {cuda_threads}, not cuda:1"


def test_server_model_thread_runs_on_the_models_gpu(cuda_threads):
    import torch

    tok = types.SimpleNamespace(eos_token_id=2, pad_token_id=0)
    model = types.SimpleNamespace(device=torch.device("cuda", 1), generation_config=types.SimpleNamespace(eos_token_id=2))
    lm = types.SimpleNamespace(model=model, tokenizer=tok, device="cuda:1")
    batcher = batchers.Batcher(lm, server_config(), Metrics())
    seen: list[int] = []
    batcher._next_batch = lambda: seen.append(torch.cuda.current_device())  # the loop asks for work, then ends
    batcher.start()
    batcher._thread.join(timeout=10)
    assert seen == [1], f"the batching thread ran on cuda:{seen}, the model is on cuda:1"


def test_scheduler_stamps_wait_on_the_models_gpu(monkeypatch):
    import torch

    stamped: list[str] = []
    monkeypatch.setattr(scheduler, "now", lambda device=None: stamped.append(str(device)) or 0.0)

    def decode_batch(model, seqs, eos, pad_id, drop_finished=True):
        for s in seqs:
            s.on_token(5, "length")
        return types.SimpleNamespace(steps=2, computed_rows=2 * len(seqs))

    monkeypatch.setattr(scheduler.decoder, "decode_batch", decode_batch)
    model = types.SimpleNamespace(device=torch.device("cuda", 1))
    reqs = [scheduler.Request(id=f"r{i}", prompt_ids=[1, 2, 3], max_new_tokens=1) for i in range(2)]
    scheduler.run_static(model, reqs, {2}, 0, batch_size=2)
    assert stamped and set(stamped) == {"cuda:1"}, f"stamps waited on {set(stamped)}"


def test_load_point_reads_the_servers_gpu_peak(cuda_threads, monkeypatch):
    run = types.SimpleNamespace(summary=lambda: {"completed": 1, "errors": {}, "slo": None}, outputs=[])
    monkeypatch.setattr(nb09_runs.loadgen, "run", lambda *a, **kw: run)
    row = nb09_runs.load_point("http://127.0.0.1:1", ["Hi"], concurrency=1, num_requests=1, max_tokens=2)
    peaks = [i for call, i in cuda_threads if call in ("peak", "reset")]
    assert peaks and set(peaks) == {1}, f"peak memory read on cuda:{set(peaks)}, the server runs on cuda:1"
    assert row["cuda_peak_bytes"] == 7 * 2**20


def test_memory_free_waits_on_the_gpu_named(cuda_threads, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cuda_threads.append(("empty", -1)))
    memory.free("cuda:1")
    assert cuda_threads == [("sync", 1), ("empty", -1)]


# ----------------------------------------------------------------------- vLLM in a process of its own


def test_vllm_check_runs_in_a_process_of_its_own(monkeypatch):
    """vLLM installs signal handlers, which Python allows only in a main thread; the preflight's checks run in
    worker threads, so the check hands vLLM to a fresh process."""
    asked = []

    def in_child(fn, *args, device="cuda", **kwargs):
        asked.append((fn, device))
        return {"output_tokens": 32, "wall_s": 0.5, "load_s": 20.0}

    monkeypatch.setattr(launch, "run_in_child", in_child, raising=False)
    def vllm_offline(*args, **kwargs):
        pytest.fail("vLLM started in the check's own (worker) thread")

    monkeypatch.setattr(vllm, "vllm_offline", vllm_offline)
    monkeypatch.setattr(gpu_check.models, "load_tokenizer", lambda name=None: None)
    monkeypatch.setattr(gpu_check.models, "chat_ids", lambda tok, p: [1, 2, 3])
    monkeypatch.setattr(gpu_check.models, "resolve", lambda name=None: "/models/tiny")
    ctx = gpu_check.Context(device="cuda:1", prompts=["Hi"])
    monkeypatch.setattr(ctx, "release", lambda: None)
    assert "engine shut down" in gpu_check.check_vllm(ctx)
    assert asked == [(vllm_offline, "cuda:1")]


def where_am_i() -> tuple[int, bool, str | None]:
    """Run by ``run_in_child``: the process, whether this is its main thread, the GPUs it may see."""
    return os.getpid(), threading.current_thread() is threading.main_thread(), os.environ.get("CUDA_VISIBLE_DEVICES")


def fail_in_child() -> None:
    raise RuntimeError("engine core died")


def test_run_in_child_runs_in_the_main_thread_of_another_process(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    pid, main_thread, visible = launch.run_in_child(where_am_i, device="cuda:1", timeout_s=120)
    assert pid != os.getpid() and main_thread
    assert visible == "5", "the child sees only the GPU the lab names, as its cuda:0"
    with pytest.raises(RuntimeError, match="engine core died"):
        launch.run_in_child(fail_in_child, timeout_s=120)
    with pytest.raises(ValueError, match="does not exist"):
        launch.run_in_child(where_am_i, device="cuda:2")

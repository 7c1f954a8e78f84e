import pytest
import torch
from torch import nn

from labkit.core import memory


def test_param_bytes_counts_tied_weights_once():
    emb = nn.Embedding(100, 8)
    head = nn.Linear(8, 100, bias=False)
    head.weight = emb.weight  # tied, as in SmolLM2
    model = nn.ModuleDict({"emb": emb, "head": head, "norm": nn.LayerNorm(8)})
    r = memory.param_bytes(model)
    assert r.source == "params"
    assert r.bytes == (100 * 8 + 8 + 8) * 4


def test_param_bytes_follow_dtype():
    m = nn.Linear(16, 16).to(torch.float16)
    assert memory.param_bytes(m).bytes == (16 * 16 + 16) * 2


def test_buffers_counted():
    m = nn.BatchNorm1d(10)
    assert memory.buffer_bytes(m).bytes == 10 * 4 * 2 + 8  # running mean/var fp32 + num_batches_tracked int64


def test_unmeasurable_sources_are_none_with_reason():
    if torch.cuda.is_available():
        pytest.skip("this check is for machines without CUDA")
    r = memory.cuda_peak()
    assert r.bytes is None and "CUDA" in r.reason
    snap = memory.snapshot()
    assert snap["rss"].bytes > 10 * 2**20
    for reading in snap.values():
        assert (reading.bytes is None) == bool(reading.reason)


def test_reading_invariants():
    with pytest.raises(AssertionError):
        memory.Reading("rss", None)  # missing value without a reason
    with pytest.raises(AssertionError):
        memory.Reading("nowhere", 1)


def test_track_sees_rss_growth():
    with memory.track() as m:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, written
    assert m.rss_growth_bytes > 32 * 2**20
    del x


def test_rss_sampler_sees_an_allocation_freed_before_it_stops():
    """A real peak: 64 MiB allocated and freed inside the block still shows, which RSS after the block cannot."""
    import gc

    with memory.RSSSampler(interval_s=0.005) as s:
        base = memory.rss().bytes
        block = bytearray(64 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page so it is resident
        import time

        time.sleep(0.05)
        del block
        gc.collect()
    assert s.peak_bytes - base > 48 * 2**20 and s.samples >= 2 and "every 5 ms" in s.source
    with pytest.raises(ValueError):
        memory.RSSSampler(interval_s=0)


def test_rss_peak_units_per_platform(monkeypatch):
    """ru_maxrss is KiB on Linux and bytes on macOS."""
    import resource
    import sys
    from types import SimpleNamespace

    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=1000))
    monkeypatch.setattr(sys, "platform", "linux")
    assert memory.rss_peak().bytes == 1000 * 1024
    monkeypatch.setattr(sys, "platform", "darwin")
    assert memory.rss_peak().bytes == 1000

import pytest
import torch
from torch import nn

from labkit import memory


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

"""labkit.engines.fusion: the written-out RMSNorm is the model's, its eager operators and traffic, graph breaks
explained, and torch.compile fusing the chain into fewer kernels."""
from __future__ import annotations

import pytest

from labkit.core import env
from labkit.engines import fusion


def test_rms_norm_is_the_models_rmsnorm():
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = torch.randn(3, 7, 48)
    torch.testing.assert_close(fusion.rms_norm(x, norm.weight, 1e-5), norm(x))
    assert fusion.eager_ops(fusion.rms_norm, x, norm.weight, 1e-5) == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    assert fusion.rms_norm_traffic(4, 8, 2) == (7 * 64, 2 * 64)
    with pytest.raises(ValueError, match="rows"):
        fusion.rms_norm_traffic(0, 8, 2)


def test_explain_counts_graphs_and_breaks():
    import torch

    x, w = torch.randn(4, 8), torch.ones(8)
    whole = fusion.explain(fusion.rms_norm, x, w, 1e-6)
    assert whole["graphs"] == 1 and whole["graph_breaks"] == 0 and whole["graph_ops"] == 6

    def with_a_host_read(x, w, eps):
        if x.abs().max().item() > 1e4:  # the Python branch needs the value on the host: the graph ends here
            x = x.clamp(-1e4, 1e4)
        return fusion.rms_norm(x, w, eps)

    broken = fusion.explain(with_a_host_read, x, w, 1e-6)
    assert broken["graph_breaks"] >= 1 and broken["graphs"] >= 2 and broken["break_reasons"][0]


def test_compile_fuses_the_chain_into_fewer_kernels():
    if not env.capability("torch.compile").available:
        pytest.skip(env.capability("torch.compile").reason)
    import torch

    x, w = torch.randn(16, 64), torch.randn(64)
    fused = fusion.compile_fused(fusion.rms_norm, x, w, 1e-6)
    assert fused.first_call_s > 0 and fused.cache_entries_before >= 0
    assert 1 <= len(fused.kernels) < len(fusion.eager_ops(fusion.rms_norm, x, w, 1e-6))
    assert all(k in fused.code for k in fused.kernels)
    rows = fusion.fusion_rows(fusion.rms_norm, {"x": fused}, {"x": (x, w, 1e-6)}, repeats=2)
    assert rows[0]["eager_ops"] == 6 and rows[0]["fused_kernels"] == len(fused.kernels)
    assert rows[0]["max_abs_diff"] < 1e-5 and rows[0]["eager_us"] > 0 and rows[0]["compiled_us"] > 0
    kept = rows[0]["samples"]  # shuffled rounds: eager, fused, the copy that bounds it; eager's extra pass is no round
    assert [len(kept[k]) for k in ("eager_us", "compiled_us", "copy_us")] == [2, 2, 2]
    assert rows[0]["copy_us"] == pytest.approx(sorted(kept["copy_us"])[0] / 2 + sorted(kept["copy_us"])[1] / 2)
    assert rows[0]["drift"] > 0
    from labkit.lessons.nb08 import findings as nb08

    v = nb08.fusion_verdict(rows[0])  # paired on the rounds: two pairs are too few for any verdict
    assert v.paired and v.n == 2 and not v.real
    m = fusion.time_per_call(fusion.rms_norm, x, w, 1e-6, repeats=3)
    assert m.n == 3 and m.median > 0 and m.meta["calls_per_sample"] >= 1
    with pytest.raises(ValueError, match="repeats"):
        fusion.time_per_call(fusion.rms_norm, x, w, repeats=0)

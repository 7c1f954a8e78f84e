"""labkit.model.moe: routing read from a config, a count extended from one, two and three experts, the active
parameters and the weights a batch reaches, on hand-checked numbers (no model is built)."""
from __future__ import annotations

import pytest

from labkit.model import moe


def test_routing_reads_the_expert_count_and_the_experts_per_token():
    assert moe.routing({"hidden_size": 64}) is None  # dense
    assert moe.routing({"n_routed_experts": 256, "num_experts_per_tok": 8}) == moe.Routing("n_routed_experts", 256, 8)
    assert moe.routing({"num_local_experts": 8}) == moe.Routing("num_local_experts", 8, None)


def test_with_experts_writes_the_text_config_of_a_multimodal_config():
    data = {"text_config": {"num_experts": 64}, "vision_config": {}}
    assert moe.with_experts(data, "num_experts", 2)["text_config"]["num_experts"] == 2
    assert data["text_config"]["num_experts"] == 64  # a copy


def _counter(base: int, per_expert: int, bent: bool = False):
    """Counts of a model of ``base`` parameters plus ``per_expert`` per routed expert (``bent``: not linear)."""
    def count(data):
        n = data["num_experts"]
        experts = per_expert * n + (n * n if bent else 0)
        return base + experts, experts, n, experts, experts, n
    return count


def test_a_count_is_extended_from_three_builds_and_must_be_linear():
    r = moe.Routing("num_experts", 128, 4)
    counts, per_expert = moe.extend(_counter(1000, 10), {"num_experts": 128}, r, "toy")
    assert counts == _counter(1000, 10)({"num_experts": 128}) and per_expert == (10, 10, 1)
    assert moe.active(counts, per_expert, r) == (1000 + 4 * 10, 4 * 10, 4)  # the 4 experts a token reaches
    with pytest.raises(ValueError, match="not linear in num_experts"):
        moe.extend(_counter(1000, 10, bent=True), {"num_experts": 128}, r, "toy")
    small = moe.Routing("num_experts", 2, 1)
    assert moe.extend(_counter(1000, 10), {"num_experts": 2}, small, "toy") == ((1020, 20, 2, 20, 20, 2), (10, 10, 1))


def test_a_batch_reaches_more_experts_and_reads_more_weights():
    assert moe.experts_reached(8, 2, 1) == pytest.approx(2)
    assert moe.experts_reached(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))
    assert moe.experts_reached(8, 2, 10_000) == pytest.approx(8)
    total, active = 1000 + 8 * 100, 1000 + 2 * 100
    assert moe.bytes_read(total, active, 8, 2, 1) == active
    assert moe.bytes_read(total, active, 8, 2, 2) == round(1000 + 100 * 8 * (1 - 0.75**2))
    assert moe.bytes_read(total, active, 8, 2, 10_000) == total
    with pytest.raises(ValueError, match="batch"):
        moe.bytes_read(total, active, 8, 2, 0)

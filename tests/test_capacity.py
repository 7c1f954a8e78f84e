"""The knee detector on synthetic curves, and the replica arithmetic (labkit.serve.fleet.capacity)."""
from __future__ import annotations

import math
import random

import pytest

from labkit.serve import client, loadgen
from labkit.serve.fleet import capacity


def saturating(rates, capacity_rps):
    """A server that keeps up to ``capacity_rps`` and then serves only that much: linear, then flat."""
    return [min(r, capacity_rps) for r in rates]


def test_linear_then_flat_finds_the_last_rate_goodput_follows():
    rates = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
    cap = 2.2  # 2.0 is followed (2.0 ≥ 0.9 × 2.0); 2.5 is not (2.2 < 2.25)
    knee = capacity.find_knee(rates, saturating(rates, cap))
    assert knee["knee_rps"] == 2.0 and knee["reached"] and knee["index"] == rates.index(2.0)
    assert "knee at 2 req/s" in knee["reason"] and "from 2.5 req/s up" in knee["reason"]
    assert [p["follows"] for p in knee["points"]] == [r <= 2.0 for r in rates]
    assert knee["points"][-1]["ratio"] == pytest.approx(cap / 4.0)


def test_the_follow_threshold_moves_the_knee():
    rates = [1.0, 2.0, 3.0, 4.0]
    goodput = [1.0, 1.9, 2.5, 2.6]  # 95 %, 83 %, 65 % of offered above the first
    assert capacity.find_knee(rates, goodput, follow=0.9)["knee_rps"] == 2.0
    assert capacity.find_knee(rates, goodput, follow=0.8)["knee_rps"] == 3.0
    assert capacity.find_knee(rates, goodput, follow=0.5)["knee_rps"] == 4.0


def test_always_following_says_the_knee_is_above_the_highest_rate():
    rates = [1.0, 2.0, 4.0, 8.0]
    knee = capacity.find_knee(rates, [0.99 * r for r in rates])
    assert knee["knee_rps"] == 8.0 and not knee["reached"]
    assert "above" in knee["reason"] and "highest rate tried" in knee["reason"] and "lower bound" in knee["reason"]


def test_never_following_says_the_first_rate_already_failed():
    knee = capacity.find_knee([2.0, 4.0, 6.0], [0.5, 0.4, 0.3])
    assert knee["knee_rps"] is None and knee["index"] is None
    assert "lowest rate" in knee["reason"] and "sweep lower rates" in knee["reason"]
    with pytest.raises(ValueError, match="sweep lower rates"):
        capacity.replicas_needed(10, 1.0, knee["knee_rps"])


def test_a_single_noisy_dip_below_the_knee_is_reported_not_taken():
    rates = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    goodput = [1.0, 1.2, 3.0, 3.9, 2.0, 1.5]  # 2.0 dipped (a hiccup), 3 and 4 held, then it saturates
    knee = capacity.find_knee(rates, goodput)
    assert knee["knee_rps"] == 4.0 and knee["dips"] == [2.0] and knee["reached"]
    assert "counted as noise" in knee["reason"]


def test_noise_around_a_saturating_curve_keeps_the_knee_near_capacity():
    rng = random.Random(7)
    rates = [0.25 * i for i in range(1, 25)]  # 0.25 … 6 req/s
    for _ in range(20):
        goodput = [g * (1 + rng.uniform(-0.05, 0.05)) for g in saturating(rates, 3.0)]
        knee = capacity.find_knee(rates, goodput)
        # ±5 % noise: every rate ≤ 3 follows (≥ 0.95 of offered), none above 3.0 / 0.85 can
        assert 3.0 <= knee["knee_rps"] <= 3.0 / 0.85 and knee["reached"]


def test_unsorted_input_is_sorted_by_offered_rate():
    rates = [3.0, 1.0, 4.0, 2.0]
    goodput = [2.95, 1.0, 2.9, 2.0]
    knee = capacity.find_knee(rates, goodput)
    assert [p["offered_rps"] for p in knee["points"]] == [1.0, 2.0, 3.0, 4.0]
    assert [p["goodput_rps"] for p in knee["points"]] == [1.0, 2.0, 2.95, 2.9]  # pairs kept together
    assert knee["knee_rps"] == 3.0 and knee["index"] == 2


@pytest.mark.parametrize("offered, goodput, match", [
    ([1.0, 2.0, 3.0], [1.0, 2.0], "3 offered rates but 2 goodputs"),
    ([], [], "at least one offered rate"),
    ([1.0, 1.0], [1.0, 0.9], "appears twice"),
    ([0.0, 1.0], [0.0, 1.0], "must be > 0"),
    ([1.0, 2.0], [1.0, -0.5], "must be ≥ 0"),
    ([1.0, math.nan], [1.0, 1.0], "finite"),
    ([1.0, 2.0], [1.0, "2"], "finite number"),
])
def test_bad_sweeps_get_a_clear_error(offered, goodput, match):
    with pytest.raises(ValueError, match=match):
        capacity.find_knee(offered, goodput)


def test_follow_must_be_a_fraction():
    for bad in (0, 1.5, -0.2):
        with pytest.raises(ValueError, match="follow"):
            capacity.find_knee([1.0], [1.0], follow=bad)


def _run(rate, good, n=10, duration=None):
    outs = [client.RequestOutput(success=True, output_tokens=4, ttft_s=0.1 if i < good else 9.0, e2e_s=1.0)
            for i in range(n)]
    return loadgen.BenchmarkResult(outputs=outs, duration_s=duration or n / rate, settings={"request_rate": rate},
                                   slo=loadgen.SLO(ttft_s=0.5))


def test_knee_from_loadgen_runs_reads_their_goodput():
    runs = [_run(1.0, 10), _run(2.0, 10), _run(4.0, 5)]  # all good, all good, half good
    knee = capacity.knee_from_summaries(runs)
    assert [p["goodput_rps"] for p in knee["points"]] == pytest.approx([1.0, 2.0, 2.0])
    assert knee["knee_rps"] == 2.0
    assert capacity.knee_from_summaries([r.summary() for r in runs])["knee_rps"] == 2.0
    no_slo = _run(1.0, 10)
    no_slo.slo = None
    with pytest.raises(ValueError, match="run it with an SLO"):
        capacity.knee_from_summaries([no_slo])
    with pytest.raises(ValueError, match="finite rate"):
        capacity.knee_from_summaries([{"request_rate": math.inf, "goodput": 1.0}])


def test_replicas_needed_shows_its_arithmetic():
    plan = capacity.replicas_needed(120, 2, 1.5)
    assert plan["demand_rps"] == pytest.approx(120 * 2 / 60)
    assert plan["per_replica_rps"] == pytest.approx(0.8 * 1.5)
    assert plan["replicas"] == math.ceil((120 * 2 / 60) / (0.8 * 1.5))
    assert plan["arithmetic"] == ("120 users × 2 req/min = 4.0 req/s; one replica holds 0.8 × 1.5 = 1.2 req/s at "
                                  "the SLO; ⌈4.0 / 1.2⌉ = 4 replicas")


def test_replicas_round_up_but_not_on_float_noise():
    assert capacity.replicas_needed(60, 4, 1.25)["replicas"] == 4  # 4.0 / (0.8 × 1.25) = 4.000000000000001
    assert capacity.replicas_needed(61, 4, 1.25)["replicas"] == 5
    one = capacity.replicas_needed(1, 0.5, 10.0)
    assert one["replicas"] == 1 and one["arithmetic"].endswith("= 1 replica")


@pytest.mark.parametrize("args, match", [
    ((0, 2, 1.5), "users=0"),
    ((2.5, 2, 1.5), "whole number of users"),
    ((10, 0, 1.5), "requests one user sends per minute"),
    ((10, 2, 0), "find_knee"),
    ((10, 2, -1.0), "≥ 0"),
    ((10, 2, 1.5, 0), "headroom=0"),
    ((10, 2, 1.5, 1.2), "in \\(0, 1\\]"),
])
def test_replicas_needed_refuses_bad_input_naming_the_fix(args, match):
    with pytest.raises(ValueError, match=match):
        capacity.replicas_needed(*args)

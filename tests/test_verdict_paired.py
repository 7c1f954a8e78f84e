"""The paired verdict: per-round log-ratios, an exact sign-flip test, a 2 % floor and "run N more pairs".

The simulated machine drifts as notebook 14 saw a real one drift: a bounded ±15 % walk from round to round, half a
step between the two passes of a pair (in a shuffled order), and 5 % noise on each pass; 16 pairs a run."""
from __future__ import annotations

import math
import random

import pytest

from labkit.core import verdict

PAIRS, NOISE, WALK, BOUND = 16, 0.05, 0.05, 0.15
SLOWDOWN = 0.086


def drifting_rounds(rng: random.Random, change: float = 0.0, pairs: int = PAIRS) -> tuple[list[float], list[float]]:
    """Per-round seconds of a base and a new variant ``change`` slower (0: an A/A run)."""
    level, new, base = 1.0, [], []
    for _ in range(pairs):
        level = min(max(level * math.exp(rng.uniform(-WALK, WALK)), 1 - BOUND), 1 + BOUND)
        first_new = rng.random() < 0.5
        passes = []
        for _ in range(2):
            passes.append(level * math.exp(rng.gauss(0, NOISE)))
            level = min(max(level * math.exp(rng.uniform(-WALK / 2, WALK / 2)), 1 - BOUND), 1 + BOUND)
        a, b = passes if first_new else passes[::-1]
        new.append(a * (1 + change))
        base.append(b)
    return new, base


def rates(change: float, runs: int, paired: bool) -> dict[str, float]:
    rng = random.Random(7)
    kinds = [verdict.compare(*drifting_rounds(rng, change), higher_is_better=False, paired=paired).kind
             for _ in range(runs)]
    return {k: kinds.count(k) / runs for k in set(kinds)}


def test_a_a_pairs_are_called_different_about_5_percent_of_the_time_at_most():
    got = rates(0.0, 400, paired=True)
    assert got.get(verdict.BETTER, 0) + got.get(verdict.WORSE, 0) <= 0.07, got


def test_an_8_6_percent_slowdown_is_caught_90_percent_of_the_time_and_never_called_faster():
    got = rates(SLOWDOWN, 400, paired=True)
    assert got.get(verdict.WORSE, 0) >= 0.90, got
    assert got.get(verdict.BETTER, 0) == 0, got


def test_the_old_overlap_rule_misses_the_same_slowdown_on_the_same_rounds():
    got = rates(SLOWDOWN, 200, paired=False)
    assert got.get(verdict.WORSE, 0) < 0.5, got  # the drift widens each side's p10–p90 range past the change


def test_fewer_than_six_pairs_give_no_verdict_and_say_how_many_more_to_run():
    v = verdict.compare([1.5, 1.6, 1.55, 1.52, 1.58], [1.0, 1.01, 0.99, 1.0, 1.02], paired=True)
    assert v.kind == verdict.NO_VERDICT and v.paired and v.n == 5 and v.more == 1
    assert "run 1 more pairs" in v.reason and v.label == "no verdict (5 pairs)"
    assert verdict.compare([1.2], [1.0], paired=True).more == verdict.MIN_PAIRS - 1


def test_a_clear_difference_is_called_with_its_test_n_p_and_interval_named():
    rng = random.Random(1)
    base = [1 + rng.uniform(-0.2, 0.2) for _ in range(8)]
    new = [b * 1.2 * math.exp(rng.gauss(0, 0.01)) for b in base]  # 20 % more throughput, pair by pair
    v = verdict.compare(new, base, paired=True)
    assert v.kind == verdict.BETTER and v.p == pytest.approx(2 / 2 ** 8) and v.low < v.ratio < v.high
    assert v.low > 1.15 and v.high < 1.25 and abs(v.ratio - 1.2) < 0.02
    for said in ("sign-flip", "8 pairs", f"p = {v.p:.3f}", "95 % interval", f"{v.low:.3f}"):
        assert said in v.reason
    flipped = verdict.compare(new, base, paired=True, higher_is_better=False)
    assert flipped.kind == verdict.WORSE and flipped.gain == pytest.approx(1 / v.ratio)


def test_a_tight_difference_under_the_floor_is_within_noise_and_a_loose_one_asks_for_more_pairs():
    base = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2, 1.0, 0.95]
    tight = verdict.compare([b * 1.005 for b in base], base, paired=True)
    assert tight.kind == verdict.NOISE and "inside ±2%" in tight.reason  # p is tiny, but 0.5 % is under the floor
    rng = random.Random(3)
    loose = verdict.compare([b * math.exp(rng.gauss(0, 0.08)) for b in base], base, paired=True)
    assert loose.kind == verdict.NO_VERDICT and loose.more and loose.more >= 1
    assert f"run {loose.more} more pairs" in loose.reason


def test_paired_sides_must_hold_one_value_per_round():
    with pytest.raises(ValueError, match="one value per round"):
        verdict.compare([1.0, 1.1, 1.2], [1.0, 1.1], paired=True)
    with pytest.raises(ValueError, match="positive"):
        verdict.compare([1.0, 0.0], [1.0, 1.0], paired=True)


def test_a_round_without_a_figure_on_both_sides_drops_out_as_a_pair_and_the_reason_counts_it():
    drift = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.25, 0.95]
    base = [d for d in drift]
    new = [1.1 * d for d in drift]
    new[2], base[5] = None, math.nan  # a round each side timed nothing in
    v = verdict.compare(new, base, paired=True, higher_is_better=False)
    assert v.n == 6 and v.ratio == pytest.approx(1.1) and v.kind == verdict.WORSE
    assert "2 rounds without a figure on both sides left out" in v.reason
    # keyed by round (or by request): the same key of each side pairs up, a key one side lacks drops out
    keyed = verdict.compare({r: 1.1 * d for r, d in enumerate(drift) if r != 3}, dict(enumerate(drift)), paired=True,
                            higher_is_better=False)
    assert keyed.n == 7 and keyed.ratio == pytest.approx(1.1) and "1 round without" in keyed.reason
    none = verdict.compare([None] * 3, [1.0] * 3, paired=True)
    assert none.kind == verdict.NO_VERDICT and none.n == 0 and none.label == "no verdict (0 pairs)"


def test_the_sign_flip_p_is_exact_for_few_pairs_and_sampled_close_to_it_beyond():
    assert verdict.sign_flip_p([0.1] * 6) == pytest.approx(2 / 64)
    assert verdict.sign_flip_p([0.1, -0.1]) == 1.0
    rng = random.Random(5)
    d = [rng.gauss(0.03, 0.05) for _ in range(verdict.EXACT_PAIRS + 2)]
    sampled = verdict.sign_flip_p(d)
    exact_sums = [0.0]
    for x in d:
        exact_sums = [s + x for s in exact_sums] + [s - x for s in exact_sums]
    exact = sum(abs(s) >= abs(sum(d)) - 1e-12 for s in exact_sums) / len(exact_sums)
    assert abs(sampled - exact) < 0.01


def test_t_quantiles_and_the_pairs_a_run_needs_follow_the_t_formula():
    for q, df, value in ((0.975, 5, 2.5706), (0.90, 5, 1.4759), (0.975, 1, 12.7062), (0.975, 30, 2.0423)):
        assert verdict.t_quantile(q, df) == pytest.approx(value, abs=2e-4)
    assert verdict.t_quantile(0.025, 5) == pytest.approx(-2.5706, abs=2e-4)

    def enough(n: int, sigma: float, change: float) -> bool:
        return n >= (verdict.t_quantile(0.975, n - 1) + verdict.t_quantile(0.90, n - 1)) ** 2 * (
            sigma / math.log1p(change)) ** 2

    for sigma in (0.05, 0.075, 0.10, 0.2):
        n = verdict.pairs_needed(sigma, SLOWDOWN)
        assert enough(n, sigma, SLOWDOWN) and (n == verdict.MIN_PAIRS or not enough(n - 1, sigma, SLOWDOWN))
        assert n > 10.5 * (sigma / math.log1p(SLOWDOWN)) ** 2  # the normal approximation undercounts
    assert [verdict.pairs_needed(s, SLOWDOWN) for s in (0.05, 0.075, 0.10)] == [7, 11, 18]  # the table
    with pytest.raises(ValueError, match="positive"):
        verdict.pairs_needed(0.05, 0)


def test_the_unpaired_tie_is_the_same_distance_either_way():
    for ratio in (1.11, 1 / 1.11):
        assert verdict.compare([ratio], [1.0]).kind == verdict.NO_VERDICT
        assert verdict.versus(ratio, 1.0).kind == verdict.BETTER if ratio > 1 else verdict.WORSE
        assert verdict.against(ratio, [1.0, 1.0]).kind == verdict.NO_VERDICT
    for ratio in (1.09, 1 / 1.09):
        assert verdict.compare([ratio], [1.0]).kind == verdict.TIED
        assert verdict.versus(ratio, 1.0).kind == verdict.TIED

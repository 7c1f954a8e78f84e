"""labkit.core.verdict: the one helper every takeaway asks before it says "faster"."""
from __future__ import annotations

import pytest

from labkit.core import verdict
from labkit.core.timing import Measurement
from labkit.core.verdict import ANOMALOUS, BETTER, IMPLAUSIBLE, NO_VERDICT, NOISE, TIED, WORSE


def _around(x, spread=0.02, n=3):
    return [x * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]


def test_quiet_pairs_are_better_or_worse_in_the_named_direction():
    v = verdict.compare(_around(20.0), _around(10.0))
    assert (v.kind, round(v.ratio, 3), v.word()) == (BETTER, 2.0, "faster")
    v = verdict.compare(_around(20.0), _around(10.0), higher_is_better=False)  # times: twice as long is worse
    assert (v.kind, round(v.gain, 3), v.word("quicker", "slower")) == (WORSE, 0.5, "slower")
    assert verdict.compare(Measurement.from_values("a", _around(1.0)), Measurement.from_values("b", _around(2.0)),
                           higher_is_better=False).kind == BETTER


def test_few_samples_give_no_verdict_or_a_tie_never_within_noise():
    v = verdict.compare([20.0, 21.0], [10.0, 10.5])
    assert v.kind == NO_VERDICT and "2 samples" in v.reason and v.label == "no verdict (2 samples)" and not v.real
    assert verdict.phrase(v, "x").startswith("2.00× x, no verdict (2 samples: at least 3")
    one = verdict.compare([324.0], [344.0], higher_is_better=False)  # 04's request 1, warmed against cold, one each
    assert one.kind == TIED and one.label == "tie (within 10%)" and "within 10%" in one.reason and not one.real
    assert verdict.pick(one, better="faster", worse="slower", same="the same") == "the same"
    assert verdict.compare([400.0], [300.0], higher_is_better=False).kind == NO_VERDICT  # 33 % apart, one sample


def test_within_noise_on_overlapping_ranges_or_close_medians():
    v = verdict.compare([9.0, 12.0, 15.0], [10.0, 11.0, 14.0])
    assert v.kind == NOISE and "overlap" in v.reason
    v = verdict.compare(_around(10.1, 0.001), _around(10.0, 0.001))
    assert v.kind == NOISE and "less than 2%" in v.reason


# the run behind issue 20: a fresh clone's quick mode on 2 cores at load 3-8, one sample per number
BUSY_CASES = [
    # (what, new, base, kwargs): each beat a physical bound or fell below a floor
    ("06 batch 8 total tokens/s 25.4× (memory-bound model 7.8×)", [12.7], [0.5], dict(bound=7.8, floor=1.0)),
    ("06 per-user speed 3.18× at batch 8", [1.59], [0.5], dict(bound=1.0)),
    ("06 batch 2 total tokens/s below batch 1's", [0.415], [0.5], dict(floor=1.0)),
    ("02 bf16 decode 5.95× fp32 (half the bytes)", [5.95], [1.0], dict(bound=2.0)),
    ("03 ort-int8-tensor 12.28× fp32 (weights 0.30× the bytes)", [12.28], [1.0], dict(bound=1 / 0.30)),
    ("07 continuous 21.76× static (its own model 2.7×)", [21.76], [1.0], dict(bound=2.7)),
    ("08 fusion 3.99× where eager read 0.13 of 24 GB/s", [3.99], [1.0], dict(bound=1.0 + 0.13 / 24)),
]


@pytest.mark.parametrize("what,new,base,kw", BUSY_CASES, ids=[c[0] for c in BUSY_CASES])
def test_the_busy_runs_ratios_are_implausible_even_from_one_sample(what, new, base, kw):
    v = verdict.compare(new, base, **kw)
    assert v.kind == IMPLAUSIBLE and v.word() == "implausible — rerun", what
    assert ("beats its bound" in v.reason) or ("below its floor" in v.reason)


QUIET_CASES = [
    # the shipped quiet references: inside their bounds, real differences
    ("06 batch 8 total 3.3× (model 7.8×)", _around(3.3), _around(1.0), dict(bound=7.8, floor=1.0), BETTER),
    ("03 ort-int8-channel 1.90× (bytes 0.30×)", _around(1.9), _around(1.0), dict(bound=1 / 0.30), BETTER),
    ("07 continuous 1.39× static (model 1.8×)", _around(1.39), _around(1.0), dict(bound=1.8), BETTER),
    ("06 per-user 0.41× at batch 8", _around(0.41), _around(1.0), dict(bound=1.0), WORSE),
    ("02 fp16 0.35× fp32 decode", _around(0.35), _around(1.0), dict(bound=2.0), WORSE),
]


@pytest.mark.parametrize("what,new,base,kw,kind", QUIET_CASES, ids=[c[0] for c in QUIET_CASES])
def test_quiet_references_get_a_real_verdict(what, new, base, kw, kind):
    assert verdict.compare(new, base, **kw).kind == kind, what


def test_a_bound_is_a_model_with_slack_and_bad_input_is_refused():
    assert verdict.compare(_around(2.15), _around(1.0), bound=2.0).kind == BETTER  # within 10 % of the bound
    assert verdict.compare(_around(2.3), _around(1.0), bound=2.0).kind == IMPLAUSIBLE
    with pytest.raises(ValueError, match="at least one sample"):
        verdict.compare([], [1.0])
    with pytest.raises(ValueError, match="positive medians"):
        verdict.compare([0.0], [1.0])


def test_samples_reads_a_rows_kept_samples_or_its_single_value():
    assert verdict.samples({"x": 2.0, "samples": {"x": [1.0, 2.0, 3.0]}}, "x") == [1.0, 2.0, 3.0]
    assert verdict.samples({"x": 2.0}, "x") == [2.0]


def test_versus_ties_single_values_within_ten_percent_and_largest_names_the_tie():
    assert verdict.versus(0.50, 0.49).kind == TIED  # 01's "memory-bound" on 50 % against 49 %
    assert verdict.versus(0.60, 0.30).kind == BETTER and verdict.versus(0.3, 0.6).kind == WORSE
    assert verdict.largest({"bandwidth": 0.50, "kernel": 0.49, "overhead": 0.01}) == ["bandwidth", "kernel"]
    assert verdict.largest({"bandwidth": 0.2, "kernel": 0.7, "overhead": 0.1}) == ["kernel"]
    assert verdict.smallest({"a": 0.185, "b": 0.184, "c": 0.30}) == ["b", "a"]


def test_a_baseline_far_off_its_twin_is_anomalous():
    """03b's M = 1 GEMM: fp32 took 765 µs on one matrix while its same-sized twin took 34 µs."""
    fp8 = [1400.0, 1420.0, 1410.0]
    v = verdict.compare(fp8, [765.0, 770.0, 760.0], higher_is_better=False, twin=[34.0, 35.0, 34.5])
    assert v.kind == ANOMALOUS and "twin" in v.reason and v.word() == "baseline anomalous — rerun"
    assert verdict.compare(fp8, [54.0, 55.0, 53.0], higher_is_better=False, twin=[50.0, 51.0, 49.0]).kind == WORSE


def test_one_value_against_the_samples_it_should_match():
    steady = [360.0, 362.0, 365.0, 361.0, 363.0]
    assert verdict.against(398.0, steady, higher_is_better=False).kind == WORSE  # a first call that paid
    assert verdict.against(362.5, steady, higher_is_better=False).kind == NOISE
    assert verdict.against(394.0, steady[:2], higher_is_better=False).kind == TIED  # 1.09x: within 10 % either way
    assert verdict.against(398.0, steady[:2], higher_is_better=False).kind == NO_VERDICT  # 1.10x one way, 0.907x back


def test_doubts_flag_a_rough_spread_and_a_drift_on_any_machine():
    assert verdict.doubts(spread=0.20, drift=1.04) == []
    said = verdict.doubts(spread=0.60, drift=0.53)
    assert len(said) == 2 and "spread 60%" in said[0] and "drift 0.53" in said[1]
    assert verdict.doubts(drift=1.67) and not verdict.doubts(drift=1.25)


def test_every_kind_has_words_and_said_never_repeats_them():
    for kind in verdict.KINDS:
        v = verdict.Verdict(kind, 1.0, 1.0, 2, "why")
        assert verdict.said(v).count(v.word()) == 1 and "why" in verdict.said(v)
        assert verdict.than(v) and verdict.pick(v, better="b", worse="w", same="s") in ("b", "w", "s")
    with pytest.raises(AssertionError, match="unknown verdict kind"):
        verdict.Verdict("faster-ish", 1.0, 1.0, 1, "")

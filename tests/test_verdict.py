"""labkit.core.verdict: the one helper every takeaway asks before it says "faster"."""
from __future__ import annotations

import pytest

from labkit.core import verdict
from labkit.core.timing import Measurement
from labkit.core.verdict import BETTER, IMPLAUSIBLE, NOISE, WORSE


def _around(x, spread=0.02, n=3):
    return [x * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]


def test_quiet_pairs_are_better_or_worse_in_the_named_direction():
    v = verdict.compare(_around(20.0), _around(10.0))
    assert (v.kind, round(v.ratio, 3), v.word()) == (BETTER, 2.0, "faster")
    v = verdict.compare(_around(20.0), _around(10.0), higher_is_better=False)  # times: twice as long is worse
    assert (v.kind, round(v.gain, 3), v.word("quicker", "slower")) == (WORSE, 0.5, "slower")
    assert verdict.compare(Measurement.from_values("a", _around(1.0)), Measurement.from_values("b", _around(2.0)),
                           higher_is_better=False).kind == BETTER


def test_within_noise_on_few_samples_overlapping_ranges_or_close_medians():
    v = verdict.compare([20.0, 21.0], [10.0, 10.5])
    assert v.kind == NOISE and "2 samples" in v.reason and v.word() == "within noise" and not v.real
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

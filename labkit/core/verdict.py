"""The one verdict every takeaway sentence is chosen by: better, worse, within noise, a tie, no verdict, implausible,
or a baseline that is itself anomalous.

``compare(new, base)`` takes two sets of samples (raw values, or ``Measurement``) and answers

- ``"implausible — rerun"`` when the gain beats its physical bound (``bound``: half the bytes caps a memory-bound
  decode at 2×, a batch cannot beat its own model) or falls below its floor (``floor``: batch-B throughput below
  batch 1's, per-user speed rising with the batch) by more than ``SLACK``: the machine, not the method, moved it;
- ``"baseline anomalous"`` when the baseline disagrees with its ``twin`` (an independent measurement that should
  take the same time: a same-sized shape, the same variant timed again) by more than ``ANOMALY``×: every ratio
  against it would measure the anomaly, not the variant;
- with fewer than ``MIN_SAMPLES`` samples on a side, ``"tie"`` when the medians lie within ``TIE`` of each other and
  ``"no verdict"`` otherwise: one sample cannot tell a difference from noise, whatever its size;
- ``"within noise"`` when the p10–p90 ranges overlap or the medians differ by less than ``TOLERANCE``;
- otherwise ``"better"`` or ``"worse"``, in the direction ``higher_is_better`` names.

``versus(a, b)`` judges two single computed values that carry no noise of their own (shares of one step, two
layers' errors, a measurement against a model's prediction): ``"tie"`` within ``TIE``, else better or worse.
``largest(pieces)`` names the largest of several such values, or the ones tied for it. ``doubts(spread, drift)``
names what makes a timed row rough (a spread over ``ROUGH_SPREAD``, a drift outside ``DRIFT_RANGE``).
``bootstrap_diff(new, base)`` bounds the difference of two medians (a percentile bootstrap): a difference is there
only when its interval leaves out zero. ``compare(new, base, paired=True)`` judges paired rounds instead (see
``compare_paired``: a sign-flip test, a 2 % floor, and "no verdict: run N more pairs" sized by ``pairs_needed``).

A sentence never says "faster" on a pair that is not a real difference: it asks ``Verdict.word`` for its word, or
lets ``phrase`` (a ratio and what the verdict allows it to say) or ``than`` (the comparison words) write the words,
or picks its clause by ``kind``. These are the only places the verdict words ("within noise", "implausible", "tie",
"no verdict", "baseline anomalous") are written: every takeaway in ``labkit.lessons.findings`` and every notebook
takes them from here, and no findings module compares a measured ratio against a threshold of its own
(``tests/test_takeaways.py`` reads their sources).
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import machine
from .timing import percentile, t_quantile

MIN_SAMPLES = 3  # fewer samples cannot tell a difference from noise
TOLERANCE = 0.02  # medians closer than 2 % are the same number on any laptop
SLACK = 0.10  # a bound is a model: beat it by more than 10 % before calling the run implausible
TIE = 0.10  # two values within 10 % of each other, with no spread to judge them by, are a tie
ANOMALY = 2.0  # a baseline more than 2× off its twin measures an anomaly, not the variant
ROUGH_SPREAD = 0.25  # (p90 − p10) / median above this: the median is a rough figure
DRIFT_RANGE = (0.8, 1.25)  # the baseline timed last over first, outside this: the machine moved during the run
MIN_PAIRS = 6  # an exact sign-flip test on fewer pairs cannot reach p < ALPHA: its smallest p is 2/2ⁿ
ALPHA = 0.05  # two-sided significance of the paired test
POWER = 0.90  # the power pairs_needed() sizes a run for
EXACT_PAIRS = 16  # up to this many pairs the sign-flip test enumerates every sign pattern; beyond, a seeded sample
FLIPS = 20_000  # sign patterns sampled beyond EXACT_PAIRS
CLAIM_POINTS = 0.05  # a published share ("INT8: −75 % memory") holds when the measured share is within 5 points

BETTER, WORSE, NOISE, IMPLAUSIBLE = "better", "worse", "within noise", "implausible — rerun"
TIED, NO_VERDICT, ANOMALOUS = "tie", "no verdict", "baseline anomalous"
KINDS = (BETTER, WORSE, NOISE, TIED, NO_VERDICT, IMPLAUSIBLE, ANOMALOUS)
TIE_LABEL = f"{TIED} (within {TIE:.0%})"  # how a tie reads in a sentence or a table cell


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of KINDS
    ratio: float  # median(new) / median(base), in the quantity's own unit
    gain: float  # the ratio in the direction of "better" (> 1 is better)
    n: int  # the smaller sample count
    reason: str  # why this verdict, in words a learner can check
    paired: bool = False  # judged on paired rounds (n is then the number of pairs)
    p: float | None = None  # the paired test's two-sided p
    low: float | None = None  # the 95 % interval of the ratio (paired only)
    high: float | None = None
    more: int | None = None  # pairs still to run for a verdict (a paired "no verdict")

    def __post_init__(self) -> None:
        assert self.kind in KINDS, f"unknown verdict kind {self.kind!r}"

    def word(self, better: str = "faster", worse: str = "slower") -> str:
        """The word a sentence may use: ``better``/``worse`` only when the difference is real, else the kind ("within
        noise", "tie", "no verdict", …); its ``reason`` says the rest."""
        return {BETTER: better, WORSE: worse, ANOMALOUS: f"{ANOMALOUS} — rerun"}.get(self.kind, self.kind)

    @property
    def label(self) -> str:
        """The verdict as a table cell and a clause: "better", "within noise", "tie (within 10 %)", "no verdict
        (1 sample)", "implausible — rerun", "baseline anomalous — rerun"."""
        if self.kind == TIED:
            return TIE_LABEL
        if self.kind == NO_VERDICT:
            unit = "pair" if self.paired else "sample"
            return f"{NO_VERDICT} ({self.n} {unit}{'s' * (self.n != 1)})"
        if self.kind == ANOMALOUS:
            return f"{ANOMALOUS} — rerun"
        return self.kind

    @property
    def real(self) -> bool:
        return self.kind in (BETTER, WORSE)

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "ratio": self.ratio, "gain": self.gain, "n": self.n, "reason": self.reason}
        if self.paired:
            out.update(paired=True, p=self.p, low=self.low, high=self.high, more=self.more)
        return out


LOG_ENV = "LABKIT_VERDICT_LOG"  # a path: every compare()/against() verdict is appended there, one JSON line each


def _logged(v: Verdict, how: str) -> Verdict:
    """``v``, appended to the file ``LABKIT_VERDICT_LOG`` names when it is set (``python -m bench.verdicts`` counts
    a run's verdicts from it: which differences of 10 % or more were called noise, a tie or no verdict)."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"how": how, **v.to_dict()}) + "\n")
    return v


def phrase(v: Verdict, what: str, better: str = "faster", worse: str = "slower") -> str:
    """``"{gain}× {what}"`` and what the verdict lets a sentence add: ``" (faster)"`` / ``" (slower)"`` when the
    difference is real, ``", within noise (why)"``, ``", tie (within 10 %; why)"``, ``", no verdict (why)"``, or
    ``": implausible — rerun (why; this machine's load)"`` / ``": baseline anomalous — rerun (why)"``."""
    ratio = f"{v.gain:.2f}×" + (f" {what}" if what else "")
    if v.kind == IMPLAUSIBLE:
        return f"{ratio}: {IMPLAUSIBLE} ({v.reason}; {machine.last_line()})"  # the load line: the likely cause
    if v.kind == ANOMALOUS:
        return f"{ratio}: {v.label} ({v.reason})"
    if v.kind in (NOISE, TIED, NO_VERDICT):
        return f"{ratio}, {v.kind} ({v.reason})"
    return f"{ratio} ({v.word(better, worse)})"


def said(v: Verdict, better: str = "faster", worse: str = "slower") -> str:
    """The verdict as a clause with its reason: "faster (3+ samples each, …)", "within noise (the p10–p90 ranges
    overlap)", "tie (1 sample each, within 10 % of each other)", "no verdict (2 samples: …)"."""
    return f"{v.word(better, worse)} ({v.reason})"


def than(v: Verdict, better: str = "faster than", worse: str = "slower than") -> str:
    """The comparison words: ``better``/``worse`` only when the difference is real, else "within noise of", "tied
    with", "with no verdict against", "implausibly far from (rerun)" or "with an anomalous baseline against"."""
    return {BETTER: better, WORSE: worse, NOISE: f"{NOISE} of", TIED: "tied with",
            NO_VERDICT: "with no verdict against", ANOMALOUS: "with an anomalous baseline against"}.get(
        v.kind, "implausibly far from (rerun)")


def pick(v: Verdict, *, better: str, worse: str, same: str, unsure: str | None = None, wild: str | None = None) -> str:
    """The clause a sentence says for this verdict: ``better``/``worse`` for a real difference, ``same`` for a tie
    or a difference within noise, ``unsure`` (default: ``same``) for no verdict, ``wild`` (default: ``unsure``)
    for an implausible run or an anomalous baseline. The one place a findings module branches on a verdict's kind."""
    unsure = same if unsure is None else unsure
    return {BETTER: better, WORSE: worse, NOISE: same, TIED: same, NO_VERDICT: unsure}.get(
        v.kind, unsure if wild is None else wild)


def _values(x: Any) -> list[float]:
    values = getattr(x, "samples", x)
    if isinstance(values, (int, float)):
        values = [values]
    values = [float(v) for v in values if not _missing(v)]  # a round that measured nothing (None) is no sample
    if not values:
        raise ValueError("compare() needs at least one sample on each side: measure before judging")
    return values


def samples(row: Any, key: str) -> list[float]:
    """The raw samples a result row kept for ``key`` (``row["samples"][key]``), or its single value."""
    kept = row.get("samples") if hasattr(row, "get") else None
    kept = kept.get(key) if isinstance(kept, dict) else None  # a table's missing samples read as NaN, not a dict
    return list(kept) if kept else [float(row[key])]


def _ratio(a: float, b: float, what: str) -> float:
    if a <= 0 or b <= 0:
        raise ValueError(f"{what} needs positive medians (got {a:g} and {b:g}): times, rates and sizes only")
    return a / b


def _within(gain: float, share: float) -> bool:
    """Whether a ratio lies within ``share`` of 1 either way, the same test for a ratio and its inverse (1.11× and
    0.90× are the same distance apart)."""
    return max(gain, 1 / gain) < 1 + share


def compare(new: Any, base: Any, *, higher_is_better: bool = True, paired: bool = False, bound: float | None = None,
            bound_why: str = "", floor: float | None = None, floor_why: str = "", twin: Any = None,
            twin_why: str = "") -> Verdict:
    """Judge ``new`` against ``base`` (see the module docstring); ``bound``/``floor`` limit the gain, ``twin`` is an
    independent measurement the baseline should agree with. With ``paired`` the two sides are per-round statistics
    of interleaved rounds, round i of each side at index i, judged by ``paired_test`` (see ``compare_paired``)."""
    limits = dict(bound=bound, bound_why=bound_why, floor=floor, floor_why=floor_why, twin=twin, twin_why=twin_why)
    if paired:
        return _logged(compare_paired(new, base, higher_is_better=higher_is_better, **limits), "paired")
    return _logged(_compare(new, base, higher_is_better=higher_is_better, **limits), "compare")


def _limits(ratio: float, gain: float, n: int, base_median: float, *, bound: float | None, bound_why: str,
            floor: float | None, floor_why: str, twin: Any, twin_why: str, **paired: Any) -> Verdict | None:
    """An implausible gain (beyond its bound or floor) or an anomalous baseline (off its twin), else None."""
    if bound is not None and gain > bound * (1 + SLACK):
        why = f" ({bound_why})" if bound_why else ""
        return Verdict(IMPLAUSIBLE, ratio, gain, n, f"{gain:.2f}× beats its bound {bound:.2f}×{why}", **paired)
    if floor is not None and gain < floor / (1 + SLACK):
        why = f" ({floor_why})" if floor_why else ""
        return Verdict(IMPLAUSIBLE, ratio, gain, n, f"{gain:.2f}× falls below its floor {floor:.2f}×{why}", **paired)
    if twin is not None:
        med_t = statistics.median(_values(twin))
        off = _ratio(base_median, med_t, "compare(twin=)")
        if max(off, 1 / off) > ANOMALY:
            why = f" ({twin_why})" if twin_why else ""
            return Verdict(ANOMALOUS, ratio, gain, n, f"the baseline's median {base_median:.3g} is {off:.2f}× its "
                                                      f"twin's {med_t:.3g}{why}, more than {ANOMALY:g}× apart",
                           **paired)
    return None


def _compare(new: Any, base: Any, *, higher_is_better: bool, **limits: Any) -> Verdict:
    a, b = _values(new), _values(base)
    med_a, med_b = statistics.median(a), statistics.median(b)
    ratio = _ratio(med_a, med_b, "compare()")
    gain = ratio if higher_is_better else 1 / ratio
    n = min(len(a), len(b))
    wild = _limits(ratio, gain, n, med_b, **limits)
    if wild:
        return wild
    if n < MIN_SAMPLES:
        each = f"{n} sample{'s' * (n != 1)}"
        if _within(gain, TIE):
            return Verdict(TIED, ratio, gain, n, f"{each}, medians within {TIE:.0%} of each other")
        return Verdict(NO_VERDICT, ratio, gain, n, f"{each}: at least {MIN_SAMPLES} tell a difference from noise")
    lo_a, hi_a, lo_b, hi_b = percentile(a, 10), percentile(a, 90), percentile(b, 10), percentile(b, 90)
    if lo_a <= hi_b and lo_b <= hi_a:
        return Verdict(NOISE, ratio, gain, n, "the p10–p90 ranges overlap")
    if _within(ratio, TOLERANCE):
        return Verdict(NOISE, ratio, gain, n, f"the medians differ by less than {TOLERANCE:.0%}")
    kind = BETTER if gain > 1 else WORSE
    return Verdict(kind, ratio, gain, n, f"{n}+ samples each, p10–p90 ranges apart")


# ----------------------------------------------------------------------------------------- the paired test


def pairs_of(new: Any, base: Any) -> tuple[list[float], list[float], int]:
    """The pairs a paired comparison judges: round i of each side at index i (two sequences of one length), or the
    same key of two mappings (keyed by round, or by request). A pair one side has no figure for (None, NaN, a key the
    other lacks) is left out, as a pair. Returns each side's kept values and how many pairs were left out."""
    a, b = getattr(new, "samples", new), getattr(base, "samples", base)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = list(dict.fromkeys([*a, *b]))
        a, b = [a.get(k) for k in keys], [b.get(k) for k in keys]
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"a paired comparison needs one value per round on each side, got {len(a)} and {len(b)}: "
                         "pass the per-round statistics, round i of each side at index i (timing.rounds keeps them "
                         "so; its extra baseline pass is not a round), None where a round has no figure")
    kept = [(float(x), float(y)) for x, y in zip(a, b) if not (_missing(x) or _missing(y))]
    if any(x <= 0 for pair in kept for x in pair):
        raise ValueError("a paired comparison needs positive per-round values: times, rates and sizes only (None "
                         "where a round has no figure)")
    return [x for x, _ in kept], [y for _, y in kept], len(a) - len(kept)


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def log_ratios(new: Any, base: Any) -> list[float]:
    """ln(new_i / base_i) for each round i with a figure on both sides (``pairs_of``): the per-pair figure the paired
    test and ``pairs_needed`` work on."""
    a, b, _left_out = pairs_of(new, base)
    return [math.log(x / y) for x, y in zip(a, b)]


def sign_flip_p(d: list[float], *, seed: int = 0) -> float:
    """The two-sided p of an exact sign-flip permutation test on the mean of ``d`` (per-pair log-ratios): under "no
    difference" each pair's sign is a coin toss, so p is the share of the 2ⁿ sign patterns whose mean is at least as
    far from 0 as the one measured. Beyond ``EXACT_PAIRS`` pairs, ``FLIPS`` patterns drawn with ``seed``."""
    if not d:
        raise ValueError("sign_flip_p() needs at least one pair")
    observed = abs(math.fsum(d))
    eps = 1e-9 * (math.fsum(abs(x) for x in d) or 1.0)  # the measured pattern itself counts, whatever the rounding
    if len(d) <= EXACT_PAIRS:
        sums = [0.0]
        for x in d:
            sums = [s + x for s in sums] + [s - x for s in sums]
        return sum(abs(s) >= observed - eps for s in sums) / len(sums)
    rng = random.Random(seed)
    hits = sum(abs(math.fsum(x if rng.random() < 0.5 else -x for x in d)) >= observed - eps for _ in range(FLIPS))
    return (hits + 1) / (FLIPS + 1)


def pairs_needed(sigma_d: float, change: float, *, alpha: float = ALPHA, power: float = POWER) -> int:
    """Pairs a paired t test needs to catch a ``change`` (0.086 for 8.6 %) at two-sided ``alpha`` with ``power``,
    when the per-pair log-ratios spread by ``sigma_d``: the least n with n ≥ (t₁₋α/₂,ₙ₋₁ + t_power,ₙ₋₁)² ·
    (σ_d/δ)², δ = ln(1 + change). Never fewer than ``MIN_PAIRS``."""
    if change <= 0 or sigma_d < 0:
        raise ValueError(f"pairs_needed(sigma_d={sigma_d}, change={change}): the change must be positive (0.086 for "
                         "8.6 %) and the spread not negative")
    scale = (sigma_d / math.log1p(change)) ** 2
    n = max(2, math.ceil(10.5 * scale))  # the normal approximation undercounts: start there and count up
    while n < 1_000_000 and n < (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) ** 2 * scale:
        n += 1
    return max(n, MIN_PAIRS)


def _more(n: int, sd: float | None, mean: float) -> int:
    """Pairs to run beyond these ``n`` for a verdict: those the t formula needs to tell this run's difference (at
    least ``TOLERANCE``) from nothing with this run's spread, or up to ``MIN_PAIRS`` where the spread is unknown."""
    if not sd:
        return max(MIN_PAIRS - n, 1)
    return max(pairs_needed(sd, max(math.expm1(abs(mean)), TOLERANCE)) - n, 1)


def compare_paired(new: Any, base: Any, *, higher_is_better: bool = True, **limits: Any) -> Verdict:
    """Paired rounds judged on their per-round log-ratios (``compare(..., paired=True)``; the pairs of ``pairs_of``:
    a round without a figure on both sides is left out and counted in the reason): the ratio is their geometric mean,
    p the exact sign-flip test's, the interval a t interval on the mean log-ratio.

    "better"/"worse": p < ``ALPHA`` and the ratio beyond ``TOLERANCE``; "within noise": the 95 % interval inside
    ±``TOLERANCE``; else "no verdict", its reason saying how many more pairs to run (``pairs_needed`` with this run's
    spread) — as it does below ``MIN_PAIRS`` pairs, whatever the difference."""
    limits = {k: limits.get(k) for k in ("bound", "floor", "twin")} | \
        {k: limits.get(k) or "" for k in ("bound_why", "floor_why", "twin_why")}
    a, b, left_out = pairs_of(new, base)
    if not a:
        return Verdict(NO_VERDICT, math.nan, math.nan, 0, "no round has a figure on both sides: nothing to pair",
                       paired=True)
    d = [math.log(x / y) for x, y in zip(a, b)]
    n, mean = len(d), math.fsum(d) / len(d)
    ratio = math.exp(mean)
    gain = ratio if higher_is_better else 1 / ratio
    sd = statistics.stdev(d) if n >= 2 else None
    wild = _limits(ratio, gain, n, statistics.median(b), **limits, paired=True)
    if wild:
        return wild
    pairs = f"{n} pair{'s' * (n != 1)}" + (f" ({left_out} round{'s' * (left_out != 1)} without a figure on both "
                                           "sides left out)" if left_out else "")
    if n < MIN_PAIRS:
        more = _more(n, sd, mean)
        return Verdict(NO_VERDICT, ratio, gain, n, f"{pairs}: a paired test needs at least {MIN_PAIRS}; run {more} "
                                                   "more pairs", paired=True, more=more)
    p = sign_flip_p(d)
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    low, high = math.exp(mean - half), math.exp(mean + half)
    test = (f"paired sign-flip test, {pairs}: p = {p:.3f}, ratio {ratio:.3f}× (95 % interval {low:.3f}–"
            f"{high:.3f}×)")
    extra = dict(paired=True, p=p, low=low, high=high)
    if p < ALPHA and not _within(ratio, TOLERANCE):
        return Verdict(BETTER if gain > 1 else WORSE, ratio, gain, n, test, **extra)
    if _within(low, TOLERANCE) and _within(high, TOLERANCE):
        return Verdict(NOISE, ratio, gain, n, f"{test}, inside ±{TOLERANCE:.0%}", **extra)
    more = _more(n, sd, mean)
    return Verdict(NO_VERDICT, ratio, gain, n, f"{test}: run {more} more pairs", **extra, more=more)


def against(value: float, base: Any, *, higher_is_better: bool = True) -> Verdict:
    """One value (a first call, a lone run) against samples of the same quantity (the steady calls after it): better
    or worse when it lies outside their p10–p90 range and off their median by ``TOLERANCE`` or more, within noise
    inside it; with fewer than ``MIN_SAMPLES`` samples, a tie within ``TIE`` or no verdict."""
    return _logged(_against(value, base, higher_is_better=higher_is_better), "against")


def _against(value: float, base: Any, *, higher_is_better: bool) -> Verdict:
    b = _values(base)
    med_b = statistics.median(b)
    ratio = _ratio(float(value), med_b, "against()")
    gain = ratio if higher_is_better else 1 / ratio
    n = len(b)
    if n < MIN_SAMPLES:
        each = f"{n} sample{'s' * (n != 1)} to judge it by"
        if _within(gain, TIE):
            return Verdict(TIED, ratio, gain, n, f"{each}, within {TIE:.0%} of its median")
        return Verdict(NO_VERDICT, ratio, gain, n, f"{each}: at least {MIN_SAMPLES} tell a difference from noise")
    if percentile(b, 10) <= value <= percentile(b, 90) or _within(ratio, TOLERANCE):
        return Verdict(NOISE, ratio, gain, n, f"inside the p10–p90 range of the {n} it is held against")
    return Verdict(BETTER if gain > 1 else WORSE, ratio, gain, n, f"outside the p10–p90 range of the {n} it is held "
                                                                  "against")


def versus(new: float, base: float, *, higher_is_better: bool = True) -> Verdict:
    """Two single computed values with no noise of their own to judge them by (shares of one step, two layers'
    errors, a measurement against a model's prediction): a tie within ``TIE``, else better or worse."""
    ratio = _ratio(float(new), float(base), "versus()")
    gain = ratio if higher_is_better else 1 / ratio
    if _within(gain, TIE):
        return Verdict(TIED, ratio, gain, 1, f"one value each, within {TIE:.0%} of each other")
    return Verdict(BETTER if gain > 1 else WORSE, ratio, gain, 1, f"one value each, {max(gain, 1 / gain) - 1:.0%} apart")


ONE_RUN_RULE = f"one run each with a {TOLERANCE:.0%} step"  # the naive reader, as a sentence names it


def one_run_each(new: float, base: float, *, higher_is_better: bool = True) -> Verdict:
    """The naive reader notebook 14 holds up against the others: one run a side, a difference called wherever the
    two figures are ``TOLERANCE`` apart, whatever the noise (``ONE_RUN_RULE``). Never a verdict to print a
    takeaway with: its A/A false-positive rate is what the notebook measures."""
    ratio = _ratio(float(new), float(base), "one_run_each()")
    gain = ratio if higher_is_better else 1 / ratio
    if _within(ratio, TOLERANCE):
        return Verdict(NOISE, ratio, gain, 1, f"{ONE_RUN_RULE}: less than the step apart")
    return Verdict(BETTER if gain > 1 else WORSE, ratio, gain, 1,
                   f"{ONE_RUN_RULE}: {max(ratio, 1 / ratio) - 1:.0%} apart")


def largest(pieces: Mapping[str, float]) -> list[str]:
    """The name of the largest of ``pieces`` (positive values), or the names tied for it (within ``TIE`` of the
    largest), largest first."""
    if not pieces:
        raise ValueError("largest() needs at least one piece")
    ranked = sorted(pieces, key=pieces.get, reverse=True)
    top = pieces[ranked[0]]
    if top <= 0:
        return ranked
    return [k for k in ranked if pieces[k] > 0 and versus(pieces[k], top).kind == TIED]


def holds(measured: float, claimed: float, points: float = CLAIM_POINTS) -> bool:
    """Whether a published share (a memory change of −0.75, a rise of +0.02) holds: the measured share within
    ``points`` of the claim, either side."""
    return abs(measured - claimed) <= points


def smallest(pieces: Mapping[str, float]) -> list[str]:
    """The name of the smallest of ``pieces`` (positive values), or the names tied for it (within ``TIE``), smallest
    first: ``largest`` of the inverses."""
    return largest({k: 1 / v for k, v in pieces.items() if v > 0}) if any(v > 0 for v in pieces.values()) else list(pieces)


def doubts(spread: float | None = None, drift: float | None = None) -> list[str]:
    """What makes a timed row rough, in words: a spread ((p90 − p10) / median) over ``ROUGH_SPREAD``, a drift (the
    baseline timed last over first) outside ``DRIFT_RANGE``; [] when neither. Shown beside the row on any machine,
    quiet or not: a rough median is rough whatever the load line says."""
    said = []
    if spread is not None and spread == spread and spread > ROUGH_SPREAD:
        said.append(f"spread {spread:.0%} (over {ROUGH_SPREAD:.0%}: a rough median)")
    lo, hi = DRIFT_RANGE
    if drift is not None and drift == drift and not lo <= drift <= hi:
        said.append(f"drift {drift:.2f} (outside {lo:g}–{hi:g}: the machine's speed moved during the run)")
    return said


def bootstrap_diff(new: Any, base: Any, *, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval for median(new) − median(base), in the quantity's own unit: each side is
    resampled with replacement ``resamples`` times (seeded, so a run repeats), the difference of the two resampled
    medians taken each time, and the central ``level`` share of those differences returned as (low, high).
    An interval that holds 0 cannot tell the two apart."""
    a, b = _values(new), _values(base)
    if not a or not b:
        raise ValueError("bootstrap_diff() needs at least one sample on each side")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level is a share between 0 and 1 (0.95 for a 95 % interval), got {level}")
    rng = random.Random(seed)
    diffs = sorted(statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
                   for _ in range(resamples))
    tail = (1 - level) / 2 * 100
    return percentile(diffs, tail), percentile(diffs, 100 - tail)

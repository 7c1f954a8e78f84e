"""The one verdict every takeaway sentence is chosen by: better, worse, within noise, or implausible.

``compare(new, base)`` takes two sets of samples (raw values, or ``Measurement``) and answers

- ``"implausible — rerun"`` when the gain beats its physical bound (``bound``: half the bytes caps a memory-bound
  decode at 2×, a batch cannot beat its own model) or falls below its floor (``floor``: batch-B throughput below
  batch 1's, per-user speed rising with the batch) by more than ``SLACK``: the machine, not the method, moved it;
- ``"within noise"`` when either side has fewer than ``MIN_SAMPLES`` samples, their p10–p90 ranges overlap, or the
  medians differ by less than ``TOLERANCE``;
- otherwise ``"better"`` or ``"worse"``, in the direction ``higher_is_better`` names.

A sentence never says "faster" on a pair that is within noise: it asks ``Verdict.word`` for its word, or lets
``phrase`` (a ratio and what the verdict allows it to say) or ``than`` (the comparison words) write the words. These
are the only places the words "within noise" and "implausible" are written: every takeaway in
``labkit.lessons.findings`` and every notebook takes them from here.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from . import machine
from .timing import percentile

MIN_SAMPLES = 3  # fewer samples cannot tell a difference from noise
TOLERANCE = 0.02  # medians closer than 2 % are the same number on any laptop
SLACK = 0.10  # a bound is a model: beat it by more than 10 % before calling the run implausible

BETTER, WORSE, NOISE, IMPLAUSIBLE = "better", "worse", "within noise", "implausible — rerun"


@dataclass(frozen=True)
class Verdict:
    kind: str  # BETTER, WORSE, NOISE or IMPLAUSIBLE
    ratio: float  # median(new) / median(base), in the quantity's own unit
    gain: float  # the ratio in the direction of "better" (> 1 is better)
    n: int  # the smaller sample count
    reason: str  # why this verdict, in words a learner can check

    def word(self, better: str = "faster", worse: str = "slower") -> str:
        """The word a sentence may use: ``better``/``worse`` only when the difference is real."""
        return {BETTER: better, WORSE: worse}.get(self.kind, self.kind)

    @property
    def real(self) -> bool:
        return self.kind in (BETTER, WORSE)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ratio": self.ratio, "gain": self.gain, "n": self.n, "reason": self.reason}


def phrase(v: Verdict, what: str, better: str = "faster", worse: str = "slower") -> str:
    """``"{gain}× {what}"`` and what the verdict lets a sentence add: ``" (faster)"`` / ``" (slower)"`` when the
    difference is real, ``", within noise (why)"``, or ``": implausible — rerun (why; this machine's load)"``."""
    ratio = f"{v.gain:.2f}×" + (f" {what}" if what else "")
    if v.kind == IMPLAUSIBLE:
        return f"{ratio}: {IMPLAUSIBLE} ({v.reason}; {machine.last_line()})"  # the load line: the likely cause
    if v.kind == NOISE:
        return f"{ratio}, {NOISE} ({v.reason})"
    return f"{ratio} ({v.word(better, worse)})"


def than(v: Verdict, better: str = "faster than", worse: str = "slower than") -> str:
    """The comparison words: ``better``/``worse`` only when the difference is real, else "within noise of" or
    "implausibly far from (rerun)"."""
    return {BETTER: better, WORSE: worse, NOISE: f"{NOISE} of"}.get(v.kind, "implausibly far from (rerun)")


def _values(x: Any) -> list[float]:
    values = getattr(x, "samples", x)
    if isinstance(values, (int, float)):
        values = [values]
    values = [float(v) for v in values]
    if not values:
        raise ValueError("compare() needs at least one sample on each side: measure before judging")
    return values


def samples(row: Any, key: str) -> list[float]:
    """The raw samples a result row kept for ``key`` (``row["samples"][key]``), or its single value."""
    kept = row.get("samples") if hasattr(row, "get") else None
    kept = kept.get(key) if isinstance(kept, dict) else None  # a table's missing samples read as NaN, not a dict
    return list(kept) if kept else [float(row[key])]


def compare(new: Any, base: Any, *, higher_is_better: bool = True, bound: float | None = None, bound_why: str = "",
            floor: float | None = None, floor_why: str = "") -> Verdict:
    """Judge ``new`` against ``base`` (see the module docstring); ``bound``/``floor`` limit the gain."""
    a, b = _values(new), _values(base)
    med_a, med_b = statistics.median(a), statistics.median(b)
    if med_a <= 0 or med_b <= 0:
        raise ValueError(f"compare() needs positive medians (got {med_a:g} and {med_b:g}): times and rates only")
    ratio = med_a / med_b
    gain = ratio if higher_is_better else 1 / ratio
    n = min(len(a), len(b))
    if bound is not None and gain > bound * (1 + SLACK):
        why = f" ({bound_why})" if bound_why else ""
        return Verdict(IMPLAUSIBLE, ratio, gain, n, f"{gain:.2f}× beats its bound {bound:.2f}×{why}")
    if floor is not None and gain < floor / (1 + SLACK):
        why = f" ({floor_why})" if floor_why else ""
        return Verdict(IMPLAUSIBLE, ratio, gain, n, f"{gain:.2f}× falls below its floor {floor:.2f}×{why}")
    if n < MIN_SAMPLES:
        return Verdict(NOISE, ratio, gain, n, f"{n} sample{'s' * (n != 1)}: at least {MIN_SAMPLES} tell a "
                                              "difference from noise")
    lo_a, hi_a, lo_b, hi_b = percentile(a, 10), percentile(a, 90), percentile(b, 10), percentile(b, 90)
    if lo_a <= hi_b and lo_b <= hi_a:
        return Verdict(NOISE, ratio, gain, n, "the p10–p90 ranges overlap")
    if abs(ratio - 1) < TOLERANCE:
        return Verdict(NOISE, ratio, gain, n, f"the medians differ by less than {TOLERANCE:.0%}")
    kind = BETTER if gain > 1 else WORSE
    return Verdict(kind, ratio, gain, n, f"{n}+ samples each, p10–p90 ranges apart")

"""Checks for notebook 14 (can you trust this benchmark?): every client's records under one definition, a bootstrap
interval for a difference of medians, and the SUT's two calls to MLPerf's LoadGen."""
from __future__ import annotations

import math
import random
import statistics
from typing import Any

from ...core import verdict
from ...serve.clients import align as align_ref
from ..exercises import NotAttempted, Wrong, call, close, exercise


def _rec(start: float, first: float, end: float, tokens: int) -> dict[str, float]:
    return {"start_s": start, "first_token_s": first, "end_s": end, "tokens": tokens}


@exercise("14.align", "every client's records under one definition", hints=(
    "One definition for everyone: TTFT is the first token's arrival minus the request's start; TPOT is the time after "
    "the first token divided by the tokens after it (n − 1), never by all n and never counting the wait for the first.",
    "A request with a single token has no time per output token: leave it out of TPOT. Throughput is every request's "
    "tokens over the run's span, from the earliest start to the latest end, not over the sum of their latencies.",
    "Build three lists with comprehensions over `records`; `statistics.median` gives each p50; the span is "
    "`max(r['end_s'] ...) - min(r['start_s'] ...)`.",
))
def _align(fn: Any) -> None:
    cases = [  # (records, what it tests, the hint for it)
        ([_rec(0.0, 0.2, 1.2, 11), _rec(0.1, 0.4, 2.4, 21), _rec(0.2, 0.3, 1.3, 11)], "three ordinary requests", 1),
        ([_rec(0.0, 0.5, 0.5, 1), _rec(0.0, 0.2, 1.0, 9), _rec(0.5, 0.6, 1.4, 5)],
         "a one-token answer has no TPOT", 2),
        ([_rec(0.0, 0.1, 1.0, 10), _rec(5.0, 5.1, 6.0, 10)], "an idle second between requests is in the span", 2),
    ]
    for i, (records, why, hint) in enumerate(cases):
        got = call(fn, [dict(r) for r in records]) if i == 0 else fn([dict(r) for r in records])
        if not isinstance(got, dict):
            raise Wrong(f"return a dict with ttft_p50_s, tpot_p50_s and output_tokens_per_s, got {got!r}", hint=1)
        want = align_ref.aligned(records)
        for key in ("ttft_p50_s", "tpot_p50_s", "output_tokens_per_s"):
            if key not in got:
                raise Wrong(f"the dict has no {key!r} (it needs ttft_p50_s, tpot_p50_s and output_tokens_per_s)",
                            hint=1)
            close(got[key], want[key], f"{key} for {why}", rtol=1e-6, hint=hint)


@exercise("14.bootstrap_diff", "a bootstrap interval for a difference of medians", hints=(
    "Resample each side with replacement, as many values as it has, take the two medians' difference, and repeat "
    "many times: the spread of those differences is the uncertainty of the one you measured. Medians, not means: "
    "one slow outlier moves a mean.",
    "Sorting the resampled differences, the central 95 % lies between the 2.5th and the 97.5th percentile: those two "
    "are the interval. Drawing without replacement gives back the same values every time, so nothing varies.",
    "Use `rng = random.Random(seed)` and `rng.choices(side, k=len(side))` for a resample; `statistics.median`; sort "
    "the list and index it at `int(0.025 * resamples)` and `int(0.975 * resamples) - 1`.",
))
def _bootstrap(fn: Any) -> None:
    rng = random.Random(5)
    base = [rng.gauss(1.0, 0.1) for _ in range(40)]
    same = [rng.gauss(1.0, 0.1) for _ in range(40)]
    shifted = [x + 0.2 for x in base]
    got = call(fn, same, base, resamples=1000, seed=1)
    try:
        lo, hi = (float(v) for v in got)
    except (TypeError, ValueError):
        raise Wrong(f"return two numbers (low, high), got {got!r}", hint=1) from None
    if not lo <= hi:
        raise Wrong(f"the interval ({lo:.4g}, {hi:.4g}) has its low end above its high end", hint=2)
    if lo == hi:
        raise Wrong("the interval has no width: every resample gave the same difference (draw with replacement)",
                    hint=2)
    if not lo <= 0 <= hi:
        raise Wrong(f"two samples of one population gave ({lo:.4g}, {hi:.4g}), which leaves out 0", hint=1)
    lo, hi = (float(v) for v in fn(shifted, base, resamples=1000, seed=1))
    if not 0 < lo <= 0.2 <= hi:
        raise Wrong(f"the same values shifted by 0.2 gave ({lo:.4g}, {hi:.4g}): it should leave out 0 and hold 0.2",
                    hint=1)
    outliers = [1.0] * 30 + [10.0] * 6
    lo, hi = (float(v) for v in fn(outliers, [1.0] * 36, resamples=1000, seed=1))
    if not lo <= 0 <= hi:
        raise Wrong(f"equal medians, one side with slow outliers, gave ({lo:.4g}, {hi:.4g}): the difference of medians "
                    "is 0 here (a mean would move)", hint=1)
    lo, hi = (float(v) for v in fn(same, base, resamples=2000, seed=3))
    ref_lo, ref_hi = verdict.bootstrap_diff(same, base, resamples=2000, seed=3)
    width, ref_width = hi - lo, ref_hi - ref_lo
    if not math.isclose(width, ref_width, rel_tol=0.3):
        raise Wrong(f"the 95 % interval is {width:.4g} wide; a percentile bootstrap gives about {ref_width:.4g} "
                    "(the 2.5th to the 97.5th percentile of the differences, not their whole range)", hint=2)
    if abs(statistics.mean([lo, hi]) - statistics.mean([ref_lo, ref_hi])) > 0.3 * ref_width:
        raise Wrong(f"the interval ({lo:.4g}, {hi:.4g}) is off centre: about ({ref_lo:.4g}, {ref_hi:.4g}) expected "
                    "(new minus base, in that order)", hint=1)


class _FakeLoadGen:
    """Records what the SUT tells LoadGen."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[Any, ...]]]] = []

    def QuerySampleResponse(self, *args: Any) -> tuple[Any, ...]:  # noqa: N802 — LoadGen's names
        return args

    def FirstTokenComplete(self, responses: Any) -> None:  # noqa: N802
        self.calls.append(("FirstTokenComplete", list(responses)))

    def QuerySamplesComplete(self, responses: Any) -> None:  # noqa: N802
        self.calls.append(("QuerySamplesComplete", list(responses)))


@exercise("14.report", "the SUT's two calls to LoadGen", hints=(
    "With token latencies on, LoadGen needs two signals per query: when its first token arrived (that stamps TTFT) "
    "and when its answer is complete (that ends its latency). Each is a call with a list of responses.",
    "The completion must carry the answer's number of output tokens: LoadGen divides the time after the first token "
    "by it to get TPOT. A response names the query's id, a data pointer and a size (0 and 0 here: no data kept).",
    "`lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])` on 'first'; on 'done' the other call, "
    "`lg.QuerySamplesComplete`, with a response that has `tokens` as its fourth argument.",
))
def _sut_report(fn: Any) -> None:
    if not callable(fn):
        raise Wrong(f"expected a function, got {type(fn).__name__}")
    lg = _FakeLoadGen()
    fn(lg, 3, "first", 0)
    heard_first = list(lg.calls)
    fn(lg, 3, "done", 17)
    if not lg.calls:  # the placeholder tells LoadGen nothing (and returns None, as a right answer does too)
        raise NotAttempted()
    if heard_first != [("FirstTokenComplete", [(3, 0, 0)])]:
        raise Wrong(f"on 'first' LoadGen heard {heard_first or 'nothing'}; it needs FirstTokenComplete with the "
                    "query's response", hint=1)
    done = lg.calls[len(heard_first):]
    if not done or done[0][0] != "QuerySamplesComplete":
        raise Wrong(f"on 'done' LoadGen heard {done or 'nothing'}; the answer's end is QuerySamplesComplete", hint=1)
    if done != [("QuerySamplesComplete", [(3, 0, 0, 17)])]:
        raise Wrong(f"on 'done' the response was {done[0][1]}: it must carry the 17 output tokens", hint=2)


@exercise("14.pairs_needed", "the pairs a paired test needs", hints=(
    "The fewer pairs, the wider the t distribution's tails: the factor (t₀.₉₇₅,ₙ₋₁ + t₀.₉₀,ₙ₋₁)² depends on n itself. "
    "Start small and count n up until n is at least that factor times (σ_d / δ)².",
    "δ is the change on the log scale, ln(1 + change) (`math.log1p(change)`), because the pairs are log-ratios; and "
    "the two-sided α = 0.05 puts 0.025 in each tail (t at 0.975), the 90 % power is t at 0.90, both with n − 1 "
    "degrees of freedom.",
    "A `while` loop that adds 1 to n as long as n is below the right-hand side, recomputed with the new n each time; "
    "`verdict.t_quantile(q, df)` gives each t; the floor of 6 last, with `max`.",
))
def _pairs_needed(fn: Any) -> None:
    cases = [  # (sigma_d, change, what it tests, the hint for it)
        (0.10, 0.086, "σ_d 0.10 for an 8.6 % change (t, not the normal approximation)", 1),
        (0.075, 0.086, "σ_d 0.075 for an 8.6 % change", 1),
        (0.20, 0.30, "σ_d 0.20 for a 30 % change (δ = ln 1.3, not 0.3)", 2),
        (0.30, 0.05, "σ_d 0.30 for a 5 % change (many pairs)", 2),
        (0.01, 0.10, "a small spread: never fewer than 6 pairs", 3),
    ]
    for i, (sd, change, why, hint) in enumerate(cases):
        got = call(fn, sd, change) if i == 0 else fn(sd, change)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
            raise Wrong(f"return a whole number of pairs, got {got!r}", hint=1)
        want = verdict.pairs_needed(sd, change)
        if int(got) != want:
            raise Wrong(f"{why}: {int(got)} pairs, expected {want}", hint=hint)

"""Notebook 04's checks: when a run of latencies has settled, and the share of the first call that is one-time cost."""
from __future__ import annotations

import numbers
import statistics
from typing import Any

from ...engines.warmup import one_time_share, settle_point, window_spread
from ..exercises import Wrong, call, close, exercise, number, slipped

# (latencies in seconds, until_spread, window): each settles, and each usual slip gives another answer on one of them
_SETTLE_CASES = (
    ([0.50, 0.51, 0.50, 0.52, 0.50, 0.51], 0.10, 5),  # steady from the first call: 0 warmup calls, not None
    ([2.4, 0.9, 0.61, 0.52, 0.50, 0.51, 0.50, 0.52, 0.50, 0.51, 0.50], 0.10, 5),
    ([1.5, 0.30, 0.26, 0.25, 0.25, 0.31, 0.25, 0.25, 0.26, 0.25], 0.10, 4),
    ([0.8, 0.42, 0.40, 0.41, 0.40, 0.40, 0.40], 0.05, 3),
    ([1.2, 0.50, 0.50, 0.56, 0.50, 0.50, 0.52, 0.51, 0.50, 0.50], 0.10, 5),  # one slower call inside a steady window
)
_NEVER = ([1.0, 0.5, 0.7, 0.5, 0.7, 0.5, 0.7, 0.5], 0.10, 4)


def _settle(latencies: list[float], until: float, window: int, spread: Any, end: bool = False) -> int | None:
    """The first steady window's start (or its end), with another spread or window: what a slip returns."""
    for stop in range(window, len(latencies) + 1):
        if spread(latencies[stop - window:stop]) < until:
            return stop if end else stop - window
    return None


@exercise("04.calls_until_settled", "calls before latency settles", hints=(
    "Slide a window of consecutive calls, window of them, along the latencies and stop at the first one whose "
    "window_spread is under until_spread. The answer is the number of calls before that window starts, the warmup "
    "calls; when no window is steady, the answer is None.",
    "Measure each window with the window_spread the cell imports, (p90 − p10) / median, not your own (max − min) / "
    "median or a standard deviation. Each window holds exactly `window` calls; the one starting at index start has "
    "start calls before it, and n latencies hold n − window + 1 windows.",
    "A window can start at every index from 0 up to `len(latencies_s) - window`; slice `window` latencies from there, "
    "measure them with `window_spread`, and return the start of the first window under until_spread. Return None only "
    "after trying every start.",
))
def _calls_until_settled(fn: Any) -> None:

    def max_min(xs: list[float]) -> float:
        return (max(xs) - min(xs)) / statistics.median(xs)

    def stdev(xs: list[float]) -> float:
        return statistics.pstdev(xs) / statistics.mean(xs)

    for i, (lat, until, window) in enumerate(_SETTLE_CASES):
        want = settle_point(lat, until, window)
        assert want is not None
        # the first case: None is the placeholder; after it, None is an answer (never settles), judged as one
        got = call(fn, list(lat), until, window) if i == 0 else fn(list(lat), until, window)
        where = f"for latencies {lat} with until_spread={until}, window={window}"
        if got is None:
            raise Wrong(f"{where} you returned None (never settles), expected {want}: calls {want + 1}–{want + window} "
                        f"spread under {until}; look at every window, not only the first", hint=1)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):  # numpy integers count
            raise Wrong(f"{where}: return a whole number of calls (or None when it never settles), got {got!r}",
                        hint=1)
        if got == want:
            continue
        slips = {  # the answer a slip gives: (why, the hint written for it)
            _settle(lat, until, window, window_spread, end=True):
                ("that counts the steady window too: return the calls *before* it (the warmup calls)", 1),
            _settle(lat, until, window, max_min): ("use the spread labkit uses, window_spread: (p90 - p10) / median, "
                                                   "not (max - min) / median", 2),
            _settle(lat, until, window, stdev): ("use window_spread ((p90 - p10) / median), not stdev / mean", 2),
            _settle(lat, until, window + 1, window_spread): (f"the window is {window} calls, not {window + 1}", 2),
            _settle(lat, until, window - 1, window_spread): (f"the window is {window} calls, not {window - 1}", 2),
        }
        slips.pop(want, None)
        if got in slips:
            why, hint = slips[got]
            raise Wrong(f"{where} you gave {got}, expected {want}: {why}", hint=hint)
        raise Wrong(f"{where} you gave {got}, expected {want}: the first {window} calls in a row whose spread is "
                    f"under {until} start after {want} calls")
    lat, until, window = _NEVER
    got = fn(list(lat), until, window)  # the right answer here is None: called directly, not through call()
    if got is not None:
        raise Wrong(f"latencies {lat} alternate between 0.5 and 0.7 s and never settle (window {window}, bar {until}); "
                    f"you gave {got!r}: return None when no window is steady", hint=1)


_SHARE_CASES = ([2.0, 0.6, 0.52, 0.5, 0.5, 0.51, 0.5], [0.9, 0.3, 0.31, 0.3, 0.29, 0.3], [5.0, 4.0, 1.0, 1.1, 1.0, 0.9])


@exercise("04.one_time_share", "share of the first call that is one-time cost", hints=(
    "The steady latency is what every call pays; what the first call pays on top of it happens once. The answer is "
    "that extra as a fraction of the first call, between 0 and 1: divide by the first latency, not the steady one.",
    "Steady is the median of the last `window` latencies. The second call may still be warming up, the median of "
    "all calls includes the cold ones, and one slow call pulls a mean up.",
    "The steady latency is the median of the last `window` latencies (`statistics.median` of a slice from the end); "
    "the one-time cost is what the first call paid above it, and the share divides that cost by the first call's own "
    "latency.",
))
def _one_time_share(fn: Any) -> None:

    for lat in _SHARE_CASES:
        window = 3
        steady = statistics.median(lat[-window:])
        want = one_time_share(list(lat), window)
        got = call(fn, list(lat), window)
        where = f"for latencies {lat} (window {window})"
        number(got, "one number, a fraction between 0 and 1", hint=1)
        slipped(got, want, [  # the value a slip gives, why, and the hint written for it
            (lat[0] / steady - 1, "that is (first - steady) / steady, a slowdown; the share of the first call is "
                                  "(first - steady) / first", 1),
            (steady / lat[0], "that is the steady part's share: the one-time part is first minus steady, over "
                              "first", 1),
            ((lat[0] - lat[1]) / lat[0], "the second call is not steady yet: take the median of the last `window` "
                                         "calls", 2),
            ((lat[0] - statistics.median(lat)) / lat[0], "the median of all calls includes the cold ones: take the "
                                                         "median of the last `window` calls", 2),
            ((lat[0] - statistics.mean(lat[-window:])) / lat[0], "use the median of the last `window` calls, not "
                                                                 "their mean (one slow call would pull it up)", 2),
            (100 * want, "return a fraction (0.75), not a percentage (75)", 1),
        ], f"{where} you gave {got:.4g}, expected {want:.4g}", tol=1e-9)
        close(float(got), want, f"one-time share {where}")

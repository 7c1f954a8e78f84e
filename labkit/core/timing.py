"""The one timing primitive: synchronise the device, then read ``perf_counter``.

``measure`` keeps every raw sample; statistics are computed on demand, and a
``Measurement`` warns when its spread is too wide to trust the median. ``rounds``/``interleave`` time variants
in shuffled, paired rounds; ``t_cdf``/``t_quantile`` (Student's t, no SciPy) serve the paired verdict's interval.
"""
from __future__ import annotations

import functools
import math
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

SPREAD_LIMIT = 0.10  # flag a measurement whose (p90 - p10) / median exceeds 10 %
# the last load line's verdict: True busy, False quiet, None not read yet (``core.machine.check`` sets it); a noisy
# measurement advises closing programs only where the machine was not seen quiet
machine_busy: bool | None = None


def sync(device: Any = None) -> None:
    """Wait for queued GPU work so the clock reads finished work (no-op on CPU).

    ``device`` names the device whose queue to wait for ("cuda:1" waits for cuda:1, not the current
    device); None waits for the current CUDA device only once CUDA is initialised: a host-only interval
    never creates a CUDA context (notebook 04 times that creation as its own phase).
    """
    name = str(device) if device is not None else ""
    if name.startswith("cpu") or name == "meta":
        return
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return
    if name.startswith("mps"):
        torch.mps.synchronize()
    elif name.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(torch.device(name))
    elif not name and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def bind_thread(device: Any) -> None:
    """Make the GPU ``device`` names ("cuda:1") the calling thread's current CUDA device: a new thread starts on
    cuda:0, where an unnamed ``sync``, allocation or peak reading would land while the model runs on another
    GPU (server and preflight threads). No-op for other devices and for plain "cuda"."""
    name = str(device) if device is not None else ""
    if not name.startswith("cuda"):
        return
    import torch

    index = torch.device(name).index
    if index is not None and torch.cuda.is_available():
        torch.cuda.set_device(index)


def clock() -> float:
    """The host's monotonic clock, for intervals with no device work to wait for: arrivals and responses
    over HTTP, file exports, wall time around whole steps that synchronise themselves."""
    return time.perf_counter()


def now(device: Any = None) -> float:
    """Seconds on a monotonic clock, after the device has finished its queued work."""
    sync(device)
    return time.perf_counter()


P99_MIN_SAMPLES = 100  # one rule for the whole lab: fewer samples cannot say anything about a 1 % tail


def p99(samples: list[float]) -> float | None:
    """The 99th percentile, or None with fewer than P99_MIN_SAMPLES samples (then it is just the maximum)."""
    return percentile(samples, 99) if len(samples) >= P99_MIN_SAMPLES else None


def percentile(samples: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not samples:
        raise ValueError("percentile of no samples: measure at least once")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} must lie in [0, 100]")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"df={df}: Student's t needs at least 1 degree of freedom")
    x = df / (df + t * t)
    a, b = df / 2, 0.5
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) \
        if 0 < x < 1 else 0.0
    tail = front * _beta_fraction(a, b, x) / a if x < (a + 1) / (a + b + 2) else \
        1 - front * _beta_fraction(b, a, 1 - x) / b if x < 1 else 1.0  # I_x(df/2, 1/2) = P(|T| ≥ |t|)
    return 1 - tail / 2 if t > 0 else tail / 2


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (t₀.₉₇₅,₅ = 2.571), by bisection; kept once
    computed (``verdict.pairs_needed`` asks for the same few quantiles for every n it tries)."""
    if not 0 < q < 1:
        raise ValueError(f"q={q}: a quantile is a share between 0 and 1")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, hi * 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


LATENCY_STATS = ("mean", "p50", "p90", "p99")  # what a latency summary reports unless asked otherwise


def gaps(stamps: Sequence[float]) -> list[float]:
    """The gaps between consecutive stamps of one stream (seconds): its inter-token (or inter-chunk) latencies.
    The one place the lab turns arrival stamps into gaps."""
    return [b - a for a, b in zip(stamps, stamps[1:])]


def pooled_gaps(streams: Sequence[Sequence[float]], window: tuple[float, float] | None = None) -> list[float]:
    """Every stream's ``gaps``, pooled; ``window`` (start, end): only the gaps that overlap it (a stall that began
    before the window's start and ended after it counts)."""
    return [g for s in streams for a, b, g in zip(s, s[1:], gaps(s))
            if window is None or (b > window[0] and a < window[1])]


def itl_stats(stamps: Sequence[Sequence[float]], window: tuple[float, float] | None = None) -> dict[str, Any]:
    """Inter-token gaps of every stream, pooled: p50, p99 (None below ``P99_MIN_SAMPLES`` gaps, the lab's
    one percentile rule), max (seconds). ``window`` (start, end): only the gaps that overlap it (a stall that
    began before the long prompt's first token and ended after it counts)."""
    gaps = pooled_gaps(stamps, window)
    if not gaps:
        return {"n": 0, "p50_s": None, "p99_s": None, "max_s": None, "mean_s": None}
    return {"n": len(gaps), "p50_s": percentile(gaps, 50), "p99_s": p99(gaps), "max_s": max(gaps),
            "mean_s": statistics.fmean(gaps)}


def latency_summary(prefix: str, values: Sequence[float], stats: Sequence[str] = LATENCY_STATS) -> dict[str, Any]:
    """``{prefix}_{stat}_s`` for each of ``stats`` (mean, p10, p50, p90, p99) from a ``Measurement`` of ``values``:
    the one latency summary of the load generator, the batching panel and the router's runs. Each is None when
    there are no values; p99 is None below P99_MIN_SAMPLES (``p99``)."""
    known = {"mean", "p10", "p50", "p90", "p99"}
    if not set(stats) <= known:
        raise ValueError(f"stats={list(stats)}: choose from {sorted(known)}")
    if not values:
        return {f"{prefix}_{s}_s": None for s in stats}
    m = Measurement.from_values(prefix, list(values))
    pick = {"mean": m.mean, "p10": m.p10, "p50": m.median, "p90": m.p90}
    return {f"{prefix}_{s}_s": (m.p99 if s == "p99" else pick[s]) for s in stats}


@dataclass
class Measurement:
    """Raw samples of one quantity with its unit; statistics are derived, never stored twice."""

    name: str
    samples: list[float]
    unit: str = "s"
    first: float | None = None  # the first (cold) call, kept apart from the samples
    warmup: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_values(cls, name: str, values: list[float], unit: str = "s", **kw: Any) -> "Measurement":
        if not values:
            raise ValueError(f"{name}: no samples; run at least one repeat")
        return cls(name=name, samples=[float(v) for v in values], unit=unit, **kw)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def p10(self) -> float:
        return percentile(self.samples, 10)

    @property
    def p90(self) -> float:
        return percentile(self.samples, 90)

    @property
    def p99(self) -> float | None:
        """Only with at least P99_MIN_SAMPLES samples (``p99``)."""
        return p99(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative width of the middle 80 %."""
        med = self.median
        return (self.p90 - self.p10) / med if med else float("inf")

    @property
    def noisy(self) -> bool:
        return self.n > 1 and self.spread > SPREAD_LIMIT

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "n": self.n,
            "median": self.median,
            "p10": self.p10,
            "p90": self.p90,
            "p99": self.p99,
            "spread": self.spread,
            "noisy": self.noisy,
            "first": self.first,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "samples": list(self.samples), "warmup": self.warmup, "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        return cls(name=data["name"], samples=list(data["samples"]), unit=data.get("unit", "s"),
                   first=data.get("first"), warmup=data.get("warmup", 0), meta=dict(data.get("meta", {})))

    def warn_if_noisy(self) -> None:
        """Warn of a wide spread only where the load line found other work on the machine (or has not read it):
        on a quiet machine the spread is the workload's own, and the tables' spread column shows it."""
        if self.noisy and machine_busy is not False:
            warnings.warn(f"{self.name}: spread {self.spread:.0%} of the median exceeds {SPREAD_LIMIT:.0%}; close other "
                          "programs or raise the repeat count before trusting the median", stacklevel=2)

    def __repr__(self) -> str:
        flag = "  (noisy)" if self.noisy else ""
        return (f"Measurement({self.name}: median {self.median:.6g} {self.unit}, "
                f"p10 {self.p10:.6g}, p90 {self.p90:.6g}, n={self.n}{flag})")


def measure(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, name: str = "call",
            device: Any = None) -> Measurement:
    """Time ``fn()`` ``repeats`` times after ``warmup`` untimed calls.

    The first call is timed and stored as ``first`` (it pays for lazy initialisation);
    it counts as one of the warmup calls when ``warmup >= 1``.
    """
    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: must be 0 or more")
    first: float | None = None
    for i in range(warmup):
        t0 = now(device)
        fn()
        if i == 0:
            first = now(device) - t0
    samples = []
    for _ in range(repeats):
        t0 = now(device)
        fn()
        samples.append(now(device) - t0)
    if first is None:
        first = samples[0]
    result = Measurement(name=name, samples=samples, unit="s", first=first, warmup=warmup)
    result.warn_if_noisy()
    return result


ORDER_SEED = 0  # rounds() shuffles each round's order with this seed by default: a rerun repeats its order


@dataclass
class Interleaved:
    """Variants timed in rounds, each round in a shuffled order (B A C, A C B, …): drift hits them alike, and round
    i of every variant forms a pair (``order``: who ran when). The baseline ``A`` is timed once more after the last
    round (not a round): ``drift`` is that extra pass over its first."""

    measurements: dict[str, Measurement]
    baseline: str
    drift: float  # the baseline's extra pass after the last round / its first: 1.0 on a steady machine
    order: list[tuple[str, ...]] = field(default_factory=list)  # the order the calls ran in, round by round

    def __getitem__(self, name: str) -> Measurement:
        return self.measurements[name]

    def drift_line(self) -> str:
        change = "steady" if abs(self.drift - 1) <= SPREAD_LIMIT else "drifted"
        return (f"Baseline '{self.baseline}' timed first and again after the last round: last / first = {self.drift:.2f} "
                f"({change}; {self.measurements[self.baseline].n} rounds, each in a shuffled order)")


class Rounds(dict):
    """What ``rounds()`` returns: each call's results by name, one per round, round i at index i (round i of A and
    round i of B form a pair); ``order`` the order the calls ran in each round; ``again`` the baseline's extra pass
    after the last round (not a round: it measures drift), None without one."""

    def __init__(self, done: dict[str, list[Any]], order: list[tuple[str, ...]], baseline: str, again: Any = None):
        super().__init__(done)
        self.order, self.baseline, self.again = order, baseline, again

    def ends(self) -> list[Any]:
        """The baseline's first pass and its extra pass after the last round (drift = last / first); just the first
        when there was no extra pass."""
        first = self[self.baseline][0]
        return [first] if self.again is None else [first, self.again]


def rounds(calls: dict[str, Callable[[], T]], n: int, *, again: bool = True, shuffle: bool = True,
           seed: int = ORDER_SEED) -> Rounds:
    """Each of ``calls`` once per round, ``n`` rounds; what each call returned, by name, round i at index i.

    With ``shuffle`` (the default) each round runs the calls in a random order drawn from ``seed`` (A B, B A, B A,
    A B, …), so over many rounds every order runs about equally often and neither side always runs first, after
    the other's leftovers; without it, in the order given. With ``again`` the first call (the baseline) runs once
    more after the last round: that extra pass, ``Rounds.again``, is not a round, and ``Rounds.ends()`` (first,
    extra) shows how far the machine drifted meanwhile. Interleaving is the one way to compare variants on a machine
    whose load moves: a slowdown mid-way hits every variant alike, and the rounds pair up for
    ``verdict.compare(…, paired=True)``.
    """
    if not calls:
        raise ValueError("rounds() needs at least one call")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"rounds n={n!r}: must be a positive integer")
    rng = random.Random(seed)
    done: dict[str, list[T]] = {name: [] for name in calls}
    order: list[tuple[str, ...]] = []
    for _ in range(n):
        names = list(calls)
        if shuffle:
            rng.shuffle(names)
        order.append(tuple(names))
        for name in names:
            done[name].append(calls[name]())
    first = next(iter(calls))
    return Rounds(done, order, first, calls[first]() if again else None)


def interleave(calls: dict[str, Callable[[], Any]], *, rounds: int, warmup: int = 1, device: Any = None,
               baseline_again: bool = True, shuffle: bool = True, seed: int = ORDER_SEED) -> Interleaved:
    """Time each of ``calls`` once per round, ``rounds`` rounds, each round in a shuffled order (``rounds()``); the
    first call is the baseline, and every variant's samples pair up with the baseline's round by round.

    Each variant gets ``warmup`` untimed calls first. With ``baseline_again`` the baseline is timed once more
    after the last round (not a sample), so ``drift`` says how much the machine moved meanwhile.
    """
    if not calls:
        raise ValueError("interleave() needs at least one call to time")
    if rounds <= 0:
        raise ValueError(f"rounds={rounds}: must be at least 1")
    first: dict[str, float] = {}
    for name, fn in calls.items():
        for i in range(warmup):
            t0 = now(device)
            fn()
            if i == 0:
                first[name] = now(device) - t0

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        def once() -> float:
            t0 = now(device)
            fn()
            return now(device) - t0
        return once

    samples = _rounds({name: timed(fn) for name, fn in calls.items()}, rounds, again=baseline_again, shuffle=shuffle,
                      seed=seed)
    baseline = next(iter(calls))
    out = {name: Measurement(name=name, samples=values, first=first.get(name, values[0]), warmup=warmup,
                             meta={"interleaved": True})
           for name, values in samples.items()}
    for m in out.values():
        m.warn_if_noisy()
    ends = samples.ends()
    return Interleaved(out, baseline, ends[-1] / ends[0], samples.order)


_rounds = rounds  # interleave's keyword ``rounds`` shadows the function inside it


class _Stopwatch:
    def __init__(self) -> None:
        self.start: float = 0.0
        self.seconds: float | None = None


@contextmanager
def track(device: Any = None) -> Iterator[_Stopwatch]:
    """``with track() as t: ...`` then ``t.seconds``: one synchronised interval."""
    watch = _Stopwatch()
    watch.start = now(device)
    yield watch
    watch.seconds = now(device) - watch.start

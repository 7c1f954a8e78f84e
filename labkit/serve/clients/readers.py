"""The ruler held against the field's: four readers of an A/A or A/B trial of interleaved passes.

A trial is a run of rounds through two proxies in front of one server (``ABPasses``): each round one pass through
A and one through B, in a shuffled order, so round i of A and round i of B form a pair; in an A/B trial B's proxy
adds a known delay to every token. ``read`` judges a trial four ways:

    naive      one run each, a difference wherever the first passes' mean TPOTs are ``verdict.TOLERANCE`` apart
    overlap    the old rule: the passes' median TPOTs, a difference where their p10–p90 ranges part
    bootstrap  an interval for the difference of medians over every request of every pass, pooled
    paired     ``verdict.compare(..., paired=True)`` on each round's pass medians: drift cancels within a pair

``real_trials`` cuts a recording into trials, ``resampled_trials`` draws many more from recorded rounds, ``rates``
counts each reader's false positives and detections, ``meets`` asks whether a reader reaches ≤ ``verdict.ALPHA``
false positives and ≥ ``verdict.POWER`` detection, ``reader_table`` lays them out, ``sigma_d`` is the spread of
the A/A pairs' log-ratios that sizes a run (``verdict.pairs_needed``). Notebook 14 and ``bench/trust.py`` run them.
"""
from __future__ import annotations

import contextlib
import os
import random
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ...core import timing, verdict
from ...core.checks import positive
from .. import loadgen
from .delay import SlowProxy

def _tpots(res: loadgen.BenchmarkResult) -> list[float]:
    return [o.tpot_s for o in res.outputs if o.success and o.tpot_s is not None]


READERS = ("naive", "overlap", "bootstrap", "paired")  # the four ways a trial is read, in the order a table shows
READER_NAMES = {"naive": verdict.ONE_RUN_RULE, "overlap": "the p10–p90 overlap rule over the passes' medians",
                "bootstrap": "a bootstrap interval over every request", "paired": "the paired sign-flip test"}


class ABPasses:
    """Passes of one workload through two slow proxies in front of one server: A adds nothing, B adds
    ``per_token_s`` to every token when a call asks (0 for A/A). ``rounds(n)`` runs n rounds, each an A pass and a B
    pass in a shuffled order (``timing.rounds``): round i of A and round i of B ran side by side and form a pair.
    A pass is ``requests`` requests of ``max_tokens`` tokens at ``concurrency`` in flight; what it keeps is every
    request's TPOT. Entering runs one pass through A that is thrown away (the server's caches warm)."""

    def __init__(self, url: str, prompts: Sequence[Any], *, model: str | None, requests: int, max_tokens: int,
                 concurrency: int) -> None:
        positive("requests", requests)
        self.url, self.prompts, self.model = url, prompts, model
        self.requests, self.max_tokens, self.concurrency = requests, max_tokens, concurrency
        self.passes = 0

    def __enter__(self) -> ABPasses:
        self._a, self._b = SlowProxy(self.url), SlowProxy(self.url)
        self._a.__enter__()
        self._b.__enter__()
        self.one(self._a)  # the server's warm-up pass, thrown away (B's proxy only forwards: nothing of it to warm)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._b.__exit__(*exc)
        self._a.__exit__(*exc)

    def one(self, proxy: SlowProxy) -> list[float]:
        res = loadgen.run(proxy.url, self.prompts, num_requests=self.requests, max_concurrency=self.concurrency,
                          max_tokens=self.max_tokens, warmup=0, model=self.model)
        self.passes += 1
        tpots = _tpots(res)
        if not tpots:
            raise RuntimeError(f"a pass of {self.requests} requests through the proxy returned no TPOT "
                               f"({res.failed} failed): is the server up?")
        return tpots

    def rounds(self, n: int, *, per_token_s: float = 0.0, seed: int = 0) -> dict[str, Any]:
        """``n`` rounds; ``{"A": [...], "B": [...], "order": [...]}``, each pass's per-request TPOTs, round i at i."""
        self._b.per_token_s = per_token_s
        done = timing.rounds({"A": lambda: self.one(self._a), "B": lambda: self.one(self._b)}, n, again=False,
                             seed=seed)
        return {"A": done["A"], "B": done["B"], "order": done.order, "per_token_s": per_token_s}


def pass_medians(passes: Sequence[Sequence[float]]) -> list[float]:
    """Each pass's median TPOT: the one statistic a pass gives the paired test and the overlap rule."""
    return [statistics.median(p) for p in passes]


def sigma_d(rec: Mapping[str, Any]) -> float:
    """The spread (standard deviation) of the per-pair log-ratios ln(B_i / A_i) of recorded rounds' pass medians:
    what ``verdict.pairs_needed`` sizes a paired run by."""
    d = verdict.log_ratios(pass_medians(rec["B"]), pass_medians(rec["A"]))
    if len(d) < 2:
        raise ValueError(f"sigma_d needs at least 2 recorded pairs, got {len(d)}")
    return statistics.stdev(d)


def read(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, slow: bool,
         bootstrap: Callable[..., tuple[float, float]] = verdict.bootstrap_diff, resamples: int = 2000
         ) -> dict[str, Any]:
    """One trial read four ways. ``a``, ``b``: each pass's per-request TPOTs, pass i of A and pass i of B from one
    round. A reader "calls" a difference (A/A, ``slow`` False: B better or worse; a slowdown trial: B worse):

    - naive: the first pass each, mean TPOT, ``verdict.one_run_each`` (a 2 % step, whatever the noise);
    - overlap: the old rule, unpaired ``verdict.compare`` of the passes' median TPOTs (p10–p90 ranges apart);
    - bootstrap: ``bootstrap`` interval for median(B) − median(A) over every request of every pass leaves out 0
      (a slowdown: lies above 0);
    - paired: ``verdict.compare(..., paired=True)`` of the passes' medians, round by round."""
    def called(kind: str) -> bool:
        return kind == verdict.WORSE if slow else kind in (verdict.BETTER, verdict.WORSE)

    naive = verdict.one_run_each(statistics.mean(b[0]), statistics.mean(a[0]), higher_is_better=False)
    med_a, med_b = pass_medians(a), pass_medians(b)
    overlap = verdict.compare(med_b, med_a, higher_is_better=False)
    paired = verdict.compare(med_b, med_a, paired=True, higher_is_better=False)
    lo, hi = bootstrap([x for p in b for x in p], [x for p in a for x in p], resamples=resamples)
    return {"pairs": len(a), "naive": called(naive.kind), "naive_ratio": naive.ratio,
            "overlap": called(overlap.kind), "overlap_kind": overlap.kind, "paired": called(paired.kind),
            "paired_kind": paired.kind, "paired_ratio": paired.ratio, "paired_p": paired.p,
            "bootstrap": lo > 0 if slow else (lo > 0 or hi < 0), "ci_s": (lo, hi)}


def real_trials(rec: Mapping[str, Any], pairs: int, *, slow: bool,
                bootstrap: Callable[..., tuple[float, float]] = verdict.bootstrap_diff) -> list[dict[str, Any]]:
    """The recorded rounds cut into consecutive trials of ``pairs`` rounds each (a rest shorter than ``pairs`` is
    left out), each read by ``read``."""
    positive("pairs", pairs)
    rows = []
    for t in range(len(rec["A"]) // pairs):
        block = slice(t * pairs, (t + 1) * pairs)
        rows.append({"trial": "A/B" if slow else "A/A", "source": "real", "index": t,
                     **read(rec["A"][block], rec["B"][block], slow=slow, bootstrap=bootstrap)})
    return rows


@contextlib.contextmanager
def _unlogged() -> Iterator[None]:
    """Resampled trials simulate the readers; they are not comparisons the run states, so the verdict log
    (``verdict.LOG_ENV``) does not count them."""
    was = os.environ.pop(verdict.LOG_ENV, None)
    try:
        yield
    finally:
        if was is not None:
            os.environ[verdict.LOG_ENV] = was


def resampled_trials(rec: Mapping[str, Any], *, pairs: int, trials: int, per_token_s: float, seed: int = 0,
                     bootstrap: Callable[..., tuple[float, float]] = verdict.bootstrap_diff, resamples: int = 400
                     ) -> list[dict[str, Any]]:
    """``trials`` A/A and ``trials`` slowdown trials of ``pairs`` pairs each, drawn from recorded A/A rounds:
    each pair one recorded round (its two passes, which ran side by side; distinct rounds, unless a trial needs more
    pairs than were recorded: then drawn with replacement), its two passes given the labels A and B at random: in
    an A/A round which side is called A is arbitrary, and keeping the recorded labels would draw the recording's
    own chance mean difference into every trial, as if it were real (a trial drawn from the recording must sample
    "no difference", as the test's null does). A slowdown trial adds
    ``per_token_s`` to every request's TPOT on the B side, as the proxy adds it to every gap between tokens. Each
    trial read by ``read`` (the bootstrap with ``resamples`` resamples, to keep it quick)."""
    positive("pairs", pairs)
    positive("trials", trials)
    rng = random.Random(seed)
    n = len(rec["A"])
    rows = []
    with _unlogged():
        for kind, slow in (("A/A", False), ("A/B", True)):
            for t in range(trials):
                idx = rng.sample(range(n), pairs) if pairs <= n else [rng.randrange(n) for _ in range(pairs)]
                drawn = [(rec["A"][i], rec["B"][i]) if rng.random() < 0.5 else (rec["B"][i], rec["A"][i])
                         for i in idx]
                a = [first for first, _ in drawn]
                b = [[x + (per_token_s if slow else 0.0) for x in second] for _, second in drawn]
                rows.append({"trial": kind, "source": "resampled", "index": t,
                             **read(a, b, slow=slow, bootstrap=bootstrap, resamples=resamples)})
    return rows


def rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per reader: the share of A/A trials where it called a difference (false positives) and the share of A/B
    trials where it called the slowdown (detection); None where there was no trial of that kind."""
    out = {}
    for reader in READERS:
        aa = [r[reader] for r in rows if r["trial"] == "A/A"]
        ab = [r[reader] for r in rows if r["trial"] == "A/B"]
        out[reader] = {"aa_false_positive_rate": sum(aa) / len(aa) if aa else None,
                       "slowdown_detection_rate": sum(ab) / len(ab) if ab else None}
    return out


def meets(r: Mapping[str, float | None]) -> bool:
    """Whether a reader's rates meet the goal a paired run is sized for: false positives at most ``verdict.ALPHA``
    and detection at least ``verdict.POWER``."""
    fp, det = r["aa_false_positive_rate"], r["slowdown_detection_rate"]
    if fp is None or det is None:
        return False
    return fp <= verdict.ALPHA and det >= verdict.POWER  # fact: shares of trials against the test's own α and power


def reader_table(real: Sequence[Mapping[str, Any]], resampled: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per reader: its rates on real trials and on resampled ones, and whether it meets the goal (``meets``)
    on the resampled trials (the many) and, where there were real trials of both kinds, on the real ones too."""
    on_real, on_resampled = rates(real), rates(resampled)
    rows = []
    for reader in READERS:
        rr, rs = on_real[reader], on_resampled[reader]
        has_real = rr["aa_false_positive_rate"] is not None and rr["slowdown_detection_rate"] is not None
        rows.append({"reader": reader, "rule": READER_NAMES[reader],
                     "aa_fp_real": rr["aa_false_positive_rate"], "detected_real": rr["slowdown_detection_rate"],
                     "aa_fp_resampled": rs["aa_false_positive_rate"],
                     "detected_resampled": rs["slowdown_detection_rate"],
                     "meets_goal": meets(rs) and (meets(rr) or not has_real)})
    return rows

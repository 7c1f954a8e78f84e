"""Notebook 14's runs (can you trust this benchmark?), shared with ``bench/trust.py``.

    clients_on_one_server  the benchmark clients (labkit's loadgen, vllm bench serve, AIPerf, GuideLLM) on one
                   request set against one server, interleaved rounds, each client held to chosen cores, each run of
                   another client between two of labkit's (the anchor); ``client_tables`` their own figures and the
                   aligned ones, ``anchored`` each client against its anchor runs, pair by pair
    aa_ab          A/A and A/B trials of interleaved passes through two slow proxies (``serve.clients.readers``), real
                   and resampled from the recorded passes: how often four readers (one run each, the overlap rule, a
                   request bootstrap, the paired test) call a difference, with none there and with a known delay
    loops          closed loop (a concurrency cap) against open loop (Poisson at the same mean rate); short against
                   long answers under the cap; the first request after an idle gap against warm ones
    vllm_batch_divergence  one prompt's greedy answer from ``vllm serve`` alone and among others sent at once
    shared_cores   the clients again on the server's own core: their CPU share between first request and last
                   response (start-up apart, `startup_cpu`), and how far the server's figures move
    loadgen_rates  MLPerf LoadGen's Offline run, then Server at fractions and multiples of the rate it sustained

A run orchestrates: requests go through ``serve.client``, ``serve.loadgen`` or the clients' own programs.
"""
from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import timing, verdict
from ...core.checks import positive
from ...core.timing import percentile
from ...decoding import invariance, quality
from ...model import models
from ...serve import client, loadgen
from ...serve.clients import align, mlperf, outside
from ...serve.clients.readers import ABPasses, rates, reader_table, real_trials, resampled_trials, sigma_d
from ...serve.vllm import server as vs

LG_FACTORS = (0.4, 2.0)  # LoadGen's Server runs: these multiples of the rate Offline sustained (at 0.5 the TPOT tail
# sat at the rescaled limit here, and early stopping asked for more queries)


# ------------------------------------------------------------------------------------------- the clients


SERVER_TPOT = "server_tpot_mean_s"  # the server's own mean TPOT over a client's run (its /metrics before and after)


class ClientPasses(dict):
    """What ``clients_on_one_server`` returns: each client's runs by name, in the order they ran; ``anchor``, the
    client every other one is paired with (None: no pairing); ``anchor_of[name][i]``, the index of the anchor's run
    just before ``name``'s run i, and ``anchor_after[name][i]`` of the one just after (None where that run failed or
    none ran); ``order``, the runs in turn; ``server_tpot[name][i]``, the server's own mean TPOT over run i."""

    def __init__(self, runs: dict[str, list[outside.ClientRun]], anchor: str | None = None,
                 anchor_of: dict[str, list[int | None]] | None = None, order: list[str] | None = None,
                 anchor_after: dict[str, list[int | None]] | None = None,
                 server_tpot: dict[str, list[float | None]] | None = None) -> None:
        super().__init__(runs)
        self.anchor, self.anchor_of, self.order = anchor, anchor_of or {}, order or []
        self.anchor_after, self.server_tpot = anchor_after or {}, server_tpot or {}

    def brackets(self, name: str) -> list[tuple[int, list[int]]]:
        """Client ``name``'s pairs: its run i and the anchor's runs either side of it that succeeded (before, then
        after; one where the other failed or never ran). Runs with neither are left out."""
        before = self.anchor_of.get(name) or []
        after = [*(self.anchor_after.get(name) or []), *[None] * len(before)]
        sides = ([x for x in (j, k) if x is not None] for j, k in zip(before, after))
        return [(i, s) for i, s in enumerate(sides) if s]


def clients_on_one_server(url: str, w: loadgen.Workload, folder: Path, *,
                          clients: Sequence[str] = tuple(outside.CLIENTS), rounds: int = 1,
                          cores: set[int] | None = None, timeout_s: float = 300.0,
                          on_run: Callable[[outside.ClientRun], None] | None = None, anchor: str | None = None,
                          seed: int = timing.ORDER_SEED, scrape: Callable[[], Any] | None = None) -> ClientPasses:
    """Each of ``clients`` once per round, in turn (interleaved: a machine that slows down mid-way slows them all),
    each in a folder of its own; a client that failed once is not run again. With ``anchor`` (one of ``clients``,
    e.g. "labkit"), each round runs the others in a shuffled order (``seed``), the anchor before each of them and once
    more at the end: every other client's run sits between two anchor runs, its pair's two sides
    (``ClientPasses.brackets``), so a drift that runs steadily through the three cancels. ``scrape``: the server's
    ``/metrics`` (``serve.metrics.scrape``), read before and after each run for its own mean TPOT over it."""
    runs: dict[str, list[outside.ClientRun]] = {c: [] for c in clients}
    order: list[str] = []
    server: dict[str, list[float | None]] = {c: [] for c in clients}

    def go(c: str, where: Path) -> outside.ClientRun:
        before = _scraped(scrape)
        run = outside.run(c, url, w, where, cores=cores, timeout_s=timeout_s)
        server[c].append(_server_tpot(before, _scraped(scrape), run))
        runs[c].append(run)
        order.append(c)
        if on_run is not None:
            on_run(run)
        return run

    if anchor is None:
        for r in range(rounds):
            for c in clients:
                if not runs[c] or runs[c][-1].ok:
                    go(c, folder / f"round{r}")
        return ClientPasses(runs, order=order, server_tpot=server)
    if anchor not in clients:
        raise ValueError(f"anchor {anchor!r} is not one of the clients {list(clients)}")
    others = [c for c in clients if c != anchor]
    anchor_of: dict[str, list[int | None]] = {c: [] for c in others}
    anchor_after: dict[str, list[int | None]] = {c: [] for c in others}
    rng = random.Random(seed)
    waiting: str | None = None  # the client whose run still waits for the anchor run after it

    def go_anchor(where: Path) -> int | None:
        beside = go(anchor, where)
        j = len(runs[anchor]) - 1 if beside.ok else None
        if waiting is not None:
            anchor_after[waiting].append(j)
        return j

    for r in range(rounds):
        turn = list(others)
        rng.shuffle(turn)
        for c in turn:
            if runs[c] and not runs[c][-1].ok:
                continue
            anchor_of[c].append(go_anchor(folder / f"round{r}-{anchor}-before-{c}"))
            go(c, folder / f"round{r}")
            waiting = c
    if waiting is not None and runs[waiting][-1].ok:
        go_anchor(folder / f"round{rounds - 1}-{anchor}-last")
    return ClientPasses(runs, anchor, anchor_of, order, anchor_after, server)


def _scraped(scrape: Callable[[], Any] | None) -> Any:
    try:
        return scrape() if scrape else None
    except (OSError, ValueError):  # /metrics did not answer: this run has no server figure, and the runs go on
        return None


def _server_tpot(before: Any, after: Any, run: outside.ClientRun) -> float | None:
    """The server's own mean TPOT over one client run (``vs.server_view``), only where its TPOT histogram counted
    exactly the run's own answered requests (not a client's extra test request, nor a record the client lost)."""
    if before is None or after is None:
        return None
    tpot = vs.server_view(before, after)["tpot"]
    return tpot.get("mean_s") if tpot.get("count") == sum(o.success for o in run.outputs) else None


def anchored(runs: ClientPasses, align_fn: Callable[[Sequence[Mapping[str, float]]], Mapping[str, Any]] = align.aligned,
             metrics: Sequence[str] = ("ttft_p50_s", *align.JUDGED, SERVER_TPOT)) -> dict[str, Any]:
    """Each client against the anchor's runs either side of it, under one definition (``align_fn``): per pair, the
    client's aligned figure over the geometric mean of the anchor's two (its one, where the other failed); a client's
    deviation is the median of its pairs' ratios, minus 1. One spread measure for everyone, its pass-to-pass range:
    the largest of a client's per-pair ratios minus the smallest (None with fewer than 2 pairs); the anchor's own
    range from its consecutive runs (run k + 1 over run k). ``max``: the largest deviation on ``align.JUDGED``
    (TPOT, tokens/s), with its client and metric. ``SERVER_TPOT``: the server's own mean TPOT over each run, where
    the runs were made with ``scrape``; ``beyond_server``: per pair, the client's TPOT ratio over the server's, what
    the client's own clock added to what the server itself did."""
    if runs.anchor is None:
        raise ValueError("anchored() needs runs made with an anchor (clients_on_one_server(..., anchor='labkit'))")
    server = {name: [*(runs.server_tpot.get(name) or []), *[None] * len(rs)] for name, rs in runs.items()}
    figures = {name: [{**align_fn(align.stamps(r.outputs)), SERVER_TPOT: srv} if r.ok else None
                      for r, srv in zip(rs, server[name])] for name, rs in runs.items()}

    def spread(ratios: Sequence[float]) -> float | None:
        return max(ratios) - min(ratios) if len(ratios) >= 2 else None

    def ratio(c: Mapping[str, Any], sides: Sequence[Mapping[str, Any]], m: str) -> float | None:
        ok = c.get(m) and all(a.get(m) for a in sides)
        return c[m] / statistics.geometric_mean([a[m] for a in sides]) if ok else None

    per: dict[str, dict[str, Any]] = {}
    found = [{"value": 0.0, "client": None, "metric": None}]
    for name in runs.anchor_of:
        pairs = [(figures[name][i], [figures[runs.anchor][j] for j in sides]) for i, sides in runs.brackets(name)
                 if figures[name][i] is not None]
        row: dict[str, Any] = {"pairs": len(pairs)}
        for m in metrics:
            ratios = [r for c, sides in pairs if (r := ratio(c, sides, m)) is not None]
            row[m] = {"deviation": statistics.median(ratios) - 1 if ratios else None, "range": spread(ratios),
                      "ratios": ratios}
            if ratios and m in align.JUDGED:
                found.append({"value": row[m]["deviation"], "client": name, "metric": m})
        beyond = [t / v for c, sides in pairs
                  if (t := ratio(c, sides, "tpot_p50_s")) and (v := ratio(c, sides, SERVER_TPOT))]
        row["beyond_server"] = {"deviation": statistics.median(beyond) - 1, "ratios": beyond} if beyond else None
        per[name] = row
    own = [f for f in figures[runs.anchor] if f is not None]
    per[runs.anchor] = {"pairs": max(len(own) - 1, 0), **{
        m: {"deviation": 0.0 if own else None, "range": spread(ratios), "ratios": ratios}
        for m in metrics for ratios in [[b[m] / a[m] for a, b in zip(own, own[1:]) if a.get(m) and b.get(m)]]}}
    return {"anchor": runs.anchor, "per_client": per, "max": max(found, key=lambda f: abs(f["value"]))}


def _wave_tpots(records: Sequence[Mapping[str, float]], concurrency: int) -> list[float]:
    """A pass's waves (``concurrency`` consecutive requests by start time), each its median TPOT (aligned)."""
    recs = sorted(records, key=lambda x: x["start_s"])
    return [statistics.median(w) for i in range(0, len(recs), concurrency)
            if (w := align.tpots(recs[i:i + concurrency]))]


def waves(runs: Sequence[outside.ClientRun], concurrency: int) -> dict[str, Any]:
    """Why two passes of one client differ: a closed loop of equal-length answers runs its requests in waves of
    ``concurrency`` (consecutive by start time), and the server's pace moves from wave to wave. Per pass, the waves'
    median TPOT (aligned definition), their largest ÷ smallest − 1; ``range`` is its median over the passes, ``waves``
    the waves in a pass (the independent figures a pass's p50 rests on)."""
    positive("concurrency", concurrency)
    per_pass = [m for m in (_wave_tpots(align.stamps(r.outputs) if r.ok else [], concurrency) for r in runs)
                if len(m) >= 2]
    return {"passes": len(per_pass), "waves": statistics.median(map(len, per_pass)) if per_pass else None,
            "range": statistics.median(max(m) / min(m) - 1 for m in per_pass) if per_pass else None}


def first_waves(runs: ClientPasses, concurrency: int) -> dict[str, dict[str, Any]]:
    """Where in a pass a client's residual sits: per client, over its pairs (``anchored``'s, the anchor's figure the
    geometric mean of its runs either side), the median of (its first wave's TPOT ÷ the anchor's first wave's) and of
    (its later waves' median TPOT ÷ the anchor's): an effect that starts with the pass (the client's own start-up
    still running, a server idle while the client started) shows in the first wave alone; one that lasts, in both."""
    positive("concurrency", concurrency)

    def split(records: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
        w = _wave_tpots(records, concurrency)
        return {"first": w[0] if w else None, "later": statistics.median(w[1:]) if len(w) >= 2 else None}

    per = anchored(runs, split, metrics=("first", "later"))["per_client"]
    return {name: {"pairs": len(per[name]["first"]["ratios"]),
                   **{k: statistics.median(r) if (r := per[name][k]["ratios"]) else None for k in ("first", "later")}}
            for name in runs.anchor_of}


def anchored_row(a: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One client's row of ``anchored``: its pairs, and per figure its deviation from the anchor and its range."""
    row = a["per_client"].get(name) or {}
    out: dict[str, Any] = {"pairs": row.get("pairs")}
    for m, short in (("ttft_p50_s", "ttft"), ("tpot_p50_s", "tpot"), ("output_tokens_per_s", "tokens_per_s"),
                     (SERVER_TPOT, "server_tpot")):
        fig = row.get(m) or {}
        out[f"{short}_vs_{a['anchor']}"] = fig.get("deviation")
        out[f"{short}_range"] = fig.get("range")
    out["tpot_beyond_server"] = (row.get("beyond_server") or {}).get("deviation")  # the client's clock, server apart
    return out


def _median_of(dicts: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [d[key] for d in dicts if d.get(key) is not None]
    return statistics.median(values) if values else None


def client_tables(runs: Mapping[str, Sequence[outside.ClientRun]],
                  align_fn: Callable[[Sequence[Mapping[str, float]]], Mapping[str, Any]] = align.aligned
                  ) -> dict[str, Any]:
    """The clients' own figures (``raw``: median over rounds, with each one's definition and CPU time) and the same
    runs under one definition (``aligned``, through ``align_fn``: the learner's or the reference), the aligned
    figures' deviation from the clients' median, and the raw ones' (what a reader comparing the clients' own
    reports would see)."""
    raw, aligned = [], {}
    for name, rs in runs.items():
        ok = [r for r in rs if r.ok]
        if not ok:
            row = rs[-1].row() if rs else {"client": name}
            raw.append({**row, "rounds": 0})
            continue
        row = ok[-1].row()
        for k in outside.HEADLINE:
            row[k] = _median_of([r.reported for r in ok], k)
        row.update(cpu_s=_median_of([vars(r) for r in ok], "cpu_s"), wall_s=_median_of([vars(r) for r in ok], "wall_s"),
                   rounds=len(ok))
        raw.append(row)
        per_round = [dict(align_fn(align.stamps(r.outputs))) for r in ok]
        aligned[name] = {k: _median_of(per_round, k) for k in (*align.ALIGNED, "requests")}
    reported = {r["client"]: r for r in raw if r.get("rounds")}
    return {"raw": raw, "aligned": aligned, "aligned_deviation": align.deviation(aligned),
            "raw_deviation": align.deviation(reported)}


def cpu_share(runs: Mapping[str, Sequence[outside.ClientRun]]) -> dict[str, float | None]:
    """Each client's CPU seconds per second between its first request and its last response (1.0: one core kept
    busy; its start-up is ``startup_cpu``'s), median over its rounds; None where its records give no times."""
    out = {}
    for name, rs in runs.items():
        shares = [r.run_cpu_s / r.run_wall_s for r in rs if r.ok and r.run_cpu_s is not None and r.run_wall_s]
        out[name] = statistics.median(shares) if shares else None
    return out


def startup_cpu(runs: Mapping[str, Sequence[outside.ClientRun]]) -> dict[str, float | None]:
    """Each client's CPU seconds from its start to its first request (imports, its services, a warm-up request),
    median over its rounds: paid once per run, whatever the run's length."""
    return {name: _median_of([vars(r) for r in rs if r.ok], "startup_cpu_s") for name, rs in runs.items()}



# ------------------------------------------------------------------------------------------- A/A and A/B


def aa_ab(url: str, prompts: Sequence[Any], *, model: str | None, aa_trials: int, pairs: int, slowdown: float,
          requests: int, max_tokens: int, concurrency: int, ab_trials: int | None = None,
          ab_pairs: Callable[[float, float], int] | int | None = None, max_ab_pairs: int | None = None,
          resampled: int = 200, bootstrap: Callable[..., tuple[float, float]] = verdict.bootstrap_diff,
          resamples: int = 400, on_sized: Callable[[Mapping[str, Any]], None] | None = None) -> dict[str, Any]:
    """A/A, then A/B with a known slowdown, read by four readers (``read``), on real trials and resampled ones.

    1. ``aa_trials`` × ``pairs`` interleaved A/A rounds (``ABPasses``): the recording. Its A passes' median TPOT
       sets the slowdown, ``per_token_s`` = ``slowdown`` × that; σ_d comes from its pairs (``sigma_d``).
    2. The pairs a paired test needs for that slowdown: ``ab_pairs(sigma_d, change)`` (the learner's t formula, or
       ``verdict.pairs_needed``), or a number; at most ``max_ab_pairs`` (what the run can afford), at least
       ``verdict.MIN_PAIRS``.
    3. ``ab_trials`` (default ``aa_trials``) A/B trials of that many rounds, B slowed.
    4. ``resampled`` A/A and as many slowdown trials of that many pairs, drawn from the recording (their bootstrap
       with ``resamples`` resamples a trial).

    The real A/A trials are the recording cut into trials of ``pairs`` rounds."""
    positive("aa_trials", aa_trials)
    ab_trials = aa_trials if ab_trials is None else ab_trials
    with ABPasses(url, prompts, model=model, requests=requests, max_tokens=max_tokens,
                  concurrency=concurrency) as ab:
        rec = ab.rounds(aa_trials * pairs, seed=1)
        tpot_a = statistics.median(x for p in rec["A"] for x in p)
        per_token_s = slowdown * tpot_a
        sd = sigma_d(rec)
        needed = (ab_pairs(sd, slowdown) if callable(ab_pairs) else ab_pairs) or verdict.pairs_needed(sd, slowdown)
        run_pairs = max(verdict.MIN_PAIRS, needed if max_ab_pairs is None else min(needed, max_ab_pairs))
        afforded = run_pairs >= needed  # fact: a count of pairs against a count of pairs
        sized = {"sigma_d": sd, "needed": needed, "pairs": run_pairs, "afforded": afforded,
                 "per_token_s": per_token_s, "tpot_a_s": tpot_a, "change": slowdown}
        if on_sized is not None:
            on_sized(sized)
        slow = ab.rounds(ab_trials * run_pairs, per_token_s=per_token_s, seed=2)
        passes = ab.passes
    real = real_trials(rec, pairs, slow=False, bootstrap=bootstrap) + \
        real_trials(slow, run_pairs, slow=True, bootstrap=bootstrap)
    drawn = resampled_trials(rec, pairs=run_pairs, trials=resampled, per_token_s=per_token_s,
                             bootstrap=bootstrap, resamples=resamples) if resampled else []
    tpot_b = statistics.median(x for p in slow["B"] for x in p)
    return {"rows": real, "resampled_rows": drawn, "rates": rates(real), "resampled_rates": rates(drawn),
            "table": reader_table(real, drawn), "aa_trials": aa_trials, "ab_trials": ab_trials,
            "aa_pairs": pairs, **sized, "resampled_trials": resampled, "recorded_rounds": len(rec["A"]),
            "slowdown_share": per_token_s / tpot_a, "measured_slowdown": tpot_b / statistics.median(
                x for p in slow["A"] for x in p) - 1, "requests_per_pass": requests, "tokens_per_request": max_tokens,
            "passes": passes, "recording": rec}


# ------------------------------------------------------------------------------------------- open and closed loop


def _ttfts(res: loadgen.BenchmarkResult) -> list[float]:
    return [o.ttft_s for o in res.outputs if o.success]


def loops(url: str, prompts: Sequence[Any], *, model: str | None, requests: int, concurrency: int,
          max_tokens: int, long_tokens: int, idle_s: float, warm_requests: int = 3) -> dict[str, Any]:
    """Closed loop (at most ``concurrency`` in flight) against open loop (Poisson arrivals at the closed loop's
    measured request rate), their TTFTs; the closed loop with ``long_tokens`` answers against ``max_tokens`` ones;
    one request after ``idle_s`` of silence against ``warm_requests`` sent back to back."""
    def run(**kw: Any) -> loadgen.BenchmarkResult:
        return loadgen.run(url, prompts, num_requests=requests, warmup=0, model=model, **kw)

    closed = run(max_concurrency=concurrency, max_tokens=max_tokens)
    rate = closed.summary()["request_throughput"]
    opened = run(request_rate=rate, max_tokens=max_tokens, seed=1)
    closed_long = run(max_concurrency=concurrency, max_tokens=long_tokens)
    warm = loadgen.run(url, prompts[:1], num_requests=warm_requests, max_concurrency=1, max_tokens=2, warmup=0,
                       model=model)
    time.sleep(idle_s)
    cold = loadgen.run(url, prompts[:1], num_requests=1, max_tokens=2, warmup=0, model=model)

    def dist(res: loadgen.BenchmarkResult) -> dict[str, Any]:
        t = _ttfts(res)
        return {"ttft_s": t, "ttft_p50_s": percentile(t, 50) if t else None,
                "ttft_p90_s": percentile(t, 90) if t else None, "failed": res.failed}

    return {"rate_per_s": rate, "closed": dist(closed), "open": dist(opened),
            "closed_long": dist(closed_long), "tokens": (max_tokens, long_tokens), "concurrency": concurrency,
            "warm_ttft_s": _ttfts(warm), "idle_s": idle_s, "after_idle_ttft_s": _ttfts(cold)}


# ------------------------------------------------------------------------------------------- vLLM batches


def vllm_batch_divergence(url: str, prompts: Sequence[Sequence[int]], *, batches: Sequence[int] = (2, 4, 8),
                          targets: Sequence[int] = (0,), max_tokens: int = 32) -> list[dict[str, Any]]:
    """Each target prompt's greedy answer (token ids) from the server alone, then sent at once with the next
    ``batch - 1`` prompts (the server batches what arrives together): the first position that differs. Every request
    carries a cache salt of its own, so no run reads another's cached prefix (a cached prefix is computed differently
    too)."""
    rows = []
    for t in targets:
        (alone,), _ = client.send_ids(url, [prompts[t]], max_tokens, 1, salts=[f"alone-{t}"])
        for b in batches:
            batch = [prompts[(t + i) % len(prompts)] for i in range(b)]
            outs, _ = client.send_ids(url, batch, max_tokens, b, salts=[f"b{b}-{t}-{i}" for i in range(b)])
            d = quality.divergence(alone.token_ids, outs[0].token_ids)
            rows.append({"target": t, "batch": b, "first_difference": d.position,
                         "ok": alone.success and outs[0].success, "alone": alone.token_ids,
                         "in_batch": outs[0].token_ids})
    return rows


def divergence_beside_vllm(model_path: str | Path, model: Any, pad_id: int, prompts: Sequence[Sequence[int]], *,
                           batches: Sequence[int], targets: Sequence[int], max_tokens: int, vllm_bf16: bool
                           ) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """The batch-divergence rows after vLLM's fp32 server has had its turn (``vllm_batch_divergence``): ``vllm_bf16``,
    a second ``vllm serve`` start in bf16 (one start more: full mode and the bench script); then the lab's engine
    on ``model`` (fp32) and on the default model loaded in bf16 (``invariance.batch_divergence``). Rows by label, and
    why vLLM bf16 is missing ('' when it ran or was not asked for)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    missing = ""
    if vllm_bf16:
        try:
            with vs.serve(vs.Settings(model=str(model_path), device=vs.default_device(), dtype="bfloat16",
                                      max_num_seqs=8)) as srv16:
                rows["vLLM bf16"] = vllm_batch_divergence(srv16.url, prompts, batches=batches, targets=targets,
                                                          max_tokens=max_tokens)
        except (vs.VLLMUnavailable, vs.VLLMStartError) as exc:
            missing = f"vllm serve in bf16 did not start: {exc}"
    for dtype in ("fp32", "bf16"):
        lab = model if dtype == "fp32" else models.load(dtype="bf16").model
        rows[f"lab engine {dtype}"] = invariance.batch_divergence(lab, prompts, pad_id, batches=batches,
                                                                  targets=targets, new_tokens=max_tokens)
    return rows, missing


# ------------------------------------------------------------------------------------------- shared cores, LoadGen


def shared_cores(url: str, w: loadgen.Workload, folder: Path, tables: Mapping[str, Any],
                 pinned: Mapping[str, Sequence[outside.ClientRun]], *, server_cores: set[int],
                 clients: Sequence[str] = ("labkit", "AIPerf"),
                 align_fn: Callable[[Sequence[Mapping[str, float]]], Mapping[str, Any]] = align.aligned
                 ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``clients`` again, each held to the server's own cores (``server_cores``) instead of a core of its own: the
    server keeps what it had, less what the client takes. Each client's CPU share and aligned figures, on a core of its
    own against on the server's; and the busiest client's move in p50 TPOT."""
    cost, startup = cpu_share(pinned), startup_cpu(pinned)
    both = clients_on_one_server(url, w, folder, clients=clients, cores=server_cores)
    shared_cost = cpu_share(both)
    rows = []
    for name, rs in both.items():
        alone = tables["aligned"].get(name) or {}
        together = dict(align_fn(align.stamps(rs[-1].outputs))) if rs and rs[-1].ok else {}
        rows.append({"client": name, "startup_cpu_s": startup.get(name), "cpu_share_own_core": cost.get(name),
                     "cpu_share_server_core": shared_cost.get(name), "tpot_p50_own_core_s": alone.get("tpot_p50_s"),
                     "tpot_p50_server_core_s": together.get("tpot_p50_s"),
                     "tokens_per_s_own_core": alone.get("output_tokens_per_s"),
                     "tokens_per_s_server_core": together.get("output_tokens_per_s")})
    judged = [r for r in rows if r["tpot_p50_server_core_s"] and r["tpot_p50_own_core_s"]]
    busiest = max(judged, key=lambda r: r["cpu_share_own_core"] or 0, default=None)
    moved = None if busiest is None else {
        "client": busiest["client"],
        "tpot_moved": busiest["tpot_p50_server_core_s"] / busiest["tpot_p50_own_core_s"] - 1,
        "tokens_per_s_moved": busiest["tokens_per_s_server_core"] / busiest["tokens_per_s_own_core"] - 1}
    return rows, moved


def loadgen_rates(url: str, model: str, prompts: Sequence[str], folder: Path, *, tpot_s: float, queries: int,
                  tokens: int, min_duration_s: float, report: mlperf.Report = mlperf.report,
                  factors: Sequence[float] = LG_FACTORS) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """MLPerf LoadGen over ``url``: Offline first (the rate the server sustains, from its "Samples per second"), then
    Server at each of ``factors`` × that rate, under ``mlperf.limits(tpot_s)``. One summary row per run."""
    limits = mlperf.limits(tpot_s)
    common = dict(max_tokens=tokens, ttft_s=limits["ttft_s"], tpot_s=limits["tpot_s"], min_duration_s=min_duration_s,
                  min_queries=queries, report=report)
    offline = mlperf.run(url, model, prompts, folder / "lg_offline", scenario="Offline", qps=8.0, **common)
    rows = [offline.row()]
    capacity = float(offline.lines.get("Samples per second") or 0)
    for factor in factors if capacity > 0 else ():
        rows.append(mlperf.run(url, model, prompts, folder / f"lg_server_{factor:g}", scenario="Server",
                               qps=factor * capacity, **common).row())
    return rows, limits

"""Notebook 14's runs (can you trust this benchmark?), shared with ``bench/trust.py``.

    clients_on_one_server  the benchmark clients (labkit's loadgen, vllm bench serve, AIPerf, GuideLLM) on one
                   request set against one server, interleaved rounds, each client held to chosen cores;
                   ``client_tables`` their own figures and the aligned ones
    server_view    vLLM's own histograms of TTFT, TPOT and inter-token time over a run (``/metrics`` before and after)
    aa_ab          A/A and A/B trials through two slow proxies: how often one-run-each means, labkit's verdict and the
                   bootstrap interval call a difference, with none there and with a known per-token delay
    loops          closed loop (a concurrency cap) against open loop (Poisson at the same mean rate); short against
                   long answers under the cap; the first request after an idle gap against warm ones
    vllm_batch_divergence  one prompt's greedy answer from ``vllm serve`` alone and among others sent at once
    shared_cores   the clients again on the server's own core: their CPU share, and how far the server's figures move
    loadgen_rates  MLPerf LoadGen's Offline run, then Server at fractions and multiples of the rate it sustained

A run orchestrates: requests go through ``serve.client``, ``serve.loadgen`` or the clients' own programs.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import verdict
from ...core.checks import positive
from ...core.timing import percentile
from ...decoding import invariance, quality
from ...model import models
from ...serve import client, loadgen, metrics
from ...serve.clients import align, mlperf, outside
from ...serve.clients.delay import SlowProxy
from ...serve.vllm import server as vs

LG_FACTORS = (0.4, 2.0)  # LoadGen's Server runs: these multiples of the rate Offline sustained (at 0.5 the TPOT tail
# sat at the rescaled limit here, and early stopping asked for more queries)


# ------------------------------------------------------------------------------------------- the clients


def clients_on_one_server(url: str, w: loadgen.Workload, folder: Path, *,
                          clients: Sequence[str] = tuple(outside.CLIENTS), rounds: int = 1,
                          cores: set[int] | None = None, timeout_s: float = 300.0,
                          on_run: Callable[[outside.ClientRun], None] | None = None
                          ) -> dict[str, list[outside.ClientRun]]:
    """Each of ``clients`` once per round, in turn (interleaved: a machine that slows down mid-way slows them all),
    each in a folder of its own per round; a client that failed once is not run again."""
    runs: dict[str, list[outside.ClientRun]] = {c: [] for c in clients}
    for r in range(rounds):
        for c in clients:
            if runs[c] and not runs[c][-1].ok:
                continue
            run = outside.run(c, url, w, folder / f"round{r}", cores=cores, timeout_s=timeout_s)
            runs[c].append(run)
            if on_run is not None:
                on_run(run)
    return runs


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
    """Each client's CPU seconds per second of its run (1.0: one core kept busy), median over its rounds."""
    out = {}
    for name, rs in runs.items():
        shares = [r.cpu_s / r.wall_s for r in rs if r.ok and r.cpu_s is not None and r.wall_s]
        out[name] = statistics.median(shares) if shares else None
    return out


# ------------------------------------------------------------------------------------------- the server's view

SERVER_HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "tpot": "vllm:request_time_per_output_token_seconds",
                     "itl": "vllm:inter_token_latency_seconds"}


def server_view(before: Sequence[tuple[str, dict[str, str], float]],
                after: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    """vLLM's histograms over what happened between two scrapes: per quantity, requests (or gaps) counted, the mean
    (exact: sum ÷ count), p50 and p90 as Prometheus estimates them, and the bucket p50 falls in (how finely the
    server can place it)."""
    delta = metrics.samples_delta(before, after)
    out = {}
    for key, name in SERVER_HISTOGRAMS.items():
        try:
            h = metrics.histogram(delta, name)
        except ValueError as exc:
            out[key] = {"status": str(exc)}
            continue
        p50 = metrics.histogram_quantile(h, 0.5)
        out[key] = {"count": h["count"], "mean_s": h["sum"] / h["count"] if h["count"] else None, "p50_s": p50,
                    "p90_s": metrics.histogram_quantile(h, 0.9),
                    "p50_bucket_s": metrics.bucket_of(h, p50) if p50 is not None else None}
    return out


# ------------------------------------------------------------------------------------------- A/A and A/B


def _tpots(res: loadgen.BenchmarkResult) -> list[float]:
    return [o.tpot_s for o in res.outputs if o.success and o.tpot_s is not None]


def aa_ab(url: str, prompts: Sequence[Any], *, model: str | None, trials: int, runs_per_side: int,
          per_token_s: float, requests: int, max_tokens: int, concurrency: int,
          bootstrap: Callable[..., tuple[float, float]] = verdict.bootstrap_diff) -> dict[str, Any]:
    """``trials`` A/A trials (both sides through a proxy adding nothing), then ``trials`` A/B trials (B's proxy adds
    ``per_token_s`` per token). Each trial runs A and B ``runs_per_side`` times, alternately; then it asks three
    readers whether B differs:

    - naive: one run each (the first), mean TPOT; "differs" by ``verdict.one_run_each`` (a step of its own)
      (in an A/B trial: "detects" when B's is that much slower);
    - verdict: labkit's ``verdict.compare`` of the per-run median TPOTs (better or worse; in an A/B trial: worse);
    - bootstrap: the interval for median(B) − median(A) over every request's TPOT leaves out 0 (A/B: above 0).

    Returns the per-trial rows and, per reader, the share of A/A trials where it called a difference (false
    positives) and the share of A/B trials where it detected the slowdown."""
    positive("trials", trials)
    positive("runs_per_side", runs_per_side)
    rows = []
    with SlowProxy(url) as a, SlowProxy(url) as b:
        def one(proxy: SlowProxy) -> loadgen.BenchmarkResult:
            return loadgen.run(proxy.url, prompts, num_requests=requests, max_concurrency=concurrency,
                               max_tokens=max_tokens, warmup=0, model=model)

        loadgen.run(a.url, prompts, num_requests=1, max_tokens=2, warmup=0, model=model)  # connections and caches warm
        for kind in ("A/A", "A/B"):
            b.per_token_s = 0.0 if kind == "A/A" else per_token_s
            for t in range(trials):
                side = {"A": [], "B": []}
                for _ in range(runs_per_side):
                    side["A"].append(one(a))
                    side["B"].append(one(b))
                ta, tb = _tpots(side["A"][0]), _tpots(side["B"][0])
                naive = verdict.one_run_each(statistics.mean(tb), statistics.mean(ta), higher_is_better=False)
                med_a = [statistics.median(_tpots(r)) for r in side["A"]]
                med_b = [statistics.median(_tpots(r)) for r in side["B"]]
                v = verdict.compare(med_b, med_a, higher_is_better=False)
                pooled_a = [x for r in side["A"] for x in _tpots(r)]
                pooled_b = [x for r in side["B"] for x in _tpots(r)]
                lo, hi = bootstrap(pooled_b, pooled_a)
                slow = kind == "A/B"
                rows.append({"trial": kind, "index": t, "naive_ratio": naive.ratio,
                             "naive": naive.kind == verdict.WORSE if slow else naive.kind in (verdict.BETTER,
                                                                                              verdict.WORSE),
                             "verdict_kind": v.kind, "verdict_ratio": v.ratio,
                             "verdict": v.kind == verdict.WORSE if slow else v.kind in (verdict.BETTER, verdict.WORSE),
                             "ci_s": (lo, hi), "bootstrap": lo > 0 if slow else (lo > 0 or hi < 0),
                             "tpot_a_s": statistics.median(pooled_a), "tpot_b_s": statistics.median(pooled_b)})
    rates = {}
    for reader in ("naive", "verdict", "bootstrap"):
        aa = [r[reader] for r in rows if r["trial"] == "A/A"]
        ab = [r[reader] for r in rows if r["trial"] == "A/B"]
        rates[reader] = {"aa_false_positive_rate": sum(aa) / len(aa), "slowdown_detection_rate": sum(ab) / len(ab)}
    tpot_a = statistics.median(r["tpot_a_s"] for r in rows if r["trial"] == "A/B")
    return {"rows": rows, "rates": rates, "trials": trials, "runs_per_side": runs_per_side,
            "per_token_s": per_token_s, "slowdown_share": per_token_s / tpot_a, "requests_per_run": requests}


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
    cost = cpu_share(pinned)
    both = clients_on_one_server(url, w, folder, clients=clients, cores=server_cores)
    shared_cost = cpu_share(both)
    rows = []
    for name, rs in both.items():
        alone = tables["aligned"].get(name) or {}
        together = dict(align_fn(align.stamps(rs[-1].outputs))) if rs and rs[-1].ok else {}
        rows.append({"client": name, "cpu_share_own_core": cost.get(name),
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

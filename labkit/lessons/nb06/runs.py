"""Notebook 06's server runs, each in rounds of short passes (``timing.rounds``: each round in a shuffled order,
round i of every side a pair for ``verdict.compare(…, paired=True)``): the lab's server at two batch sizes, Poisson
against bursty arrivals, and the same ``loadgen.run`` against the lab's servers and ``vllm serve`` (one start, or
the room's shared server).
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ...core import timing
from ...serve import loadgen
from ...serve import metrics as prom
from ...serve.vllm.shared import SharedServer
from ...serve.vllm import server as vs

SAME_LOAD_FIGURES = ("request_throughput", "output_tokens_per_s", "ttft_p50_s", "tpot_p50_s", "itl_p50_s", "e2e_p50_s",
                     "goodput")


SERVER_FIGURES = ("output_tokens_per_s", "request_throughput", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s")
OPEN_LOOP_FIGURES = ("request_throughput", "goodput", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "e2e_p90_s")


def per_round(label: Mapping[str, Any], summaries: Sequence[Mapping[str, Any]], figures: Sequence[str]) -> dict[str, Any]:
    """One row from a side's passes (loadgen summaries, round i at index i): ``label``'s keys, the passes'
    requests, completed and failed summed, each of ``figures`` the median over the passes, and every pass's value
    under ``samples`` (one per round, so two sides' samples pair up; a figure a pass lacks is kept as None)."""
    samples = {f: [s.get(f) for s in summaries] for f in figures}
    return {**label, "rounds": len(summaries), **{k: sum(s[k] for s in summaries) for k in ("requests", "completed", "failed")},
            **{f: statistics.median(v) if all(x is not None for x in v) else None for f, v in samples.items()},
            "samples": samples}


def batch_size_rounds(server: Any, sizes: Sequence[int], n_rounds: int, *, clients: int, num_requests: int,
                      max_tokens: int) -> tuple[list[dict[str, Any]], dict[int, tuple[Any, Any]]]:
    """The lab's ``server`` at each ``max_batch_size`` in ``sizes``, ``n_rounds`` rounds of one short pass each
    (``num_requests`` requests from ``clients`` clients, ``max_tokens`` each), each round in a shuffled order; each
    size's shape is warmed once first (not a round). Returns one row per size (``per_round``, plus the mean batch
    size the server ran, from its counters around each pass) and, per size, its last pass's /metrics scrapes
    (before, after)."""
    for b in sizes:
        server.configure(max_batch_size=b)
        loadgen.run(server.url, num_requests=clients, max_concurrency=clients, max_tokens=4)  # warm this shape
    scraped: dict[int, tuple[Any, Any]] = {}

    def one_pass(b: int) -> Any:
        def run() -> dict[str, Any]:
            server.configure(max_batch_size=b)
            before, first = server.stats(), prom.scrape(server.url)
            summary = loadgen.run(server.url, num_requests=num_requests, max_concurrency=clients, max_tokens=max_tokens,
                                  warmup=0).summary()
            scraped[b] = (first, prom.scrape(server.url))
            return {**summary, "mean_batch_size": prom.mean_batch_between(before, server.stats())}
        return run

    done = timing.rounds({b: one_pass(b) for b in sizes}, n_rounds, again=False)
    return [per_round({"max_batch_size": b}, done[b], SERVER_FIGURES + ("mean_batch_size",)) for b in sizes], scraped


def arrival_rounds(url: str, shapes: Mapping[str, float], n_rounds: int, **loadgen_options: Any) -> list[dict[str, Any]]:
    """Open-loop runs of each arrival shape (label → burstiness), ``n_rounds`` rounds of one short pass each, each
    round in a shuffled order; round i of every shape draws its gaps from seed i + 1, so a pair differs in the
    shape alone; no pass sends a warm-up request of its own (the server is warm). One row per shape (``per_round``):
    each pass's TTFT p50 and p90 are its ``samples``."""
    seeds = {label: itertools.count(1) for label in shapes}

    def one_pass(label: str) -> Any:
        return lambda: loadgen.run(url, burstiness=shapes[label], seed=next(seeds[label]), warmup=0,
                                   **loadgen_options).summary()

    done = timing.rounds({label: one_pass(label) for label in shapes}, n_rounds, again=False)
    return [per_round({"arrivals": label, "burstiness": b}, done[label], OPEN_LOOP_FIGURES) for label, b in shapes.items()]


def same_load(urls: dict[str, str], n_rounds: int, **loadgen_options: Any) -> list[dict[str, Any]]:
    """The same ``loadgen.run`` against each server in turn, ``n_rounds`` rounds, each in a shuffled order (so a
    slower stretch of the machine hits each alike, and round i of two servers is a pair): one row per server, each
    figure the median over the rounds, every round's value kept under ``samples`` (round i at index i; a round
    that lacks a figure is dropped from that figure's samples on every server, so they still pair up)."""
    done = timing.rounds({name: (lambda url=url: loadgen.run(url, **loadgen_options).summary())
                          for name, url in urls.items()}, n_rounds, again=False)
    kept = {f: [i for i in range(n_rounds) if all(done[n][i].get(f) is not None for n in done)] for f in SAME_LOAD_FIGURES}
    rows = []
    for name, runs in done.items():
        samples = {f: [runs[i][f] for i in kept[f]] for f in SAME_LOAD_FIGURES}
        rows.append({"server": name, "rounds": n_rounds, "requests": sum(r["requests"] for r in runs),
                     "failed": sum(r["failed"] for r in runs),
                     **{f: statistics.median(v) if v else None for f, v in samples.items()}, "samples": samples})
    return rows


def beside_vllm(settings: Any, urls: dict[str, str], n_rounds: int, deadline_s: float = 300.0, warmup_requests: int = 8,
                shared: SharedServer | None = None, **loadgen_options: Any) -> dict[str, Any]:
    """``same_load`` over the lab's servers (``urls``) and ``vllm serve`` (one start, warmed up first), or the room's
    ``shared`` server (nothing started here; its row is labelled as another machine's). Returns ``status`` ("ok" or
    the one line saying why vLLM did not run), ``rows`` and ``platform``."""
    try:
        with vs.serve_or_shared(settings, shared, deadline_s, "vllm-same-load") as srv:
            loadgen.run(srv.url, num_requests=warmup_requests, max_concurrency=warmup_requests, max_tokens=4)
            name = shared.label if shared else f"vllm serve (max_num_seqs {settings.max_num_seqs})"
            rows = same_load({**urls, name: srv.url}, n_rounds, **loadgen_options)
            chose = shared.platform() if shared else srv.platform()
    except (vs.VLLMUnavailable, vs.VLLMStartError) as exc:
        return {"status": str(exc)}
    failed = sum(r["failed"] for r in rows)
    return {"status": "ok" if not failed else f"{failed} request(s) failed", "rows": rows, "platform": chose}

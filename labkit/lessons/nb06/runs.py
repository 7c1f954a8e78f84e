"""Notebook 06's run beside vLLM: the same ``loadgen.run`` against the lab's servers and ``vllm serve`` (one start,
or the room's shared server), interleaved in rounds.
"""
from __future__ import annotations

import statistics
from typing import Any

from ...core import timing
from ...serve import loadgen
from ...serve.vllm.shared import SharedServer
from ...serve.vllm import server as vs

SAME_LOAD_FIGURES = ("request_throughput", "output_tokens_per_s", "ttft_p50_s", "tpot_p50_s", "itl_p50_s", "e2e_p50_s",
                     "goodput")


def same_load(urls: dict[str, str], n_rounds: int, **loadgen_options: Any) -> list[dict[str, Any]]:
    """The same ``loadgen.run`` against each server in turn, ``n_rounds`` times (interleaved, so a slower
    stretch of the machine hits each alike): one row per server, each figure the median over the rounds, every
    round's value kept under ``samples``."""
    done = timing.rounds({name: (lambda url=url: loadgen.run(url, **loadgen_options).summary())
                          for name, url in urls.items()}, n_rounds, again=False)
    rows = []
    for name, runs in done.items():
        samples = {f: [r[f] for r in runs if r.get(f) is not None] for f in SAME_LOAD_FIGURES}
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

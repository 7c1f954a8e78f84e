"""Dynamic batching on the serving path: the same load against max_batch_size=1 and max_batch_size=8.

Starts ``python -m labkit serve`` itself (a child process per configuration, so the client's work does
not share the server's interpreter), sends streaming requests from ``labkit.serve.loadgen`` at a fixed
concurrency, prints one JSON line per configuration, then one JSON document comparing them (last line).

    flock /tmp/labkit-heavy.lock .venv/bin/python -m bench.serving [--requests 64] [--max-tokens 32]
"""
from __future__ import annotations

import argparse
import json
import sys

from labkit.core import config
from labkit.core.results import jsonable
from labkit.serve import launch, loadgen
from labkit.serve import metrics as prom

KEYS = ("max_batch_size", "concurrency", "requests", "completed", "failed", "duration_s", "output_tokens",
        "output_tokens_per_s", "request_throughput", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "itl_p50_s",
        "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "mean_batch_size")


def measure(max_batch_size: int, concurrency: int, requests: int, max_tokens: int, model: str | None) -> dict:
    with launch.run_server(model, subprocess=True, port=0, max_batch_size=max_batch_size) as srv:
        # warmup at full concurrency: every batch shape the run will see has been through the model once
        loadgen.run(srv.url, num_requests=concurrency, max_concurrency=concurrency, max_tokens=4, warmup=1)
        before = _batch_totals(srv.url)
        res = loadgen.run(srv.url, num_requests=requests, max_concurrency=concurrency, max_tokens=max_tokens,
                          ignore_eos=True, warmup=0)
        after = _batch_totals(srv.url)
    batches = after[1] - before[1]
    row = {"max_batch_size": max_batch_size, **res.summary(),
           "mean_batch_size": (after[0] - before[0]) / batches if batches else None}
    return {k: row.get(k) for k in KEYS}


def _batch_totals(url: str) -> tuple[float, float]:
    """(sequences, batches) run so far, from the server's Prometheus /metrics."""
    values = prom.totals(url, timeout_s=10)
    return values["labkit_batch_size_sum"], values["labkit_batch_size_count"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=config.pick(32, 16), help="requests per configuration")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request (ignore_eos: exactly this)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--model", default=None, help="default: LABKIT_MODEL or the default model")
    args = ap.parse_args()
    rows = []
    for b in args.batch_sizes:
        row = measure(b, args.concurrency, args.requests, args.max_tokens, args.model)
        rows.append(row)
        print(json.dumps(jsonable(row)), flush=True)
    base = rows[0]["output_tokens_per_s"]
    speedups = {str(r["max_batch_size"]): r["output_tokens_per_s"] / base for r in rows} if base else {}
    print(json.dumps(jsonable({"bench": "serving", "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                                "requests": args.requests, "speedup_vs_first": speedups,
                                "failed": sum(r["failed"] for r in rows), "configs": rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The server under load: 1,000 requests at 64 concurrent clients, mixed prompt and answer lengths, against
``python -m labkit serve`` in its own process; or ``--soak SECONDS`` of the same traffic.

Reports completed, failed (answered with an error or refused with a status), lost (no answer at all: must
be 0), TTFT / TPOT / E2E percentiles, and the server process's RSS after a warm-up and after the load
(growth must stay under 5 %). One JSON line per phase; the last line is one JSON document with the targets.

    flock /tmp/labkit-heavy.lock .venv/bin/python -m bench.load                 # 1,000 requests, 64 clients
    flock /tmp/labkit-heavy.lock .venv/bin/python -m bench.load --soak 600      # ten minutes of it
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

from labkit.core.results import jsonable
from labkit.serve import launch, loadgen, protocol
from labkit.serve.experiments import paged

KEYS = ("requests", "completed", "failed", "lost", "duration_s", "request_throughput", "output_tokens_per_s",
        "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "e2e_p50_s",
        "e2e_p90_s", "e2e_p99_s", "errors")
ANSWER_TOKENS = (4, 8, 16, 32, 64)  # max_tokens drawn from these, short answers more often
ANSWER_WEIGHTS = (4, 4, 3, 2, 1)
RSS_GROWTH_LIMIT = 0.05


def workload(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """``n`` prompts from data/requests.json (mixed lengths) and an answer limit for each."""
    rng = random.Random(seed)
    pool = [r.prompt for r in paged.load_requests()]
    return [rng.choice(pool) for _ in range(n)], rng.choices(ANSWER_TOKENS, ANSWER_WEIGHTS, k=n)


def rss_bytes(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


def phase(url: str, n: int, clients: int, seed: int) -> dict:
    prompts, limits = workload(n, seed)
    res = loadgen.run(url, prompts, num_requests=n, max_concurrency=clients, max_tokens=limits, ignore_eos=True,
                      warmup=0, timeout_s=1800)
    s = res.summary()
    s["lost"] = sum(o.status is None for o in res.outputs)  # no HTTP answer at all: neither served nor refused
    return {k: s.get(k) for k in KEYS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--soak", type=float, default=0.0, help="seconds of load instead of --requests (0: off)")
    ap.add_argument("--batching", choices=protocol.BATCHING, default="continuous")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--model", default=None, help="default: LABKIT_MODEL or the default model")
    args = ap.parse_args()
    with launch.run_server(args.model, subprocess=True, port=0, batching=args.batching,
                            max_batch_size=args.max_batch_size, max_queue=4 * args.clients) as srv:
        warm = phase(srv.url, args.clients * 2, args.clients, seed=1)  # every batch shape once, allocator settled
        rss_before = rss_bytes(srv.proc.pid)
        print(json.dumps(jsonable({"phase": "warm-up", **warm, "rss_bytes": rss_before})), flush=True)
        rows, rss_samples, t0, i = [], [], time.monotonic(), 0
        while True:
            n = args.requests if not args.soak else args.clients * 4
            rows.append(phase(srv.url, n, args.clients, seed=100 + i))
            rss_samples.append(rss_bytes(srv.proc.pid))
            i += 1
            print(json.dumps(jsonable({"phase": f"load {i}", **rows[-1], "rss_bytes": rss_samples[-1]})), flush=True)
            if not args.soak or time.monotonic() - t0 >= args.soak:
                break
    total = {k: sum(r[k] for r in rows) for k in ("requests", "completed", "failed", "lost")}
    growth = rss_samples[-1] / rss_before - 1
    print(json.dumps(jsonable({
        "bench": "load", "batching": args.batching, "max_batch_size": args.max_batch_size, "clients": args.clients,
        "soak_s": args.soak or None, "duration_s": time.monotonic() - t0, **total,
        "percentiles_of_last_phase": {k: v for k, v in rows[-1].items() if "_p" in k and k.endswith("_s")},
        "rss_before_bytes": rss_before, "rss_after_bytes": rss_samples[-1], "rss_max_bytes": max(rss_samples),
        "rss_growth": growth,
        "targets": {"lost == 0": total["lost"] == 0, f"rss growth < {RSS_GROWTH_LIMIT:.0%}": growth < RSS_GROWTH_LIMIT},
    })))
    return 0


if __name__ == "__main__":
    sys.exit(main())

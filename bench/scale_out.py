"""Notebook 11's headline figures, measured in one run: replicas of `labkit serve` behind smg.

    policies   round-robin against cache-aware routing (and consistent hashing, full mode) on the shared-prefix,
               multi-turn workload, interleaved in rounds: prefix-cache hit rates (prompts and positions) from
               every replica's /metrics, TTFT p50/p90, and the TTFT p50 ratio with its verdict over the rounds;
               answers compared with one server's
    capacity   one replica under open-loop Poisson arrivals at rising rates against an SLO: goodput, the knee,
               and the replicas a load needs
    cost       $ per million output tokens at the knee's throughput and a price from data/prices.json

Prints one JSON line per section, the last line one JSON document with every headline figure.
LABKIT_QUICK=1 shrinks rounds, prompts and request counts (the same code paths). On a laptop the replicas share
the cores: the figures are about cache locality and latency, not throughput.

    python -m bench.scale_out [--price "AWS m7i.xlarge"]
"""
from __future__ import annotations

import argparse
import json
import sys

from labkit.core import config, env
from labkit.core.results import jsonable
from labkit.lessons import cost
from labkit.lessons.nb11 import runs as nb11_runs
from labkit.model import hardware, models
from labkit.serve import loadgen
from labkit.serve.fleet import capacity
from labkit.serve.fleet import router
from labkit.serve.fleet import routing

DROP = ("records", "text", "prompt")


def _emit(section: str, rows: list[dict]) -> None:
    for r in rows:
        print(json.dumps(jsonable({"section": section, **{k: v for k, v in r.items() if k not in DROP}})), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=config.pick(8, 6),
                    help="rounds of the policy comparison, judged paired (at least 6 pairs for a verdict)")
    ap.add_argument("--price", default=None, help="a row of data/prices.json (default: the first CPU row of this "
                                                  "machine's architecture)")
    args = ap.parse_args(argv)
    if args.rounds <= 0:
        ap.error("--rounds must be positive")
    prices = {p["name"]: p for p in cost.load_prices()}
    if args.price is not None and args.price not in prices:
        ap.error(f"--price {args.price!r}: choose one of {sorted(prices)}")
    pick = config.pick
    policies = pick(("round_robin", "cache_aware", "consistent_hashing"), ("round_robin", "cache_aware"))
    tok = models.load_tokenizer()
    with router.replicas(2, prefix_cache_tokens=16384, threads=1) as reps:
        routers = {p: router.start_router([r.url for r in reps], p) for p in policies}
        try:
            groups = pick(4, 2)  # quick mode: more, shorter rounds
            works = [routing.workload(tok, groups, 2, pick(4, 3), pick(512, 256), tag=f"-{r}",
                                      document_tokens=pick(256, 128)) for r in range(args.rounds)]
            warm = routing.workload(tok, 1, 2, 1, pick(512, 256), tag="-warm-up")
            cmp = nb11_runs.compare_policies(routers, reps, works, pick(16, 6), stagger_s=0.3, warmup=warm)
            single = routing.run_policy(reps[0].url, "one server", reps[:1], works[0][:groups], pick(16, 6),
                                        stagger_s=0.3)
        finally:
            router.stop_all(list(routers.values()))
        identical = {"all_identical": all(routing.same_answers(single["records"], recs[0])["all_identical"]
                                          for recs in cmp["records"].values())}
        table = nb11_runs.policy_table(cmp["runs"])
        _emit("policy_runs", cmp["runs"])
        _emit("policies", table)

        server = reps[0]
        prompts = [f"{q} Answer in a few words." for q in routing.QUESTIONS]
        n_tokens = pick(24, 8)
        loadgen.run(server.url, prompts, num_requests=2, max_concurrency=1, max_tokens=4, endpoint="chat")
        alone = loadgen.run(server.url, prompts, num_requests=3, max_concurrency=1, max_tokens=n_tokens,
                            endpoint="chat", ignore_eos=True, warmup=0).summary()
        slo, slo_why = loadgen.slo_from_baseline(loadgen.SLO(ttft_s=1.0, tpot_s=0.25), alone, 3)
        rates = [round(m / alone["e2e_p50_s"], 2) for m in pick((0.5, 1, 1.5, 2, 3, 4), (1, 1.5, 2, 3))]
        swept = nb11_runs.capacity_sweep(server, prompts, rates, pick(20, 6), n_tokens, slo)
    sweep, knee, held = swept["points"], swept["knee"], swept["held"]
    _emit("capacity", sweep)
    at_knee = [r for r in sweep if r["offered_rps"] <= (knee["knee_rps"] or sweep[0]["offered_rps"])][-1]
    price = prices[args.price or cost.price_for("cpu", hardware.cpu_arch())]
    tps = held["output_tokens_per_s"] or at_knee["output_tokens_per_s"]
    usd = cost.usd_per_million_tokens(tps, price["hourly_usd"])
    row = {"name": price["name"], "usd_per_million_tokens": usd, "tokens_per_s": tps,
           "hourly_usd": price["hourly_usd"], "source": price["source"], "date": price["date"]}
    _emit("cost", [row])
    head = nb11_runs.headline(table, cmp["runs"], knee, row, identical)
    need = capacity.replicas_needed(200, 2, held["rps"]) if held["rps"] else None
    summary = {"bench": "scale_out", "quick": config.quick(), **head, "slo": slo_why,
               "replicas_for_200_users_at_2_rpm": need["replicas"] if need else None,
               "sustained_rps": held["rps"], "ceiling_rps": held["ceiling_rps"],
               "note": "the replicas share this machine's cores: cache locality and latency, not throughput",
               "hardware": env.hardware(), "versions": {**env.versions(("torch", "transformers")),
                                                        **env.versions(("smg",))}}
    print(json.dumps(jsonable(summary), allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

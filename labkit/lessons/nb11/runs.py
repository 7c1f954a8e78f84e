"""Notebook 11's measurements and headline figures, shared with ``bench/scale_out.py``.

``compare_policies``  the router's policies on the shared-prefix workload, in shuffled interleaved rounds (each round on
                      fresh system prompts, every replica's prefix cache flushed before each run), one row per
                      run and one per replica and run.
``capacity_point``    one server under open-loop Poisson arrivals at one rate for ``seconds`` of arrivals (a
                      queue builds only over time), judged against an SLO: goodput over the arrival window and the
                      rate really completed (``capacity.sweep_point``), beside vLLM bench's good requests ÷ the
                      run's duration; the callers flush the replica's prefix cache before each rate.
``headline``          the figures a takeaway quotes and the benchmark prints, each with its sample count.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ...core import timing, verdict
from ...serve import loadgen
from ...serve.fleet import capacity, routing

ROUTING_KEYS = {"consistent_hashing": "conversation", "manual": "conversation"}  # session affinity per conversation


def compare_policies(routers: Mapping[str, Any], replicas: Sequence[Any], workloads: Sequence[Sequence[Any]],
                     max_tokens: int, stagger_s: float = 0.0, warmup: Sequence[Any] = ()) -> dict[str, Any]:
    """Each policy's router on ``workloads[r]`` in round r, the policies interleaved, each round in a shuffled order
    (``timing.rounds``), the conversations starting ``stagger_s`` apart (``routing.run``); ``warmup``: a workload
    each router runs once first, not a round (the first requests after the replicas' start). Returns ``runs`` (one
    summary row per policy and round, its ``round`` the pair index of a paired verdict), ``replicas`` (per replica and
    run) and ``records`` (policy → the per-turn records of every round)."""
    if not routers or not workloads:
        raise ValueError("compare_policies needs at least one router and one round's workload")
    for policy in routers if warmup else ():
        routing.run_policy(routers[policy].url, policy, replicas, warmup, max_tokens,
                           routing_key=ROUTING_KEYS.get(policy), stagger_s=stagger_s)
    done = {p: 0 for p in routers}
    runs: list[dict[str, Any]] = []
    per_replica: list[dict[str, Any]] = []
    records: dict[str, list[list[dict[str, Any]]]] = {p: [] for p in routers}

    def one(policy: str) -> Any:
        r = done[policy]
        out = routing.run_policy(routers[policy].url, policy, replicas, workloads[r], max_tokens,
                                 routing_key=ROUTING_KEYS.get(policy), stagger_s=stagger_s)
        runs.append({**out["summary"], "round": r})
        per_replica.extend({**p, "round": r} for p in out["replicas"])
        records[policy].append(out["records"])
        done[policy] += 1
        return out["summary"]

    timing.rounds({p: (lambda p=p: one(p)) for p in routers}, len(workloads), again=False)
    return {"runs": runs, "replicas": per_replica, "records": records}


def policy_table(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy: medians over its rounds (and the rounds counted) of TTFT p50/p90 and hit rates."""
    out = []
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        med = lambda key: statistics.median(r[key] for r in mine if r[key] is not None)  # noqa: E731
        out.append({"policy": policy, "rounds": len(mine), "requests": sum(r["requests"] for r in mine),
                    "failed": sum(r["failed"] for r in mine), "hit_rate": med("hit_rate"),
                    "token_hit_rate": med("token_hit_rate"), "ttft_p50_s": med("ttft_p50_s"),
                    "ttft_p90_s": med("ttft_p90_s"), "max_share": med("max_share")})
    return out


def capacity_point(url: str, prompts: Sequence[str], rate: float, seconds: float, max_tokens: int, slo: loadgen.SLO,
                   seed: int = 0) -> dict[str, Any]:
    """One open-loop run: Poisson arrivals at ``rate`` per second for ``seconds`` (``capacity.steady_requests``)."""
    n = capacity.steady_requests(rate, seconds)
    res = loadgen.run(url, list(prompts), num_requests=n, request_rate=rate, burstiness=1.0, max_tokens=max_tokens,
                      endpoint="chat", ignore_eos=True, slo=slo, seed=seed, warmup=0)
    s = res.summary()
    return {**capacity.sweep_point(res.outputs, rate, slo), "goodput_over_run_rps": s["goodput"],
            "duration_s": s["duration_s"], "ttft_p50_s": s["ttft_p50_s"], "ttft_p90_s": s["ttft_p90_s"],
            "tpot_p50_s": s["tpot_p50_s"], "output_tokens": s["output_tokens"]}


def capacity_sweep(server: Any, prompts: Sequence[str], rates: Sequence[float], seconds: float, max_tokens: int,
                   slo: loadgen.SLO, follow: float = 0.9) -> dict[str, Any]:
    """The capacity sweep notebook 11 and ``bench/scale_out.py`` share: each rate for ``seconds`` of arrivals
    (``capacity_point``), the replica's prefix cache flushed first; then the knee (``capacity.find_knee`` on the
    goodput) and what one replica holds (``capacity.sustained``). Returns ``points``, ``knee``, ``held``."""
    points = []
    for rate in rates:
        server.flush_cache()  # each rate starts from an empty prefix cache
        points.append(capacity_point(server.url, prompts, rate, seconds, max_tokens, slo))
    knee = capacity.find_knee([p["offered_rps"] for p in points], [p["goodput_rps"] for p in points], follow)
    return {"points": points, "knee": knee, "held": capacity.sustained(points, knee)}


def ttft_verdict(runs: Sequence[dict[str, Any]], new: str = "cache_aware", base: str = "round_robin") -> verdict.Verdict:
    """``new``'s TTFT p50 against ``base``'s, paired by round (``compare_policies`` ran both on round r's workload,
    in a shuffled order); a round either policy did not time drops out as a pair."""
    def of(policy: str) -> dict[int, float | None]:
        return {r["round"]: r["ttft_p50_s"] or None for r in runs if r["policy"] == policy}

    return verdict.compare(of(new), of(base), paired=True, higher_is_better=False)


def headline(table: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], knee: dict[str, Any] | None,
             cost: dict[str, Any] | None, identical: dict[str, Any] | None) -> dict[str, Any]:
    """Cache-aware against round-robin (hit rates, TTFT p50 ratio with its paired verdict over the rounds: round
    r of one policy against round r of the other, the same workload), the knee and $ per million tokens: the
    notebook's takeaways and ``bench/scale_out.py``'s JSON."""
    by = {r["policy"]: r for r in table}
    head: dict[str, Any] = {}
    if "cache_aware" in by and "round_robin" in by:
        ca, rr = by["cache_aware"], by["round_robin"]
        v = ttft_verdict(runs)
        head.update(cache_aware_hit_rate=ca["hit_rate"], round_robin_hit_rate=rr["hit_rate"],
                    cache_aware_token_hit_rate=ca["token_hit_rate"], round_robin_token_hit_rate=rr["token_hit_rate"],
                    ttft_p50_ratio_ca_over_rr=ca["ttft_p50_s"] / rr["ttft_p50_s"], ttft_verdict=v.kind,
                    ttft_verdict_label=v.label, ttft_verdict_reason=v.reason, ttft_pairs=v.n,
                    rounds=min(ca["rounds"], rr["rounds"]))
    if identical is not None:
        head["answers_identical_to_one_server"] = identical["all_identical"]
    if knee is not None:
        head.update(knee_rps=knee["knee_rps"], knee_reached=knee["reached"], knee_reason=knee["reason"])
    if cost is not None:
        head.update(usd_per_million_tokens=cost.get("usd_per_million_tokens"), price=cost.get("name"),
                    tokens_per_s=cost.get("tokens_per_s"))
    return head

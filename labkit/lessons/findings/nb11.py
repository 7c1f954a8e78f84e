"""Notebook 11's takeaways: cache-aware against round-robin routing (hits, and TTFT over the rounds), the capacity a
replica holds, the cost per million tokens there, and what a killed replica and a bad configuration did.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import Findings


def takeaways(*, head: Mapping[str, Any], capacity_reason: str, arithmetic: str | None, chosen: Mapping[str, Any],
              tokens_per_s: float, answered: int, requests: int) -> Findings:
    """``head``: ``scale_out.headline``'s figures (its ``ttft_verdict`` from ``core.verdict``); ``capacity_reason``:
    the knee finder's reason; ``arithmetic``: the replicas-needed sum, or None where no knee was found; ``chosen``:
    the price row (name, usd_per_million_tokens, tokens_per_s: what it was priced at); ``tokens_per_s``: one replica's output at the knee;
    ``answered``/``requests``: the fault run. The headline: TTFT p50, cache-aware over round-robin."""
    word = {"better": "lower", "worse": "higher"}.get(head["ttft_verdict"], head["ttft_verdict"])
    says = [
        f"Cache-aware routing: {head['cache_aware_hit_rate']:.0%} of requests reused a replica's cached prefix "
        f"({head['cache_aware_token_hit_rate']:.0%} of prompt positions) against round-robin's "
        f"{head['round_robin_hit_rate']:.0%} ({head['round_robin_token_hit_rate']:.0%}); TTFT p50 "
        f"{head['ttft_p50_ratio_ca_over_rr']:.2f}× round-robin's ({word} over {head['rounds']} rounds). Answers "
        f"identical to one server's: {head['answers_identical_to_one_server']}.",
        f"Capacity: {capacity_reason}" + (f"; {arithmetic}." if arithmetic else "."),
        f"Cost: ${chosen['usd_per_million_tokens']:.2f} per million output tokens at {chosen['name']}'s price, priced "
        + (f"as if the instance made {chosen['tokens_per_s']:.1f} tokens/s from this run's {tokens_per_s:.1f} (one replica "
           "at the knee; the line above the cost table says how)." if chosen.get("tokens_per_s")
           and abs(chosen["tokens_per_s"] - tokens_per_s) > 1e-9 else f"from this run's {tokens_per_s:.1f} tokens/s."),
        f"Faults: a replica killed mid-run left {answered} of {requests} requests answered and the rest counted; the "
        "router refused a bad configuration and both ports in use, each in one line.",
    ]
    rows = [{"finding": "TTFT p50, cache-aware / round-robin", "value": head["ttft_p50_ratio_ca_over_rr"],
             "verdict": head["ttft_verdict"], **{k: v for k, v in head.items() if k != "ttft_p50_ratio_ca_over_rr"}},
            {"finding": f"$ per million output tokens at {chosen['name']}'s price", "value": chosen["usd_per_million_tokens"]}]
    return Findings(rows=rows, sentences=says)

"""Notebook 11's takeaways: cache-aware against round-robin routing (hits, and TTFT over the rounds), the capacity a
replica holds, the cost per million tokens there, and what a killed replica and a bad configuration did.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from ..findings import Findings, beyond_sweep, sweep_end


def work_words(head: Mapping[str, Any]) -> str:
    """The measured TTFT p50 ratio (cache-aware / round-robin) beside what the cached work alone predicts.

    A reused prompt position needs no prefill, so each policy prefills (1 - its token hit rate) of the prompts and,
    if TTFT were prefill work alone, the ratio would be (1 - cache-aware's rate) / (1 - round-robin's). The rest of a
    TTFT (the request's fixed cost) does not shrink with the cache, which pushes the ratio towards 1: a measured
    ratio further below the expectation than ``verdict.SLACK`` is more than the work explains, and the rest is
    queueing (round-robin's uncached prefills also wait behind each other)."""
    ca, rr, measured = head["cache_aware_token_hit_rate"], head["round_robin_token_hit_rate"], head["ttft_p50_ratio_ca_over_rr"]
    if rr >= 1:  # fact: a share of positions, all of them reused
        return "round-robin reused every prompt position: no prefill work is left to compare"
    expected = (1 - ca) / (1 - rr)
    says = (f"the prompt positions reused predict a TTFT ratio of about {expected:.2f} from prefill work alone "
            f"((1 − {ca:.0%}) / (1 − {rr:.0%})); measured {measured:.2f}")
    return says + verdict.pick(
        verdict.versus(measured, expected, higher_is_better=False),
        better=(", below what the work allows: the rest is queueing (round-robin's uncached prefills also queue "
                "behind each other, so each waits for the others' prefill too)"),
        worse=(", within what the work explains (the part of a TTFT that is not prefill does not shrink with the "
               "cache)"),
        same=f", a {verdict.TIE_LABEL} with what the work alone predicts")


def capacity_words(capacity_reason: str, arithmetic: str | None, knee_rps: float | None, reached: bool | None,
                   rates: Sequence[float] = (), param: str = "RATE_MULTIPLES", held: str = "") -> str:
    """The capacity sentence: the knee finder's reason, where the sweep's ends cut it (the true knee beyond the
    highest rate, or under the lowest) and which parameter widens the sweep, then the replica sum, marked a bound
    when the knee is one (a knee above the sweep means fewer replicas may do)."""
    end = sweep_end(knee_rps, rates, reached) if rates else ("above" if reached is False else None)
    says = f"Capacity: {capacity_reason}"
    if end == "above" and rates:  # the knee finder's reason already says the knee lies above: name the parameter
        says += f"; add higher levels to {param} to find it"
    elif end and rates:
        says += f"; {beyond_sweep(end, rates, 'req/s', param)}"
    if held:
        says += f". {held.rstrip('.')}"
    if arithmetic:
        says += (f"; {arithmetic} — an upper bound on the replicas, since the knee is only a lower bound" if end == "above"
                 else f"; {arithmetic}")
    return says + "."


def takeaways(*, head: Mapping[str, Any], capacity_reason: str, arithmetic: str | None, chosen: Mapping[str, Any],
              tokens_per_s: float, answered: int, requests: int, rates: Sequence[float] = (),
              priced_at: str = "at the knee", held: str = "") -> Findings:
    """``head``: ``nb11.runs.headline``'s figures (its ``ttft_verdict`` from ``core.verdict``, paired by round where
    ``ttft_pairs`` says so; a head recorded before says it was judged unpaired); ``capacity_reason``:
    the knee finder's reason; ``arithmetic``: the replicas-needed sum, or None where no knee was found; ``chosen``:
    the price row (name, usd_per_million_tokens, tokens_per_s: what it was priced at); ``tokens_per_s``: one replica's output at the priced point (``priced_at``, in words: the knee, or the sweep's best where none was found);
    ``answered``/``requests``: the fault run; ``rates``: the capacity sweep's offered rates (req/s), so a knee at its
    ends is said to be a bound (``capacity_words``). The headline: TTFT p50, cache-aware over round-robin."""
    word = {"better": "lower", "worse": "higher"}.get(head["ttft_verdict"],
                                                      head.get("ttft_verdict_label") or head["ttft_verdict"])
    how = (f"judged paired over {head['rounds']} rounds: {head['ttft_verdict_reason']}" if head.get("ttft_pairs")
           else f"over {head['rounds']} rounds, judged unpaired: recorded before rounds were paired")
    says = [
        f"Cache-aware routing: {head['cache_aware_hit_rate']:.0%} of requests reused a replica's cached prefix "
        f"({head['cache_aware_token_hit_rate']:.0%} of prompt positions) against round-robin's "
        f"{head['round_robin_hit_rate']:.0%} ({head['round_robin_token_hit_rate']:.0%}); TTFT p50 "
        f"{head['ttft_p50_ratio_ca_over_rr']:.2f}× round-robin's ({word}, {how}); "
        f"{work_words(head)}. Answers "
        f"identical to one server's: {head['answers_identical_to_one_server']}.",
        capacity_words(capacity_reason, arithmetic, head.get("knee_rps"), head.get("knee_reached"), rates, held=held),
        f"Cost: ${chosen['usd_per_million_tokens']:.2f} per million output tokens at {chosen['name']}'s price, priced "
        + (f"as if the instance made {chosen['tokens_per_s']:.1f} tokens/s from this run's {tokens_per_s:.1f} (one replica "
           f"{priced_at}; the line above the cost table says how)." if chosen.get("tokens_per_s")
           and chosen["tokens_per_s"] != tokens_per_s else
           f"from this run's {tokens_per_s:.1f} tokens/s (one replica {priced_at})."),
        f"Faults: a replica killed mid-run left {answered} of {requests} requests answered and the rest counted; the "
        "router refused a bad configuration and both ports in use, each in one line.",
    ]
    rows = [{"finding": "TTFT p50, cache-aware / round-robin", "value": head["ttft_p50_ratio_ca_over_rr"],
             "verdict": head["ttft_verdict"], **{k: v for k, v in head.items() if k != "ttft_p50_ratio_ca_over_rr"}},
            {"finding": f"$ per million output tokens at {chosen['name']}'s price", "value": chosen["usd_per_million_tokens"]}]
    return Findings(rows=rows, sentences=says)

"""Notebook 06's takeaways: static batching against its physical limits, padding, the server's batch size and
arrival patterns.
"""
from __future__ import annotations

from typing import Any

from ...core import verdict
from ...core.verdict import Verdict
from ..findings import Findings


def takeaways(*, sweep: list[dict[str, Any]], memory_bound_gain: float, padding: list[dict[str, Any]],
              serving: list[dict[str, Any]], open_loop: list[dict[str, Any]], clients: int,
              request_rate: float) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``sweep``: static_sweep rows (batch 1 first); ``memory_bound_gain``: the sizing model's predicted total-tokens/s
    gain at the largest batch; ``padding``: padding_experiment rows (mixed first, bucketed last); ``serving``: the
    max_batch_size 1 and 8 rows (loadgen figures plus max_batch_size); ``open_loop``: Poisson then bursty rows.
    Every comparison is judged paired on the rows' per-round ``samples`` (round i of each side at index i): the
    sweep's and the padding's rounds, the server's passes at each batch size, the arrival shapes' passes.
    """
    ok = [r for r in sweep if r.get("status", "ok") == "ok"]
    if not ok or not padding or len(serving) != 2 or len(open_loop) != 2:
        raise ValueError("findings need the sweep's ok rows, the padding rows, two server rows and two open-loop rows")
    first, last = ok[0], ok[-1]
    total_v, user_v = batch_verdicts(first, last, memory_bound_gain)
    gain, user = total_v.gain, user_v.ratio
    ttft_x = last["ttft_s"] / first["ttft_s"]
    worst = min(ok, key=lambda r: r["agreement"])
    mixed, bucketed = padding[0], padding[-1]
    bucket_v = verdict.compare(verdict.samples(bucketed, "ttft_s"), verdict.samples(mixed, "ttft_s"),
                               higher_is_better=False, paired=True)
    one, many = serving
    serve_v, tpot_v = server_verdicts(one, many)
    poisson, bursty = open_loop
    burst_v = worse_ttft(open_loop)[1]
    sentences = [
        throughput_sentence(last["batch_size"], total_v, memory_bound_gain)
        + f" Each user got {user:.2f}× batch 1's speed ({user_v.word('faster', 'slower')}"
        + (f": {user_v.reason}" if not user_v.real else "") + f") and waited {ttft_x:.1f}× as long for the first token.",
        ("Batching changed no answer: every batch's greedy tokens equal each prompt's tokens decoded alone."
         if worst["agreement"] == 1 else
         f"Batching changed some answers: at batch {worst['batch_size']} only {worst['agreement']:.0%} of the tokens "
         "equal each prompt decoded alone (padded rows and other matrix shapes round differently)."),
        f"In the mixed batch {mixed['wasted_fraction']:.0%} of the prompt tokens were padding; bucketing by length "
        f"prefilled {verdict.than(bucket_v)} the mixed batch ({bucket_v.gain:.2f}× its speed; {bucket_v.reason}), and "
        f"the mixed batch's tokens equal the bucketed ones on {mixed['agreement']:.0%}.",
        f"With {clients} clients, max_batch_size {many['max_batch_size']} (mean batch {many['mean_batch_size']:.1f}) "
        "served " + verdict.phrase(serve_v, f"the tokens/s of max_batch_size {one['max_batch_size']}", "more", "fewer")
        + f"; each token took {tpot_v.ratio:.2f}× as long: " + verdict.said(tpot_v, "faster", "slower")
        + f"; {one['failed'] + many['failed']} requests failed.",
        f"At {request_rate:g} requests/s, bursty arrivals made the TTFT p90 {burst_v.ratio:.2f}× Poisson's "
        f"(pass by pass: {burst_v.word('shorter', 'longer')}, {burst_v.reason}); goodput {poisson['goodput']:.2f} "
        f"(Poisson) and {bursty['goodput']:.2f} (bursty) requests/s, each the median of its passes.",
    ]
    rows = [
        {"finding": f"static batch {last['batch_size']} / batch 1, total tokens/s (×)", "value": gain},
        {"finding": "memory-bound prediction of that gain (×)", "value": memory_bound_gain},
        {"finding": f"static batch {last['batch_size']} / batch 1, tokens/s per user (×)", "value": user},
        {"finding": "lowest greedy agreement with prompts alone (share)", "value": worst["agreement"]},
        {"finding": "padding share of the mixed batch's prompt tokens", "value": mixed["wasted_fraction"]},
        {"finding": "prefill mixed / bucketed (×)", "value": bucket_v.gain, "verdict": bucket_v.kind},
        {"finding": f"server max_batch_size {many['max_batch_size']} / {one['max_batch_size']}, tokens/s (×)",
         "value": serve_v.gain, "verdict": serve_v.kind},
        {"finding": "TTFT p90 bursty / Poisson (×)", "value": burst_v.ratio, "verdict": burst_v.kind},
    ]
    return Findings(rows=rows, sentences=sentences)


def server_verdicts(one: dict[str, Any], many: dict[str, Any]) -> tuple[Verdict, Verdict]:
    """The larger max_batch_size against the smaller, judged paired on their passes (``samples``, round i of each
    at index i): served output tokens/s (higher is better) and each pass's TPOT p50 (lower is better)."""
    return (verdict.compare(verdict.samples(many, "output_tokens_per_s"), verdict.samples(one, "output_tokens_per_s"),
                            paired=True),
            verdict.compare(verdict.samples(many, "tpot_p50_s"), verdict.samples(one, "tpot_p50_s"),
                            higher_is_better=False, paired=True))


def worse_ttft(open_loop: list[dict[str, Any]]) -> tuple[str | None, Verdict]:
    """Which arrivals (Poisson, bursty: ``open_loop``'s two rows) saw the worse TTFT p90, by the takeaway's own
    verdict, paired on the passes' TTFT p90s (``samples``, round i of each shape at index i); ``None`` when that
    verdict names no winner (within noise, no verdict, implausible). The reveal and the takeaway both read it, so
    they cannot disagree."""
    poisson, bursty = open_loop
    v = verdict.compare(verdict.samples(bursty, "ttft_p90_s"), verdict.samples(poisson, "ttft_p90_s"),
                        higher_is_better=False, paired=True)  # one p90 per pass: requests within a pass share its drift
    return {verdict.WORSE: bursty.get("arrivals", "bursty"), verdict.BETTER: poisson.get("arrivals", "Poisson")}.get(v.kind), v


def batch_verdicts(first: dict[str, Any], last: dict[str, Any], memory_bound_gain: float) -> tuple[Verdict, Verdict]:
    """Total and per-user tokens/s of the largest batch against batch 1, each against its physical limits.

    Total: at most the memory-bound model's gain, at least batch 1's (one weight read serves every row).
    Per user: never faster than alone (each step does a batch's work).
    Both judged paired on the sweep's rounds (``samples``, round i of each size at index i)."""
    total = verdict.compare(verdict.samples(last, "total_tokens_per_s"), verdict.samples(first, "total_tokens_per_s"),
                            paired=True, bound=memory_bound_gain, bound_why="the memory-bound model of this batch",
                            floor=1.0, floor_why="one weight read serves every row, so a batch cannot lose to batch 1")
    user = verdict.compare(verdict.samples(last, "tokens_per_s_per_user"),
                           verdict.samples(first, "tokens_per_s_per_user"), paired=True, bound=1.0,
                           bound_why="each step does the whole batch's work, so no user can get faster than alone")
    return total, user


def throughput_sentence(batch: int, v: Verdict, model_gain: float) -> str:
    """The sentence a batch's total-throughput verdict chooses (never 'gave more' on noise)."""
    return verdict.pick(
        v, better=(f"Batch {batch} gave {v.gain:.1f}× the total tokens/s of batch 1 "
                   f"(the memory-bound model allows up to {model_gain:.1f}×)."),
        worse=f"Batch {batch} gave less total throughput than batch 1 ({v.gain:.2f}×).",
        same=(f"Batch {batch} gave " + verdict.phrase(v, "batch 1's total tokens/s")
              + ": raise SWEEP_REPEATS or close other programs."),
        wild=(f"Batch {batch}'s total tokens/s came out " + verdict.phrase(v, "batch 1's")
              + ": the machine, not batching, moved this number."))

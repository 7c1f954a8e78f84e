"""Notebook 07's takeaways: paged KV blocks against reserving the model's limit, continuous against static
batching (each against its own model), the answers batching kept, and vLLM's engine on the same requests.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import results, verdict
from ..findings import Findings, UNPAIRED, recorded, rounds_verdict


def batching_verdicts(static: Mapping[str, Any], continuous: Mapping[str, Any], alone: Mapping[str, Any],
                      cb_bound: float | None, when: str | None = None) -> tuple[verdict.Verdict, verdict.Verdict]:
    """Continuous against static throughput (at most ``cb_bound``: the larger of the steps and rows it saves), and
    static against one at a time, paired on the rounds' ``samples`` of tokens_per_s (round i of each mode at index
    i); ``when``: the day of the reference the rows come from, if they do (``rounds_verdict``)."""
    cb = rounds_verdict(verdict.samples(continuous, "tokens_per_s"), verdict.samples(static, "tokens_per_s"), when=when,
                        bound=cb_bound, bound_why="continuous batching's own model: the static run's steps or rows "
                                                  "over its own")
    return cb, rounds_verdict(verdict.samples(static, "tokens_per_s"), verdict.samples(alone, "tokens_per_s"), when=when)


def engine_verdict(one: Mapping[str, Any], every: Mapping[str, Any], batch: int,
                   when: str | None = None) -> verdict.Verdict:
    """vLLM all at once against one at a time, paired on the rounds of one server start: ``batch`` requests at once
    cannot beat ``batch``× one's throughput."""
    return rounds_verdict(verdict.samples(every, "tokens_per_s"), verdict.samples(one, "tokens_per_s"), when=when,
                          bound=batch, bound_why=f"{batch} requests at once cannot beat {batch}× one request's throughput")


def short_verdict(static: Mapping[str, Any], continuous: Mapping[str, Any], when: str | None = None) -> verdict.Verdict:
    """How much sooner continuous batching answered the short requests than static batching (lower mean latency is
    better), paired on the rounds' ``samples`` of mean_latency_short_s; rows that kept one value each (a reference
    from before these samples) are two values with no noise of their own to judge them by (``verdict.versus``)."""
    key = "mean_latency_short_s"
    if key in (static.get("samples") or {}) and key in (continuous.get("samples") or {}):
        return rounds_verdict(verdict.samples(continuous, key), verdict.samples(static, key), higher_is_better=False,
                              when=when)
    return verdict.versus(continuous[key], static[key], higher_is_better=False)


def reference_sentence(reference: Any, cb: verdict.Verdict) -> str:
    """Where this run's paired verdict on continuous against static is "no verdict" (quick mode's rounds are too
    few), the committed full-mode reference's verdict beside it; '' otherwise."""
    if reference is None or not cb.paired or cb.kind != verdict.NO_VERDICT:
        return ""
    rows = {r["mode"]: r for r in reference.section("batching")}
    if not {"static", "continuous"} <= set(rows):
        return ""
    ref_v, _ = batching_verdicts(rows["static"], rows["continuous"], rows.get("one at a time", rows["static"]),
                                 None, when=recorded(reference))  # its own workload: this run's bound is not its own
    return (f"This run gives {cb.label} on continuous against static; the reference (full mode): "
            f"continuous batching gave {_phrase(ref_v, 'the static throughput')}.")


def _phrase(v: verdict.Verdict, what: str) -> str:
    """``verdict.phrase``, and where a reference's rounds were judged by the unpaired rule, the reason that says so
    also beside a real difference."""
    if v.real and UNPAIRED in v.reason:
        return f"{v.gain:.2f}× {what} ({v.word()}; {v.reason})"
    return verdict.phrase(v, what)


def takeaways(*, paged: Mapping[str, Any], contiguous: Mapping[str, Any], big_model: str, big_gpu: str,
              static: Mapping[str, Any], continuous: Mapping[str, Any], alone: Mapping[str, Any], cb_bound: float,
              same: Mapping[str, bool], batch: int, long_tokens: int, reference: Any = None,
              engine: Mapping[str, Any] | None = None, when: str | None = None) -> Findings:
    """``paged``/``contiguous``: the big model's allocation rows (waste_fraction, fit_in_budget); ``static``,
    ``continuous``, ``alone``: the lab's batching rows (tokens_per_s with its samples, mean_latency_short_s,
    wasted_row_fraction, wall_s, decode_steps); ``same``: mode → its greedy tokens equal each request alone;
    ``reference``: the shipped 07 results, if any; ``engine``: vLLM's ``one`` and ``every`` rows, its ``squeezed``
    blocks row and ``squeeze_tokens``, or None where vLLM did not run; ``when``: the day of the reference the rows
    come from, where they do (its rounds then may be judged unpaired, and say so). Every verdict is paired on the
    rounds. The headline: continuous ÷ static."""
    cb, static_v = batching_verdicts(static, continuous, alone, cb_bound, when)
    short_v = short_verdict(static, continuous, when)
    short = short_v.gain
    fit = paged["fit_in_budget"] / contiguous["fit_in_budget"]
    ref_x = None
    if reference is not None:
        rate = {r["mode"]: r["tokens_per_s"] for r in reference.section("batching")}
        ref_x = rate["continuous"] / rate["static"] if rate.get("static") else None
    step_x = (static["wall_s"] / static["decode_steps"]) / (alone["wall_s"] / alone["decode_steps"])
    why = {verdict.WORSE: f"A static batch waits for its longest answer ({long_tokens} tokens) while its finished rows "
                          f"keep computing ({static['wasted_row_fraction']:.0%} of its rows were waste) and pads every "
                          f"prompt to the longest; a step of {batch} rows cost {step_x:.1f}× a one-row step here, so the "
                          "shared weight reads did not pay for the waste.",
           verdict.BETTER: "Sharing each step's weight reads outweighed the rows wasted on finished requests and "
                           "padding."}.get(static_v.kind, f"No lesson from it until the verdict is real ({static_v.label}).")
    says = [f"Reserving up to the model's limit left {contiguous['waste_fraction']:.0%} of the KV memory empty; blocks "
            f"left {paged['waste_fraction']:.1%} (under one block per request), so {fit:.0f}× as many {big_model} "
            f"requests fit on a {big_gpu}.",
            "Continuous batching gave " + _phrase(cb, "the static throughput")
            + (f", within the {cb_bound:.1f}× its own model allows," if cb.real else "")
            + " and answered short requests " + verdict.phrase(short_v, "as fast as static did", "sooner", "later")
            + ": static batches made "
            f"{static['wasted_row_fraction']:.0%} of their rows compute for finished requests, continuous "
            f"{continuous['wasted_row_fraction']:.0%}.",
            results.beside_reference("continuous ÷ static throughput", cb.gain, reference, ref_x),
            reference_sentence(reference, cb),
            f"Static batches of {batch} gave " + _phrase(static_v, "one-at-a-time's throughput") + f". {why}",
            "Batching changed no answer: every request got exactly the greedy tokens it gets alone."
            if all(same.values()) else f"Some answers differ from the request run alone: {dict(same)}; look for the cause."]
    rows = [{"finding": "continuous / static batching, tokens/s (×)", "value": cb.gain, "verdict": cb.kind},
            {"finding": "short requests answered sooner, continuous / static (×)", "value": short,
             "verdict": short_v.kind},
            {"finding": f"{big_model} requests fitting the budget, paged / contiguous-max (×)", "value": fit},
            {"finding": "static batching / one at a time, tokens/s (×)", "value": static_v.gain, "verdict": static_v.kind}]
    if engine is not None:
        one, every, squeezed = engine["one"], engine["every"], engine["squeezed"]
        v = engine_verdict(one, every, batch, when)
        n = squeezed["preemptions_vllm"]
        says.append(f"vLLM's engine chose transformers' tokens in every run: {every['same_tokens_as_transformers']}; all "
                    f"at once it gave " + _phrase(v, "its one-at-a-time throughput") + f". In a pool too small "
                    f"for {batch} {engine['squeeze_tokens']}-token answers it preempted {n:.0f} time{'s' * (n != 1)}, the "
                    f"replay predicted {squeezed['preemptions_replay']}.")
        ref_engine = {r["mode"]: r for r in reference.section("vllm_engine")} if reference is not None else {}
        if v.paired and v.kind == verdict.NO_VERDICT and {"one at a time", "all at once"} <= set(ref_engine):
            ref_v = engine_verdict(ref_engine["one at a time"], ref_engine["all at once"], batch, recorded(reference))
            says.append(f"vLLM all at once against one at a time: {v.label} here; the reference (full mode): it gave "
                        + _phrase(ref_v, "its one-at-a-time throughput") + ".")
        rows.append({"finding": "vLLM all at once / one at a time, tokens/s (×)", "value": v.gain, "verdict": v.kind})
    return Findings(rows=rows, sentences=[x for x in says if x])

"""Notebook 13's takeaways: what a prefix cache served an agent's turns, what a cache-buster cost in TTFT, where
reloading KV from the disk tier beats recomputing it, how many sessions one KV budget keeps, and where tool calls
land."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from ..findings import Findings, recorded


def busted_sentence(server: str, clean: Mapping[str, Any], busted: Mapping[str, Any], judged: Any,
                    fixed: Mapping[str, Any] | None = None) -> str:
    """One server's clean run against the same trace with a timestamp in the system prompt (and the fix)."""
    fix = (f"; with the clock pinned it served {fixed['cached_share']:.0%} again" if fixed else "")
    how = (f"the same request's TTFT per prompt token with the timestamp was {judged.ratio:.2f}× the clean run's "
           f"(the geometric mean of {judged.n} requests paired round by round; {judged.word('faster', 'slower')}: "
           f"{judged.reason})" if judged.paired else
           f"median TTFT per prompt token with the timestamp was {judged.ratio:.2f}× the clean run's "
           f"({judged.word('faster', 'slower')}, judged unpaired: {judged.reason})")
    return (f"{server}: the clean trace's prompt tokens were {clean['cached_share']:.0%} served from the prefix cache, "
            f"the timestamped one's {busted['cached_share']:.0%}{fix}. From turn 1 on, {how}.")


def tier_sentence(bytes_per_token: int, predicted: Mapping[str, Any], measured: int | None, table: Sequence[Mapping[str, Any]],
                  bandwidth: float) -> str:
    """The crossover predicted from the sizing formula, the tier's bandwidth and the prefill speed, against the one the
    TTFTs show."""
    longest = table[-1]
    lengths = ", ".join(str(r["tokens"]) for r in table)
    undecided = [r for r in table if r["reload_verdict"] in (verdict.NO_VERDICT, verdict.TIED)]
    if measured is not None:
        seen = f"measured, reloading was faster from {measured} tokens on (of {lengths})"
    elif undecided:
        seen = (f"measured, no length shows reloading faster by its verdict ({undecided[-1]['reload_verdict_reason']} "
                f"at {undecided[-1]['tokens']} tokens: run more rounds)")
    else:
        seen = f"measured, reloading was never judged faster at the lengths tried ({lengths})"
    return (f"Each token of this model's KV is {bytes_per_token:,} bytes (fp32); read back at {bandwidth / 1e9:.1f} GB/s "
            f"against this machine's prefill, the predicted crossover is "
            f"{predicted['tokens'] if predicted['tokens'] is not None else 'never'} tokens; {seen}. At "
            f"{longest['tokens']} tokens a reload took {longest['reload_over_recompute']:.2f}× a recompute's TTFT.")


def takeaways(*, clean: Mapping[str, Any], busted: Mapping[str, Any], judged: Any, sentences: Sequence[str],
              crossover: int | None, resident: Mapping[str, Any], tool_rows: Sequence[Mapping[str, Any]] | None
              ) -> Findings:
    """The rows (the cached share of the lab server's clean trace first) and the sentences they choose."""
    rows: list[dict[str, Any]] = [
        {"finding": "cached share of prompt tokens, clean trace (lab server)", "value": clean["cached_share"]},
        {"finding": "cached share of prompt tokens, timestamp in the system prompt (lab server)",
         "value": busted["cached_share"]},
        {"finding": "TTFT per prompt token, timestamped ÷ clean (" + ("geometric mean of the pairs" if judged.paired
                                                                      else "median") + ")",
         "value": judged.ratio, "verdict": judged.kind},
        {"finding": "reload beats recompute from (tokens, measured)", "value": crossover},
        {"finding": "sessions resident in the KV budget, predicted", "value": resident["predicted"]},
        {"finding": "sessions resident in the KV budget, measured", "value": resident["measured"]},
    ]
    said = list(sentences)
    said.append(f"One KV budget of {resident['budget_tokens']:,} positions was predicted to hold {resident['predicted']} "
                f"sessions of this trace whole; run with {resident['runs']}, the cached share stayed near the perfect "
                f"cache's up to {resident['measured']} session{'s' if resident['measured'] != 1 else ''}.")
    if tool_rows:
        for r in tool_rows:
            rows.append({"finding": f"tool calls conforming, tool_choice={r['tool_choice']} (vLLM)",
                         "value": r["conforming_share"]})
        by = {r["tool_choice"]: r for r in tool_rows}
        auto = by.get("auto")
        if auto is not None:
            forced = "; ".join(f"{c}: {by[c]['conforming']} of {by[c]['requests']} conforming calls in tool_calls "
                               f"({by[c]['cut_off']} cut off at max_tokens)" for c in by if c != "auto")
            said.append(f"Under tool_choice=auto, {auto['in_tool_calls']} of {auto['requests']} answers came back as "
                        f"tool_calls, {auto['in_content']} wrote the call as text and {auto['in_none']} made none. "
                        f"Forced by the grammar, {forced}.")
    return Findings(rows, said)


def tier_beside_reference(table: Sequence[Mapping[str, Any]], full_rounds: int, ref: Any = None) -> str:
    """Where this run timed too few rounds for a paired verdict at some length (quick mode's one round), says so,
    with the full-mode reference's verdicts beside (``ref``: the notebook's shipped reference, its "tier" rows) or,
    where none ships, that full mode runs ``full_rounds`` rounds to decide; empty where every length had its pairs."""
    short = [r for r in table if r["reload_verdict"] == verdict.NO_VERDICT
             and r.get("pairs", 0) < verdict.MIN_PAIRS]  # fact: pairs counted against the test's minimum
    if not short:
        return ""
    here = "; ".join(f"{r['tokens']} tokens: {r['reload_verdict_label']}" for r in short)
    rows = {r["tokens"]: r for r in (ref.section("tier") if ref is not None else [])}
    if not rows:
        return (f"Too few pairs here for the paired test ({here}); full mode runs {full_rounds} rounds of each way, and no "
                "full-mode reference of this notebook ships yet to show its verdicts.")
    return (f"Too few pairs here for the paired test ({here}); the full-mode reference (recorded "
            f"{recorded(ref, 'tier')}): "
            + "; ".join(f"{n} tokens: reload {r['reload_over_recompute']:.2f}× recompute ({r['reload_verdict']})"
                        for n, r in sorted(rows.items())) + ".")

"""Notebook 12's takeaways: what a grammar costs and buys (valid answers, tokens, time), what N adapters cost
against N copies and whether vLLM's adapters answer as the merged weights do, and what splitting prefill from
decode moved and changed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import results, verdict
from ..findings import PAIRED_NOTE, UNPAIRED, Findings, recorded


def structured_sentence(con: Mapping[str, Any], free: Mapping[str, Any], where: str) -> str:
    """Constrained against free decoding on one server: valid answers, tokens per answer, tokens/s per sequence and
    the batch's wall time, each difference in the verdict's words."""
    return (f"{where}: {con['valid']} of {con['requests']} constrained answers were valid JSON of the schema, against "
            f"{free['valid']} of {free['requests']} free; {con['tokens_per_answer']:.0f} tokens per answer against "
            f"{free['tokens_per_answer']:.0f}. Per sequence the constrained decode ran at {con['speed_ratio']:.2f}× "
            f"the free one's tokens/s ({con['speed_verdict']}: {con['speed_why']}), and the batch took "
            f"{con['wall_ratio']:.2f}× the free batch's wall time ({con['wall_verdict']}: {con['wall_why']}).")


def lora_sentence(modes: Sequence[Mapping[str, Any]], checks: Mapping[str, Mapping[str, Any]],
                  judged: Mapping[str, Any]) -> str:
    """vLLM's base / one adapter / mixed throughput, with the verdicts, and the answers against merged weights."""
    by = {m["mode"]: m for m in modes}
    equal = ", ".join(f"{name} {c['equal']}/{c['compared']}" for name, c in checks.items())
    return (f"vLLM with LoRA: {by['base']['tokens_per_s']:.1f} tokens/s for the base, {by['one']['tokens_per_s']:.1f} "
            f"with one adapter ({judged['one'].word()}, {judged['one'].ratio:.2f}× the base: {judged['one'].reason}), "
            f"{by['mixed']['tokens_per_s']:.1f} with the adapters mixed in one batch ({judged['mixed'].word()}, "
            f"{judged['mixed'].ratio:.2f}× the base: {judged['mixed'].reason}). Greedy answers equal to transformers "
            f"with the adapter merged: {equal}.")


def pd_sentence(split: Sequence[Mapping[str, Any]], bytes_ratio: float | None, itl: Mapping[str, Any] | None,
                plain: Mapping[str, Any] | None = None) -> str:
    """Prefill on one server and decode on another: tokens identical to one server's, the bytes moved against the
    formula, the short streams' stall under a burst, split against one server, and what the split costs their
    median gap (the decode server has one core of the two)."""
    same = sum(bool(r["identical"]) for r in split)
    loaded = sum(1 for r in split if not r["recomputed"])
    says = (f"Prefill here, decode there: {same} of {len(split)} answers identical to one server's; the decode server "
            f"loaded the KV of {loaded} of them")
    if bytes_ratio is not None:
        says += f", and each layer file held {bytes_ratio:.3f}× the sizing formula's bytes (headers aside)"
    isolated = itl is not None and itl.get("verdict") == verdict.BETTER
    if itl is not None and itl.get("gain") is not None:
        says += (f". Under a burst of long prompts, the short streams' longest stall was {itl['gain']:.1f}× shorter "
                 f"split than on one server ({itl['verdict']}: {itl['verdict_reason']})" if isolated
                 else f". Under a burst of long prompts, the short streams' stall: {itl['verdict']} "
                      f"({itl['verdict_reason']})")
    if itl is not None and plain is not None and itl.get("itl_p50_s") and plain.get("itl_p50_s"):
        says += (f"; the median gap between their tokens was {itl['itl_p50_s'] / plain['itl_p50_s']:.2f}× one "
                 "server's (the decode server has one core, one server both)")
    return says + (": on shared cores the split isolated the short streams' latency; it adds no throughput." if isolated
                   else ": this run shows no latency isolation; on shared cores the split adds no throughput either.")


def pd_reference_row(ref: Any, bytes_ratio: float | None) -> dict[str, Any] | None:
    """The split's takeaway where it did not start in this run: ``pd_sentence`` on the reference's rows (``ref``: the
    notebook's shipped reference; ``bytes_ratio``: its files' bytes over the formula's), saying first that the rows
    are the reference's and on which machine. None where the reference holds no split."""
    split = ref.section("pd_split") if ref is not None else []
    if not split:
        return None
    itl = {r["target"]: r for r in ref.section("pd_itl")}
    said = pd_sentence(split, bytes_ratio, itl.get("split"), itl.get("plain"))
    env = (ref.notes.get("section_env") or {}).get("pd_split") or ref.env
    where = results.where_of(results.Results(ref.name, env=env))
    judged = itl.get("split") or {}
    unpaired = (f" Its stall verdict was {UNPAIRED} {recorded(ref, 'pd_split')} "
                f"({judged.get('rounds')} rounds, before rounds were paired)."
                if judged.get("verdict_reason") and not str(judged["verdict_reason"]).startswith("paired") else "")
    return {"bytes_ratio": bytes_ratio, "where": where,
            "sentence": f"The prefill/decode split did not start in this run; from the {where}: {said[0].lower()}{said[1:]}"
                        + unpaired}


def takeaways(*, lab: Mapping[str, Any] | None, vllm_con: Mapping[str, Any] | None, mask: Mapping[str, Any],
              bytes_row: Mapping[str, Any], lora: str | None, lora_gain: float | None, pd: Mapping[str, Any] | None,
              structured: Sequence[str] = ()) -> Findings:
    """The rows (the headline first: constrained answers valid, on the lab's server) and the sentences."""
    rows: list[dict[str, Any]] = []
    said: list[str] = list(structured)
    if lab is not None:
        rows.append({"finding": "valid JSON of the schema, constrained (lab's server)", "value": lab["valid_share"]})
        rows.append({"finding": "constrained ÷ free tokens/s per sequence (lab's server)", "value": lab["speed_ratio"],
                     "verdict": lab["speed_verdict"]})
    if vllm_con is not None:
        rows.append({"finding": "valid JSON of the schema, constrained (vLLM)", "value": vllm_con["valid_share"]})
    rows.append({"finding": "hand-written mask ÷ model, ms per token", "value":
                 mask["mask_ms_per_token"] / mask["model_ms_per_token"]})
    said.append(f"A mask computed by hand visits every vocabulary entry at every step: {mask['mask_ms_per_token']:.0f} ms "
                f"per token against the model's {mask['model_ms_per_token']:.0f} ms here; a grammar engine looks its "
                "mask up instead, which is why serving engines compile the grammar once.")
    rows.append({"finding": f"{bytes_row['n']} adapters + base ÷ {bytes_row['n']} full copies, bytes",
                 "value": bytes_row["base_plus_adapters_bytes"] / bytes_row["full_copies_bytes"]})
    said.append(f"{bytes_row['n']} variants as adapters of rank {bytes_row['rank']}: "
                f"{bytes_row['base_plus_adapters_bytes'] / 2**20:,.0f} MiB with the base, against "
                f"{bytes_row['full_copies_bytes'] / 2**20:,.0f} MiB as {bytes_row['n']} full copies.")
    if lora is not None:
        rows.append({"finding": "mixed adapters ÷ base, tokens/s (vLLM)", "value": lora_gain})
        said.append(lora)
    if pd is not None:
        rows.append({"finding": "KV bytes moved per request ÷ the sizing formula"
                     + (f" ({pd['where']})" if pd.get("where") else ""), "value": pd["bytes_ratio"]})
        said.append(pd["sentence"])
    return Findings(rows=rows, sentences=said)




def _too_few(v: Any) -> bool:
    """A paired verdict that had fewer pairs than the test needs (quick mode's short runs)."""
    return v.paired and v.kind == verdict.NO_VERDICT and v.n < verdict.MIN_PAIRS  # fact: pairs counted against the minimum


def _recorded(ref: Any, section: str) -> str:
    how = "paired" if (ref.notes or {}).get("verdicts") == PAIRED_NOTE else "unpaired"
    return f"judged {how}, recorded {recorded(ref, section)}"


def structured_beside_reference(row: Mapping[str, Any], ref: Any, section: str = "vllm_structured") -> str:
    """Where this run's constrained-against-free verdict on tokens/s per sequence (``row``: the constrained row of
    ``structured_table``) had too few pairs, the full-mode reference's verdicts beside it (``section``'s constrained
    row), and how they were judged; empty where this run decided, or no reference holds the section."""
    con = next((r for r in (ref.section(section) if ref is not None else []) if r.get("variant") == "constrained"), None)
    too_few = (row.get("speed_verdict") == verdict.NO_VERDICT
               and (row.get("pairs") or 0) < verdict.MIN_PAIRS)  # fact: pairs counted against the test's minimum
    if not too_few or con is None or "speed_verdict" not in con:
        return ""
    return (f"This run: {row['speed_label']}, too few pairs for the paired test. The full-mode reference ({_recorded(ref, section)}, "
            f"{con.get('rounds')} rounds): constrained tokens/s per sequence {con['speed_ratio']:.2f}× the free one's "
            f"({con['speed_verdict']}), the batch's wall time {con['wall_ratio']:.2f}× ({con['wall_verdict']}).")


def lora_beside_reference(judged: Mapping[str, Any], ref: Any, section: str = "lora_modes") -> str:
    """Where this run's LoRA verdicts (mode → verdict against the base) had too few pairs, the full-mode reference's
    beside them: its rows' tokens/s samples read by the rule it was recorded under (unpaired before rounds were paired,
    else paired), and how; empty where this run decided, or no reference holds the section."""
    rows = {r["mode"]: r for r in (ref.section(section) if ref is not None else [])}
    if not any(_too_few(v) for v in judged.values()) or "base" not in rows:
        return ""
    paired = (ref.notes or {}).get("verdicts") == PAIRED_NOTE
    said = []
    for mode in judged:
        if mode in rows:  # round i of each at index i, None where a round measured nothing (pairs_of drops it)
            v = verdict.compare(rows[mode]["samples"]["tokens_per_s"], rows["base"]["samples"]["tokens_per_s"],
                                paired=paired)
            said.append(f"{mode} {v.ratio:.2f}× the base ({v.label})")
    return (f"This run: {', '.join(f'{m} {v.label}' for m, v in judged.items())}, too few pairs for the paired test. "
            f"The full-mode reference ({_recorded(ref, section)}, {rows['base'].get('rounds')} rounds): "
            + "; ".join(said) + ".")

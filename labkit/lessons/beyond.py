"""Notebook 10's workloads and headline figures, shared with ``bench/beyond.py``.

The workloads are built from the lab's own data (``data/eval``'s prose): a text the answer copies, a
long document many questions share, a long prompt that arrives while answers stream. ``headline`` turns
the sections' rows into the ratios the bench prints, each beside its quality or equality check.
"""
from __future__ import annotations

from typing import Any

from ..serve.prefill import document_text

COPY_INSTRUCTION = "Correct any spelling mistakes in the following text and return the whole text."
FREE_CHAT = "Write a short story about a lighthouse keeper."
QUESTIONS = ("What does the café write on its blackboard?", "How many iron rings are on the sea wall?",
             "Who visits the lighthouse, and how often?", "What colour is the school's door?",
             "What is the soup on Fridays?", "When does the first bakery light its ovens?",
             "What do the teachers turn the view into?", "Why do the boats come back heavy on Thursdays?")
STREAM_PROMPTS = ("Count slowly from one to fifty, in words.", "List the months of the year, one per line.",
                  "Name twenty animals, one per line.", "Spell out the alphabet, one letter per line.")


def copy_prompt(tokenizer: Any, passage_tokens: int) -> str:
    """An editing task whose answer copies a passage of the prompt (prompt lookup's good case)."""
    return f"{COPY_INSTRUCTION}\n\n{document_text(tokenizer, passage_tokens)}"


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def headline(lookup: list[dict[str, Any]], prefix: list[dict[str, Any]], chunked: list[dict[str, Any]],
             kv: list[dict[str, Any]], engines: list[dict[str, Any]], kv_name: str | None = None,
             quality_floor: float = 0.9) -> dict[str, Any]:
    """The headline ratio of each section, with the check that makes it honest.

    lookup   rows of ``speculative.compare_lookup`` (task 'copy' and 'chat')
    prefix   rows of ``prefill.prefix_cache_run`` (off first, then on)
    chunked  rows of ``prefill.chunked_prefill_run`` (unchunked first, then chunked)
    kv       rows of ``kvquant.compare``; ``kv_name``: the quantised row to report (default: the smallest)
    engines  rows of ``cpu_engines.measure_*`` (llama.cpp rows have engines named 'llama.cpp …'); the lab's
             best is its fastest path whose greedy agreement with fp32 is at least ``quality_floor``
    """
    out: dict[str, Any] = {}
    copy = next((r for r in lookup if r["task"] == "copy"), None)
    if copy:
        out.update(lookup_copy_decode_speedup=copy["decode_speedup"], lookup_copy_tokens_per_forward=copy["tokens_per_forward"],
                   lookup_identical_to_greedy=all(r["identical"] for r in lookup))
    if len(prefix) == 2:
        off, on = prefix
        out.update(prefix_cache_ttft_ratio=_ratio(off["ttft_p50_s"], on["ttft_p50_s"]), prefix_cache_hit_rate=on["hit_rate"],
                   prefix_cache_outputs_identical=off["texts"] == on["texts"])
    if len(chunked) == 2:
        off, on = chunked
        out.update(chunked_prefill_itl_max_ratio=_ratio(off["itl_max_s"], on["itl_max_s"]),
                   # p99 only where both runs have the samples for it (timing.P99_MIN_SAMPLES gaps)
                   chunked_prefill_itl_p99_ratio=_ratio(off.get("itl_p99_s"), on.get("itl_p99_s")),
                   chunked_prefill_long_ttft_ratio=_ratio(on["long_ttft_s"], off["long_ttft_s"]),
                   chunked_prefill_outputs_identical=off["texts"] == on["texts"])
    if kv:
        quant = [r for r in kv[1:] if r.get("status", "ok") == "ok" and (kv_name is None or r["cache"] == kv_name)]
        if quant:
            best = max(quant, key=lambda r: r["bytes_ratio"] or 0)
            out.update(kv_quant_cache=best["cache"], kv_quant_bytes_ratio=best["bytes_ratio"],
                       kv_quant_agreement=best["agreement"], kv_quant_kl=best["kl"],
                       kv_quant_speed_ratio=_ratio(best["decode_tokens_per_s"], kv[0]["decode_tokens_per_s"]))
    ok = [r for r in engines if r.get("status") == "ok"]
    lab = [r for r in ok if not r["engine"].startswith("llama.cpp") and r["agreement"] >= quality_floor]
    llama = [r for r in ok if r["engine"].startswith("llama.cpp")]
    if lab:
        best_lab = max(lab, key=lambda r: r["decode_tokens_per_s"])
        out.update(lab_best_engine=f"{best_lab['engine']} {best_lab['format']}", quality_floor=quality_floor,
                   lab_best_decode_tokens_per_s=best_lab["decode_tokens_per_s"], lab_best_agreement=best_lab["agreement"])
    if llama:
        ref = next((r for r in llama if r["format"] == "Q4_1"), llama[0])
        out.update(llamacpp_engine=f"{ref['engine']} {ref['format']}", llamacpp_decode_tokens_per_s=ref["decode_tokens_per_s"],
                   llamacpp_agreement=ref["agreement"])
        if lab:
            out["lab_best_over_llamacpp_decode"] = best_lab["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
    else:
        out["llamacpp_reason"] = next((r["status"] for r in engines if r["engine"].startswith("llama.cpp")), "not run")
    return out

"""Notebook 10's workloads and headline figures, shared with ``bench/beyond.py``.

The workloads are built from the lab's own data (``data/eval``'s prose): a text the answer copies, a
long document many questions share, a long prompt that arrives while answers stream. ``headline`` turns
the sections' rows into the ratios the bench prints, each beside its quality or equality check.
"""
from __future__ import annotations

from typing import Any

from ...core import verdict
from ...decoding import quality
from ...serve.experiments.prefill import document_text

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
    lab = [r for r in ok if not r["engine"].startswith("llama.cpp")
           and r["agreement"] >= quality_floor]  # fact: the caller's quality floor, a rule fixed before the run
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


# ------------------------------------------------------------------------- the lab's mechanisms beside vLLM's


def _verdict(new: list[float | None], base: list[float | None]) -> str | None:
    """The paired verdict on a time that should fall (``new`` against ``base``), from the rounds' statistics (round
    i of each at index i; a round either side did not measure drops out as a pair), as its label ("better", "no
    verdict (4 pairs)", …)."""
    v = verdict.compare(new, base, paired=True, higher_is_better=False)
    return v.label if v.n else None


def _runs(row: dict[str, Any]) -> str:
    """How the lab's figure was measured: "the median of N interleaved rounds' medians", or "one run"."""
    n = row.get("rounds")
    return f"the median of {n} interleaved rounds' medians" if n else "one run"


def _tail(row: dict[str, Any]) -> tuple[str, float | None]:
    """The ITL tail a chunked-prefill row can speak of: p99 from ``timing.P99_MIN_SAMPLES`` gaps, else the max."""
    return ("p99", row["itl_p99_s"]) if row.get("itl_p99_s") is not None else ("max", row.get("itl_max_s"))


def beside_vllm(prefix: list[dict[str, Any]], chunked: list[dict[str, Any]], lookup: list[dict[str, Any]],
                served: dict[str, Any], references: dict[str, dict[str, list[int]]], eos: set[int]) -> list[dict[str, Any]]:
    """One row per figure: the lab's mechanism (rows of ``prefix_cache_run`` off/on, ``chunked_prefill_run``
    unchunked/chunked, ``compare_lookup`` per task) beside vLLM's (``vllm_mechanisms.compare``), each with its
    tokens check. ``references``: "prefix" and "streams" (transformers' greedy ids by request name, as
    ``served`` names them), "lookup" (the lab's decoded ids by task). A mechanism ``served`` lacks (quick mode runs
    the prefix cache alone) has no rows."""
    rows = []
    if "prefix" in served:
        p_off, p_on = prefix
        v_off, v_on = served["prefix"]["without"], served["prefix"]["with"]
        pre_check = {m: quality.check_line(quality.answers_check(served["prefix"][m]["answers"], references["prefix"], eos))
                     for m in ("with", "without")}
        prefix_tokens = f"with the cache {pre_check['with']}; without {pre_check['without']} (vs transformers)"
        lab_prefix_tokens = "answers identical off / on" if p_off["texts"] == p_on["texts"] else "answers differ off / on"
        rows.append({"mechanism": "prefix caching", "figure": "TTFT without / with the cached prefix (median, ×)",
                     "labkit": _ratio(p_off["ttft_p50_s"], p_on["ttft_p50_s"]),
                     "vllm": _ratio(v_off["ttft_p50_s"], v_on["ttft_p50_s"]),
                     "vllm_verdict": _verdict(v_on["samples"]["ttft_p50_s"], v_off["samples"]["ttft_p50_s"]),
                     "labkit_tokens": lab_prefix_tokens, "vllm_tokens": prefix_tokens,
                     "note": f"labkit {_runs(p_on)} of {p_on['requests']} requests; vLLM the median of {v_on['rounds']} "
                             f"interleaved rounds' medians ({len(v_on['samples']['ttft_s'])} requests per mode); "
                             "verdicts paired round by round"})
        rows.append({"mechanism": "prefix caching", "figure": "prompt tokens read from the cache (share)",
                     "labkit": p_on["token_hit_rate"], "vllm": v_on["token_hit_rate"],
                     "labkit_tokens": lab_prefix_tokens, "vllm_tokens": prefix_tokens,
                     "note": "labkit: /metrics labkit_prefix_cache_*; vLLM: /metrics vllm:prefix_cache_hits / _queries "
                             f"(without the shared salt: {v_off['token_hit_rate'] or 0:.0%})"})
    if "chunked" in served:
        c_off, c_on = chunked
        big, small = served["chunked"]["large"], served["chunked"]["small"]
        chunk_check = {m: quality.check_line(quality.answers_check(dict(zip(references["streams"], served["chunked"][m]["answers"])),
                                                        references["streams"], eos)) for m in ("small", "large")}
        lab_chunk_tokens = "answers identical unchunked / chunked" if c_off["texts"] == c_on["texts"] else "answers differ"
        (lab_tail, lab_a), (_, lab_b) = _tail(c_off), _tail(c_on)
        (v_tail, v_a), (_, v_b) = _tail(big), _tail(small)
        if lab_tail != _tail(c_on)[0]:
            lab_tail, lab_a, lab_b = "max", c_off["itl_max_s"], c_on["itl_max_s"]
        if v_tail != _tail(small)[0]:
            v_tail, v_a, v_b = "max", big["itl_max_s"], small["itl_max_s"]
        rows.append({"mechanism": "chunked prefill", "figure": "running streams' ITL tail, whole / chunked prompt (×)",
                     "labkit": _ratio(lab_a, lab_b), "vllm": _ratio(v_a, v_b), "labkit_tokens": lab_chunk_tokens,
                     "vllm_tokens": f"small budget {chunk_check['small']}; large {chunk_check['large']} (vs transformers)",
                     "note": f"labkit: ITL {lab_tail} of {c_off['itl_n']} gaps, chunks of {c_on['prefill_chunk_tokens']} vs "
                             f"unchunked; vLLM: ITL {v_tail} of {big['itl_n']} gaps over {big['rounds']} rounds, "
                             f"--max-num-batched-tokens {small['max_num_batched_tokens']} vs {big['max_num_batched_tokens']}"})
        rows.append({"mechanism": "chunked prefill", "figure": "streams' worst gap while the long prompt prefills, whole / "
                     "chunked (×)", "labkit": _ratio(c_off["itl_during_long_prefill_max_s"], c_on["itl_during_long_prefill_max_s"]),
                     "vllm": _ratio(big["stall_p50_s"], small["stall_p50_s"]), "labkit_tokens": lab_chunk_tokens,
                     "vllm_verdict": _verdict(small["samples"]["stall_s"], big["samples"]["stall_s"]),
                     "vllm_tokens": f"small budget {chunk_check['small']}",
                     "note": f"labkit {_runs(c_on)}; vLLM median of {len(small['samples']['stall_s'])} rounds"})
        rows.append({"mechanism": "chunked prefill", "figure": "the long prompt's own TTFT, chunked / whole (×)",
                     "labkit": _ratio(c_on["long_ttft_s"], c_off["long_ttft_s"]),
                     "vllm": _ratio(small["long_ttft_p50_s"], big["long_ttft_p50_s"]),
                     "labkit_tokens": lab_chunk_tokens, "vllm_tokens": f"small budget {chunk_check['small']}",
                     "note": f"labkit {_runs(c_on)}; vLLM median of {len(small['samples']['long_ttft_s'])} rounds"})
    for lab in lookup:
        task = lab["task"]
        v = served.get("speculative", {}).get(task)
        if v is None:
            continue
        lab_ids = {task: references["lookup"][task]}
        spec_check = quality.check_line(quality.answers_check({task: v["ngram_answer"]}, lab_ids, eos))
        plain_check = quality.check_line(quality.answers_check({task: v["plain_answer"]}, lab_ids, eos))
        lab_tokens = ("identical to plain decoding" if lab["identical"] and lab.get("mechanism_tokens_match", True)
                      else "differ from plain decoding")
        vllm_tokens = f"n-gram {spec_check}; plain {plain_check} (vs the lab's)"
        rows.append({"mechanism": "n-gram speculation", "figure": f"draft tokens accepted, {task} (share)",
                     "labkit": lab.get("acceptance_rate"), "vllm": v["acceptance_rate"], "labkit_tokens": lab_tokens,
                     "vllm_tokens": vllm_tokens,
                     "note": f"vLLM: /metrics vllm:spec_decode_num_accepted_tokens / _draft_tokens, {v['rounds']} runs"})
        rows.append({"mechanism": "n-gram speculation", "figure": f"decode speedup, {task} (×)",
                     "labkit": lab["decode_speedup"], "vllm": v["decode_speedup"], "labkit_tokens": lab_tokens,
                     "vllm_verdict": v["verdict"],
                     "vllm_tokens": vllm_tokens,
                     "note": f"vLLM: 1/TPOT as its engine timed it (/metrics), n-gram server over plain, {v['rounds']} "
                             f"interleaved runs each: {v['verdict']}"})
    return rows

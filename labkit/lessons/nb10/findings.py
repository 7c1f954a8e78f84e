"""Notebook 10's takeaways: prompt lookup, the prefix cache, chunked prefill, a quantised KV cache and the CPU
engines, each ratio judged by its verdict beside the check that the answers stayed the same.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import cpu, timing, verdict
from ...engines.cpu import best_lab_row
from ..findings import Findings


def lookup_verdict(row: Mapping[str, Any]) -> verdict.Verdict:
    """Prompt lookup's decode tokens/s against plain decoding's: paired round by round where the row says its runs
    were interleaved rounds (``compare_lookup``'s ``rounds_paired``), else (a row recorded before) by the unpaired
    rule on its samples. A forward pass that yields k tokens is at most k× faster (``tokens_per_forward`` bounds the
    gain)."""
    limits = dict(bound=max(1.0, row["tokens_per_forward"]), bound_why="a pass that yields k tokens saves at most k "
                  "passes' time")
    new, base = verdict.samples(row, "lookup_decode_tokens_per_s"), verdict.samples(row, "plain_decode_tokens_per_s")
    if _is_true(row.get("rounds_paired")):
        return verdict.compare(new, base, paired=True, **limits)
    return verdict.compare(new, base, **limits)


def _is_true(x: Any) -> bool:
    """A flag as a table keeps it: True (also numpy's), never a missing value (None, or NaN in a frame)."""
    return x is not None and not isinstance(x, float) and bool(x)


def _per_round(row: Mapping[str, Any], key: str) -> list[float | None] | None:
    kept = row.get("samples") if hasattr(row, "get") else None
    return list(kept[key]) if isinstance(kept, dict) and kept.get(key) else None


def judged(new: Mapping[str, Any], base: Mapping[str, Any], key: str, unpaired: tuple[Any, Any], *,
           higher_is_better: bool = False) -> tuple[verdict.Verdict, str]:
    """The verdict on two rows and how it was reached: paired on their per-round statistics (``samples[key]``, round
    i of each at index i) where both rows were measured in rounds; else, for a row recorded before (one run each),
    the unpaired rule on ``unpaired`` (new's and base's samples), and the words say so."""
    a, b = _per_round(new, key), _per_round(base, key)
    if a is not None and b is not None:
        v = verdict.compare(a, b, paired=True, higher_is_better=higher_is_better)
        return v, f"judged paired over {v.n} rounds"
    return (verdict.compare(*unpaired, higher_is_better=higher_is_better),
            "judged unpaired on one run each (recorded before runs were paired in rounds)")


def worst_gaps(stamps: Sequence[Sequence[float]]) -> list[float]:
    """Each stream's worst inter-token gap (seconds): one sample per running stream (a row recorded as one run)."""
    return [max(timing.gaps(s)) for s in stamps if len(s) > 1]


def lookup_why(row: Mapping[str, Any], v: verdict.Verdict | None = None) -> str:
    """Why prompt lookup ran at its speed, from the row's own numbers, when it did not beat plain decoding.

    Its speed over plain decoding is (tokens per forward pass) ÷ (a verification pass's time over a plain step's):
    a pass that checks k drafted tokens costs more than a one-token step, so it pays only when enough drafts are
    accepted. Empty when lookup was at least as fast; ``v`` (``lookup_verdict``) says whether "slower" is real."""
    if verdict.versus(row["decode_speedup"], 1.0).kind == verdict.BETTER:
        return ""  # lookup beat plain decoding: nothing to explain
    # the decode time spans the passes after the prefill's: one fewer than the forward passes counted
    step_s = row["plain_decode_s"] / max(1, row["plain_forward_passes"] - 1)
    pass_s = row["lookup_decode_s"] / max(1, row["lookup_forward_passes"] - 1)
    cost, tpf = pass_s / step_s, row["tokens_per_forward"]
    matched = "never matched" if row["acceptance_rate"] == 0 else "rarely matched"
    rare = verdict.pick(verdict.versus(tpf, 1.0),
                        same=f"the drafts {matched} (acceptance {row['acceptance_rate']:.0%}, {tpf:.2f} tokens per pass, "
                             "near 1)",
                        better=f"{tpf:.2f} tokens per pass (acceptance {row['acceptance_rate']:.0%})", worse="")
    word = ("slower" if v is not None and v.kind == verdict.WORSE else
            f"at {row['decode_speedup']:.2f}× plain decoding's speed")
    task = row.get("task") or getattr(row, "name", None)  # a frame's row keeps the task as its name
    return (f"On {f'the {task} task' if task else 'this task'} lookup was {word} because {rare}, while each verification pass cost "
            f"{cost:.2f}× a plain step ({pass_s * 1e3:.0f} vs {step_s * 1e3:.0f} ms: a pass that carries drafts runs them too): "
            f"{tpf:.2f} ÷ {cost:.2f} = {tpf / cost:.2f}×.")


def _said(v: verdict.Verdict) -> str:
    """A time's verdict in words: 'shorter' / 'longer' when the difference is real, and why."""
    return verdict.said(v, "shorter", "longer")


def kv_ranked(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``kvquant.compare``'s rows with the quantised caches ranked by mean KL against the model's own cache (row 0,
    the reference, stays first): KL reads every token's whole distribution, where greedy agreement over a few
    tokens moves in steps of 1/n. ``kl_rank`` is 1 for the closest; a cache that failed here keeps no rank and goes last."""
    ok = lambda r: r.get("status") in (None, "ok") and r.get("kl") is not None  # noqa: E731  (None: a reference row)
    ranked = sorted((dict(r) for r in rows[1:] if ok(r)), key=lambda r: r["kl"])
    for i, r in enumerate(ranked, start=1):
        r["kl_rank"] = i
    return [dict(rows[0]), *ranked, *(dict(r) for r in rows[1:] if not ok(r))] if rows else []


def kv_ranking(rows: Sequence[Mapping[str, Any]]) -> str:
    """The quantised caches in KL order, each with its greedy agreement beside it, and why KL ranks them."""
    ranked = [r for r in kv_ranked(rows) if "kl_rank" in r]
    if not ranked:
        return "No quantised KV cache ran here: nothing to rank."
    n = int(ranked[0].get("new_tokens") or 0)
    step = f"; agreement over {n} tokens moves in steps of {1 / n:.0%}, too coarse to rank them" if n else ""
    return (f"KV caches ranked by mean KL against the model's own cache (lower is closer{step}): "
            + "; ".join(f"{r['kl_rank']}. {r['cache']} KL {r['kl']:.2e}, agreement {r['agreement']:.1%}" for r in ranked)
            + ".")


def llamacpp_elsewhere(rows: Sequence[Mapping[str, Any]], there_hw: Mapping[str, Any], here_hw: Mapping[str, Any],
                       quality_floor: float) -> str:
    """llama.cpp against the lab's best when llama.cpp did not run here and its figures come from a reference run
    (``rows``: its ``cpu_engines``; ``there_hw``/``here_hw``: the ``hardware`` entries of that run and of this
    machine): the sentence names the CPU that measured it and says it is not this machine, and when the CPU family
    differs (AVX-512 against AVX2, Arm), that the ranking may not carry over."""
    there, here = cpu.machine_line(dict(there_hw)), cpu.machine_line(dict(here_hw))
    llama = next((r for r in rows if r.get("status") == "ok" and r["engine"].startswith("llama.cpp")
                  and r["format"] == "Q4_1"), None)
    lab = best_lab_row([dict(r) for r in rows], quality_floor)
    if llama is None or lab is None:
        return f"The reference run (on {there}, not this machine) has no llama.cpp row to compare either."
    family = cpu.isa_class(dict(there_hw)), cpu.isa_class(dict(here_hw))
    measure = "install labkit[llamacpp] to measure it here"
    carry = (f" Its CPU family ({family[0]}) is this machine's too; still, {measure}." if family[0] == family[1]
             and family[0] != "ISA not recorded" else
             f" The reference did not record its instruction sets, so it may be another CPU family than this machine's "
             f"({family[1]}) and the ranking may not carry over: {measure}." if family[0] == "ISA not recorded" else
             f" Its CPU family ({family[0]}) is not this machine's ({family[1]}), so the ranking may not carry over: "
             f"{measure}.")
    return (f"llama.cpp did not run here: its figures come from the reference run on {there}, not this machine "
            f"({here}). There, llama.cpp Q4_1 decoded {llama['decode_tokens_per_s'] / lab['decode_tokens_per_s']:.2f}× "
            f"the lab's best path with agreement ≥ {quality_floor:.0%} ({lab['engine']} {lab['format']}; "
            f"{llama['decode_tokens_per_s']:.1f} vs {lab['decode_tokens_per_s']:.1f} tokens/s)." + carry)


def takeaways(*, head: Mapping[str, Any], lookup: tuple[Mapping[str, Any], Mapping[str, Any]],
              prefix: tuple[Mapping[str, Any], Mapping[str, Any]], chunked: tuple[Mapping[str, Any], Mapping[str, Any]],
              kv: tuple[Mapping[str, Any], Mapping[str, Any]], quality_floor: float,
              kv_rows: Sequence[Mapping[str, Any]] = (), llamacpp_reference: str | None = None) -> Findings:
    """``head``: ``nb10.runs.headline``'s figures; ``lookup``: the copying and free-chat rows of ``compare_lookup``;
    ``prefix``: off and on rows of ``prefix_cache_rounds`` (each round's median TTFT in ``samples``); ``chunked``:
    unchunked and chunked rows of ``chunked_prefill_rounds`` (each round's stall and long TTFT in ``samples``); each
    pair of them is judged paired, round by round; ``kv``: the model's own cache row and the
    quantised one reported (``samples`` of step_s); ``kv_rows``: every cache's row, ranked by KL (``kv_ranking``).
    ``llamacpp_reference``: ``llamacpp_elsewhere``'s sentence, where llama.cpp's figures come from a reference run.
    The headline: prompt lookup's decode speedup on copying."""
    copy, chat = lookup
    look_v = lookup_verdict(copy)
    off, on = prefix
    ttft_v, ttft_how = judged(on, off, "ttft_p50_s", (on["ttft_s"], off["ttft_s"]))
    plain, chunk = chunked
    tail = plain["itl_tail"] if plain["itl_tail"] == chunk["itl_tail"] else "max"  # p99 only from 100 gaps on
    itl_x = plain[f"itl_{tail}_s"] / chunk[f"itl_{tail}_s"]
    stall_v, stall_how = judged(chunk, plain, "stall_s", (worst_gaps(chunk.get("stamps") or []),
                                                          worst_gaps(plain.get("stamps") or [])))
    long_v, _ = judged(chunk, plain, "long_ttft_s", (chunk["long_ttft_s"], plain["long_ttft_s"]))
    base, best = kv
    kv_v = verdict.compare(verdict.samples(best, "step_s"), verdict.samples(base, "step_s"), higher_is_better=False)
    engines = (f"; llama.cpp Q4_1 decodes {1 / head['lab_best_over_llamacpp_decode']:.2f}× as fast (agreement "
               f"{head['llamacpp_agreement']:.1%} vs {head['lab_best_agreement']:.1%})"
               if "lab_best_over_llamacpp_decode" in head else
               f"; llama.cpp: {head.get('llamacpp_reason', 'not run').split(' (')[0]}")  # the reason's gist
    says = [
        f"Prompt lookup: {copy['tokens_per_forward']:.1f} tokens per forward pass on the copying task, decode "
        + verdict.phrase(look_v, "plain decoding's speed") + f"; free chat {chat['tokens_per_forward']:.2f} per pass, "
        f"{chat['decode_speedup']:.2f}×. Greedy tokens identical: {head['lookup_identical_to_greedy']}."
        + "".join(f" {w}" for w in (lookup_why(copy, look_v), lookup_why(chat, lookup_verdict(chat))) if w),
        f"Prefix cache: median TTFT without / with it {head['prefix_cache_ttft_ratio']:.2f}×, with {on['hit_rate']:.0%} "
        f"of prompts hitting; {ttft_how}, TTFT with it: {_said(ttft_v)}; answers identical: "
        f"{head['prefix_cache_outputs_identical']}.",
        f"Chunked prefill: the running streams' ITL {tail} unchunked / chunked {itl_x:.1f}×; the streams' worst gap "
        f"with chunks against without, {stall_how}: {_said(stall_v)}; the long prompt's own TTFT {long_v.ratio:.1f}× "
        f"unchunked's, {_said(long_v)}; answers identical: {head['chunked_prefill_outputs_identical']}.",
        f"KV cache ({best['cache']}): {best['bytes_ratio']:.1f}× fewer bytes, decode steps "
        + verdict.phrase(kv_v, "the speed") + f", KL {best['kl']:.2e}, agreement {best['agreement']:.1%}."
        + (f" {kv_ranking(kv_rows)}" if kv_rows else ""),
        f"CPU engines: the lab's fastest path with agreement ≥ {quality_floor:.0%} is {head['lab_best_engine']} at "
        f"{head['lab_best_decode_tokens_per_s']:.1f} tokens/s" + engines + "."
        + (f" {llamacpp_reference}" if llamacpp_reference and "lab_best_over_llamacpp_decode" not in head else ""),
    ]
    rows = [{"finding": "prompt lookup / plain decode tokens/s, copying task (×)", "value": look_v.gain,
             "verdict": look_v.kind},
            {"finding": "prefix cache: TTFT without / with (median, ×)", "value": head["prefix_cache_ttft_ratio"],
             "verdict": ttft_v.kind},
            {"finding": f"chunked prefill: ITL {tail} unchunked / chunked (×)", "value": itl_x, "verdict": stall_v.kind},
            {"finding": f"KV cache {best['cache']}: bytes of the model's own cache / its bytes (×)",
             "value": best["bytes_ratio"]},
            {"finding": f"KV cache {best['cache']}: decode step speed / the model's own cache's (×)", "value": kv_v.gain,
             "verdict": kv_v.kind}]
    return Findings(rows=rows, sentences=says)


def same_file_elsewhere(here: Mapping[str, Any], here_base: Mapping[str, Any], there: Mapping[str, Any] | None,
                        there_base: Mapping[str, Any] | None, *, here_how: str, there_how: str,
                        there_name: str = "notebook 03") -> str:
    """The same engine and file timed by another notebook of the run (``there``; ``there_base`` its PyTorch fp32
    row): do the two figures agree? The two fp32 rows say whether the machine itself moved between the notebooks:
    where it did and the gains over each notebook's own fp32 agree, the difference is the machine's; where the fp32s
    agree, or the gains differ, the two measurements of the engine differ (prompt, token count, what else was loaded)."""
    if not there or not there.get("decode_tokens_per_s") or not there_base or not there_base.get("decode_tokens_per_s"):
        return f"{there_name} recorded no decode speed for this file in this run: nothing to check against."
    tps = verdict.compare(verdict.samples(here, "decode_tokens_per_s"), verdict.samples(there, "decode_tokens_per_s"))
    rel_here = here["decode_tokens_per_s"] / here_base["decode_tokens_per_s"]
    rel_there = there["decode_tokens_per_s"] / there_base["decode_tokens_per_s"]
    base_x = here_base["decode_tokens_per_s"] / there_base["decode_tokens_per_s"]  # did the machine itself move?
    same_base = verdict.versus(here_base["decode_tokens_per_s"], there_base["decode_tokens_per_s"]).kind == verdict.TIED
    same_rel = verdict.versus(rel_here, rel_there).kind == verdict.TIED
    head = (f"The same file: {here['decode_tokens_per_s']:.1f} tokens/s here ({here_how}), "
            f"{there['decode_tokens_per_s']:.1f} in {there_name} ({there_how}): here "
            + verdict.phrase(tps, f"{there_name}'s speed") + ". ")
    rel = (f"Over each notebook's own PyTorch fp32: {rel_here:.2f}× here, {rel_there:.2f}× there; PyTorch fp32 itself "
           f"ran {base_x:.2f}× as fast here")
    if not tps.real:
        return head + rel + "."
    if same_rel and not same_base:
        return head + rel + ": the same gain, so the machine ran at another speed between the two notebooks, not the engine."
    return (head + rel + ": " + ("the machine ran at the same speed, so " if same_base else "the gains differ, so ")
            + "the two measurements of the engine differ (prompt, token count, alone or beside other sessions, their "
            "spread), not only the machine: compare like with like before quoting either.")



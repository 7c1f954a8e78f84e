"""Notebook 05's takeaways: the KV cache's speedup and size, prompt length against prefill and decode, cache
variants, attention kernels and where a decode step spends its time.
"""
from __future__ import annotations

import statistics
from typing import Any

from ...core import verdict
from ...core.verdict import Verdict
from ...model import kvlayout, sizing
from ..findings import Findings, step_split


def _times(new: Any, base: Any, key: str, **kw: Any) -> Verdict:
    """Verdict on two result rows' times (lower is better), paired round by round: both rows were timed in the same
    rounds (``timing.rounds``: round i of each at index i of its samples), so round i of one ran beside round i of
    the other."""
    return verdict.compare(verdict.samples(new, key), verdict.samples(base, key), higher_is_better=False, paired=True,
                           **kw)


def faster_of(rows: Any, names: list[str], key: str) -> tuple[str | None, str]:
    """Which of two rows (indexed by name) took less ``key`` time, by the same verdict the takeaways use: (the
    winner, "") when the difference is real, else (None, the verdict's words) so a reveal crowns no one."""
    v = _times(rows.loc[names[1]], rows.loc[names[0]], key)
    if v.kind == verdict.BETTER:
        return names[1], ""
    if v.kind == verdict.WORSE:
        return names[0], ""
    return None, f"{v.kind} ({v.reason})"


def takeaways(*, loop_agreement: float, core_identical: bool, tokens: int, speedup: float,
              step_growth: dict[str, float], kv_sizes: Any, bytes_per_position: int, split: Any, variants: Any,
              attention: Any, decode_shares: dict[str, Any], weight_bytes: int | None = None,
              gap: dict[str, Any] | None = None, static_reason: str = "",
              loop_s: dict[str, list[float]] | None = None) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the verdicts.

    ``step_growth``: last step's time / first decode step's, per 'cache on' / 'cache off'. ``kv_sizes``: rows with
    'measured / formula'. ``split``: prefill_decode_split rows, shortest prompt first. ``variants``: rows indexed
    by cache variant ('dynamic', 'static') with tpot_s and agreement. ``attention``: rows indexed by
    implementation ('eager', 'sdpa') with ttft_s and agreement. Rows that kept ``samples`` (one per round, every row
    of a table timed in the same rounds) are judged by ``verdict.compare(..., paired=True)``; a row without them counts
    as one pair (never a real difference). ``loop_s``: each round's total time of the loop, per 'cache on' / 'cache
    off' (round i at index i), for the cache's paired verdict; without it the speedup is one value against 1. ``decode_shares``: group → share
    of a decode step, or → the shares of each profiled repeat. ``weight_bytes``: the bytes a decode step reads
    besides the cache, for the growth the bytes predict. ``gap``: the profiled step split three ways
    (``hardware.decode_gap`` with the profiler's matmul time), as notebooks 01 and 10 split theirs.
    ``static_reason``: why the static cache did not run (``cache_variants.static_cache_reason``); ``variants`` then
    holds no 'static' row and the sentence says why.
    """
    fit = kv_sizes["measured / formula"]
    short, long_ = split.iloc[0], split.iloc[-1]
    prompt_x, ttft_x, tpot_x = (long_.prompt_tokens / short.prompt_tokens, long_.ttft_s / short.ttft_s,
                                long_.tpot_s / short.tpot_s)
    tpot_said = _times(long_, short, "tpot_s", bound=1.0, bound_why="a longer cache cannot make a step faster")
    predicted = None
    if weight_bytes:
        step_bytes = [sizing.decode_bytes_per_step(weight_bytes, bytes_per_position,
                                                   r.prompt_tokens + r.get("new_tokens", 1) / 2, 1) for r in (short, long_)]
        predicted = step_bytes[1] / step_bytes[0]  # weights plus the cache one step reads, long ÷ short prompt
    has_static = "static" in variants.index
    if not has_static and not static_reason:
        raise ValueError("variants has no 'static' row: pass static_reason, the reason it did not run")
    static_x = variants.loc["static"].tpot_s / variants.loc["dynamic"].tpot_s if has_static else None
    static_said = _times(variants.loc["static"], variants.loc["dynamic"], "tpot_s") if has_static else None
    sdpa_x = attention.loc["sdpa"].ttft_s / attention.loc["eager"].ttft_s
    sdpa_said = _times(attention.loc["sdpa"], attention.loc["eager"], "ttft_s")
    share = {g: (list(v) if isinstance(v, (list, tuple)) else [float(v)]) for g, v in decode_shares.items()}
    matmul_s, attn_s = share.get("matmul", [0.0]), share.get("attention", [0.0])
    matmul, attn = statistics.median(matmul_s), statistics.median(attn_s)
    split_said = verdict.compare(matmul_s, attn_s) if min(matmul_s + attn_s) > 0 else None
    on_g, off_g = step_growth["cache on"], step_growth["cache off"]
    if split_said is not None and split_said.kind == verdict.BETTER:
        where_time = ("matrix multiplication dominates, so a faster matrix-vector kernel, or fewer bytes read by a good "
                      "one (notebooks 02, 03), helps decode more than a faster attention kernel.")
    elif split_said is not None and split_said.kind == verdict.WORSE:
        where_time = "attention dominates here, so a faster attention kernel helps decode more than smaller weights."
    else:
        why = split_said.reason if split_said is not None else "one group recorded no time"
        where_time = f"this run cannot say which dominates ({why}: raise REPEATS, close other programs)."
    cache_v = (verdict.compare(loop_s["cache on"], loop_s["cache off"], higher_is_better=False, paired=True)
               if loop_s else verdict.versus(speedup, 1.0))  # paired rounds, or one timed loop each way
    # without the cache, did a step grow, and more than with it? (a step that got faster grew nothing)
    grows = verdict.versus(off_g, on_g) if verdict.versus(off_g, 1.0).kind == verdict.BETTER else verdict.versus(1.0, 1.0)
    sentences = [
        f"With the cache your loop made {tokens} tokens {speedup:.1f}× "
        + verdict.pick(cache_v, better="faster than", worse="slower than", same=f"({cache_v.label}) against",
                       unsure=f"({cache_v.label}) against")
        + f" without it ({cache_v.reason}). From the first decode steps to the last, a step's time changed {on_g:.2f}× "
        f"with the cache and "
        f"{off_g:.2f}× without: "
        + verdict.pick(grows, better="without the cache each step grows with the sequence it recomputes.",
                       worse="the cached steps grew more, which the cache should prevent: rerun on a quiet machine.",
                       same=(f"this run cannot tell the two apart ({grows.label}: too few tokens, or a noisy machine: "
                             "raise LOOP_TOKENS).")),
        f"Your loop agreed with generate on {loop_agreement:.0%} of its tokens, and labkit's decode core gave "
        f"{'the same tokens as' if core_identical else 'different tokens from'} generate.",
        f"The cache holds {bytes_per_position:,} bytes per position and sequence; the tensors measured "
        f"{fit.min():.3f}–{fit.max():.3f}× the formula"
        + (" — the formula is the cache." if fit.min() > 0.99 and fit.max() < 1.01 else  # fact: bytes counted, not timed
           " — not the formula: look at the positions each cache holds."),
        f"A {prompt_x:.0f}× longer prompt made TTFT {ttft_x:.1f}× longer and TPOT {tpot_x:.2f}×"
        + (f" (the bytes a step reads predict {predicted:.2f}×)" if predicted else "") + ": prefill "
        + verdict.pick(verdict.versus(ttft_x, 1.0), better="grows with the prompt", worse="got shorter, which no prompt "
                       "can do: rerun", same="barely grew")
        + "; a decode step "
        + verdict.pick(tpot_said, worse="grew (each step reads the whole, longer cache)",
                       same=f"did not change ({tpot_said.label}: {tpot_said.reason})",
                       better=f"got faster, which no cache can do ({tpot_said.reason}): rerun",
                       wild=f"got faster, which no cache can do ({tpot_said.label}: {tpot_said.reason})")
        + ".",
        (f"Without compiling, the static cache decoded {verdict.than(static_said)} the dynamic one "
         f"({static_x:.2f}× its time per token; {static_said.reason}), with "
         f"{variants.loc['static'].agreement:.0%} of its tokens equal." if has_static else
         f"The static cache did not run on this model: {static_reason}."),
        f"sdpa prefilled the long prompt {verdict.than(sdpa_said)} eager ({sdpa_x:.2f}× its TTFT; {sdpa_said.reason}); "
        f"{attention.loc['sdpa'].agreement:.0%} of its tokens equal eager's.",
        f"A decode step spent {matmul:.0%} of its time in matrix multiplication and {attn:.0%} in attention "
        f"(median of {len(matmul_s)} profiled step{'s' * (len(matmul_s) != 1)}): " + where_time
        + (f" The profiled step is {step_split(gap)}." if gap else ""),
    ]
    rows = [
        {"finding": f"cache on vs off, {tokens} new tokens (speedup ×)", "value": speedup},
        {"finding": "loop tokens equal to generate (share)", "value": loop_agreement},
        {"finding": "KV bytes measured / formula (min)", "value": float(fit.min())},
        {"finding": "KV bytes measured / formula (max)", "value": float(fit.max())},
        {"finding": f"TTFT, {prompt_x:.0f}× longer prompt (×)", "value": ttft_x},
        {"finding": f"TPOT, {prompt_x:.0f}× longer prompt (×)", "value": tpot_x},
        {"finding": f"TPOT, {prompt_x:.0f}× longer prompt, predicted from bytes (×)", "value": predicted},
        {"finding": "TPOT static / dynamic cache (×)", "value": static_x},
        {"finding": "static cache tokens equal to dynamic (share)",
         "value": float(variants.loc["static"].agreement) if has_static else None},
        {"finding": "TTFT sdpa / eager (×)", "value": sdpa_x},
        {"finding": "sdpa tokens equal to eager (share)", "value": float(attention.loc["sdpa"].agreement)},
        {"finding": "decode step spent in matmul (share)", "value": matmul},
    ]
    return Findings(rows=rows, sentences=sentences)


def layer_by_layer_sentence(config: Any, kv_dtype: str, per_position: int, context: int) -> str:
    """Notebook 01's layer-by-layer KV figure (``sizing.kv_bytes``) beside the per-position formula the tensors were
    checked against, for this model at ``context`` tokens: equal when every layer is full attention of one size."""
    s = sizing.shape(config)
    layered = sizing.kv_bytes(s, kv_dtype, context)
    kinds = kvlayout.kind_counts(sizing.layer_caches(s))
    what = ", ".join(f"{n} {k}" for k, n in kinds.items())
    if layered == per_position * context:
        return (f"Layer by layer (notebook 01) this model keeps {layered:,} bytes at {context:,} tokens, the same as "
                f"the formula: its {what} layers all keep every token at one size.")
    said = (f"Layer by layer (notebook 01) this model keeps {layered:,} bytes at {context:,} tokens, "
            f"{layered / (per_position * context):.3f}× the formula's {per_position * context:,}: its layers are {what}")
    if "mla" in kinds:  # the latent is a serving engine's cache; transformers 4.57's held expanded keys and values
        held = sizing.transformers_kv_bytes(s, kv_dtype, context)
        said += ("; that is the latent a serving engine keeps, and this transformers' cache (the tensors measured here) "
                 + ("keeps it too" if held == layered else f"keeps the expanded keys and values instead: {held:,} bytes"))
    return said + "."

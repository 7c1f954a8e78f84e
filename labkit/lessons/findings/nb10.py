"""Notebook 10's takeaways: prompt lookup, the prefix cache, chunked prefill, a quantised KV cache and the CPU
engines, each ratio judged by its verdict beside the check that the answers stayed the same.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from . import Findings


def lookup_verdict(row: Mapping[str, Any]) -> verdict.Verdict:
    """Prompt lookup's decode tokens/s against plain decoding's, over the repeats: a forward pass that yields k
    tokens is at most k× faster (``tokens_per_forward`` bounds the gain)."""
    return verdict.compare(verdict.samples(row, "lookup_decode_tokens_per_s"),
                           verdict.samples(row, "plain_decode_tokens_per_s"), bound=max(1.0, row["tokens_per_forward"]),
                           bound_why="a pass that yields k tokens saves at most k passes' time")


def worst_gaps(stamps: Sequence[Sequence[float]]) -> list[float]:
    """Each stream's worst inter-token gap (seconds): one sample per running stream."""
    return [max(b - a for a, b in zip(s, s[1:])) for s in stamps if len(s) > 1]


def _said(v: verdict.Verdict) -> str:
    """A time's verdict in words: 'shorter' / 'longer' when the difference is real, and why."""
    return f"{v.word('shorter', 'longer')} ({v.reason})"


def takeaways(*, head: Mapping[str, Any], lookup: tuple[Mapping[str, Any], Mapping[str, Any]],
              prefix: tuple[Mapping[str, Any], Mapping[str, Any]], chunked: tuple[Mapping[str, Any], Mapping[str, Any]],
              kv: tuple[Mapping[str, Any], Mapping[str, Any]], quality_floor: float) -> Findings:
    """``head``: ``beyond.headline``'s figures; ``lookup``: the copying and free-chat rows of ``compare_lookup``;
    ``prefix``: off and on rows of ``prefix_cache_run`` (per-request ``ttft_s``); ``chunked``: unchunked and
    chunked rows of ``chunked_prefill_run`` (``stamps`` per stream); ``kv``: the model's own cache row and the
    quantised one reported (``samples`` of step_s). The headline: prompt lookup's decode speedup on copying."""
    copy, chat = lookup
    look_v = lookup_verdict(copy)
    off, on = prefix
    ttft_v = verdict.compare(on["ttft_s"], off["ttft_s"], higher_is_better=False)
    plain, chunk = chunked
    tail = plain["itl_tail"] if plain["itl_tail"] == chunk["itl_tail"] else "max"  # p99 only from 100 gaps on
    itl_x = plain[f"itl_{tail}_s"] / chunk[f"itl_{tail}_s"]
    stall_v = verdict.compare(worst_gaps(chunk["stamps"]), worst_gaps(plain["stamps"]), higher_is_better=False)
    long_v = verdict.compare(chunk["long_ttft_s"], plain["long_ttft_s"], higher_is_better=False)
    base, best = kv
    kv_v = verdict.compare(verdict.samples(best, "step_s"), verdict.samples(base, "step_s"), higher_is_better=False)
    engines = (f"; llama.cpp Q4_1 decodes {1 / head['lab_best_over_llamacpp_decode']:.2f}× as fast (agreement "
               f"{head['llamacpp_agreement']:.1%} vs {head['lab_best_agreement']:.1%})"
               if "lab_best_over_llamacpp_decode" in head else
               f"; llama.cpp: {head.get('llamacpp_reason', 'not run').split(' (')[0]}")  # the reason's gist
    says = [
        f"Prompt lookup: {copy['tokens_per_forward']:.1f} tokens per forward pass on the copying task, decode "
        + verdict.phrase(look_v, "plain decoding's speed") + f"; free chat {chat['tokens_per_forward']:.2f} per pass, "
        f"{chat['decode_speedup']:.2f}×. Greedy tokens identical: {head['lookup_identical_to_greedy']}.",
        f"Prefix cache: median TTFT without / with it {head['prefix_cache_ttft_ratio']:.2f}×, with {on['hit_rate']:.0%} "
        f"of prompts hitting; per request, TTFTs with it were {_said(ttft_v)}; answers identical: "
        f"{head['prefix_cache_outputs_identical']}.",
        f"Chunked prefill: the running streams' ITL {tail} unchunked / chunked {itl_x:.1f}×; each stream's worst gap "
        f"was {_said(stall_v)} with chunks; the long prompt's own TTFT {long_v.ratio:.1f}× unchunked's, "
        f"{_said(long_v)}; answers identical: {head['chunked_prefill_outputs_identical']}.",
        f"KV cache ({best['cache']}): {best['bytes_ratio']:.1f}× fewer bytes, decode steps "
        + verdict.phrase(kv_v, "the speed") + f", agreement {best['agreement']:.1%}, KL {best['kl']:.2e}.",
        f"CPU engines: the lab's fastest path with agreement ≥ {quality_floor:.0%} is {head['lab_best_engine']} at "
        f"{head['lab_best_decode_tokens_per_s']:.1f} tokens/s" + engines + ".",
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

"""Prefix caching and chunked prefill, measured from the client side against the lab's server.

Both live in the continuous-batching engine (``labkit.serve.prefix_cache``: ``PrefixCache``;
``labkit.serve.continuous``: ``prefill_chunk_tokens``; ``labkit serve --batching continuous
--prefix-cache-tokens N --prefill-chunk-tokens N``). Here they are switched on and off under the same load and
measured as a client sees them:

prefix caching   requests that share a long first part (a system prompt, a document) reuse its KV instead
                 of prefilling it again: TTFT with and without, the hit counters from ``/metrics``, and the
                 answers compared.
chunked prefill  a long prompt arrives while other answers stream. Unchunked, its whole prefill runs
                 between two decode steps and every running stream stalls for it; chunked, each step
                 prefills at most N prompt tokens and the streams keep moving. The running streams'
                 inter-token latency (ITL) with and without, and what the long prompt pays (its TTFT).
"""
from __future__ import annotations

import contextlib
import statistics
from collections.abc import Sequence
from typing import Any

from ...core import timing
from ...core.checks import positive
from ...core.timing import itl_stats, percentile
from ...model.prompts import eval_tokens
from .. import client, launch, loadgen
from .. import metrics as prom


def metrics(url: str, prefix: str = "labkit_") -> dict[str, float]:
    """The server's ``/metrics`` as {name: value} for unlabelled samples named ``prefix``…"""
    return {name: value for name, labels, value in prom.scrape(url, timeout_s=30) if name.startswith(prefix)
            and not labels}


def document_text(tokenizer: Any, n_tokens: int, offset_tokens: int = 0) -> str:
    """``n_tokens`` tokens of the evaluation text (data/eval), as text: a long shared document."""
    positive("n_tokens", n_tokens)
    ids = eval_tokens(tokenizer)
    if offset_tokens + n_tokens > len(ids):
        raise ValueError(f"the evaluation text has {len(ids)} tokens; asked for {offset_tokens} + {n_tokens}")
    return tokenizer.decode(ids[offset_tokens:offset_tokens + n_tokens])


def reusable_prefix(cached: Sequence[int], prompt: Sequence[int], block: int) -> int:
    """Positions of ``prompt`` a prefix cache holding ``cached`` can serve: their common prefix, aligned down to
    whole blocks, leaving at least the prompt's last token to prefill (its logits give the first new token).
    The rule of ``prefix_cache.PrefixCache.lookup``."""
    positive("block", block)
    limit = min(len(cached), len(prompt) - 1)
    n = 0
    while n < limit and cached[n] == prompt[n]:
        n += 1
    return n // block * block


def shared_prefix_prompts(document: str, questions: Sequence[str]) -> list[str]:
    """One prompt per question, each starting with the same document: the shared prefix."""
    if not questions:
        raise ValueError("no questions: pass at least one")
    return [f"Read this text:\n\n{document}\n\nQuestion: {q}" for q in questions]


def prefix_cache_run(lm: Any, prompts: Sequence[str], max_tokens: int, concurrency: int,
                     prefix_cache_tokens: int) -> dict[str, Any]:
    """The same requests against the continuous-batching server with the prefix cache off (0) or on
    (``prefix_cache_tokens``): loadgen's TTFT and E2E, each answer's text, and the cache's counters."""
    positive("max_tokens", max_tokens)
    positive("concurrency", concurrency)
    with launch.run_server(lm, port=0, batching="continuous", max_batch_size=concurrency,
                            prefix_cache_tokens=prefix_cache_tokens) as srv:
        res = loadgen.run(srv.url, list(prompts), num_requests=len(prompts), max_concurrency=concurrency,
                          max_tokens=max_tokens, endpoint="chat", ignore_eos=True, warmup=0)
        counters = metrics(srv.url, "labkit_prefix_cache")
    failed = [o.error for o in res.outputs if not o.success]
    if failed:
        raise RuntimeError(f"{len(failed)} request(s) failed: {failed[0]}")
    s = res.summary()
    queries, hits = counters.get("labkit_prefix_cache_queries_total", 0), counters.get("labkit_prefix_cache_hits_total", 0)
    qt = counters.get("labkit_prefix_cache_query_tokens_total", 0)
    return {"prefix_cache_tokens": prefix_cache_tokens, "requests": len(prompts), "concurrency": concurrency,
            "ttft_p50_s": s["ttft_p50_s"], "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"],
            "e2e_p50_s": s["e2e_p50_s"], "duration_s": s["duration_s"],
            "ttft_s": [o.ttft_s for o in res.outputs], "texts": [o.text for o in res.outputs],
            "cache_queries": queries, "cache_hits": hits, "hit_rate": hits / queries if queries else None,
            "hit_tokens": counters.get("labkit_prefix_cache_hit_tokens_total", 0), "query_tokens": qt,
            "token_hit_rate": counters.get("labkit_prefix_cache_hit_tokens_total", 0) / qt if qt else None}


def _counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def prefix_cache_rounds(lm: Any, prompts: Sequence[str], max_tokens: int, concurrency: int,
                        prefix_cache_tokens: int, rounds: int) -> list[dict[str, Any]]:
    """The same requests in ``rounds`` interleaved rounds (``timing.rounds``: each round's order shuffled) against two
    continuous-batching servers started together, the prefix cache off (0) and on (``prefix_cache_tokens``); each
    pass starts from an empty cache (``flush_cache``), so it is the one run ``prefix_cache_run`` makes, repeated.
    After the start each server answers one warm-up request (the first prompt), not a round. Returns [off, on]: per mode each round's
    median TTFT (``samples["ttft_p50_s"]``, round i at index i: the pairs of a paired verdict) and their median,
    every request's TTFT pooled, the cache's counters over the rounds, the first round's answers and whether every
    round answered the same."""
    positive("max_tokens", max_tokens)
    positive("concurrency", concurrency)
    positive("rounds", rounds)
    sizes = {"off": 0, "on": prefix_cache_tokens}
    with contextlib.ExitStack() as stack:
        servers = {mode: stack.enter_context(launch.run_server(lm, port=0, batching="continuous",
                                                               max_batch_size=concurrency, prefix_cache_tokens=n))
                   for mode, n in sizes.items()}

        def one(mode: str) -> dict[str, Any]:
            srv = servers[mode]
            srv.flush_cache()  # each pass from an empty cache: the first requests miss, the rest can hit
            before = metrics(srv.url, "labkit_prefix_cache")
            res = loadgen.run(srv.url, list(prompts), num_requests=len(prompts), max_concurrency=concurrency,
                              max_tokens=max_tokens, endpoint="chat", ignore_eos=True, warmup=0)
            failed = [o.error for o in res.outputs if not o.success]
            if failed:
                raise RuntimeError(f"{len(failed)} request(s) failed: {failed[0]}")
            return {"summary": res.summary(), "ttft_s": [o.ttft_s for o in res.outputs],
                    "texts": [o.text for o in res.outputs],
                    "counters": _counters_delta(before, metrics(srv.url, "labkit_prefix_cache"))}

        for srv in servers.values():  # the warm-up after the start: not a round (each pass flushes the cache first)
            loadgen.run(srv.url, list(prompts[:1]), num_requests=1, max_concurrency=1, max_tokens=max_tokens,
                        endpoint="chat", ignore_eos=True, warmup=0)
        done = timing.rounds({mode: (lambda m=mode: one(m)) for mode in servers}, rounds, again=False)
    out = []
    for mode, runs in done.items():
        total = lambda key: sum(r["counters"].get(key, 0.0) for r in runs)  # noqa: E731
        queries, hits = total("labkit_prefix_cache_queries_total"), total("labkit_prefix_cache_hits_total")
        qt, ht = total("labkit_prefix_cache_query_tokens_total"), total("labkit_prefix_cache_hit_tokens_total")
        per_round = [r["summary"]["ttft_p50_s"] for r in runs]
        ttft = [t for r in runs for t in r["ttft_s"]]
        out.append({"prefix_cache_tokens": sizes[mode], "requests": len(prompts), "concurrency": concurrency,
                    "rounds": rounds, "ttft_p50_s": statistics.median(per_round), "ttft_p90_s": percentile(ttft, 90),
                    "e2e_p50_s": statistics.median(r["summary"]["e2e_p50_s"] for r in runs),
                    "ttft_s": ttft, "texts": runs[0]["texts"],
                    "same_texts_every_round": all(r["texts"] == runs[0]["texts"] for r in runs),
                    "cache_queries": queries, "cache_hits": hits, "hit_rate": hits / queries if queries else None,
                    "hit_tokens": ht, "query_tokens": qt, "token_hit_rate": ht / qt if qt else None,
                    "order": ["".join("A" if m == "off" else "B" for m in o) for o in done.order],
                    "samples": {"ttft_p50_s": per_round}})
    return out


# ------------------------------------------------------------------------------------- chunked prefill


def _check_burst(stream_tokens: int, long_tokens: int, long_after: int) -> None:
    """The burst's counts are positive and the long prompt arrives while the streams are still decoding."""
    positive("stream_tokens", stream_tokens)
    positive("long_tokens", long_tokens)
    positive("long_after", long_after)
    if long_after >= stream_tokens:
        raise ValueError(f"long_after={long_after} must be below stream_tokens={stream_tokens}: the long prompt "
                         "must arrive while the streams are still decoding")


def chunked_prefill_run(lm: Any, stream_prompts: Sequence[str], stream_tokens: int, long_prompt: str,
                        prefill_chunk_tokens: int, long_tokens: int = 1, long_after: int = 4) -> dict[str, Any]:
    """Streams decoding, then one long prompt arrives (after the first stream's ``long_after``-th token),
    against the continuous-batching server with chunked prefill off (0) or on: the streams' ITL, pooled
    over the whole run, the long prompt's TTFT, and the streams' texts."""
    _check_burst(stream_tokens, long_tokens, long_after)
    with launch.run_server(lm, port=0, batching="continuous", max_batch_size=len(stream_prompts) + 1,
                            prefill_chunk_tokens=prefill_chunk_tokens, max_prompt_tokens=8192) as srv:
        got = client.burst(srv.url, stream_prompts, stream_tokens, [long_prompt], long_tokens, long_after,
                           endpoint="chat")
    if got.errors:
        raise RuntimeError(f"a request of the chunked-prefill run failed: {got.errors[0]}")
    (long,) = got.burst
    raw = {"stamps": got.stamps, "texts": [o.text for o in got.streams], "long_sent_s": long.start_s}
    long_first = got.first_token_s
    itl = itl_stats(raw["stamps"])
    during = itl_stats(raw["stamps"], (raw["long_sent_s"], long_first)) if long_first is not None else itl_stats([])
    return {"prefill_chunk_tokens": prefill_chunk_tokens, "streams": len(stream_prompts), "stream_tokens": stream_tokens,
            "itl_p50_s": itl["p50_s"], "itl_p99_s": itl["p99_s"], "itl_max_s": itl["max_s"], "itl_n": itl["n"],
            # the tail this run can speak of (itl_<tail>_s): p99 from 100 gaps on, the worst gap below that
            "itl_tail": "p99" if itl["p99_s"] is not None else "max",
            "itl_during_long_prefill_max_s": during["max_s"], "gaps_during_long_prefill": during["n"],
            "long_ttft_s": long_first - raw["long_sent_s"] if long_first is not None else None,
            "stamps": raw["stamps"], "long_sent_s": raw["long_sent_s"], "long_first_token_s": long_first,
            "texts": raw["texts"]}


def chunked_prefill_rounds(lm: Any, stream_prompts: Sequence[str], stream_tokens: int, long_prompt: str,
                           prefill_chunk_tokens: int, rounds: int, long_tokens: int = 1,
                           long_after: int = 4) -> list[dict[str, Any]]:
    """``chunked_prefill_run``'s burst in ``rounds`` interleaved rounds (``timing.rounds``, each round's order
    shuffled) against two continuous-batching servers started together, chunked prefill off (0) and on
    (``prefill_chunk_tokens``); each server first answers one warm-up request (the first stream's prompt), not a
    round. Returns [unchunked,
    chunked]: the streams' gaps pooled over the rounds (p50, p99 from ``timing.P99_MIN_SAMPLES`` gaps, max), per
    round the worst gap overlapping the long prompt's prefill (``samples["stall_s"]``) and the long prompt's TTFT
    (``samples["long_ttft_s"]``), round i at index i: the pairs of a paired verdict; their medians; the first
    round's stamps (for ``stamps_figure``) and texts, and whether every round streamed the same texts."""
    _check_burst(stream_tokens, long_tokens, long_after)
    positive("rounds", rounds)
    sizes = {"unchunked": 0, "chunked": prefill_chunk_tokens}
    with contextlib.ExitStack() as stack:
        servers = {mode: stack.enter_context(launch.run_server(
            lm, port=0, batching="continuous", max_batch_size=len(stream_prompts) + 1, prefill_chunk_tokens=n,
            max_prompt_tokens=8192)) for mode, n in sizes.items()}

        def one(mode: str) -> dict[str, Any]:
            got = client.burst(servers[mode].url, stream_prompts, stream_tokens, [long_prompt], long_tokens,
                               long_after, endpoint="chat")
            if got.errors:
                raise RuntimeError(f"a request of the chunked-prefill run failed: {got.errors[0]}")
            (long,) = got.burst
            first = got.first_token_s
            during = itl_stats(got.stamps, (long.start_s, first)) if first is not None else itl_stats([])
            return {"stamps": got.stamps, "texts": [o.text for o in got.streams], "long_sent_s": long.start_s,
                    "long_first_token_s": first, "stall_s": during["max_s"], "gaps_during": during["n"],
                    "long_ttft_s": first - long.start_s if first is not None else None}

        for srv in servers.values():  # the warm-up after the start: not a round
            client.burst(srv.url, stream_prompts[:1], 2, stream_prompts[:1], 1, 1, endpoint="chat")
        done = timing.rounds({mode: (lambda m=mode: one(m)) for mode in servers}, rounds, again=False)
    out = []
    for mode, runs in done.items():
        itl = itl_stats([s for r in runs for s in r["stamps"]])
        stalls = [r["stall_s"] for r in runs]
        ttfts = [r["long_ttft_s"] for r in runs]
        med = lambda xs: statistics.median(x for x in xs if x is not None) if any(x is not None for x in xs) else None  # noqa: E731
        first = runs[0]
        out.append({"prefill_chunk_tokens": sizes[mode], "streams": len(stream_prompts), "stream_tokens": stream_tokens,
                    "rounds": rounds, "itl_p50_s": itl["p50_s"], "itl_p99_s": itl["p99_s"], "itl_max_s": itl["max_s"],
                    "itl_n": itl["n"], "itl_tail": "p99" if itl["p99_s"] is not None else "max",
                    # the worst gap overlapping the long prompt's prefill, and that prompt's TTFT: medians of the rounds
                    "itl_during_long_prefill_max_s": med(stalls),
                    "gaps_during_long_prefill": statistics.median(r["gaps_during"] for r in runs),
                    "long_ttft_s": med(ttfts), "stamps": first["stamps"], "long_sent_s": first["long_sent_s"],
                    "long_first_token_s": first["long_first_token_s"], "texts": first["texts"],
                    "same_texts_every_round": all(r["texts"] == first["texts"] for r in runs),
                    "samples": {"stall_s": stalls, "long_ttft_s": ttfts}})
    return out


def stamps_figure(runs: Sequence[dict[str, Any]], title: str = "Token arrivals of the running streams"):
    """Each stream's token arrival times, one row per (run, stream); a band marks the long prompt's prefill."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in runs:
        label = f"chunk {r['prefill_chunk_tokens']}" if r["prefill_chunk_tokens"] else "unchunked"
        for i, s in enumerate(r["stamps"]):
            fig.add_scatter(x=s, y=[f"{label} · stream {i}"] * len(s), mode="markers", marker={"size": 5},
                            name=label, showlegend=i == 0)
        if r.get("long_first_token_s") is not None:
            fig.add_scatter(x=[r["long_sent_s"], r["long_first_token_s"]], y=[f"{label} · long prompt"] * 2,
                            mode="lines+markers", line={"width": 6}, name=f"{label}: long prompt's prefill")
    fig.update_layout(title=title, xaxis_title="seconds from the start", template="plotly_white",
                      height=200 + 40 * sum(len(r["stamps"]) + 1 for r in runs), yaxis={"autorange": "reversed"})
    return fig

"""vLLM's own prefix caching, chunked prefill and n-gram speculation, on notebook 10's workloads.

The lab builds each mechanism by hand (``labkit.serve.experiments.prefill``, ``labkit.decoding.speculative``); here
vLLM does the same work and is measured the same way, from the client and from ``/metrics`` deltas around each run:

prefix caching     the same requests sharing a document, in interleaved rounds. *Without*: each request carries
                   a cache salt of its own (vLLM's ``cache_salt``: blocks hashed under another salt are never
                   shared), so none can reuse another's prefix. *With*: the round's requests share one salt, fresh
                   each round, so each round starts from an empty cache as the lab's server does. TTFT of each,
                   and the prompt tokens read from the cache (``vllm:prefix_cache_hits`` / ``…_queries``).
chunked prefill    streams decoding, then one long prompt, against two servers that differ only in
                   ``--max-num-batched-tokens`` (vLLM's token budget per engine step: a longer prompt is prefilled
                   in chunks, the running streams' decode tokens in the same steps), in interleaved rounds: the
                   streams' inter-token gaps (``timing.itl_stats``) and the long prompt's TTFT.
n-gram speculation one request at a time on a plain server and on one started with ``--speculative-config
                   {"method": "ngram", ...}``, interleaved: TPOT of each, and acceptance from
                   ``vllm:spec_decode_num_accepted_tokens`` / ``vllm:spec_decode_num_draft_tokens``.

Prompts go as chat-formatted token ids to the completions endpoint and answers come back as token ids
(``return_token_ids``), so every answer is compared token by token with the lab's and transformers'.
This module knows nothing of the lab's own servers: the notebook puts the two side by side.
"""
from __future__ import annotations

import re
import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from ...core import verdict
from ...decoding import quality
from ...core.checks import positive
from ...core.timing import itl_stats, percentile, rounds as interleaved_rounds
from .. import client
from . import offline as vllm_engine
from . import server as vs
from ..metrics import metrics_delta

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"  # prompt tokens, not requests
DRAFTS, DRAFT_TOKENS, ACCEPTED = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                                  "vllm:spec_decode_num_accepted_tokens_total")
TPOT = "vllm:request_time_per_output_token_seconds"  # a histogram: _sum and _count per finished request


# ---------------------------------------------------------------------------------------- /metrics figures


def token_hit_rate(delta: Mapping[str, float]) -> float | None:
    """Share of the prompt tokens looked up in the prefix cache that it held (a ``metrics_delta``); None when
    nothing was looked up."""
    queries = delta.get(QUERIES, 0.0)
    return delta.get(HITS, 0.0) / queries if queries else None


def acceptance(delta: Mapping[str, float]) -> dict[str, float | None]:
    """Speculation over a run, from a ``metrics_delta``: drafts proposed, draft tokens, accepted tokens, the share
    of draft tokens accepted, and tokens accepted per draft."""
    drafts, tokens, accepted = (delta.get(k, 0.0) for k in (DRAFTS, DRAFT_TOKENS, ACCEPTED))
    return {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / tokens if tokens else None,
            "accepted_per_draft": accepted / drafts if drafts else None}


def engine_tpot(delta: Mapping[str, float]) -> float | None:
    """Mean TPOT of the requests a run finished, as the engine timed them (first to last token over the tokens
    after the first), from a ``metrics_delta``; None when none finished."""
    count = delta.get(TPOT + "_count", 0.0)
    return delta.get(TPOT + "_sum", 0.0) / count if count else None


def chunked_prefill_logged(log_text: str) -> dict[str, Any]:
    """What vLLM's log says about chunked prefill: whether the engine runs with it (``enable_chunked_prefill=`` in
    its config line) and the per-step token budget (the budget line, else the ``max_num_batched_tokens`` it was
    given). None where the log does not say (vLLM logs the budget line once per process, not always)."""
    enabled = re.findall(r"enable_chunked_prefill=(True|False)", log_text)
    budget = (re.findall(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)", log_text)
              or re.findall(r"'max_num_batched_tokens': (\d+)", log_text))
    return {"chunked_prefill": enabled[-1] == "True" if enabled else None,
            "budget": int(budget[-1]) if budget else None}


def greedy_references(lm: Any, prompts: Mapping[str, Sequence[int]], new_tokens: int) -> dict[str, list[int]]:
    """transformers ``generate``, greedy, each prompt alone (``vllm.hf_greedy``): the ids up to end-of-sequence."""
    work = [SimpleNamespace(id=name, prompt_ids=list(ids), max_new_tokens=new_tokens) for name, ids in prompts.items()]
    return vllm_engine.hf_greedy(lm, work)


# ---------------------------------------------------------------------------------------- requests


def _failures(outs: Sequence[client.RequestOutput]) -> list[str]:
    return [o.error or "failed" for o in outs if not o.success]


# ---------------------------------------------------------------------------------------- prefix caching


def prefix_rounds(server: vs.VLLMServer, prompts: Mapping[str, Sequence[int]], max_tokens: int, concurrency: int,
                  n_rounds: int) -> dict[str, dict[str, Any]]:
    """``n_rounds`` interleaved rounds of the same requests without and with a shared cache (see the module
    docstring; ``timing.rounds``: each round's order shuffled), after one warm-up pass of each mode that is not a
    round: per mode each round's median TTFT (round i at index i: the pairs of a paired verdict) and their median
    (every request's TTFT kept too: a round's first requests miss even with the cache), the prompt tokens the cache
    held, the first round's answers."""
    positive("n_rounds", n_rounds)
    names, ids = list(prompts), list(prompts.values())
    nonce = uuid.uuid4().hex[:8]  # a rerun against the same server starts from an empty cache too
    salts = {"without": lambda r: [f"{nonce}-r{r}-{n}" for n in names], "with": lambda r: [f"{nonce}-r{r}"] * len(names)}
    kept: dict[str, dict[str, Any]] = {m: {"ttft_s": [], "round_p50_s": [], "hits": 0.0, "queries": 0.0, "answers": [],
                                           "errors": []}
                                       for m in salts}

    def run(mode: str, r: int | str) -> None:
        before = server.metrics()
        outs, _wall = client.send_ids(server.url, ids, max_tokens, concurrency, salts=salts[mode](r))
        delta = metrics_delta(before, server.metrics())
        if r == "warm-up":  # the first pass after the server's start: not a round
            return
        k = kept[mode]
        ttfts = [o.ttft_s for o in outs if o.success]
        k["ttft_s"] += ttfts
        k["round_p50_s"].append(statistics.median(ttfts) if ttfts else None)  # round r stays at index r
        k["hits"] += delta.get(HITS, 0.0)
        k["queries"] += delta.get(QUERIES, 0.0)
        k["answers"].append(dict(zip(names, (o.token_ids for o in outs))))
        k["errors"] += _failures(outs)

    for mode in salts:
        run(mode, "warm-up")
    count = dict.fromkeys(salts, 0)

    def next_round(mode: str) -> None:
        run(mode, count[mode])
        count[mode] += 1

    interleaved_rounds({mode: (lambda m=mode: next_round(m)) for mode in salts}, n_rounds, again=False)
    return {mode: {"mode": mode, "requests": len(names), "rounds": n_rounds, "concurrency": concurrency,
                   # each round's median TTFT (the lab's figure for one run), then their median
                   "ttft_p50_s": statistics.median(p50s) if (p50s := [x for x in k["round_p50_s"] if x is not None])
                   else None,
                   "ttft_p90_s": percentile(k["ttft_s"], 90) if k["ttft_s"] else None,
                   "hit_tokens": k["hits"], "query_tokens": k["queries"],
                   "token_hit_rate": token_hit_rate({HITS: k["hits"], QUERIES: k["queries"]}),
                   "samples": {"ttft_p50_s": k["round_p50_s"], "ttft_s": k["ttft_s"]}, "answers": k["answers"][0],
                   "same_answers_every_round": all(a == k["answers"][0] for a in k["answers"]),
                   "failed": len(k["errors"]), "errors": k["errors"][:3]}
            for mode, k in kept.items()}


# ---------------------------------------------------------------------------------------- chunked prefill


def long_prompt_while_streaming(base_url: str, stream_prompts: Sequence[Sequence[int]], stream_tokens: int,
                                long_prompt: Sequence[int], long_after: int = 4, salt: str | None = None,
                                timeout_s: float = 600.0) -> dict[str, Any]:
    """Streams decoding ``stream_tokens`` each; after the first stream's ``long_after``-th chunk the long prompt
    arrives (one token asked). Stamps of every stream, when the long prompt was sent, when its token came
    (``client.burst`` checks that it comes while they still decode)."""
    got = client.burst(base_url, stream_prompts, stream_tokens, [long_prompt], 1, long_after, salt=salt,
                       timeout_s=timeout_s)
    (long,) = got.burst
    return {"stamps": got.stamps, "answers": got.answers, "long_sent_s": long.start_s,
            "long_first_token_s": got.first_token_s, "long_answer": long.token_ids, "errors": got.errors}


def chunked_rounds(servers: Mapping[str, vs.VLLMServer], stream_prompts: Sequence[Sequence[int]], stream_tokens: int,
                   long_prompt: Sequence[int], n_rounds: int, long_after: int = 4) -> dict[str, dict[str, Any]]:
    """The long-prompt-while-streaming round on each server in turn, ``n_rounds`` times (interleaved). Per server:
    the streams' gaps pooled over every round (p50, p99 from ``timing.P99_MIN_SAMPLES`` gaps, max), the worst gap
    overlapping the long prompt's prefill in each round, the long prompt's TTFT in each, the first round's
    answers. Every round has its own cache salt: no round's prompt is served from an earlier one's cache. Each server
    first answers one warm-up round that is not a round (the first after its start); the rounds run in a shuffled
    order (``timing.rounds``), and a round's stall and TTFT stay at its index (None where the long prompt's first
    token never came), so the servers' rounds pair up."""
    positive("n_rounds", n_rounds)
    nonce = uuid.uuid4().hex[:8]
    calls = {name: (lambda srv=srv, name=name: long_prompt_while_streaming(
        srv.url, stream_prompts, stream_tokens, long_prompt, long_after, f"{nonce}-{name}-{uuid.uuid4().hex[:6]}"))
        for name, srv in servers.items()}
    for call in calls.values():
        call()  # the warm-up round after the start
    done = interleaved_rounds(calls, n_rounds, again=False)
    out = {}
    for name, runs in done.items():
        stamps = [s for r in runs for s in r["stamps"]]
        itl = itl_stats(stamps)
        stalls, ttfts = [], []
        for r in runs:
            measured = r["long_first_token_s"] is not None
            during = itl_stats(r["stamps"], (r["long_sent_s"], r["long_first_token_s"])) if measured else None
            stalls.append(during["max_s"] if during else None)
            ttfts.append(r["long_first_token_s"] - r["long_sent_s"] if measured else None)
        srv = servers[name]
        out[name] = {"server": name, "max_num_batched_tokens": srv.settings.max_num_batched_tokens,
                     **{f"logged_{k}": v for k, v in chunked_prefill_logged(srv.log()).items()}, "rounds": n_rounds,
                     "streams": len(stream_prompts), "stream_tokens": stream_tokens, "long_prompt_tokens": len(long_prompt),
                     "itl_n": itl["n"], "itl_p50_s": itl["p50_s"], "itl_p99_s": itl["p99_s"], "itl_max_s": itl["max_s"],
                     "itl_tail": "p99" if itl["p99_s"] is not None else "max",
                     "stall_p50_s": statistics.median(measured) if (measured := [s for s in stalls if s is not None])
                     else None,
                     "long_ttft_p50_s": statistics.median(t) if (t := [x for x in ttfts if x is not None]) else None,
                     "samples": {"stall_s": stalls, "long_ttft_s": ttfts},
                     "answers": runs[0]["answers"], "long_answer": runs[0]["long_answer"],
                     "same_answers_every_round": all(quality.all_identical(r["answers"], runs[0]["answers"]) for r in runs),
                     "errors": [e for r in runs for e in r["errors"]][:3]}
    return out


# ---------------------------------------------------------------------------------------- n-gram speculation


def decode_rate(out: client.RequestOutput) -> float | None:
    """Decode tokens/s of one answer, 1 / TPOT: the tokens after the first over the time after it. Tokens are
    counted from the ids the server sent (a speculative step sends several in one chunk), else its usage count."""
    n = len(out.token_ids) or out.output_tokens
    return (n - 1) / (out.e2e_s - out.ttft_s) if out.success and n > 1 and out.e2e_s > out.ttft_s else None


def speculative_rounds(plain: vs.VLLMServer, ngram: vs.VLLMServer, tasks: Mapping[str, Sequence[int]],
                       new_tokens: int, n_rounds: int) -> dict[str, dict[str, Any]]:
    """Each task's prompt, one request at a time, on the plain server and the n-gram one, ``n_rounds`` interleaved
    rounds (``timing.rounds``: each round's order shuffled) after one warm-up request of each that is not a round,
    ``/metrics`` read around every request. Decode tokens/s is 1 / TPOT as the engine timed it
    (``vllm:request_time_per_output_token_seconds``: its first to last token, whatever the HTTP stream coalesced;
    a speculative step's tokens may reach the client in one chunk), the client's kept beside it; the paired verdict
    on their ratio (round i of each side a pair; a round either side did not time drops out); acceptance from the
    n-gram server's counters; the first round's answers of both."""
    positive("n_rounds", n_rounds)
    out = {}
    for task, ids in tasks.items():
        def timed(server: vs.VLLMServer, ids: Sequence[int] = ids) -> tuple[client.RequestOutput, dict[str, float]]:
            before = server.metrics()
            o = client.send_ids(server.url, [ids], new_tokens, 1)[0][0]
            return o, metrics_delta(before, server.metrics())

        for server in (plain, ngram):
            timed(server)  # the warm-up request: not a round
        done = interleaved_rounds({"plain": lambda: timed(plain), "ngram": lambda: timed(ngram)}, n_rounds, again=False)
        per_round = {m: [1 / t if o.success and (t := engine_tpot(d)) else None for o, d in runs]
                     for m, runs in done.items()}
        rate = {m: [x for x in xs if x is not None] for m, xs in per_round.items()}
        seen = {m: [r for o, _d in runs if (r := decode_rate(o)) is not None] for m, runs in done.items()}
        spec = {k: sum(d.get(k, 0.0) for _o, d in done["ngram"]) for k in (DRAFTS, DRAFT_TOKENS, ACCEPTED)}
        v = verdict.compare(per_round["ngram"], per_round["plain"], paired=True)
        v = v if v.n else None
        out[task] = {"task": task, "prompt_tokens": len(ids), "new_tokens": new_tokens, "rounds": n_rounds,
                     "plain_decode_tokens_per_s": statistics.median(rate["plain"]) if rate["plain"] else None,
                     "ngram_decode_tokens_per_s": statistics.median(rate["ngram"]) if rate["ngram"] else None,
                     "decode_speedup": v.gain if v else None, "verdict": v.label if v else "not measured",
                     "verdict_reason": v.reason if v else "a run failed", **acceptance(spec),
                     # round i at index i (None: not timed), so the sides pair up
                     "samples": {"plain_decode_tokens_per_s": per_round["plain"],
                                 "ngram_decode_tokens_per_s": per_round["ngram"],
                                 "client_plain_decode_tokens_per_s": seen["plain"],
                                 "client_ngram_decode_tokens_per_s": seen["ngram"]},
                     "plain_answer": done["plain"][0][0].token_ids, "ngram_answer": done["ngram"][0][0].token_ids,
                     "failed": sum(len(_failures([o for o, _d in runs])) for runs in done.values())}
    return out


# ---------------------------------------------------------------------------------------- servers


def budgets(base: vs.Settings, small_tokens: int, large_tokens: int) -> dict[str, vs.Settings]:
    """Two servers that differ only in their per-step token budget (``--max-num-batched-tokens``)."""
    if not 0 < small_tokens < large_tokens:
        raise ValueError(f"small_tokens={small_tokens}, large_tokens={large_tokens}: need 0 < small < large")
    if small_tokens < base.max_num_seqs:
        raise ValueError(f"small_tokens={small_tokens} is below max_num_seqs={base.max_num_seqs}: vLLM refuses a "
                         "budget that cannot hold one token of every running sequence")
    return {"large": replace(base, max_num_batched_tokens=large_tokens),
            "small": replace(base, max_num_batched_tokens=small_tokens)}


PARTS = ("prefix", "chunked", "speculative")  # the mechanisms compare() can hold vLLM to


def compare(base: vs.Settings, *, small_tokens: int, large_tokens: int, speculative: Mapping[str, Any],
            prefix_prompts: Mapping[str, Sequence[int]], prefix_max_tokens: int, concurrency: int,
            stream_prompts: Sequence[Sequence[int]], stream_tokens: int, long_prompt: Sequence[int],
            lookup_tasks: Mapping[str, Sequence[int]], lookup_tokens: int, n_rounds: int,
            deadline_s: float = 300.0, long_after: int = 4, parts: Sequence[str] = PARTS) -> dict[str, Any]:
    """The mechanisms of ``parts`` on as few ``vllm serve`` starts as they need: for "chunked" the large- and
    small-budget servers start together and take the chunked-prefill rounds, then the small one stops; the large
    one (prefix caching on) takes the "prefix" rounds, then stays up as the plain server beside an n-gram one for
    the "speculative" rounds. ``parts=("prefix",)`` is one start (quick mode's budget). Returns ``status`` ("ok", or
    the one line saying why vLLM did not run), each mechanism's rows under its name, and ``skipped``."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise ValueError(f"parts={list(parts)}: choose one or more of {list(PARTS)}")
    two = budgets(base, small_tokens, large_tokens)
    spec = replace(two["large"], speculative=dict(speculative))
    named = two if "chunked" in parts else {"large": two["large"]}
    out: dict[str, Any] = {}
    try:
        with vs.started_together(named, deadline_s) as servers:
            large = servers["large"]
            chosen, blocks = large.platform(), large.kv_blocks()
            start_s = {name: srv.start_s for name, srv in servers.items()}
            if "chunked" in parts:
                out["chunked"] = chunked_rounds(servers, stream_prompts, stream_tokens, long_prompt, n_rounds, long_after)
                servers.pop("small").stop()
            if "prefix" in parts:
                out["prefix"] = prefix_rounds(large, prefix_prompts, prefix_max_tokens, concurrency, n_rounds)
            if "speculative" in parts:
                with vs.serve(spec, deadline_s=deadline_s, name="vllm-ngram") as ngram:
                    start_s["ngram"] = ngram.start_s
                    out["speculative"] = speculative_rounds(large, ngram, lookup_tasks, lookup_tokens, n_rounds)
    except (vs.VLLMUnavailable, vs.VLLMStartError) as exc:
        return {"status": str(exc)}
    errors = [e for part in ("prefix", "chunked") for r in out.get(part, {}).values() for e in r["errors"]]
    failed = sum(r["failed"] for r in out.get("speculative", {}).values())
    status = "ok" if not errors and not failed else f"some requests failed: {(errors or ['see the rows'])[0]}"
    return {"status": status, **out, "skipped": [p for p in PARTS if p not in out], "platform": chosen,
            "blocks": blocks, "start_s": start_s, "settings": {"base": vs.recorded(base), "small_tokens": small_tokens,
                                             "large_tokens": large_tokens, "speculative": dict(speculative)}}

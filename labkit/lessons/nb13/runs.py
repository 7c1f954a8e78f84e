"""Notebook 13's runs (serving agents), shared with ``bench/agents.py``: an agent trace replayed turn by turn against a
server, what its prefix cache served, reload against recompute for the disk tier, and tool calls per ``tool_choice``.

    replay       each session's requests in the order agents send them (every session's turn 0, then every turn 1,
                 ...), one at a time: prompt tokens, cached tokens (the usage's ``prompt_tokens_details``), TTFT,
                 the answer's ids; a routing key per session when asked (the router's session affinity)
    replay_rounds  several runs of one trace (clean, busted, ...) replayed side by side, request by request in
                 shuffled rounds, each run on its own server or under its own salt: the pairs of a paired verdict
    tier_rounds  at each prefix length, interleaved: a prompt evicted to the disk tier and read back, against the
                 same prompt evicted and recomputed; a truncated tier file recomputes (the fault)
    tool_runs    N chat requests with the trace's tools per ``tool_choice`` (auto, required, a named function)

A run orchestrates: the requests go through ``serve.client``, never a socket of its own.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import timing, verdict
from ...core.checks import positive
from ...decoding import quality
from ...serve import client
from ...serve.agents import prefix_lint, tiers, trace
from ...serve.fleet.router import ROUTED_HEADER, ROUTING_KEY_HEADER

Prompts = Sequence[Sequence[Sequence[int] | str]]  # per session, per turn: the rendered prompt's token ids (or its text)


def order(prompts: Prompts) -> list[tuple[int, int]]:
    """(session, turn) in the order agents send them: turn 0 of every session, then turn 1 of every session, ..."""
    turns = max((len(s) for s in prompts), default=0)
    return [(s, t) for t in range(turns) for s in range(len(prompts)) if t < len(prompts[s])]


def replay(url: str, prompts: Prompts, *, max_tokens: int = 4, model: str | None = None, salt: str | None = None,
           routing_key: bool = False, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Every session's requests in ``order``, one at a time (an agent waits for its answer before its next turn);
    ``salt`` (vLLM's ``cache_salt``) keeps this run from the cache of another; ``routing_key``: each session's name
    in the router's routing-key header (a router that takes text only gets the prompts as text). One row per
    request."""
    positive("max_tokens", max_tokens)
    turns = order(prompts)
    bodies = [client.payload("completions", p if isinstance(p := prompts[s][t], str) else list(p), model, max_tokens,
                             ignore_eos=True, return_token_ids=True, cache_salt=salt) for s, t in turns]
    headers = [{ROUTING_KEY_HEADER: f"session-{s}"} if routing_key else None for s, _ in turns]
    outs = client.send_each(url, bodies, headers=headers, keep_headers=(ROUTED_HEADER,), timeout_s=timeout_s)
    rows = [_row(s, t, prompts[s][t], out) for (s, t), out in zip(turns, outs)]
    failed = [r for r in rows if not r["ok"]]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} requests failed; the first: {failed[0]['status']} "
                           f"{failed[0]['error']}")
    return rows


def _row(s: int, t: int, prompt: Sequence[int] | str, out: Any) -> dict[str, Any]:
    return {"session": s, "turn": t, "prompt_tokens": out.prompt_tokens or len(prompt), "cached_tokens": out.cached_tokens,
            "ttft_s": out.ttft_s if out.success else None, "ok": out.success, "status": out.status, "error": out.error,
            "worker": out.headers.get(ROUTED_HEADER), "answer": out.token_ids}


def replay_rounds(runs: Mapping[str, Prompts], urls: Mapping[str, str], *, max_tokens: int = 4,
                  model: str | None = None, salts: Mapping[str, str | None] | None = None,
                  flush: Mapping[str, Callable[[], Any]] | None = None, timeout_s: float = 600.0
                  ) -> dict[str, list[dict[str, Any]]]:
    """Several runs of one trace (name → prompts, every run the same sessions and turns) replayed side by side,
    request by request: round k sends request k of ``order`` of every run, the runs in a shuffled order
    (``timing.rounds``), each to its server ``urls[name]`` (runs sharing one server keep their caches apart by their
    ``salts``). Each server gets its requests in ``replay``'s order, so what its prefix cache serves is what one
    ``replay`` of that run gets, while the runs' request k are timed next to each other: round k of two runs is a
    pair. After its start each server first answers one short warm-up request (not a round), then ``flush[url]`` (a
    lab server's ``flush_cache``) empties its cache. One row list per run, in ``order``, each row with its
    ``round``."""
    positive("max_tokens", max_tokens)
    if not runs or set(urls) != set(runs):
        raise ValueError(f"runs {sorted(runs)} and urls {sorted(urls)}: give one server URL per run")
    turns = order(next(iter(runs.values())))
    if any(order(p) != turns for p in runs.values()):
        raise ValueError("every run must have the same sessions and turns: request k of each is a pair")
    salts = dict(salts or {})
    for url in dict.fromkeys(urls.values()):  # the warm-up request after the start, then an empty cache
        first = next(iter(runs.values()))[0][0]
        short = first[:16] if isinstance(first, str) else list(first[:8])
        client.send_each(url, [client.payload("completions", short, model, 1, ignore_eos=True,
                                              cache_salt=f"warm-up-{id(url)}" if salts else None)], timeout_s=timeout_s)
        if flush and url in flush:
            flush[url]()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}

    def one(name: str) -> None:
        k = len(rows[name])
        s, t = turns[k]
        p = runs[name][s][t]
        body = client.payload("completions", p if isinstance(p, str) else list(p), model, max_tokens, ignore_eos=True,
                              return_token_ids=True, cache_salt=salts.get(name))
        (out,) = client.send_each(urls[name], [body], keep_headers=(ROUTED_HEADER,), timeout_s=timeout_s)
        if not out.success:
            raise RuntimeError(f"{name}: request {k} (session {s}, turn {t}) failed: {out.status} {out.error}")
        rows[name].append({**_row(s, t, p, out), "round": k})

    timing.rounds({name: (lambda n=name: one(n)) for name in runs}, len(turns), again=False)
    return rows


def summary(rows: Sequence[Mapping[str, Any]], name: str, skip_first_turn: bool = False) -> dict[str, Any]:
    """A run in one row: prompt and cached tokens, the cached share, median and mean TTFT, and each request's TTFT
    (``ttft_s``) and TTFT per prompt token (``ttft_per_token_s``: prompts of different lengths compared fairly);
    ``skip_first_turn``: turn 0, which no earlier request of its session can serve, left out."""
    kept = [r for r in rows if not (skip_first_turn and r["turn"] == 0)]
    prompt = sum(r["prompt_tokens"] for r in kept)
    cached = sum(r["cached_tokens"] or 0 for r in kept)
    ttft = [r["ttft_s"] for r in kept]
    return {"run": name, "requests": len(kept), "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": cached / prompt if prompt else None, "ttft_p50_s": statistics.median(ttft),
            "ttft_mean_s": statistics.fmean(ttft), "ttft_s": ttft,
            "ttft_per_token_s": [r["ttft_s"] / r["prompt_tokens"] for r in kept]}


def busted_against_clean(rows: Mapping[str, Sequence[Mapping[str, Any]]], busted: str = "timestamp",
                         clean: str = "clean") -> tuple[dict[str, dict[str, Any]], Any]:
    """Each run's ``summary``, and the verdict on the busted run's TTFT per prompt token against the clean run's,
    turns 1 on (turn 0 is cold in both: only later turns can lose their session's own prefix). Rows of
    ``replay_rounds`` (each with its ``round``) are judged paired, the same request of the two runs a pair (timed
    in the same round); rows of two ``replay`` runs, one after the other, by the unpaired rule."""
    whole = {name: summary(r, name) for name, r in rows.items()}
    if all("round" in r for name in (busted, clean) for r in rows[name]):
        def per_token(name: str) -> dict[tuple[int, int], float | None]:
            return {(r["session"], r["turn"]): (r["ttft_s"] / r["prompt_tokens"] if r["ttft_s"] else None)
                    for r in rows[name] if r["turn"] > 0}
        return whole, verdict.compare(per_token(busted), per_token(clean), paired=True, higher_is_better=False)
    later = {name: summary(rows[name], name, skip_first_turn=True) for name in (busted, clean)}
    return whole, verdict.compare(later[busted]["ttft_per_token_s"], later[clean]["ttft_per_token_s"],
                                  higher_is_better=False)


def per_turn(rows: Sequence[Mapping[str, Any]], predicted: Mapping[tuple[int, int], int]) -> list[dict[str, Any]]:
    """One row per turn: mean prompt tokens, the predicted and the measured cached share, median TTFT."""
    out = []
    for t in sorted({r["turn"] for r in rows}):
        these = [r for r in rows if r["turn"] == t]
        prompt = sum(r["prompt_tokens"] for r in these)
        out.append({"turn": t, "prompt_tokens": prompt / len(these),
                    "predicted_share": sum(predicted[(r["session"], t)] for r in these) / prompt,
                    "measured_share": sum(r["cached_tokens"] or 0 for r in these) / prompt,
                    "ttft_p50_s": statistics.median(r["ttft_s"] for r in these)})
    return out


def perfect_served(prompts: Prompts, served: Callable[[list[Sequence[int]]], list[int]] = prefix_lint.served_tokens,
                   block: int | None = None) -> dict[tuple[int, int], int]:
    """What a perfect prefix cache serves each request of a replay: ``served`` (``prefix_lint.served_tokens``, or the
    learner's) over the prompts in ``order``; with ``block``, as a block cache serves it (``served_by_block``)."""
    sent = order(prompts)
    found = dict(zip(sent, served([prompts[s][t] for s, t in sent])))
    return served_by_block(found, prompts, block) if block else found


def served_by_block(served: Mapping[tuple[int, int], int], prompts: Prompts, block: int) -> dict[tuple[int, int], int]:
    """A perfect cache's served tokens as a block cache serves them: whole blocks only, and never the prompt's last
    token (its logits give the first answer token)."""
    positive("block", block)
    return {(s, t): min(n, len(prompts[s][t]) - 1) // block * block for (s, t), n in served.items()}


def over_context(url: str, max_model_len: int, model: str | None = None) -> dict[str, Any]:
    """A completions request whose prompt (token ids) is one token past ``max_model_len``: the server's status and
    message (a clear 400 is the right answer)."""
    body = {"prompt": [1] * (positive("max_model_len", max_model_len) + 1), "max_tokens": 1,
            **({"model": model} if model else {})}
    return client.refusal(client.post_all(url, [body], endpoint="completions")[1][0])


def post_tools(url: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """A trace request with its tools sent to the chat endpoint as it is: the status and message."""
    body = {k: v for k, v in request.items() if k != "model"}
    return client.refusal(client.post_all(url, [body])[1][0])


# ---------------------------------------------------------------------------------------- the disk tier


def tier_rounds(server: Any, text_ids: Sequence[int], lengths: Sequence[int], filler_tokens: int, *, rounds: int,
                max_tokens: int = 4, truncate: bool = False) -> list[dict[str, Any]]:
    """For each round and length n, the ways in a shuffled order (``timing.rounds``): prompt A (n tokens) is served,
    then a filler of ``filler_tokens`` evicts it, then A comes back: once with the tier on (A was spilled to disk and
    is read back: ``reload``), once with it off (A was dropped: ``recompute``). ``truncate``: a third way, A's file cut to half before it comes back
    (the tier must recompute). When A comes back it displaces the filler, which is dropped, not written: the
    measured request pays the read alone, as in an engine that writes its tier in the background (this one writes
    at eviction, on the model's thread). ``server``: a ``launch.ServerHandle`` with a prefix cache of at most
    ``filler_tokens`` positions and a disk tier. One row per measurement, with A's answer ids."""
    ways = ("reload", "recompute", "truncated") if truncate else ("reload", "recompute")
    filler = list(text_ids[-filler_tokens:])
    folder = Path(server.config.prefix_cache_disk_dir)
    rows: list[dict[str, Any]] = []
    cells = [(r, n) for r in range(positive("rounds", rounds)) for n in lengths]  # each (round, length): the ways shuffled
    done = dict.fromkeys(ways, 0)

    def measure(way: str) -> None:
        r, n = cells[done[way]]
        done[way] += 1
        a = list(text_ids[r * 7:r * 7 + n])  # another start each round: nothing cached from the last
        server.flush_cache()
        server.set_spill(None if way != "recompute" else (lambda positions: False))
        client.send_ids(server.url, [a], max_tokens, 1)
        client.send_ids(server.url, [filler], 1, 1)  # A is evicted: to disk, or dropped
        server.set_spill(lambda positions: False)  # A's return displaces the filler: dropped, not written
        if way == "truncated":
            for f in folder.glob("prefix-*.safetensors"):
                f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
        outs, _ = client.send_ids(server.url, [a], max_tokens, 1)
        o = outs[0]
        if not o.success:
            raise RuntimeError(f"{way} of {n} tokens failed: {o.status} {o.error}")
        rows.append({"tokens": n, "way": way, "round": r, "ttft_s": o.ttft_s, "cached_tokens": o.cached_tokens,
                     "answer": o.token_ids})

    timing.rounds({way: (lambda w=way: measure(w)) for way in ways}, len(cells), again=False)
    server.set_spill(None)
    return rows


def tier_table(rows: Sequence[Mapping[str, Any]], predicted: Callable[[int, str], float] | None = None
               ) -> list[dict[str, Any]]:
    """Per length: median TTFT of each way, reload ÷ recompute with its verdict (``reload_verdict``: reload judged
    against recompute paired, round r against round r, lower TTFT better: ``verdict.MIN_PAIRS`` rounds or more for a
    verdict), and the predicted seconds when ``predicted(n, way)`` is given."""
    out = []
    for n in sorted({r["tokens"] for r in rows}):
        row: dict[str, Any] = {"tokens": n}
        for way in ("reload", "recompute", "truncated"):
            these = [r["ttft_s"] for r in rows if r["tokens"] == n and r["way"] == way]
            if these:
                row[f"{way}_ttft_s"] = statistics.median(these)
                row[f"{way}_cached"] = statistics.median(r["cached_tokens"] or 0 for r in rows
                                                         if r["tokens"] == n and r["way"] == way)
                if predicted is not None and way != "truncated":
                    row[f"{way}_predicted_s"] = predicted(n, way)
        row["reload_over_recompute"] = row["reload_ttft_s"] / row["recompute_ttft_s"]
        by = {way: {r["round"]: r["ttft_s"] or None for r in rows if r["tokens"] == n and r["way"] == way}
              for way in ("reload", "recompute")}
        judged = verdict.compare(by["reload"], by["recompute"], paired=True, higher_is_better=False)
        row["reload_verdict"], row["reload_verdict_reason"] = judged.kind, judged.reason
        row["reload_verdict_label"], row["pairs"] = judged.label, judged.n
        out.append(row)
    return out


def measured_crossover(table: Sequence[Mapping[str, Any]]) -> int | None:
    """The shortest measured length from which reloading stays faster than recomputing by its verdict (None: at no
    length from which every longer one was judged faster; ``tier_table``'s ``reload_verdict`` says why)."""
    wins = [r["reload_verdict"] == verdict.BETTER for r in table]
    for i, r in enumerate(table):
        if all(wins[i:]):
            return int(r["tokens"])
    return None


def truncated_equal(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The truncated-file answers against the clean ones of the same prompt: greedy ids must be equal."""
    clean = {(r["tokens"], r["round"]): r["answer"] for r in rows if r["way"] == "reload"}
    cut = [r for r in rows if r["way"] == "truncated"]
    same = [quality.identical(clean[(r["tokens"], r["round"])], r["answer"]) for r in cut]
    return {"compared": len(cut), "identical": sum(same), "recomputed": sum(not r["cached_tokens"] for r in cut)}


def tier_prediction(rows: Sequence[Mapping[str, Any]], disk: Mapping[str, Any], bytes_per_token: float
                    ) -> dict[str, Any]:
    """The crossover ``tiers`` predicts from the KV formula's ``bytes_per_token``, the disk's measured read-back
    (``core.machine.disk_bandwidth``) and the prefill speed the fastest recompute of the longest prefix showed: ``{"tokens",
    "reason", "prefill_tokens_per_s"}``."""
    longest = max(r["tokens"] for r in rows)
    prefill = longest / min(r["ttft_s"] for r in rows if r["way"] == "recompute" and r["tokens"] == longest)
    return {**tiers.crossover(bytes_per_token, disk["bytes_per_s"], prefill, disk["start_s"]),
            "prefill_tokens_per_s": prefill}


def predicted_seconds(bytes_per_token: float, bandwidth: float, prefill_tokens_per_s: float, start_s: float
                      ) -> Callable[[int, str], float]:
    """``tiers``' arithmetic as ``tier_table`` reads it: seconds to reload or recompute n tokens."""
    def seconds(n: int, way: str) -> float:
        if way == "reload":
            return tiers.reload_s(n, bytes_per_token, bandwidth, start_s)
        return tiers.recompute_s(n, prefill_tokens_per_s)
    return seconds


# ---------------------------------------------------------------------------------------- tool calls

TOOL_CHOICES = ("auto", "required", "named", "required, not strict")


def tool_body(request: Mapping[str, Any], choice: str, max_tokens: int) -> dict[str, Any]:
    """A trace request's messages and tools with ``tool_choice`` ``choice``: "auto", "required", "named" (the first
    tool, by name) or "required, not strict" (required, with each tool's ``strict`` flag off: the server then forces
    the call's envelope, not its arguments' schema)."""
    if choice not in TOOL_CHOICES:
        raise ValueError(f"choice={choice!r}: choose one of {list(TOOL_CHOICES)}")
    tools = [dict(t) for t in (request.get("tools") or trace.TOOLS)]
    if choice == "required, not strict":
        tools = [{**t, "function": {**t["function"], "strict": False}} for t in tools]
    named = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    return {"messages": list(request["messages"]), "tools": tools, "max_tokens": max_tokens, "temperature": 0.0,
            "tool_choice": named if choice == "named" else choice.split(",")[0]}


def tool_runs(url: str, requests: Sequence[Mapping[str, Any]], max_tokens: int, *, model: str | None = None,
              choices: Sequence[str] = TOOL_CHOICES) -> dict[str, list[dict[str, Any]]]:
    """Every request once per ``tool_choice``, all of one choice at once (not streamed): each completion with its
    client-side tokens/s (completion tokens ÷ seconds to the answer)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for choice in choices:
        bodies = [{**tool_body(r, choice, max_tokens), **({"model": model} if model else {})} for r in requests]
        _, answers = client.post_all(url, bodies)
        rows = []
        for a in answers:
            data = a["data"] if a["status"] == 200 else {"choices": [], "error": a["data"]}
            tokens = ((data.get("usage") or {}).get("completion_tokens") or 0)
            rows.append({**data, "status": a["status"], "tokens_per_s": tokens / a["e2e_s"] if a["e2e_s"] else None})
        out[choice] = rows
    return out


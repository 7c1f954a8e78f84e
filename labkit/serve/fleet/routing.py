"""Routing a shared-prefix, multi-turn workload across replicas: the workload, its client, what a policy did
to each replica's prefix cache, and the cache-aware decision written out and replayed.

``workload``   G groups of conversations. Each group has its own long system prompt (a team's handbook);
               each conversation asks a few questions in turn, and every turn resends the conversation so
               far. So a turn shares its whole prefix with the turn before it, and its system prompt with
               every conversation of its group: a replica that served the group before holds that prefix.
``run``        every conversation at once against one URL (a router, or one server), each turn after the
               previous answer, streamed: TTFT, end-to-end time, the answer and the worker the router chose
               (its ``x-smg-routed-worker-id`` header). A failed turn ends its conversation and every turn it
               did not send is counted failed: nothing is lost, and a client timeout bounds every request.
``run_policy`` one policy's run: each replica's cache flushed, its ``/metrics`` read before and after; per
               replica its share of the requests, its prefix-cache hit rate (prompts that reused a cached
               prefix) and token hit rate (prompt positions reused instead of prefilled).
``longest_prefix_route``  the cache-aware decision: the replica holding the longest matching prefix, unless
               its load exceeds the least-loaded replica's by more than a threshold.
``replay``     a routing rule on the requests in the order the router received them, given what each replica
               held and its requests in flight at that moment, beside the router's real choice.

It starts no process: the replicas and the router come from ``labkit.serve.fleet.router``.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.checks import positive
from ...core.timing import clock, latency_summary
from ...model.prompts import eval_tokens
from .. import client
from .router import ROUTED_HEADER, ROUTING_KEY_HEADER

# each group's name starts with its own letter, so two groups' prompts share no first character
GROUP_NAMES = ("Atlas", "Borealis", "Cobalt", "Dune", "Ember", "Fjord", "Granite", "Harbor", "Iris", "Juniper")
QUESTIONS = ("What does the café write on its blackboard?", "How many iron rings are on the sea wall?",
             "Who visits the lighthouse, and how often?", "What colour is the school's door?",
             "What is the soup on Fridays?", "When does the first bakery light its ovens?",
             "What do the teachers turn the view into?", "Why do the boats come back heavy on Thursdays?",
             "Summarise the handbook in one sentence.", "Which rule in the handbook matters most?",
             "What would a newcomer find surprising here?", "Name two places the handbook mentions.")
KEYS = ("conversation", "group")  # what a routing key may follow (consistent hashing: session affinity)


@dataclass(frozen=True)
class Conversation:
    group: int
    index: int  # within its group
    system: str  # the group's system prompt
    questions: tuple[str, ...]  # one per turn

    @property
    def key(self) -> str:
        return f"{GROUP_NAMES[self.group]}-{self.index}"


def workload(tokenizer: Any, groups: int, per_group: int, turns: int, system_tokens: int,
             tag: str = "", document_tokens: int = 0) -> list[Conversation]:
    """``groups`` × ``per_group`` conversations of ``turns`` turns; group g's system prompt holds
    ``system_tokens`` tokens of its own passage of the evaluation text. With ``document_tokens``, each
    conversation's first message also carries a document of its own (a user pasting a text), which every
    later turn of that conversation resends. ``tag`` (e.g. the round) makes the system prompts of two
    workloads differ from their first word, so one never hits the other's cache."""
    for name, value in (("groups", groups), ("per_group", per_group), ("turns", turns), ("system_tokens", system_tokens)):
        positive(name, value)
    if isinstance(document_tokens, bool) or not isinstance(document_tokens, int) or document_tokens < 0:
        raise ValueError(f"document_tokens={document_tokens!r}: 0 (none) or a positive number of tokens")
    if groups > len(GROUP_NAMES):
        raise ValueError(f"groups={groups}: at most {len(GROUP_NAMES)} (one name each)")
    if per_group * turns > len(QUESTIONS):
        raise ValueError(f"per_group × turns = {per_group * turns}: at most {len(QUESTIONS)}, so no two "
                         "conversations of a group ask the same question")
    ids = eval_tokens(tokenizer)
    need = groups * system_tokens + groups * per_group * document_tokens
    if need > len(ids):
        raise ValueError(f"groups × system_tokens + conversations × document_tokens = {need}: the evaluation text has "
                         f"{len(ids)} tokens; lower one of them")
    systems = [f"{GROUP_NAMES[g]}{tag} team assistant. Answer in one short sentence, from this handbook only.\n\n"
               + tokenizer.decode(ids[g * system_tokens:(g + 1) * system_tokens]) for g in range(groups)]

    def questions(g: int, c: int) -> tuple[str, ...]:
        qs = [QUESTIONS[(c * turns + t) % len(QUESTIONS)] for t in range(turns)]
        if document_tokens:
            start = groups * system_tokens + (g * per_group + c) * document_tokens
            qs[0] = f"My notes:\n\n{tokenizer.decode(ids[start:start + document_tokens])}\n\n{qs[0]}"
        return tuple(qs)

    # in the order users arrive: the first conversation of every group, then the second of every group, …
    return [Conversation(g, c, systems[g], questions(g, c)) for c in range(per_group) for g in range(groups)]


def prompt_text(messages: Sequence[dict[str, str]]) -> str:
    """A request's messages as one text, what a router's prefix tree compares (role names left out)."""
    return "\n".join(m["content"] for m in messages)


# ---------------------------------------------------------------------------------------- the client


async def _converse(session: Any, url: str, conv: Conversation, max_tokens: int, t0: float, model: str | None,
                    key: str | None, gate: asyncio.Semaphore, delay_s: float) -> list[dict[str, Any]]:
    await asyncio.sleep(delay_s)  # when this user starts talking
    messages = [{"role": "system", "content": conv.system}]
    rows: list[dict[str, Any]] = []
    headers = {ROUTING_KEY_HEADER: conv.key if key == "conversation" else GROUP_NAMES[conv.group]} if key else None
    for turn, question in enumerate(conv.questions):
        base = {"conversation": conv.key, "group": conv.group, "turn": turn}
        if rows and not rows[-1]["ok"]:  # the answer this turn builds on never came
            rows.append({**base, "ok": False, "status": None, "error": f"not sent: turn {turn - 1} failed",
                         "worker": None, "text": "", "prompt": ""})
            continue
        messages.append({"role": "user", "content": question})
        payload = {"messages": list(messages), "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                   "stream_options": {"include_usage": True}, **({"model": model} if model else {})}
        async with gate:
            out = await client.send_request(session, url, payload, True, t0, headers, (ROUTED_HEADER,))
        rows.append({**base, "ok": out.success, "status": out.status, "error": out.error,
                     "worker": out.headers.get(ROUTED_HEADER), "start_s": out.start_s, "ttft_s": out.ttft_s,
                     "e2e_s": out.e2e_s, "end_s": out.start_s + out.e2e_s, "output_tokens": out.output_tokens,
                     "text": out.text, "prompt": prompt_text(messages)})
        messages.append({"role": "assistant", "content": out.text})
    return rows


async def run_async(url: str, conversations: Sequence[Conversation], max_tokens: int, *, model: str | None = None,
                    routing_key: str | None = None, concurrency: int | None = None, stagger_s: float = 0.0,
                    timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """Every conversation at once, conversation i starting ``i × stagger_s`` seconds in (users do not all
    arrive in the same instant), at most ``concurrency`` requests in flight; one row per turn."""
    import aiohttp

    positive("max_tokens", max_tokens)
    if routing_key is not None and routing_key not in KEYS:
        raise ValueError(f"routing_key={routing_key!r}: choose one of {KEYS}, or None")
    if not conversations:
        raise ValueError("no conversations: build them with routing.workload(...)")
    if not stagger_s >= 0:
        raise ValueError(f"stagger_s={stagger_s!r}: seconds between two conversations' starts, 0 or more")
    gate = asyncio.Semaphore(concurrency or len(conversations))
    timeout = aiohttp.ClientTimeout(total=timeout_s)  # a hung worker becomes a failed request, never a hang
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = model or await client.discover_model(session, url)
        t0 = clock()
        done = await asyncio.gather(*(_converse(session, url.rstrip("/") + client.ENDPOINTS["chat"], c, max_tokens,
                                                t0, model, routing_key, gate, i * stagger_s)
                                      for i, c in enumerate(conversations)))
    return [row for rows in done for row in rows]


def run(url: str, conversations: Sequence[Conversation], max_tokens: int, **kwargs: Any) -> list[dict[str, Any]]:
    """``run_async`` from synchronous code, also inside Jupyter (whose event loop is already running)."""
    return client.run_sync(lambda: run_async(url, conversations, max_tokens, **kwargs))


# ---------------------------------------------------------------------------------------- what a policy did

# (prompts hit, prompts looked up, positions reused, positions looked up): labkit serve; vLLM counts tokens only
_CACHE_METRICS = (("labkit_prefix_cache_hits_total", "labkit_prefix_cache_queries_total",
                   "labkit_prefix_cache_hit_tokens_total", "labkit_prefix_cache_query_tokens_total"),
                  (None, None, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))


def cache_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """One replica's prefix-cache counters over a run (after − before) and its hit rates."""
    for hits, queries, hit_tok, query_tok in _CACHE_METRICS:
        if query_tok in after:
            d = {k: after.get(k, 0.0) - before.get(k, 0.0) if k else None for k in (hits, queries, hit_tok, query_tok)}
            n_hits, n_q, n_ht, n_qt = (d[k] if k else None for k in (hits, queries, hit_tok, query_tok))
            return {"cache_queries": n_q, "cache_hits": n_hits,
                    "hit_rate": n_hits / n_q if n_q else None,
                    "token_hit_rate": n_ht / n_qt if n_qt else None, "hit_tokens": n_ht, "query_tokens": n_qt}
    raise ValueError("no prefix-cache counters in these metrics: start the replica with its prefix cache on "
                     "(labkit serve --batching continuous --prefix-cache-tokens N, or vllm serve --enable-prefix-caching)")


def summarize(policy: str, records: Sequence[dict[str, Any]], replica_urls: Sequence[str],
              deltas: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the run's row, one row per replica): TTFT p50/p90 of the answered requests, failures, hit rates over all
    replicas (from their counters) and each replica's share of the requests (from the router's header)."""
    ok = [r for r in records if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    per = []
    for url, d in zip(replica_urls, deltas):
        n = sum(r.get("worker") == url for r in ok)
        per.append({"policy": policy, "replica": url, "requests": n, "share": n / len(ok) if ok else None, **d})
    total = {k: sum(p[k] or 0 for p in per) for k in ("cache_hits", "cache_queries", "hit_tokens", "query_tokens")}
    row = {"policy": policy, "requests": len(records), "answered": len(ok), "failed": len(records) - len(ok),
           **latency_summary("ttft", ttft, ("p50", "p90")), **latency_summary("e2e", [r["e2e_s"] for r in ok], ("p50",)),
           "hit_rate": total["cache_hits"] / total["cache_queries"] if total["cache_queries"] else None,
           "token_hit_rate": total["hit_tokens"] / total["query_tokens"] if total["query_tokens"] else None,
           "max_share": max((p["share"] or 0) for p in per) if per else None,
           "unrouted": sum(r.get("worker") not in replica_urls for r in ok)}
    return row, per


def run_policy(url: str, policy: str, replicas: Sequence[Any], conversations: Sequence[Conversation], max_tokens: int,
               **kwargs: Any) -> dict[str, Any]:
    """One measured run through the router at ``url``: the replicas' caches flushed, their ``/metrics`` read
    before and after. Returns ``summary`` (one row), ``replicas`` (one row each) and ``records`` (one per turn)."""
    for rep in replicas:
        if hasattr(rep, "flush_cache"):  # labkit serve; a vLLM replica gets a workload of its own instead
            rep.flush_cache()
    before = [rep.metrics() for rep in replicas]
    records = run(url, conversations, max_tokens, **kwargs)
    deltas = [cache_delta(b, rep.metrics()) for b, rep in zip(before, replicas)]
    row, per = summarize(policy, records, [rep.url for rep in replicas], deltas)
    return {"summary": row, "replicas": per, "records": records}


def answers(records: Sequence[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(conversation, turn) → the answer's text, for the answered turns."""
    return {(r["conversation"], r["turn"]): r["text"] for r in records if r["ok"]}


def same_answers(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How many answered turns of two runs of one workload gave the same text (greedy: they must)."""
    x, y = answers(a), answers(b)
    both = sorted(set(x) & set(y))
    same = sum(x[k] == y[k] for k in both)
    return {"compared": len(both), "identical": same, "all_identical": bool(both) and same == len(both)}


# ---------------------------------------------------------------------------------------- the decision


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def longest_prefix_route(prompt: Sequence[Any], cached: Sequence[Sequence[Sequence[Any]]], loads: Sequence[int],
                         threshold: int) -> int:
    """The replica (an index) holding the longest prefix of ``prompt`` among the prompts it was sent
    (``cached[r]``), ties to the least loaded, then the lowest index; unless its load exceeds the least-loaded
    replica's by more than ``threshold`` requests: then the least-loaded replica (lowest index on a tie)."""
    if not cached or len(cached) != len(loads):
        raise ValueError(f"{len(cached)} replicas' caches but {len(loads)} loads: one of each per replica")
    best = [max((common_prefix(prompt, p) for p in held), default=0) for held in cached]
    top = max(best)
    choice = min((r for r in range(len(best)) if best[r] == top), key=lambda r: (loads[r], r))
    least = min(range(len(loads)), key=lambda r: (loads[r], r))
    return least if loads[choice] - loads[least] > threshold else choice


def replay(records: Sequence[dict[str, Any]], workers: Sequence[str], route: Callable[..., int],
           threshold: int) -> list[dict[str, Any]]:
    """``route(prompt, cached, loads, threshold)`` on every answered request, in the order the router received
    them: ``cached[r]`` the prompt texts the router had sent replica r before, ``loads[r]`` those still in flight
    then. One row per request: the router's choice, the rule's, and whether they agree."""
    sent = sorted((r for r in records if r["ok"] and r.get("worker") in workers), key=lambda r: r["start_s"])
    held: dict[str, list[str]] = {w: [] for w in workers}
    rows = []
    for i, rec in enumerate(sent):
        loads = [sum(o["worker"] == w and o["end_s"] > rec["start_s"] for o in sent[:i]) for w in workers]
        choice = route(rec["prompt"], [list(held[w]) for w in workers], list(loads), threshold)
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(workers):
            raise ValueError(f"the rule returned {choice!r}: an index from 0 to {len(workers) - 1}")
        match = [max((common_prefix(rec["prompt"], p) for p in held[w]), default=0) for w in workers]
        theirs = workers.index(rec["worker"])
        agree = choice == theirs
        rows.append({"conversation": rec["conversation"], "turn": rec["turn"], "router": rec["worker"],
                     "rule": workers[choice], "agree": agree, "loads": loads, "matches": match,
                     # the same longest match and the same load: either replica is the rule's answer
                     "tie": not agree and match[choice] == match[theirs] and loads[choice] == loads[theirs],
                     "router_match_share": match[theirs] / len(rec["prompt"]) if rec["prompt"] else 0.0})
        held[rec["worker"]].append(rec["prompt"])
    return rows

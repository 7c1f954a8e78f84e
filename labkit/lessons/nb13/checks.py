"""Checks for notebook 13 (serving agents): the tokens a perfect prefix cache serves, where a session's next request
stops extending its last one, and the disk tier's spill policy."""
from __future__ import annotations

import copy
import json
from typing import Any

from ...serve.agents import trace
from ..exercises import Wrong, call, exercise


@exercise("13.served_tokens", "tokens a perfect prefix cache serves", hints=(
    "A prefix cache serves a prompt the tokens it shares, from its very first token, with a prompt it has already "
    "seen: any earlier prompt, not only the one just before it (another session with the same system prompt counts).",
    "For each prompt, compare it with every earlier prompt token by token from position 0 and stop at the first "
    "difference: that count is what one earlier prompt could serve. Keep the largest. The first prompt gets 0.",
    "Two loops, `for i, new in enumerate(prompts)` and inside it one over `prompts[:i]`; a counter that walks both "
    "prompts from 0 while their tokens agree and neither has ended; the best counter per prompt goes in the list.",
))
def _served_tokens(fn: Any) -> None:
    cases = [  # (prompts in the order sent, expected, what it tests, the hint for it)
        ([[1, 2, 3], [1, 2, 3, 4, 5]], [0, 3], "a turn that extends the one before: all of the earlier prompt", 1),
        ([[1, 2, 3], [9, 2, 3]], [0, 0], "a change at the first token: nothing is served, whatever follows", 2),
        ([[1, 2, 3, 4], [1, 2, 7, 4]], [0, 2], "shared tokens after a difference do not count: a prefix, not a set", 2),
        ([[1, 2, 3, 4], [5, 6], [1, 2, 3, 9]], [0, 0, 3], "the best earlier prompt, not only the previous one", 1),
        ([[1, 2], [1, 2, 3], [1, 2, 3, 4]], [0, 2, 3], "a session of three turns", 2),
        ([[4, 5, 6], [4, 5, 6]], [0, 3], "the same prompt again: all of it", 2),
        ([[1, 2, 3, 4, 5], [1, 2]], [0, 2], "a shorter prompt inside an earlier one: all of the shorter", 2),
    ]
    for i, (prompts, want, why, hint) in enumerate(cases):
        args = [list(p) for p in prompts]
        got = call(fn, args) if i == 0 else fn(args)
        try:
            got = [int(n) for n in got]
        except (TypeError, ValueError):
            raise Wrong(f"return one count per prompt (a list of integers), got {got!r}", hint=1) from None
        if got != want:
            raise Wrong(f"prompts {prompts}: you returned {got}, expected {want} ({why}).", hint=hint)


def _pair(kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turns 1 and 2 of a small session with the cache-buster ``kind`` (or none)."""
    session = trace.trace(1, 4, seed=3)[0]
    for one in kind.split("+"):
        if one != "clean":
            session = trace.bust(session, one, seed=1)
    return copy.deepcopy(session.requests[1]), copy.deepcopy(session.requests[2])


@exercise("13.first_divergence", "where a session's next request stops extending its last", hints=(
    "A tool-capable chat template renders the tools first, then every message in order. The later request extends "
    "the earlier one only if the tools and each of the earlier request's messages come back exactly as they were, "
    "as text: the same data with its JSON keys in another order is other tokens.",
    "Compare `json.dumps` of the two tool lists first (key order kept): different means 'tools'. Then for each index k "
    "of the earlier request's messages, compare `json.dumps` of message k in both: the first that differs, or is "
    "missing from the later request, is f'messages[{k}]'. If nothing differs, return None.",
))
def _first_divergence(fn: Any) -> None:
    cases = [  # (cache-buster, expected, what it tests, the hint for it)
        ("timestamp", "messages[0]", "a clock in the system prompt: the first message changes", 1),
        ("tools_reordered", "tools", "the tools in another order: the template renders them before any message", 1),
        ("json_keys", "messages[3]", "a tool result with its JSON keys in another order: the same data, other text",
         1),
        ("edited_history", "messages[1]", "the task (message 1) rewritten mid-session", 2),
        ("tools_reordered+timestamp", "tools", "the tools reordered and a clock in the system prompt: the template "
         "renders the tools first, so that is where the prompts part", 1),
        ("clean", None, "a clean next turn repeats everything and adds: it extends", 2),
    ]
    for i, (kind, want, why, hint) in enumerate(cases):
        old, new = _pair(kind)
        got = call(fn, old, new) if i == 0 else fn(old, new)
        if got is not None and not isinstance(got, str):
            raise Wrong(f"return None or the field's name as a string ('tools', 'messages[2]'), got {got!r}", hint=2)
        if got != want:
            raise Wrong(f"{kind.replace('_', ' ')}: you returned {got!r}, expected {want!r} ({why}).", hint=hint)
    old, new = _pair("clean")
    shorter = {**new, "messages": new["messages"][:2]}
    got = fn(old, shorter)
    if got != "messages[2]":
        raise Wrong(f"a later request that dropped earlier turns (history truncated to 2 messages): you returned {got!r}, "
                    "expected 'messages[2]': the first earlier message it no longer holds", hint=2)
    swapped = copy.deepcopy(old)
    swapped["messages"][1] = json.loads(json.dumps(swapped["messages"][1]))
    if fn(old, swapped) is not None:
        raise Wrong("two copies of the same request (equal text) must give None", hint=2)


@exercise("13.spill", "the disk tier's spill policy", hints=(
    "Writing an evicted entry to disk pays only if reading it back will beat computing it again: that is true from "
    "the crossover length on, and never when there is no crossover (the tier reads a token's KV more slowly than "
    "the model computes it).",
    "Return False when `crossover_tokens` is None; otherwise `positions >= crossover_tokens`: at exactly the "
    "crossover, reloading is already the faster way.",
))
def _spill(fn: Any) -> None:
    cases = [  # (positions, crossover, expected, what it tests, the hint for it)
        (4096, 512, True, "a long entry past the crossover: reloading beats recomputing", 1),
        (128, 512, False, "a short entry below the crossover: recomputing it is faster than reading it back", 1),
        (512, 512, True, "exactly the crossover length: reloading already wins", 2),
        (511, 512, False, "one position below the crossover", 2),
        (4096, None, False, "no crossover: this tier never beats recomputing, so writing to it is wasted", 1),
        (16, 1, True, "a tier that wins from the first token: spill everything", 2),
    ]
    for i, (n, cross, want, why, hint) in enumerate(cases):
        try:
            got = call(fn, n, cross) if i == 0 else fn(n, cross)
        except TypeError as exc:
            raise Wrong(f"positions={n}, crossover_tokens={cross}: your policy raised TypeError ({exc}); {why}",
                        hint=hint) from None
        if not isinstance(got, bool):
            raise Wrong(f"return True (spill) or False (drop), got {got!r}", hint=2)
        if got != want:
            raise Wrong(f"positions={n}, crossover_tokens={cross}: you returned {got}, expected {want} ({why}).",
                        hint=hint)

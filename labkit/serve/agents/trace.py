"""An agent's sessions as the requests a server receives: made here, seeded, never fetched.

A coding or research agent sends its whole history every turn: a system prompt, its tool schemas, the task, and
for each earlier step the assistant's tool call and the tool's result, then a few new tokens. ``trace(sessions,
turns, seed)`` builds ``sessions`` such sessions of ``turns`` requests each (OpenAI chat bodies, tool calls and
tool results included), the text drawn from the lab's own evaluation prose (``data/eval``), tool results of varied
length. Each request extends the one before it: turn k+1 repeats turn k's messages and adds the assistant's call
and its result.

``bust(session, kind)`` makes the same session with one of the cache-busters real deployments hit: ``timestamp``
(the time in the system prompt, new every request), ``tools_reordered`` (the tool list in another order every
request), ``json_keys`` (each tool result's JSON keys in another order every request) or ``edited_history`` (an
earlier turn rewritten mid-session). ``prefix_lint`` names each. ``pin_clock(session)`` is the timestamp's fix: the
session's start time, read once, the same in every request.

``render(body, tokenizer)`` turns a request into the prompt's token ids with ``TOOL_TEMPLATE``, a Hermes-style
tool-calling chat template (the tool list as JSON in the system turn, each call as ``<tool_call>{…}</tool_call>``,
each result as ``<tool_response>…</tool_response>``): the model's own template (SmolLM2's) renders no tools. The
lab's server and ``vllm serve`` are sent the same ids; ``vllm serve --chat-template`` gets the same template for
its chat endpoint, where its ``hermes`` tool parser reads the calls back.

What it does not do: send anything.
"""
from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...core.checks import positive
from ...model.prompts import eval_text

TOOLS: tuple[dict[str, Any], ...] = tuple(
    {"type": "function", "function": {"name": name, "description": about, "strict": True, "parameters": {
        "type": "object", "properties": {k: {"type": t, "description": d} for k, t, d in params},
        "required": [params[0][0]],
        "additionalProperties": False}}}
    for name, about, params in (
        ("search_notes", "Search the project's notes for a phrase; returns the matching passages.",
         (("query", "string", "words to look for"), ("limit", "integer", "at most this many passages"))),
        ("read_file", "Read part of a file of the project.",
         (("path", "string", "the file, relative to the project"), ("start_line", "integer", "first line, from 1"))),
        ("run_tests", "Run the project's tests whose names match a pattern; returns the failures.",
         (("pattern", "string", "a test-name pattern"), ("timeout_s", "integer", "seconds before it stops"))),
        ("write_note", "Append a line to the session's notes.",
         (("text", "string", "what to write"), ("tag", "string", "a one-word label"))),
    ))
SYSTEM = ("You are a careful assistant working in a software project. Use the tools to look things up before you "
          "answer, quote what you read, and say when you are unsure.")
BUSTERS = ("timestamp", "tools_reordered", "json_keys", "edited_history")
START_TIME = "2026-12-06T09:00:00"  # the first request's clock in ``timestamp``; each later one is some seconds on
TOOL_TEMPLATE = (
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content %}{% else %}"
    "{% set system = 'You are a helpful assistant.' %}{% endif %}"
    "<|im_start|>system\n{{ system }}"
    "{% if tools %}\n\nYou may call one or more functions. Their signatures:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "To call one, answer with <tool_call>{\"name\": <function-name>, \"arguments\": <args-json-object>}</tool_call>"
    "{% endif %}<|im_end|>\n"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{% for c in m.tool_calls %}\n<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass(frozen=True)
class Session:
    """One agent session: its requests in order (OpenAI chat bodies), each extending the one before it."""

    name: str
    requests: tuple[dict[str, Any], ...]

    @property
    def turns(self) -> int:
        return len(self.requests)


def _words(rng: random.Random, source: Sequence[str], n: int) -> str:
    start = rng.randrange(max(1, len(source) - n))
    return " ".join(source[start:start + n])


def _call(rng: random.Random, source: Sequence[str], k: int, turn: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The assistant's tool call at ``turn`` of session ``k`` and the tool's result, a JSON object whose
    ``passages`` hold 20 to 180 words (results vary a lot in length)."""
    tool = TOOLS[rng.randrange(len(TOOLS))]["function"]
    first = tool["parameters"]["required"][0]
    arguments = {first: _words(rng, source, rng.randint(2, 5))}
    call_id = f"call_{k}_{turn}"
    call = {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function", "function": {"name": tool["name"], "arguments": json.dumps(arguments)}}]}
    result = {"ok": True, "tool": tool["name"], "passages": [_words(rng, source, rng.randint(20, 180))
                                                            for _ in range(rng.randint(1, 2))]}
    return call, {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}


def trace(sessions: int, turns: int, seed: int = 0, system_words: int = 0) -> list[Session]:
    """``sessions`` agent sessions of ``turns`` requests each, seeded: the same arguments give the same requests.
    ``system_words`` adds that many words of project context to the system prompt (a long shared prefix)."""
    positive("sessions", sessions)
    positive("turns", turns)
    if system_words < 0:
        raise ValueError(f"system_words={system_words}: a number of words, 0 or more")
    source = [w for w in eval_text().split() if w.isascii()]  # English prose: the other scripts' paragraphs have no spaces
    out = []
    for k in range(sessions):
        rng = random.Random(seed * 1_000_003 + k)
        system = SYSTEM + (" Project context: " + _words(rng, source, system_words) if system_words else "")
        messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                          {"role": "user", "content": "Task: " + _words(rng, source, 25)}]
        requests = []
        for turn in range(turns):
            if turn:
                messages += list(_call(rng, source, k, turn))
            requests.append({"model": "labkit", "messages": copy.deepcopy(messages), "tools": copy.deepcopy(list(TOOLS)),
                             "max_tokens": 16, "temperature": 0.0})
        out.append(Session(f"session {k}", tuple(requests)))
    return out


def _reordered(obj: Any, shift: int) -> Any:
    """The same JSON data with every object's keys rotated by ``shift``: consecutive shifts give other orders."""
    if isinstance(obj, dict):
        keys = list(obj)
        keys = keys[shift % len(keys):] + keys[:shift % len(keys)] if keys else keys
        return {key: _reordered(obj[key], shift) for key in keys}
    if isinstance(obj, list):
        return [_reordered(v, shift) for v in obj]
    return obj


def bust(session: Session, kind: str, seed: int = 0) -> Session:
    """``session`` with the cache-buster ``kind`` (one of ``BUSTERS``) applied to every request after the first
    (``edited_history``: from the middle turn on)."""
    if kind not in BUSTERS:
        raise ValueError(f"kind={kind!r}: choose one of {list(BUSTERS)}")
    rng = random.Random(seed)
    out = []
    for turn, body in enumerate(session.requests):
        body = copy.deepcopy(body)
        if kind == "timestamp":
            clock = f"{START_TIME[:-2]}{(7 * turn + rng.randrange(5)) % 60:02d}"
            body["messages"][0]["content"] = f"Current time: {clock}. " + body["messages"][0]["content"]
        elif kind == "tools_reordered" and turn:
            order = list(range(len(body["tools"])))
            while order == sorted(order):
                rng.shuffle(order)
            body["tools"] = [body["tools"][i] for i in order]
        elif kind == "json_keys" and turn:
            for m in body["messages"]:
                if m["role"] == "tool":
                    m["content"] = json.dumps(_reordered(json.loads(m["content"]), turn))
        elif kind == "edited_history" and turn >= max(1, len(session.requests) // 2):
            body["messages"][1]["content"] += " (Updated: keep the answer short.)"
        out.append(body)
    return Session(f"{session.name}, {kind}", tuple(out))


def pin_clock(session: Session) -> Session:
    """The timestamp's fix: ``session`` with the clock read once, at its start, and the same text in every request's
    system prompt (a clock that must be current belongs at the end of the newest message, not at the start)."""
    out = []
    for body in session.requests:
        body = copy.deepcopy(body)
        body["messages"][0]["content"] = f"Session started: {START_TIME}. " + body["messages"][0]["content"]
        out.append(body)
    return Session(f"{session.name}, clock pinned", tuple(out))


def render(body: dict[str, Any], tokenizer: Any, template: str = TOOL_TEMPLATE) -> list[int]:
    """The prompt's token ids for request ``body`` (an OpenAI chat body with ``tools``), as a tool-capable chat
    template renders it: the tools, every message, then the assistant's turn to answer."""
    text = tokenizer.apply_chat_template(body["messages"], tools=body.get("tools") or None, chat_template=template,
                                         add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

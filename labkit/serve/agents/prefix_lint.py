"""Does the next request of a session extend the one before it? The check a prefix cache depends on, in words.

A prefix cache serves the tokens a prompt shares, from its start, with one it has seen. An agent sends its whole
history every turn, so turn k+1 hits the cache only when its rendered prompt begins with turn k's. A tool-capable
chat template renders the tool list and every message (tool calls and tool results included) into the prompt, so
any change there, in any byte, moves the first diverging token up to that point: a timestamp in the system prompt
busts every turn from the first token on; tools sent in another order, or a tool result's JSON keys in another
order, bust it from there.

``lint(old, new)`` judges two OpenAI chat request bodies, whatever the model: in the order a template renders them,
the tools, then each of the earlier request's messages, which the later one must repeat exactly. It returns a
``Lint``: whether ``new`` extends ``old``, the first field that differs (``tools[2]``, ``messages[0].content``),
the character where it does, and the cause in words. ``shared_prefix`` counts the tokens two tokenised prompts
share; ``served_tokens`` what a perfect prefix cache would serve each prompt of a run.

What it does not do: render a template (no model is needed, and none is loaded) or say how many tokens a server
really reused (its usage's ``cached_tokens`` or its metrics say that).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...decoding.quality import first_difference

EXTENDS, BUSTED = "extends", "busts the cache"
# what a value that changes every request looks like: an ISO time or date, a clock time, a UUID, a long number
_VOLATILE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?|\b\d{1,2}:\d{2}(:\d{2})?\b|"
                       r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b\d{6,}\b", re.I)
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


class NotARequest(ValueError):
    """A body that is not an OpenAI chat request: the message names what is missing and how to fix it."""


@dataclass(frozen=True)
class Lint:
    """The verdict on a pair of requests: ``extends`` (the later request begins with everything the earlier one
    sent), else the first ``field`` that differs, the ``offset`` in it (characters of its JSON text) and the
    ``cause`` in words."""

    extends: bool
    field: str | None
    offset: int | None
    cause: str

    @property
    def verdict(self) -> str:
        return EXTENDS if self.extends else BUSTED

    def line(self) -> str:
        """One line: the verdict, where, and why."""
        where = f" at {self.field}" + (f", character {self.offset}" if self.offset is not None else "") if self.field else ""
        return f"{self.verdict}{where}: {self.cause}"


# ---------------------------------------------------------------------------------------- reading a body


def request(body: Any, name: str = "the request") -> dict[str, Any]:
    """``body`` checked as an OpenAI chat request (a JSON object with a list of messages, each with a role);
    ``NotARequest`` naming the fix otherwise."""
    if not isinstance(body, Mapping):
        raise NotARequest(f"{name} is a JSON {type(body).__name__}, not an object: give an OpenAI chat request body "
                          '({"model": …, "messages": [{"role": "user", "content": "…"}], "tools": […]})')
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise NotARequest(f"{name} has no \"messages\" list: a chat request body holds its history there (a "
                          "completions body with \"prompt\" is not one)")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise NotARequest(f"{name}: messages[{i}] has no \"role\": each message is an object such as "
                              '{"role": "user", "content": "…"}')
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise NotARequest(f"{name}: \"tools\" is a {type(tools).__name__}: give a list of tool definitions")
    return dict(body)


def read(path: str | Path) -> dict[str, Any]:
    """A request body from a JSON file; ``NotARequest`` naming the fix when it is missing, not JSON or not a
    chat request."""
    path = Path(path)
    if not path.is_file():
        raise NotARequest(f"{path}: no such file")
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotARequest(f"{path} is not JSON ({exc}): save the request body the client sent") from None
    return request(body, str(path))


# ---------------------------------------------------------------------------------------- the check


def _text(value: Any) -> str:
    """A value as a template renders it: text as it is, anything else as JSON with its keys in their order."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _first_char(a: str, b: str) -> int:
    return first_difference(list(a), list(b)) or 0


def _volatile(a: str, b: str, at: int) -> str | None:
    """The changing value around character ``at`` of two texts, when it looks like a time, a date, an id or a count."""
    for old in _VOLATILE.finditer(a):
        if old.start() <= at <= old.end():
            new = _VOLATILE.match(b, old.start())
            return f"'{old.group(0)}' became '{new.group(0) if new else b[old.start():old.end() + 8]}'"
    return None


def _same_json_other_order(a: Any, b: Any) -> bool:
    """Equal as data, different as text: a JSON object whose keys came in another order."""
    def parsed(v: Any) -> Any:
        if isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError:
                return v
        return v

    pa, pb = parsed(a), parsed(b)
    return pa == pb and _text(a) != _text(b) and isinstance(pa, (dict, list))


def _calls_data(calls: Any) -> Any:
    """Tool calls as data: each call's ``function.arguments`` (a JSON string on the wire) parsed, so two calls that
    differ only in their arguments' key order compare equal."""
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        fn = dict(call.get("function") or {}) if isinstance(call, Mapping) else {}
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except ValueError:
                pass
        out.append({**call, "function": fn} if isinstance(call, Mapping) else call)
    return out


def _tools_cause(old: list[Any], new: list[Any]) -> Lint | None:
    if _text(old) == _text(new):
        return None
    names = [((t.get("function") or {}).get("name") if isinstance(t, Mapping) else None) for t in old]
    new_names = [((t.get("function") or {}).get("name") if isinstance(t, Mapping) else None) for t in new]
    i = first_difference([_text(t) for t in old], [_text(t) for t in new])
    field = f"tools[{i}]" if i is not None else "tools"
    if sorted(map(str, names)) == sorted(map(str, new_names)) and names != new_names:
        return Lint(False, field, None, f"tools reordered: {names} became {new_names} (send them in one fixed order)")
    if i is not None and i < min(len(old), len(new)) and _same_json_other_order(old[i], new[i]):
        return Lint(False, field, _first_char(_text(old[i]), _text(new[i])),
                    f"a reordered JSON object: tool {names[i]!r} has the same definition with its keys in another "
                    "order (serialise tools with one key order, e.g. sorted)")
    if i is not None and i < min(len(old), len(new)):
        return Lint(False, field, _first_char(_text(old[i]), _text(new[i])), f"tool {names[i]!r} changed")
    return Lint(False, field, None, f"the tool list changed: {names} became {new_names}")


def _message_cause(k: int, old: Mapping[str, Any], new: Mapping[str, Any]) -> Lint | None:
    for key in _MESSAGE_KEYS:
        a, b = old.get(key), new.get(key)
        if _text(a) == _text(b):
            continue
        field = f"messages[{k}].{key}"
        role = old.get("role")
        if isinstance(a, str) and isinstance(b, str) and key == "content":
            at = _first_char(a, b)
            changing = _volatile(a, b, at)
            if role == "system" and changing:
                return Lint(False, field, at, f"a changing value in the system prompt: {changing} (move it to the "
                                              "end of the conversation, or leave it out)")
            if _same_json_other_order(a, b):
                return Lint(False, field, at, f"a reordered JSON object: the {role} message's JSON has the same data "
                                              "with its keys in another order (serialise it with one key order)")
            if changing:
                return Lint(False, field, at, f"a changing value in an earlier {role} message: {changing}")
            return Lint(False, field, at, f"a changed earlier turn: the {role} message {k} was edited")
        if key == "tool_calls" and _calls_data(a) == _calls_data(b):  # the same calls, written in another key order
            return Lint(False, field, _first_char(_text(a), _text(b)),
                        "a reordered JSON object: a tool call's arguments carry the same data with keys in another order")
        return Lint(False, field, _first_char(_text(a), _text(b)) if a is not None and b is not None else None,
                    f"a changed earlier turn: the {role} message {k}'s {key} differs")
    return None


def lint(old: Any, new: Any) -> Lint:
    """Whether request ``new`` extends request ``old`` (both OpenAI chat bodies): in template order, the tools and
    then each of ``old``'s messages must come back unchanged; else the first field that differs and why."""
    old, new = request(old, "the earlier request"), request(new, "the later request")
    tools = _tools_cause(list(old.get("tools") or []), list(new.get("tools") or []))
    if tools is not None:
        return tools
    before, after = old["messages"], new["messages"]
    for k, m in enumerate(before):
        if k >= len(after):
            return Lint(False, f"messages[{k}]", None, f"earlier turns dropped: the later request holds {len(after)} "
                                                       f"messages, the earlier one {len(before)} (history truncated)")
        found = _message_cause(k, m, after[k])
        if found is not None:
            return found
    added = len(after) - len(before)
    return Lint(True, None, None, f"the later request repeats all {len(before)} earlier messages and the tools, and "
                                  f"adds {added} message{'s' if added != 1 else ''}: a prefix cache serves the rest")


def shared_prefix(old_ids: Sequence[int], new_ids: Sequence[int]) -> int:
    """Tokens two prompts share from their start: what a perfect prefix cache could serve of ``new_ids``."""
    at = first_difference(list(old_ids), list(new_ids))
    return min(len(old_ids), len(new_ids)) if at is None else at


def first_field(old: Any, new: Any) -> str | None:
    """``lint``'s first differing field as the request's top level names it: None when ``new`` extends ``old``, else
    "tools" or "messages[k]"."""
    found = lint(old, new)
    if found.extends:
        return None
    return "tools" if (found.field or "").startswith("tools") else (found.field or "").split(".")[0]


def served_tokens(prompts: Sequence[Sequence[int]]) -> list[int]:
    """For each prompt, in the order a server received them, the tokens a perfect prefix cache (one that kept every
    earlier prompt) could serve: its longest shared prefix with any earlier prompt."""
    return [max((shared_prefix(old, new) for old in prompts[:i]), default=0) for i, new in enumerate(prompts)]


# ---------------------------------------------------------------------------------------- the command

EXIT_EXTENDS, EXIT_BUSTED, EXIT_BAD_INPUT = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit prefix-lint OLD.json NEW.json``: the verdict, where, and why. Exit 0 when NEW extends OLD,
    1 when it does not, 2 on a file that is not a chat request."""
    ap = argparse.ArgumentParser(prog="python -m labkit prefix-lint",
                                 description="Does the later chat request extend the earlier one (a prefix cache "
                                             "hit), and if not, where and why?")
    ap.add_argument("old", help="the earlier request body (JSON)")
    ap.add_argument("new", help="the later request body of the same session (JSON)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a line")
    args = ap.parse_args(argv)
    try:
        found = lint(read(args.old), read(args.new))
    except NotARequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps({"verdict": found.verdict, "extends": found.extends, "field": found.field,
                      "offset": found.offset, "cause": found.cause}) if args.json else found.line())
    return EXIT_EXTENDS if found.extends else EXIT_BUSTED

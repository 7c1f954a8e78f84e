"""Where a tool call lands in a chat completion, and whether it conforms: the counting behind notebook 13's table.

A server with a tool parser (``vllm serve --enable-auto-tool-choice --tool-call-parser …``) returns a call in
``message.tool_calls``; a small model under ``tool_choice="auto"`` often writes the call as text in
``message.content`` instead, or answers without one. ``landing(response)`` says which: ``tool_calls``,
``content`` (a JSON object naming a known tool, found in the text) or ``none``. ``conforms(call, tools)`` checks a
call against its tool's parameter schema (``decoding.quality.conforms``). ``table(runs, tools)`` counts, per ``tool_choice``, how
many requests landed where and how many calls conform, with the decode tokens/s each run measured.

What it does not do: send requests (``serve.client``) or parse a model's raw text format (the server's parser does).
"""
from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ...decoding import quality

LANDINGS = ("tool_calls", "content", "none")
_OBJECT = re.compile(r"\{.*\}", re.S)


def _tools_by_name(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in tools if isinstance(t, Mapping) and "function" in t}


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def calls(response: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(where the call landed, the calls as {"name", "arguments"}) of one chat completion's first choice."""
    message = ((response.get("choices") or [{}])[0] or {}).get("message") or {}
    structured = message.get("tool_calls") or []
    if structured:
        return "tool_calls", [{"name": (c.get("function") or {}).get("name"),
                               "arguments": _arguments((c.get("function") or {}).get("arguments"))} for c in structured]
    known = _tools_by_name(tools)
    text = message.get("content") or ""
    found = _OBJECT.search(text)
    if found:
        try:
            data = json.loads(found.group(0))
        except ValueError:
            data = None
        if isinstance(data, dict):
            inner = data.get("function") if isinstance(data.get("function"), dict) else {}
            name = data.get("name") or inner.get("name")
            if name in known:
                args = data.get("arguments", data.get("parameters", inner.get("arguments", {})))
                return "content", [{"name": name, "arguments": _arguments(args)}]
    return "none", []


def conforms(call: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``call`` names a known tool and its arguments are valid against that tool's parameter schema."""
    fn = _tools_by_name(tools).get(call.get("name"))
    if fn is None or not isinstance(call.get("arguments"), dict):
        return False
    return quality.conforms(call["arguments"], fn.get("parameters") or {"type": "object"})


def table(runs: Mapping[str, Sequence[Mapping[str, Any]]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per ``tool_choice`` (the keys of ``runs``; each value the completions it got, each with an optional
    ``"tokens_per_s"`` its client measured): requests, where the calls landed, how many stopped at ``max_tokens``
    (``cut_off``: a call cut short lands nowhere), how many conform, the median tokens/s."""
    rows = []
    for choice, responses in runs.items():
        landed = {k: 0 for k in LANDINGS}
        valid = 0
        for r in responses:
            where, found = calls(r, tools)
            landed[where] += 1
            valid += bool(found) and all(conforms(c, tools) for c in found)
        rates = [r["tokens_per_s"] for r in responses if r.get("tokens_per_s")]
        cut = sum(((r.get("choices") or [{}])[0] or {}).get("finish_reason") == "length" for r in responses)
        rows.append({"tool_choice": choice, "requests": len(responses),
                     **{f"in_{k}": v for k, v in landed.items()}, "cut_off": cut, "conforming": valid,
                     "conforming_share": valid / len(responses) if responses else None,
                     "tokens_per_s": statistics.median(rates) if rates else None})
    return rows

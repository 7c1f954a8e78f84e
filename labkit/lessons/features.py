"""Notebook 12's measurements against any OpenAI-compatible server (the lab's, ``vllm serve``), shared with
``bench/serving_features.py``.

``ask_all``            one batch of chat requests sent together, each answer checked against a JSON schema: valid
                       answers, tokens per answer, tokens/s per sequence, the batch's wall time.
``structured_rounds``  free against constrained (and any other request variants), interleaved over rounds.
``structured_table``   one row per variant: medians over the rounds, and the verdict on tokens/s per sequence and
                       on the batch's wall time against the free variant.
``malformed``          what a server answers to a malformed ``response_format``: the status and the error's text.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from ..core import verdict
from ..serve import client

PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                  "city": {"type": "string"}},
                 "required": ["name", "age", "city"], "additionalProperties": False}


MALFORMED = {  # a malformed response_format, and what is wrong with it
    "a schema that is not an object": {"type": "json_schema", "json_schema": {"name": "answer", "schema": "person"}},
    "a type the schema language lacks": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": {"type": "object", "properties": {"colour": {"type": "colour"}}}}},
    "no json_schema": {"type": "json_schema"},
    "an unknown response_format type": {"type": "yaml"},
}


def json_schema_format(schema: Mapping[str, Any], name: str = "answer") -> dict[str, Any]:
    """OpenAI's ``response_format`` for a JSON schema."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": dict(schema), "strict": True}}


def valid(text: str, schema: Mapping[str, Any] | None) -> bool:
    """Whether ``text`` is JSON and, given a schema, valid against it."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if schema is None:
        return True
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def ask_all(url: str, prompts: Sequence[str], *, max_tokens: int, response_format: Mapping[str, Any] | None = None,
            schema: Mapping[str, Any] | None = None, model: str | None = None, extra: Mapping[str, Any] | None = None,
            timeout_s: float = 300.0) -> dict[str, Any]:
    """Send one greedy chat request per prompt, all at once; check each answer against ``schema`` (JSON only when
    None). Returns the batch's wall time, the answers and per-request rows."""
    bodies = [{"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
               "temperature": 0, **({"response_format": dict(response_format)} if response_format else {}),
               **dict(extra or {})} for p in prompts]
    wall, outs = client.post_all(url, bodies, timeout_s=timeout_s)
    rows = []
    for prompt, out in zip(prompts, outs):
        ok = out["status"] == 200
        text = out["data"]["choices"][0]["message"]["content"] if ok else ""
        tokens = out["data"].get("usage", {}).get("completion_tokens", 0) if ok else 0
        rows.append({"prompt": prompt, "status": out["status"], "text": text, "tokens": tokens,
                     "valid": ok and valid(text, schema), "e2e_s": out["e2e_s"],
                     "tokens_per_s": tokens / out["e2e_s"] if ok and out["e2e_s"] > 0 else None,
                     "error": None if ok else str(out["data"].get("error", {}).get("message", out["data"]))[:200]})
    return {"wall_s": wall, "rows": rows}


def structured_rounds(url: str, prompts: Sequence[str], variants: Mapping[str, Mapping[str, Any]], *, max_tokens: int,
                      rounds: int, schema: Mapping[str, Any], model: str | None = None) -> list[dict[str, Any]]:
    """Each variant (name → ``ask_all`` keyword arguments, e.g. ``{"response_format": ...}``; ``{}`` is free
    decoding) once per round, interleaved A B A B …; one row per variant and round."""
    out = []
    for r in range(rounds):
        for name, kwargs in variants.items():
            batch = ask_all(url, prompts, max_tokens=max_tokens, schema=schema, model=model, **dict(kwargs))
            rows = batch["rows"]
            answered = [x for x in rows if x["status"] == 200]
            out.append({"variant": name, "round": r, "requests": len(rows), "answered": len(answered),
                        "valid": sum(x["valid"] for x in rows), "tokens": sum(x["tokens"] for x in answered),
                        "tokens_per_answer": statistics.mean(x["tokens"] for x in answered) if answered else None,
                        "tokens_per_s_per_seq": statistics.median(x["tokens_per_s"] for x in answered
                                                                  if x["tokens_per_s"]) if answered else None,
                        "seq_rates": [x["tokens_per_s"] for x in answered if x["tokens_per_s"]],
                        "wall_s": batch["wall_s"], "first_round": r == 0,
                        "example": rows[0]["text"][:120] if rows else ""})
    return out


def structured_table(runs: Sequence[Mapping[str, Any]], base: str = "free") -> list[dict[str, Any]]:
    """One row per variant: valid answers of all, tokens per answer, tokens/s per sequence and the batch's wall
    time (medians over the rounds; the first round's wall time, which also paid the grammar's first compile, beside
    them), with the verdicts against ``base``: tokens/s per sequence over every request, wall time over the rounds."""
    names = list(dict.fromkeys(r["variant"] for r in runs))
    if base not in names:
        raise ValueError(f"base={base!r}: no such variant among {names}")
    def of(name: str) -> list[Mapping[str, Any]]:
        return [r for r in runs if r["variant"] == name]
    table = []
    for name in names:
        rows = of(name)
        row = {"variant": name, "rounds": len(rows), "valid": sum(r["valid"] for r in rows),
               "requests": sum(r["requests"] for r in rows),
               "tokens_per_answer": statistics.median(r["tokens_per_answer"] for r in rows
                                                      if r["tokens_per_answer"] is not None),
               "tokens_per_s_per_seq": statistics.median(x for r in rows for x in r["seq_rates"]),
               "wall_s": statistics.median(r["wall_s"] for r in rows),
               "first_wall_s": next(r["wall_s"] for r in rows if r["first_round"])}
        row["valid_share"] = row["valid"] / row["requests"]
        if name != base:
            speed = verdict.compare([x for r in rows for x in r["seq_rates"]], [x for r in of(base) for x in r["seq_rates"]])
            wall = verdict.compare([r["wall_s"] for r in rows], [r["wall_s"] for r in of(base)], higher_is_better=False)
            row.update({"speed_ratio": speed.ratio, "speed_verdict": speed.word(), "speed_why": speed.reason,
                        "wall_ratio": wall.ratio, "wall_verdict": wall.word("shorter", "longer"),
                        "wall_why": wall.reason})
        table.append(row)
    return table


def malformed(url: str, response_format: Any, model: str | None = None) -> dict[str, Any]:
    """One chat request with ``response_format`` as given: the status and the error message a server answers."""
    body = {"model": model, "max_tokens": 8, "response_format": response_format,
            "messages": [{"role": "user", "content": "Hi"}]}
    (_wall, (out,)) = client.post_all(url, [body], timeout_s=60)
    err = out["data"].get("error", {}) if isinstance(out["data"].get("error"), dict) else {}
    return {"status": out["status"], "message": str(err.get("message", out["data"]))[:300], "param": err.get("param")}

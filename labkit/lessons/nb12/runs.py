"""Notebook 12's runs, shared with ``bench/serving_features.py``: structured outputs against any OpenAI-compatible
server (the lab's, ``vllm serve``), and the prefill-here-decode-there session.

Structured outputs:

``ask_all``            one batch of chat requests sent together, each answer checked against a JSON schema: valid
                       answers, tokens per answer, tokens/s per sequence, the batch's wall time.
``structured_rounds``  free against constrained (and any other request variants), interleaved over rounds.
``structured_table``   one row per variant: medians over the rounds, and the verdict on tokens/s per sequence and
                       on the batch's wall time against the free variant.
``malformed``          what a server answers to a malformed ``response_format``: the status and the error's text.

Prefill here, decode there:
``pd_servers``  the three ``vllm serve`` of the comparison: prefill (core 1) and decode (core 0) with the
                ExampleConnector on one folder, and one plain server on every core (the same hardware, unsplit)
``pd_session``  on those servers, behind the lab's proxy: each prompt's greedy tokens against the plain server's,
                the KV bytes the prefill wrote per layer against the sizing formula, whether the decode server
                loaded them (its log) or recomputed; a prompt the prefill never saw (the decode server recomputes);
                the short streams' stalls under a burst of long prompts, split against plain (``itl_rounds``);
                and the prefill server killed mid-run (every request answered by decode alone, or counted failed)
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import verdict
from ...core.checks import positive
from ...core.timing import itl_stats, percentile, pooled_gaps, rounds as interleaved_rounds
from ...decoding import quality
from ...serve import client
from ...serve.fleet import pd_proxy
from ...serve.metrics import metrics_delta
from ...serve.vllm import disagg
from ...serve.vllm import server as vs


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
    """Whether ``text`` is JSON and, given a schema, valid against it (``quality.conforms``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return schema is None or quality.conforms(value, schema)


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
    decoding) once per round, ``rounds`` interleaved rounds, each in a shuffled order (``timing.rounds``), after one
    warm-up batch of each (``round`` -1, ``warmup`` True: it also pays a grammar's first compile; not a round). One
    row per variant and batch; round r of each variant is a pair of ``structured_table``'s paired verdicts."""
    positive("rounds", rounds)

    def one(name: str, r: int) -> dict[str, Any]:
        batch = ask_all(url, prompts, max_tokens=max_tokens, schema=schema, model=model, **dict(variants[name]))
        rows = batch["rows"]
        answered = [x for x in rows if x["status"] == 200]
        return {"variant": name, "round": r, "warmup": r < 0, "requests": len(rows), "answered": len(answered),
                "valid": sum(x["valid"] for x in rows), "tokens": sum(x["tokens"] for x in answered),
                "tokens_per_answer": statistics.mean(x["tokens"] for x in answered) if answered else None,
                "tokens_per_s_per_seq": statistics.median(rates) if (rates := [x["tokens_per_s"] for x in answered
                                                                               if x["tokens_per_s"]]) else None,
                "seq_rates": [x["tokens_per_s"] for x in answered if x["tokens_per_s"]],
                "wall_s": batch["wall_s"], "first_round": r < 0, "example": rows[0]["text"][:120] if rows else ""}

    out = [one(name, -1) for name in variants]  # the warm-up batch of each: not a round
    count = dict.fromkeys(variants, 0)

    def next_round(name: str) -> dict[str, Any]:
        row = one(name, count[name])
        count[name] += 1
        out.append(row)
        return row

    interleaved_rounds({name: (lambda n=name: next_round(n)) for name in variants}, rounds, again=False)
    return out


def structured_verdicts(runs: Sequence[Mapping[str, Any]], base: str = "free") -> dict[str, dict[str, Any]]:
    """Each variant's paired verdicts against ``base`` (rows of ``structured_rounds``, round r against round r, the
    warm-up batch left out): ``speed`` on each round's median tokens/s per sequence, ``wall`` on each round's wall
    time."""
    def of(name: str) -> list[Mapping[str, Any]]:
        return sorted((r for r in runs if r["variant"] == name and not r.get("warmup")), key=lambda r: r["round"])

    def pairs(name: str, key: str) -> tuple[dict[int, float | None], dict[int, float | None]]:
        return ({r["round"]: r[key] or None for r in of(name)}, {r["round"]: r[key] or None for r in of(base)})

    return {name: {"speed": verdict.compare(*pairs(name, "tokens_per_s_per_seq"), paired=True),
                   "wall": verdict.compare(*pairs(name, "wall_s"), paired=True, higher_is_better=False)}
            for name in dict.fromkeys(r["variant"] for r in runs) if name != base}


def structured_table(runs: Sequence[Mapping[str, Any]], base: str = "free") -> list[dict[str, Any]]:
    """One row per variant: valid answers of all, tokens per answer, tokens/s per sequence and the batch's wall
    time (medians over the rounds; the first batch's wall time, which also paid the grammar's first compile, beside
    them: the warm-up batch, not a round, where ``structured_rounds`` ran one), with the paired verdicts against
    ``base``, round r against round r: each round's median tokens/s per sequence, and each round's wall time."""
    names = list(dict.fromkeys(r["variant"] for r in runs))
    if base not in names:
        raise ValueError(f"base={base!r}: no such variant among {names}")
    def of(name: str) -> list[Mapping[str, Any]]:
        return [r for r in runs if r["variant"] == name and not r.get("warmup")]
    judged = structured_verdicts(runs, base)
    table = []
    for name in names:
        rows = of(name)
        first = next(r for r in runs if r["variant"] == name and (r.get("warmup") or r["first_round"]))
        row = {"variant": name, "rounds": len(rows), "valid": sum(r["valid"] for r in rows),
               "requests": sum(r["requests"] for r in rows),
               "tokens_per_answer": statistics.median(r["tokens_per_answer"] for r in rows
                                                      if r["tokens_per_answer"] is not None),
               "tokens_per_s_per_seq": statistics.median(x for r in rows for x in r["seq_rates"]),
               "wall_s": statistics.median(r["wall_s"] for r in rows), "first_wall_s": first["wall_s"]}
        row["valid_share"] = row["valid"] / row["requests"]
        if name != base:
            speed, wall = judged[name]["speed"], judged[name]["wall"]
            row.update({"speed_ratio": speed.ratio, "speed_verdict": speed.word(), "speed_why": speed.reason,
                        "wall_ratio": wall.ratio, "wall_verdict": wall.word("shorter", "longer"),
                        "wall_why": wall.reason, "pairs": speed.n, "speed_label": speed.label})
        table.append(row)
    return table


def malformed(url: str, response_format: Any, model: str | None = None) -> dict[str, Any]:
    """One chat request with ``response_format`` as given: the status and the error message a server answers."""
    body = {"model": model, "max_tokens": 8, "response_format": response_format,
            "messages": [{"role": "user", "content": "Hi"}]}
    (_wall, (out,)) = client.post_all(url, [body], timeout_s=60)
    return client.refusal(out)


# ---------------------------------------------------------------------------------- prefill here, decode there


def pd_servers(base: vs.Settings, storage: str | Path) -> dict[str, vs.Settings]:
    """Prefill on core 1, decode on core 0 (the connector's folder ``storage``), and the plain server on all cores."""
    return {**disagg.connector_settings(base, "split", storage, ("1", "0")),
            "plain": dataclasses.replace(base, cpu_cores=vs.cpu_cores())}


def _layer_rows(storage: Path, before: set[str], model: str) -> list[dict[str, Any]]:
    rows = []
    for r in disagg.kv_files(storage):
        if r["folder"] in before or not r["tokens"]:
            continue
        formula = disagg.kv_bytes_formula(model, r["tokens"], 4 if r["dtype"] == "F32" else 2)
        data = [b - h for b, h in zip(r["per_layer_bytes"], r["header_bytes"])]
        rows.append({"tokens": r["tokens"], "layers": r["layers"], "bytes": r["bytes"], "layer0_bytes": r["per_layer_bytes"][0],
                     "header0_bytes": r["header_bytes"][0], "formula0_bytes": formula[0],
                     "all_layers_equal_formula": data == list(formula)})
    return rows


def pd_session(servers: Mapping[str, vs.VLLMServer], storage: str | Path, model: str, prompts: Sequence[Sequence[int]],
               *, decide: Callable[[int, int, bool], Sequence[str]] = disagg.plan, threshold: int | None = None,
               max_tokens: int = 16, missing_prompt: Sequence[int] = (), short_prompts: Sequence[Sequence[int]] = (),
               long_prompt: Sequence[int] = (), n_long: int = 2, burst_rounds: int = 3, stream_tokens: int = 32,
               kill_prompt: Sequence[int] = ()) -> dict[str, Any]:
    """See the module docstring. Returns ``split`` (per prompt), ``missing``, ``itl`` (rows), ``kill`` and the
    proxy's ``summary``."""
    if not prompts or any(len(p) < 2 for p in prompts):
        raise ValueError("prompts: give one or more prompts of 2 tokens or more (token ids)")
    one_token = [n for n, p in (("missing_prompt", missing_prompt), ("long_prompt", long_prompt),
                                ("kill_prompt", kill_prompt)) if len(p) == 1]
    if one_token:  # a one-token prompt on a connector server can find an empty folder and crash its engine
        raise ValueError(f"{one_token}: give a prompt of 2 tokens or more, or () to leave that part out")
    storage = Path(storage)
    P, D, plain = servers["prefill"], servers["decode"], servers["plain"]
    block = D.kv_blocks()["block_size"] or disagg.CPU_BLOCK_SIZE
    threshold = disagg.min_split_tokens(block) if threshold is None else threshold
    ref = [o.token_ids for o in client.send_ids(plain.url, [list(p) for p in prompts], max_tokens, 1)[0]]
    out: dict[str, Any] = {"block_size": block, "threshold": threshold}
    with pd_proxy.proxy(P.url, D.url, threshold, decide) as px:
        split = []
        for p, want in zip(prompts, ref):
            log0, m0, folders = len(D.log()), disagg.transfer_metrics(D.scrape()), {
                r["folder"] for r in disagg.kv_files(storage)}
            got = client.send_ids(px.url, [list(p)], max_tokens, 1)[0][0]
            time.sleep(0.5)  # the worker's log line lands after the answer
            log = D.log()[log0:]
            split.append({"prompt_tokens": len(p), "route": px.records[-1]["route"] if px.records else None,
                          "identical": quality.identical(got.token_ids, want), "error": got.error,
                          "expected_loaded": disagg.loaded_tokens(len(p), block), **disagg.kv_log(log),
                          "recomputed": disagg.recomputed(log),
                          "cached_tokens": px.records[-1].get("cached_tokens") if px.records else None,
                          "metrics": metrics_delta(m0, disagg.transfer_metrics(D.scrape())),
                          "files": _layer_rows(storage, folders, model)})
        out["split"] = split
        if missing_prompt:
            log0 = len(D.log())
            got = client.send_ids(D.url, [list(missing_prompt)], max_tokens, 1)[0][0]
            want = client.send_ids(plain.url, [list(missing_prompt)], max_tokens, 1)[0][0]
            time.sleep(0.5)
            log = D.log()[log0:]
            out["missing"] = {"prompt_tokens": len(missing_prompt), "recomputed": disagg.recomputed(log),
                              **disagg.kv_log(log), "identical": quality.identical(got.token_ids, want.token_ids), "error": got.error}
        if short_prompts and long_prompt:
            rows = itl_rounds({"plain": plain.url, "split": px.url}, short_prompts, stream_tokens, long_prompt,
                              n_long=n_long, n_rounds=burst_rounds)
            out["itl"] = [{k: v for k, v in r.items() if k != "answers"} | {"answers_equal": quality.all_identical(r["answers"], rows[0]["answers"])}
                          for r in rows]
        if kill_prompt:
            P.kill()
            outs, _wall = client.send_ids(px.url, [list(kill_prompt)] * 2, max_tokens, 1)
            want = client.send_ids(plain.url, [list(kill_prompt)], max_tokens, 1)[0][0]
            out["kill"] = {"requests": len(outs), "answered": sum(o.success for o in outs),
                           "failed": sum(not o.success for o in outs), "fallbacks": px.fallbacks,
                           "identical": all(quality.identical(o.token_ids, want.token_ids) for o in outs if o.success),
                           "reasons": sorted({str(r.get("reason"))[:80] for r in px.records
                                              if r.get("fallback") and r.get("reason")})}
        out["summary"] = px.summary()
    return out


def bytes_ratio(split: Sequence[Mapping[str, Any]]) -> float | None:
    """Bytes the prefill wrote in layer 0 (headers left out) ÷ the sizing formula's, over every split request."""
    files = [f for r in split for f in r["files"]]
    if not files:
        return None
    return sum(f["layer0_bytes"] - f["header0_bytes"] for f in files) / sum(f["formula0_bytes"] for f in files)


# ---------------------------------------------------------------------------------------- ITL under a burst


def salted(prompt: Sequence[int], k: int) -> list[int]:
    """``prompt`` with its first token replaced by one of its own per ``k``: no cache, local or on disk, holds it."""
    return [1000 + k, *list(prompt)[1:]]


def itl_rounds(targets: Mapping[str, str], stream_prompts: Sequence[Sequence[int]], stream_tokens: int,
               long_prompt: Sequence[int], n_long: int, n_rounds: int, long_after: int = 4) -> list[dict[str, Any]]:
    """The short streams' inter-token gaps while a burst of ``n_long`` long prompts arrives, on each of ``targets``
    (name → base URL) in turn, ``n_rounds`` interleaved rounds (each in a shuffled order) after one warm-up burst
    on each that is not a round; the first target is the baseline each other is judged against (the paired
    ``verdict.compare`` on each round's stall, the longest gap overlapping the burst's prefill, round r against
    round r, lower is better: a p90 gap misses two stalls among sixty gaps). Every long prompt is ``salted`` apart.

    The comparison this lab makes on two cores: the baseline is one plain ``vllm serve`` (no connector) on core 0
    taking everything; "split" is the proxy in front of a prefill server on core 1 and a decode server on core 0.
    Both keep the streams on core 0; the split adds the core that absorbs the long prompts' prefill, which is
    what disaggregation buys. A same-hardware baseline is one server on cores 0-1: pass it as the first target."""
    positive("n_long", n_long), positive("n_rounds", n_rounds)
    if not targets:
        raise ValueError("targets={}: name at least a baseline and one other server (name → base URL)")
    counter = iter(range(10**6))

    def one(url: str) -> client.Burst:
        return client.burst(url, stream_prompts, stream_tokens,
                            [salted(long_prompt, next(counter)) for _ in range(n_long)], 1, long_after, timeout_s=300.0)

    for url in targets.values():
        one(url)  # the warm-up burst: not a round
    done = interleaved_rounds({name: (lambda u=url: one(u)) for name, url in targets.items()}, n_rounds, again=False)
    p90 = {name: [percentile(g, 90) for r in runs if (g := pooled_gaps(r.stamps))] for name, runs in done.items()}
    per_round = {name: [itl_stats(r.stamps, (r.sent_s, r.first_token_s))["max_s"] if r.first_token_s is not None
                        else None for r in runs] for name, runs in done.items()}  # round r at index r
    base, rows = next(iter(targets)), []
    for name, runs in done.items():
        itl, stalls = itl_stats([s for r in runs for s in r.stamps]), [m for m in per_round[name] if m is not None]
        v = None if name == base else verdict.compare(per_round[name], per_round[base], paired=True,
                                                       higher_is_better=False)
        v = v if v and v.n else None
        rows.append({"target": name, "rounds": n_rounds, "streams": len(stream_prompts), "stream_tokens": stream_tokens,
                     "long_prompts": n_long, "long_prompt_tokens": len(long_prompt), "itl_n": itl["n"],
                     "itl_p50_s": itl["p50_s"], "itl_p99_s": itl["p99_s"], "itl_max_s": itl["max_s"],
                     "itl_p90_round_p50_s": statistics.median(p90[name]) if p90[name] else None,
                     "stall_p50_s": statistics.median(stalls) if stalls else None,
                     "verdict": v.label if v else ("baseline" if name == base else "not measured"),
                     "gain": v.gain if v else None, "verdict_reason": v.reason if v else "",
                     "samples": {"itl_p90_s": p90[name], "stall_s": per_round[name]}, "answers": runs[0].answers,
                     "errors": [e for r in runs for e in r.errors][:3]})
    return rows

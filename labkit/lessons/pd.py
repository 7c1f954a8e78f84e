"""Notebook 12's prefill-here-decode-there session, shared with ``bench/serving_features.py``.

``pd_servers``  the three ``vllm serve`` of the comparison: prefill (core 1) and decode (core 0) with the
                ExampleConnector on one folder, and one plain server on every core (the same hardware, unsplit)
``pd_session``  on those servers, behind the lab's proxy: each prompt's greedy tokens against the plain server's,
                the KV bytes the prefill wrote per layer against the sizing formula, whether the decode server
                loaded them (its log) or recomputed; a prompt the prefill never saw (the decode server recomputes);
                the short streams' stalls under a burst of long prompts, split against plain (``pd_proxy.itl_rounds``);
                and the prefill server killed mid-run (every request answered by decode alone, or counted failed)
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..serve.metrics import metrics_delta
from ..serve.fleet import pd_proxy
from ..serve.vllm import disagg
from ..serve import client
from ..serve.vllm import server as vs


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
               long_prompt: Sequence[int] = (), n_long: int = 2, itl_rounds: int = 3, stream_tokens: int = 32,
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
                          "identical": got.token_ids == want, "error": got.error,
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
                              **disagg.kv_log(log), "identical": got.token_ids == want.token_ids, "error": got.error}
        if short_prompts and long_prompt:
            rows = pd_proxy.itl_rounds({"plain": plain.url, "split": px.url}, short_prompts, stream_tokens, long_prompt,
                                     n_long=n_long, n_rounds=itl_rounds)
            out["itl"] = [{k: v for k, v in r.items() if k != "answers"} | {"answers_equal": r["answers"] == rows[0]["answers"]}
                          for r in rows]
        if kill_prompt:
            P.kill()
            outs, _wall = client.send_ids(px.url, [list(kill_prompt)] * 2, max_tokens, 1)
            want = client.send_ids(plain.url, [list(kill_prompt)], max_tokens, 1)[0][0]
            out["kill"] = {"requests": len(outs), "answered": sum(o.success for o in outs),
                           "failed": sum(not o.success for o in outs), "fallbacks": px.fallbacks,
                           "identical": all(o.token_ids == want.token_ids for o in outs if o.success),
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

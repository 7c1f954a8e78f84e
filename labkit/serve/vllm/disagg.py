"""Prefill here, decode there: two ``vllm serve`` joined by vLLM's ExampleConnector, the lab's proxy in front.

The ExampleConnector passes the KV through a directory (``shared_storage_path``): a server writes one safetensors
file per attention layer for each prompt it has no folder for (named by the hash of its first whole blocks of ids);
one that finds the folder logs "External Cache Hit!", loads it ("Inject KV cache of N tokens to the paged memory")
and computes only the rest. It reads no ``kv_role``: that only switches vLLM's scheduler book-keeping.

Here: the two servers' ``connector_settings``; ``plan``, the routing decision (the reference of the learner's
exercise); ``kv_files`` (each file's safetensors header, ``model.tensorfile``) beside ``kv_bytes_formula``;
``kv_log``, ``recomputed`` and ``transfer_metrics``, loaded or recomputed. The proxy that routes by ``plan`` and
the ITL rounds, split or not, are fleet's (``serve.fleet.pd_proxy``): a router in front of servers.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...core.checks import positive
from ...model import sizing, tensorfile
from ...model.dtypes import DTYPE_BYTES, normalize_dtype
from ..metrics import metric_totals
from . import server as vs

CONNECTOR = "ExampleConnector"
ROLES = {"split": ("kv_producer", "kv_consumer"), "both": ("kv_both", "kv_both")}  # (prefill's, decode's) kv_role
CPU_BLOCK_SIZE = 128  # vLLM's CPU platform default block (vllm/platforms/cpu.py) when none is given
HIT_LINE = "External Cache Hit!"  # ExampleConnector.get_num_new_matched_tokens, in the scheduler's process
_INJECT = re.compile(r"Inject KV cache of (\d+) tokens to the paged memory")  # its start_load_kv, in the worker
EXTERNAL_HITS, EXTERNAL_QUERIES = "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"  # label source: local_compute, local_cache_hit, external_kv_transfer


# ---------------------------------------------------------------------------------------- the two servers


def connector_config(role: str, storage_dir: str | Path) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for the ExampleConnector with ``kv_role`` ``role`` on ``storage_dir``."""
    return {"kv_connector": CONNECTOR, "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)}}


def connector_settings(base: vs.Settings, role: str, storage_dir: str | Path,
                       cores: tuple[str, str] = ("1", "0")) -> dict[str, vs.Settings]:
    """``{"prefill": …, "decode": …}``: ``base`` with the connector on ``storage_dir`` and one core each (``cores``:
    the prefill server's, the decode server's). ``role`` "split": kv_producer and kv_consumer; "both": kv_both on
    each, as vLLM's own disaggregated examples run the connector. ``--enable-prompt-tokens-details`` makes each
    answer's usage say how many prompt tokens were not computed (``cached_tokens``)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}: choose one of {sorted(ROLES)}")
    if len(cores) != 2 or not all(cores):
        raise ValueError(f"cores={cores!r}: give two core lists, the prefill server's then the decode server's")
    return {name: replace(base, cpu_cores=core, extra_args=(*base.extra_args, "--kv-transfer-config",
                                                            json.dumps(connector_config(kv_role, storage_dir)),
                                                            "--enable-prompt-tokens-details"))
            for name, kv_role, core in zip(("prefill", "decode"), ROLES[role], cores)}


def loaded_tokens(prompt_tokens: int, block_size: int = CPU_BLOCK_SIZE) -> int:
    """Prompt tokens whose KV the decode server can load after a prefill of the same prompt: the prefill stores
    ``(n - 1) // block × block`` tokens, the decode looks up ``(n - 2) // block × block`` (the connector's
    ``align_to_block_size``); 0 when those differ (n - 1 a whole number of blocks) or the prompt is under a block."""
    stored, looked_up = (prompt_tokens - 1) // block_size * block_size, (prompt_tokens - 2) // block_size * block_size
    return stored if stored == looked_up and stored > 0 else 0


def min_split_tokens(block_size: int = CPU_BLOCK_SIZE) -> int:
    """The shortest prompt whose KV can go over at all: one block and two tokens."""
    return positive("block_size", block_size) + 2


def plan(prompt_tokens: int, threshold: int, prefill_up: bool) -> list[str]:
    """The servers a request visits: ``["prefill", "decode"]`` for a prompt of ``threshold`` tokens or more while
    the prefill server is up, else ``["decode"]`` (a short prompt costs less to prefill than to hand over)."""
    return ["prefill", "decode"] if prefill_up and prompt_tokens >= threshold else ["decode"]


ROUTES = (["prefill", "decode"], ["decode"])  # what a plan may return


# ---------------------------------------------------------------------------------------- the bytes moved


def _layer_order(path: Path) -> tuple[int, str]:
    return (int(m.group(1)) if (m := re.search(r"\.(\d+)\.", path.name)) else -1, path.name)


def kv_files(storage_dir: str | Path) -> list[dict[str, Any]]:
    """One row per request folder the connector wrote (named by the hash of the prompt's ids): its layer files
    in layer order, each file's bytes and header bytes, the tokens, shape and dtype the header gives, the total."""
    root = Path(storage_dir)
    if not root.is_dir():
        raise ValueError(f"storage_dir={str(root)!r} is not a directory: pass the connector's shared_storage_path")
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.safetensors"), key=_layer_order)
        heads = [tensorfile.header(f) for f in files]
        sizes, headers = [f.stat().st_size for f in files], [n for n, _meta in heads]
        shapes = {tuple(meta.get("kv_cache", {}).get("shape", ())) for _n, meta in heads}
        dtypes = {meta.get("kv_cache", {}).get("dtype") for _n, meta in heads}
        shape = shapes.pop() if len(shapes) == 1 else None
        rows.append({"folder": folder.name, "layers": len(files), "bytes": sum(sizes), "per_layer_bytes": sizes,
                     "header_bytes": headers, "payload_bytes": sum(sizes) - sum(headers),
                     "tokens": shape[0] if shape else None, "shape": list(shape) if shape else None,
                     "dtype": dtypes.pop() if len(dtypes) == 1 else None,
                     "mtime": max((f.stat().st_mtime for f in files), default=None)})
    return rows


def kv_bytes_formula(config: Any, tokens: int, dtype_bytes: float | str) -> list[int]:
    """Bytes each KV-holding layer keeps for ``tokens`` tokens: tokens × 2 × KV heads × head_dim × bytes for a
    full-attention layer (labkit's own ``sizing.layer_caches``). ``config``: a ``sizing.ModelShape``, a model
    name or path, or a config object; ``dtype_bytes``: bytes per value, or a dtype name ("float32")."""
    positive("tokens", tokens)
    value = DTYPE_BYTES[normalize_dtype(dtype_bytes)] if isinstance(dtype_bytes, str) else dtype_bytes
    if not value > 0:
        raise ValueError(f"dtype_bytes={dtype_bytes!r}: bytes per value (4 for float32), or a dtype name")
    s = config if isinstance(config, sizing.ModelShape) else sizing.shape(config)
    return [layer.bytes(tokens, value) for layer in sizing.layer_caches(s) if layer.kind not in ("linear", "shared")]


# ---------------------------------------------------------------------------------------- loaded or recomputed


def kv_log(log_text: str) -> dict[str, Any]:
    """What a server's log says of the connector: "External Cache Hit!" lines (the scheduler found a folder) and
    the tokens of each "Inject KV cache of N tokens" (the worker loaded them)."""
    return {"hits": log_text.count(HIT_LINE), "injected_tokens": [int(n) for n in _INJECT.findall(log_text)]}


def recomputed(log_text: str) -> bool:
    """Whether the request(s) a slice of the decode server's log covers computed their prompt: True when no KV
    was injected. A hit line alone does not count: a prompt under one block finds the folder of zero tokens,
    logs the hit and loads nothing."""
    return not any(n > 0 for n in kv_log(log_text)["injected_tokens"])


def transfer_metrics(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """The connector's counters from a ``/metrics`` scrape (``metrics.scrape``), flat so that ``metrics_delta``
    takes their difference: external cache queries and hits (tokens), and prompt tokens by source."""
    totals = metric_totals(samples)
    out = {k: totals.get(k, 0.0) for k in (EXTERNAL_QUERIES, EXTERNAL_HITS)}
    for name, labels, value in samples:
        if name == BY_SOURCE and "source" in labels:
            out[key] = out.get(key := f"prompt_tokens_{labels['source']}_total", 0.0) + value
    return out

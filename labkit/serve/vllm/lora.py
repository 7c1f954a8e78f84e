"""Many adapters, one model, in ``vllm serve``: multi-LoRA flags, answers checked against merged weights, throughput.

vLLM loads each adapter beside the one base (``--enable-lora``, ``--lora-modules name=path``) and picks it per
request by the ``model`` field: the base's name for the base, an adapter's name for that adapter. Requests for
different adapters share a batch: the base's matmuls run once for all of them, and each row adds its own
``B @ (A @ x)`` (vLLM's Punica kernels; on a CPU, ``PunicaWrapperCPU``'s torch ops).

``lora_args``     the flags for ``Settings.extra_args``, checked against the adapters' ranks and vLLM's rank choices
``lora_check``    each adapter's greedy answers against ``adapters.merged_greedy`` (the adapter merged into the
                  weights, in transformers), token by token, cut at end-of-sequence
``lora_rounds``   the same requests as base / one adapter / adapters mixed in one batch, interleaved over rounds:
                  output tokens/s and TTFT of each
``lora_logged``   what the log says about LoRA (the Punica wrapper chosen), ``lora_metrics`` the
                  ``vllm:lora_requests_info`` line of ``/metrics``

Prompts go as chat-formatted token ids to the completions endpoint and answers come back as token ids
(``return_token_ids``), so they compare with transformers' exactly.
"""
from __future__ import annotations

import json
import re
import statistics
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import verdict
from ...core.checks import positive
from ...core.timing import rounds as interleaved_rounds
from ...decoding.quality import answers_check
from ...model.adapters import adapter_rank
from .. import client
from . import server as vs

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks: --max-lora-rank's choices
MODES = ("base", "one", "mixed")
LORA_INFO = "vllm:lora_requests_info"


def lora_args(adapters: Mapping[str, str | Path], max_loras: int | None = None,
              max_rank: int | None = None) -> tuple[str, ...]:
    """``--enable-lora --max-loras N --max-lora-rank R --lora-modules name=path …`` for ``Settings.extra_args``.

    ``max_loras``: adapters one batch may hold (default: all of them); ``max_rank``: the largest rank vLLM sizes
    its buffers for, one of vLLM's choices (default: the smallest that holds every adapter's rank). A path holding
    ``,`` or ``=`` goes in vLLM's JSON form (``{"name": …, "path": …}``), which it parses instead."""
    if not adapters:
        raise ValueError("no adapters: pass {name: folder}, e.g. from adapters.make_adapters()")
    ranks = {name: adapter_rank(path) for name, path in adapters.items()}
    need = max(ranks.values())
    if max_rank is None:
        max_rank = next((r for r in MAX_LORA_RANKS if r >= need), need)
    if max_rank not in MAX_LORA_RANKS:
        raise ValueError(f"max_rank={max_rank}: vLLM accepts one of {MAX_LORA_RANKS}")
    if max_rank < need:
        raise ValueError(f"max_rank={max_rank} is below adapter rank {need} ({max(ranks, key=ranks.get)}); "
                         f"pass max_rank >= {need}")
    max_loras = positive("max_loras", len(adapters) if max_loras is None else max_loras)
    modules = []
    for name, path in adapters.items():
        if not name or any(c in name for c in "=,{} "):
            raise ValueError(f"adapter name {name!r}: use letters, digits, '_' or '-' (it is the request's model)")
        path = str(Path(path).resolve())
        plain = "=" not in path and "," not in path
        modules.append(f"{name}={path}" if plain else json.dumps({"name": name, "path": path}))
    return ("--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_rank),
            "--lora-modules", *modules)


# ---------------------------------------------------------------------------------------- what the server says


def served_models(url: str) -> dict[str, Any]:
    """The base's name and the adapters' names a server lists at ``/v1/models`` (an adapter has a ``parent``)."""
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as resp:  # 127.0.0.1 only
        data = json.loads(resp.read()).get("data") or []
    base = [m["id"] for m in data if not m.get("parent")]
    return {"base": base[0] if base else None, "adapters": [m["id"] for m in data if m.get("parent")]}


def lora_logged(log_text: str) -> dict[str, Any]:
    """What vLLM's log says about LoRA: the Punica wrapper it chose (``PunicaWrapperCPU`` on a CPU: torch ops, no
    custom kernel), the adapters it loaded, and the log lines that name LoRA (at most 12)."""
    wrapper = re.findall(r"Using (PunicaWrapper\w+)", log_text)
    loaded = re.findall(r"Loaded new LoRA adapter: name '([^']+)'", log_text)
    lines = [ln.strip() for ln in log_text.splitlines() if re.search(r"LoRA|Punica", ln)]  # not the config dumps
    return {"punica_wrapper": wrapper[-1] if wrapper else None, "adapters_loaded": loaded, "lines": lines[:12]}


def lora_metrics(server: vs.VLLMServer) -> list[dict[str, str]]:
    """The labels of ``vllm:lora_requests_info`` (``max_lora``, ``running_lora_adapters``,
    ``waiting_lora_adapters``) as ``/metrics`` shows them now; [] when the server serves no LoRA."""
    return [labels for name, labels, _ in server.scrape() if name == LORA_INFO]


# ---------------------------------------------------------------------------------------- requests


def lora_check(server: vs.VLLMServer, references: Mapping[str, Sequence[Sequence[int]]],
               prompts: Sequence[Sequence[int]], max_tokens: int, eos: set[int],
               concurrency: int = 1) -> dict[str, dict[str, Any]]:
    """Each of ``references``' models (``"base"`` or an adapter's name; e.g. ``adapters.greedy_table``) asked the
    ``prompts`` greedily, its answers against the references, both cut at ``eos`` (``quality.answers_check``)."""
    base = served_models(server.url)["base"]
    out = {}
    for name, ref in references.items():
        if len(ref) != len(prompts):
            raise ValueError(f"{name}: {len(ref)} reference answers for {len(prompts)} prompts; one per prompt")
        model = base if name == "base" else name
        outs, _ = client.send_ids(server.url, prompts, max_tokens, concurrency, models=[model] * len(prompts),
                                  ignore_eos=False)
        got = {f"p{i}": o.token_ids for i, o in enumerate(outs)}
        check = answers_check(got, {f"p{i}": list(r) for i, r in enumerate(ref)}, eos)
        out[name] = {**check, "equal": len(prompts) - len(check["first_differences"]) - len(check["missing"]),
                     "answers": [o.token_ids for o in outs], "errors": [o.error for o in outs if not o.success]}
    return out


def _mode_models(mode: str, base: str, adapters: Sequence[str], n: int) -> list[str]:
    if mode == "base":
        return [base] * n
    if mode == "one":
        return [adapters[0]] * n
    return [adapters[i % len(adapters)] for i in range(n)]  # mixed: the adapters alternate within the batch


def paired_verdict(mode: Mapping[str, Any], base: Mapping[str, Any]) -> verdict.Verdict:
    """``mode``'s tokens/s against ``base``'s (rows of ``lora_rounds``), paired round by round; a round either
    measured nothing in drops out as a pair."""
    return verdict.compare(mode["samples"]["tokens_per_s"], base["samples"]["tokens_per_s"], paired=True)


def lora_rounds(server: vs.VLLMServer, adapters: Sequence[str], prompts: Sequence[Sequence[int]], max_tokens: int,
                concurrency: int, rounds: int, warmup: bool = True) -> list[dict[str, Any]]:
    """The same requests (``max_tokens`` each, ``ignore_eos``) three ways, interleaved ``rounds`` times, each round
    in a shuffled order (``timing.rounds``), after one warm-up pass of each way that is not a round (``warmup``:
    leave it out only on a server that has already answered each adapter since its start): all to the
    base, all to ``adapters[0]``, and the adapters alternating request by request (mixed in one batch). One row
    per mode: output tokens/s (all tokens over the wall time, each round's and their median), TTFT p50 (each
    round's median, then their median), failures. ``samples`` keep each round's figure at its index (None where
    no request of that round succeeded), so the modes pair up round by round (``paired_verdict``)."""
    positive("rounds", rounds)
    adapters = list(adapters)
    if not adapters:
        raise ValueError("no adapters: pass the adapters' names the server was started with (lora_args)")
    listed = served_models(server.url)
    unknown = [a for a in adapters if a not in listed["adapters"]]
    if unknown:
        raise ValueError(f"adapters {unknown} are not served (it serves {listed['adapters']}); start it with "
                         "Settings(extra_args=lora_args(...))")
    prompts = [list(p) for p in prompts]

    def run(mode: str) -> dict[str, Any]:
        outs, wall = client.send_ids(server.url, prompts, max_tokens, concurrency,
                                     models=_mode_models(mode, listed["base"], adapters, len(prompts)))
        ok = [o for o in outs if o.success]
        return {"tokens_per_s": sum(o.output_tokens for o in ok) / wall if ok else None,
                "ttft_p50_s": statistics.median(o.ttft_s for o in ok) if ok else None,
                "errors": [o.error for o in outs if not o.success]}

    for m in MODES if warmup else ():
        run(m)  # the warm-up pass of each way (an adapter's first batch loads it): not a round
    done = interleaved_rounds({m: (lambda m=m: run(m)) for m in MODES}, rounds, again=False)
    rows = []
    for mode, runs in done.items():
        per_round = [r["tokens_per_s"] for r in runs]
        tps = [x for x in per_round if x is not None]
        ttft = [r["ttft_p50_s"] for r in runs if r["ttft_p50_s"] is not None]
        errors = [e for r in runs for e in r["errors"]]
        rows.append({"mode": mode, "models": sorted(set(_mode_models(mode, listed["base"], adapters, len(prompts)))),
                     "requests": len(prompts), "max_tokens": max_tokens, "concurrency": concurrency,
                     "rounds": rounds, "tokens_per_s": statistics.median(tps) if tps else None,
                     "ttft_p50_s": statistics.median(ttft) if ttft else None,
                     "samples": {"tokens_per_s": per_round, "ttft_p50_s": [r["ttft_p50_s"] for r in runs]}, "failed": len(errors),
                     "errors": errors[:3]})
    return rows

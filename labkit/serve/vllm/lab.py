"""vLLM's engine held to the lab's mechanisms, on one ``vllm serve`` start.

``engine_runs`` takes the lab's workload (``scheduler.mixed_workload``: prompt ids and answer limits) through one
server and returns every run: the same requests one at a time (client concurrency 1) and all at once (the server's
``max_num_seqs`` caps its batch at N), in interleaved rounds, each run's greedy ids checked against references
(transformers, the lab's continuous batching); then, optionally, the same prompts with longer answers
(``squeeze_tokens``, exactly that many) that the server's KV pool (``Settings.num_blocks``) cannot hold for N
running requests, so vLLM must preempt; /metrics is read before and after every run. ``replay`` is the prediction:
``labkit.serve.experiments.paged.simulate`` through vLLM's pool, its block size and its cap on running requests.

Latency and TTFT count from the start of a run, when every request had arrived, as the lab's scheduler counts them:
a request the client holds back (concurrency 1) waits in the client instead of the server's queue.

Faults: a start that cannot happen gives ``status`` its reason (one line); a server that dies or stops answering
mid-run gives ``status`` "vllm serve ... mid-run: <its log's error line>" with the runs measured before it. Every
request of the cut run is answered or counted failed (``loadgen``'s ``read_timeout_s``); nothing hangs.
"""
from __future__ import annotations

import re
import statistics
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core import timing
from ...decoding.quality import first_difference, until_eos
from .. import loadgen
from ..experiments import paged
from . import server as vs
from ..metrics import metrics_delta
from ..processes import last_error_line

READ_TIMEOUT_S = 300.0  # a stream silent this long fails its request (a queued request waits for its first token)
ONE, ALL = "one at a time", "all at once"


class ServerDied(RuntimeError):
    """``vllm serve`` exited or stopped answering during a run; the message carries its log's error line."""


def died(server: vs.VLLMServer) -> str:
    code = server.proc.poll()
    how = f"exited with {code}" if code is not None else "stopped answering"
    return f"vllm serve {how} mid-run: {last_error_line(server.log())} (log: {server.log_path})"


def scrape(server: vs.VLLMServer) -> dict[str, float]:
    """/metrics as one number per name; ``ServerDied`` when the server is gone."""
    try:
        return server.metrics()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServerDied(died(server)) from exc


@dataclass
class Served:
    """One run of the workload through the server: what the client saw and what /metrics added."""

    name: str
    work: Sequence[Any]
    result: loadgen.BenchmarkResult
    metrics: dict[str, float]

    @property
    def tokens_per_s(self) -> float:
        return self.result.summary()["output_tokens_per_s"]

    def generated(self) -> dict[str, int]:
        """Tokens each request generated, its end-of-sequence token included (the server's count)."""
        return {r.id: o.output_tokens for r, o in zip(self.work, self.result.outputs)}

    def answers(self, eos: set[int]) -> dict[str, list[int]]:
        return {r.id: until_eos(o.token_ids, eos) for r, o in zip(self.work, self.result.outputs)}

    def rows(self, eos: set[int], references: Mapping[str, Mapping[str, Sequence[int]]] | None = None
             ) -> list[dict[str, Any]]:
        """One row per request: lengths, latency and TTFT from the run's start, and each reference's verdict."""
        out = []
        for r, o in zip(self.work, self.result.outputs):
            got = until_eos(o.token_ids, eos)
            row = {"run": self.name, "id": r.id, "kind": r.kind, "prompt_tokens": len(r.prompt_ids),
                   "max_tokens": r.max_new_tokens, "output_tokens": len(got), "latency_s": o.start_s + o.e2e_s,
                   "ttft_s": o.start_s + o.ttft_s, "status": "ok" if o.success else (o.error or "failed")}
            for name, ref in (references or {}).items():
                diff = first_difference(got, ref.get(r.id, []))
                row[f"same_as_{name}"], row[f"first_difference_{name}"] = diff is None, diff
            out.append(row)
        return out


def served_run(server: vs.VLLMServer, name: str, work: Sequence[Any], *, concurrency: int | None = None,
               max_tokens: int | None = None, ignore_eos: bool = False,
               read_timeout_s: float = READ_TIMEOUT_S) -> Served:
    """The workload through ``server`` once: greedy, the prompts' token ids as they are, each request's own answer
    limit (or ``max_tokens`` for all, exactly that many with ``ignore_eos``), ``concurrency`` in flight (None: all)."""
    before = scrape(server)
    res = loadgen.run(server.url, [list(r.prompt_ids) for r in work], num_requests=len(work),
                      max_concurrency=concurrency, max_tokens=max_tokens or [r.max_new_tokens for r in work],
                      endpoint="completions", ignore_eos=ignore_eos, return_token_ids=True, warmup=0,
                      read_timeout_s=read_timeout_s)
    if res.failed and not server.alive():
        raise ServerDied(died(server))
    return Served(name, list(work), res, metrics_delta(before, scrape(server)))


_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


def natural_blocks(log_text: str) -> int | None:
    """The blocks vLLM's KV cache would have held before ``num_blocks`` overrode it (its log says so)."""
    m = _OVERRIDE.findall(log_text)
    return int(m[-1][0]) if m else None


def engine_runs(settings: vs.Settings, work: Sequence[Any], *, rounds: int = 3, squeeze_tokens: int | None = None,
                others: Mapping[str, Callable[[], Any]] | None = None, modes: Sequence[str] = (ONE, ALL),
                deadline_s: float = 300.0, read_timeout_s: float = READ_TIMEOUT_S, **start: Any) -> dict[str, Any]:
    """One ``vllm serve`` start (see the module docstring) and one discarded warm-up request. ``rounds`` rounds of
    ``modes`` (ONE, ALL) and ``others`` (name -> a call timed in the same rounds, e.g. the lab's continuous batching in
    process, while the server idles), each round in a shuffled order (``timing.rounds``: round i of each at index i,
    the pairs of ``verdict.compare(…, paired=True)``); then the squeeze run. Returns ``status`` ("ok", or why not), ``runs`` (mode -> [Served]),
    ``others`` (name -> [results]), ``squeeze`` (Served or None), and what vLLM chose: ``platform``, ``blocks``,
    ``natural_blocks``, ``start_s``. ``start`` goes to ``vllm_server.serve`` (python, log_dir)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: a positive integer (3 or more tell a difference from noise)")
    unknown = set(modes) - {ONE, ALL}
    if unknown:
        raise ValueError(f"modes {sorted(unknown)}: choose from {[ONE, ALL]}")
    out: dict[str, Any] = {"status": "ok", "runs": {m: [] for m in modes}, "others": {k: [] for k in others or {}},
                           "squeeze": None, "settings": vs.recorded(settings)}
    concurrency = {ONE: 1, ALL: None}
    try:
        with vs.serve(settings, deadline_s=deadline_s, **start) as server:
            out.update(start_s=server.start_s, platform=server.platform(), blocks=server.kv_blocks(),
                       natural_blocks=natural_blocks(server.log()))
            loadgen.run(server.url, [list(work[0].prompt_ids)], num_requests=1, max_tokens=4, warmup=0,
                        read_timeout_s=read_timeout_s)  # the first request pays set-up
            calls = {mode: (lambda mode=mode: out["runs"][mode].append(served_run(
                server, mode, work, concurrency=concurrency[mode], read_timeout_s=read_timeout_s))) for mode in modes}
            calls.update({name: (lambda name=name, call=call: out["others"][name].append(call()))
                          for name, call in (others or {}).items()})
            timing.rounds(calls, rounds, again=False)  # each round in a shuffled order; the runs kept as they come
            if squeeze_tokens:
                out["squeeze"] = served_run(server, "squeezed", work, max_tokens=squeeze_tokens, ignore_eos=True,
                                            read_timeout_s=read_timeout_s)
    except (vs.VLLMUnavailable, vs.VLLMStartError, ServerDied) as exc:
        out["status"] = str(exc)
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:  # between runs: /version, /metrics
        out["status"] = f"vllm serve stopped answering mid-run: {exc}"
    return out


def mode_row(mode: str, runs: Sequence[Served], eos: set[int], references: Mapping[str, Mapping[str, Sequence[int]]],
             max_num_seqs: int) -> dict[str, Any]:
    """A mode's runs as one row, in the lab's batching table's columns: median tokens/s with its samples, the
    median over runs of the mean latency (short and long requests) and TTFT from the run's start, and whether
    every run gave the references' tokens."""
    rows = [r.rows(eos, references) for r in runs]

    def med(key: str, kind: str | None = None) -> float | None:
        means = [statistics.fmean(x[key] for x in rs if kind is None or x["kind"] == kind) for rs in rows
                 if any(kind is None or x["kind"] == kind for x in rs)]
        return statistics.median(means) if means else None

    rate = [r.tokens_per_s for r in runs]
    row = {"mode": mode, "max_num_seqs": max_num_seqs, "client_concurrency": 1 if mode == ONE else len(runs[0].work),
           "requests": len(runs[0].work), "tokens_per_s": statistics.median(rate), "rounds": len(runs),
           "mean_latency_short_s": med("latency_s", "short"), "mean_latency_long_s": med("latency_s", "long"),
           "mean_ttft_s": med("ttft_s"), "failed": sum(r.result.failed for r in runs),
           "preemptions": sum(r.metrics.get("vllm:num_preemptions_total", 0.0) for r in runs),
           "samples": {"tokens_per_s": rate}}
    for name in references:
        row[f"same_tokens_as_{name}"] = all(x[f"same_as_{name}"] for rs in rows for x in rs)
    return row


def replay(work: Sequence[Any], answers: Mapping[str, int], block_size: int, num_blocks: int, max_running: int,
           max_model_len: int) -> dict[str, Any]:
    """The notebook's prediction for vLLM's pool: ``paged.simulate`` of ``work`` with these answer lengths through
    ``num_blocks - 1`` blocks (vLLM keeps one back) of ``block_size``, at most ``max_running`` at once; and how many
    of the requests fit at once at their full length (``paged.fit_count``)."""
    reqs = [paged.Request(id=r.id, prompt_tokens=len(r.prompt_ids), answer_tokens=answers[r.id],
                          max_tokens=max(answers[r.id], r.max_new_tokens), kind=r.kind) for r in work]
    usable = num_blocks - 1
    if usable < 1:
        raise ValueError(f"num_blocks={num_blocks}: vLLM keeps one block back; give at least 2")
    budget = usable * block_size
    sim = paged.simulate(reqs, "paged", budget, max_model_len, block_size, max_running)
    return {"requests": len(reqs), "block_size": block_size, "usable_blocks": usable,
            "fit_at_once": paged.fit_count(reqs, "paged", budget, 1, max_model_len, block_size),
            "max_running": sim.max_running, "mean_running": sim.mean_running, "steps": sim.steps,
            "preemptions": sim.preemptions}

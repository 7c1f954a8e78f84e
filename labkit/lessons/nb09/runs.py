"""Notebook 09's (the capstone's) runs: each precision measured on the serving
shape beside its cost in answers, one load point (latency, throughput, peak memory), the SLO sweep over
concurrency levels, and ``vllm serve`` under that same load. The report they feed is ``lessons.report``.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ...core import env, memory, timing
from ...core.checks import positive
from ...decoding import quality
from ...model import models
from ...model.prompts import cycle
from ...serve import decoder, loadgen, processes
from ...serve import metrics as prom
from ...serve.vllm import shared as room
from ...serve.vllm import server as vs
from ..report import meets, pick_precision

def choose_precision(models_by_precision: dict[str, Any], tokenizer: Any, prompts: Sequence[str], batch: int,
                     new_tokens: int, reference: str = "fp32", min_agreement: float = 0.9, ref_prompts: int = 3,
                     ref_tokens: int = 12, repeats: int = 3) -> tuple[list[dict[str, Any]], str]:
    """Measure each precision on the serving shape and its cost in answers; return the rows and the choice.

    Speed: ``batch`` chat prompts decoded together for ``new_tokens`` each (``decoder.decode_batch``, the
    servers' own loop, prefill included), after one untimed warmup batch each, in ``repeats`` rounds, each in a
    shuffled order (``timing.rounds``: a slowdown hits each alike); each row keeps its ``samples`` of tokens/s, round i
    at index i, for the paired verdicts, and its median as ``tokens_per_s``. Quality: greedy agreement and KL against ``reference`` on
    ``ref_prompts`` prompts. The choice is the fastest precision whose agreement is at least ``min_agreement``
    (``pick_precision``), so a faster precision that changes answers loses.
    """
    if reference not in models_by_precision:
        raise ValueError(f"reference precision {reference!r} is not among {list(models_by_precision)}")
    for name, value in (("batch", batch), ("new_tokens", new_tokens), ("repeats", repeats)):
        positive(name, value)
    ids = [models.chat_inputs(tokenizer, p)["input_ids"][0].tolist() for p in cycle(prompts, batch)]
    ref = quality.reference(models_by_precision[reference], tokenizer, list(prompts[:ref_prompts]), new_tokens=ref_tokens)

    def runner(model: Any, n: int) -> Callable[[], float]:
        eos = decoder.eos_ids(model, tokenizer)

        def run() -> float:
            seqs = [decoder.Sequence(prompt_ids=list(x), max_new_tokens=n, ignore_eos=True) for x in ids]
            with timing.track(model.device) as watch:
                decoder.decode_batch(model, seqs, eos, tokenizer.pad_token_id)
            return watch.seconds
        return run

    for model in models_by_precision.values():
        runner(model, 2)()  # warmup: first calls pay allocation and kernel set-up
    walls = timing.rounds({name: runner(model, new_tokens) for name, model in models_by_precision.items()}, repeats,
                          again=False)
    rows = []
    for name, model in models_by_precision.items():
        q = quality.compare(model, ref)
        rates = [batch * new_tokens / w for w in walls[name]]
        rows.append({"precision": name, "batch": batch, "new_tokens": new_tokens, "rounds": repeats,
                     "seconds": statistics.median(walls[name]), "tokens_per_s": statistics.median(rates),
                     "agreement": q.agreement, "kl": q.kl, "samples": {"tokens_per_s": rates}})
    return rows, pick_precision(rows, min_agreement)


# ------------------------------------------------------------------------------------- load points


def load_point(url: str, prompts: Sequence[str], concurrency: int, num_requests: int, max_tokens: int,
               slo: Any = None, endpoint: str = "chat", device: Any = None, stats: Callable[[], Any] | None = None,
               **loadgen_options: Any) -> dict[str, Any]:
    """One load test (``labkit.serve.loadgen.run``, streaming, answers end at end-of-sequence or ``max_tokens``)
    at ``concurrency`` clients, with the process's peak RSS (sampled) and the CUDA allocator peak of ``device``,
    the server's (default: the device notebooks use, ``env.device()``; "cuda:1" reads GPU 1, not the current one).

    ``stats``: the server's metrics snapshot (``ServerHandle.stats``); read after loadgen's warm-up and after the
    run, its difference gives the row's ``mean_batch_size`` of the measured requests alone (``metrics.mean_batch_between``)."""
    device = device if device is not None else env.device()
    before: dict[str, Any] = {}
    start = (lambda: before.update(stats())) if stats is not None else None
    with memory.track(device) as mem, memory.RSSSampler(interval_s=0.05) as rss:
        run = loadgen.run(url, prompts, num_requests=num_requests, max_concurrency=concurrency, max_tokens=max_tokens,
                          endpoint=endpoint, ignore_eos=False, slo=slo, on_start=start, **loadgen_options)
    batch = {"mean_batch_size": prom.mean_batch_between(before, stats())} if stats is not None else {}
    summary = {k: v for k, v in run.summary().items() if k not in ("errors", "slo")}
    errors = run.summary()["errors"]
    return {**summary, **batch, "concurrency": concurrency, "peak_rss_bytes": rss.peak_bytes, "peak_rss_source": rss.source,
            "samples": {"e2e_s": [o.e2e_s for o in run.outputs if o.success]},  # per request: for a verdict
            "cuda_peak_bytes": mem.cuda_peak.bytes, "cuda_peak_note": mem.cuda_peak.reason,
            "errors": "; ".join(f"{n}× {e}" for e, n in errors.items())}


def slo_sweep(url: str, prompts: Sequence[str], levels: Sequence[int], requests_per_client: int, max_tokens: int,
              slo: Any, min_good_fraction: float = 0.9, stop_at_first_miss: bool = True,
              **options: Any) -> list[dict[str, Any]]:
    """``load_point`` at each concurrency in ``levels`` (rising), ``requests_per_client`` × concurrency
    requests each; stops after the first level that misses the SLO (higher ones only queue longer)."""
    if not levels or sorted(levels) != list(levels):
        raise ValueError(f"levels={list(levels)}: give concurrency levels in rising order, at least one")
    rows = []
    for c in levels:
        row = load_point(url, prompts, c, requests_per_client * c, max_tokens, slo, **options)
        row["meets_slo"] = meets(row, min_good_fraction)
        rows.append(row)
        if stop_at_first_miss and not row["meets_slo"]:
            break
    return rows


# ------------------------------------------------------------------------------------------ vLLM under the same load


def vllm_load(settings: Any, prompts: Sequence[str], concurrency: int, num_requests: int, max_tokens: int, slo: Any,
              levels: Sequence[int] = (), requests_per_client: int = 2, min_good_fraction: float = 0.9,
              warmup_requests: int = 8, deadline_s: float = 300.0,
              shared: room.SharedServer | None = None) -> dict[str, Any]:
    """The capstone's load against ``vllm serve`` on one start: a warm-up, the same ``load_point`` every
    configuration gets, then the same SLO sweep over ``levels`` while the server is up. Its memory is the PSS of the
    server's processes summed after the run (``core.memory.processes_memory``) (vLLM allocates its KV cache at start); the lab's allocator peak does
    not apply. With ``shared`` (the room's server, ``labkit.serve.vllm.shared``) the load goes there and nothing starts
    here; its memory is not readable, and ``row["where"]`` says whose machine it was. Returns ``status`` ("ok" or the
    one line saying why vLLM did not run), ``row``, ``sweep``, ``platform``, ``start_s`` (None on a shared server)."""
    try:
        with vs.serve_or_shared(settings, shared, deadline_s, "vllm-capstone") as srv:
            loadgen.run(srv.url, prompts, num_requests=warmup_requests, max_concurrency=warmup_requests, max_tokens=4,
                        endpoint="chat")  # the first requests pay set-up
            row = load_point(srv.url, prompts, concurrency, num_requests, max_tokens, slo)
            held, source = (None, room.MEMORY_NOTE) if shared else memory.processes_memory(processes.group_pids(srv.proc.pid))
            row.update(peak_rss_bytes=held, cuda_peak_bytes=None, mean_batch_size=None, peak_rss_source=source,
                       cuda_peak_note="vLLM runs in its own processes: this process's allocator does not see it")
            if shared:
                row.update(where=shared.provenance()["where"], server_url=shared.url, served_model=shared.model)
            sweep = (slo_sweep(srv.url, prompts, levels, requests_per_client, max_tokens, slo, min_good_fraction)
                     if levels else [])
            chose, start_s = (shared.platform(), None) if shared else (srv.platform(), srv.start_s)
    except (vs.VLLMUnavailable, vs.VLLMStartError) as exc:
        return {"status": str(exc)}
    return {"status": "ok" if not row["failed"] else f"{row['failed']} request(s) failed: {row['errors']}",
            "row": row, "sweep": sweep, "platform": chose, "start_s": start_s}

"""Static batching versus continuous batching of the same requests, with the same greedy decoding.

static      takes ``batch_size`` requests, decodes them together until the longest is done (finished rows
            keep computing, as ``generate`` does), returns the whole batch, then takes the next
            ``batch_size``. A request's response is ready when its batch is (``finished_s``); the moment its
            own last token came out is kept too (``last_token_s``). ``batch_size=1`` is one at a time.
continuous  keeps up to ``max_batch_size`` requests running and admits a waiting one at every token
            boundary: a new request's prompt is prefilled alone (its own KV cache), then its cache is
            left-padded and joined to the running batch's; a finished request leaves at once (its rows
            are dropped from every layer's cache) and its response is ready right then.

Both use ``labkit.decoding.decode``'s ``prefill`` and ``decode_one_token`` (left padding, positions that count
only real tokens), so a request's greedy tokens are the ones it gets when run alone. Every request
arrives at time 0 (an offline workload, like ``vllm.LLM.generate``); times are seconds from the start.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core import config, env, timing
from ...core.checks import model_device, positive
from ...core.results import write_json_atomic
from ...core.timing import now
from ...decoding.quality import answers_check
from ...model import models
from ...model.models import chat_ids
from .. import decoder
from ..continuous import ContinuousEngine
from ..prefix_cache import PrefixCache
from . import paged

MODES = ("static", "continuous")


@dataclass(frozen=True)
class Request:
    """One request of a workload: its chat-formatted prompt tokens and its answer limit."""

    id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.id}: needs at least one prompt token")
        positive("max_new_tokens", self.max_new_tokens)


@dataclass
class Completion:
    """What one request got and when (seconds from the start of the run)."""

    id: str
    kind: str
    n_prompt: int
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    admitted_s: float | None = None  # its prefill started
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None  # its response was ready

    @property
    def latency_s(self) -> float:
        assert self.finished_s is not None, f"request {self.id} did not finish"
        return self.finished_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n_out": len(self.tokens), "latency_s": self.finished_s}


@dataclass
class Run:
    """One workload run: every request's completion plus what the engine computed."""

    mode: str
    max_batch_size: int
    wall_s: float
    completions: list[Completion]
    decode_steps: int = 0
    computed_rows: int = 0  # sum over decode steps of the rows in the batch (finished rows riding along count)
    prefills: int = 0  # prefill forward passes (static: one per batch; continuous: one per request)

    @property
    def output_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.completions)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def mean_batch(self) -> float:
        return self.computed_rows / self.decode_steps if self.decode_steps else 0.0

    def outputs(self) -> dict[str, list[int]]:
        return {c.id: list(c.tokens) for c in self.completions}

    def summary(self) -> dict[str, Any]:
        lat = [c.latency_s for c in self.completions]
        short = [c.latency_s for c in self.completions if c.kind == "short"]
        long_ = [c.latency_s for c in self.completions if c.kind == "long"]
        useful = self.output_tokens - len(self.completions)  # each request's first token comes from a prefill
        return {"mode": self.mode, "max_batch_size": self.max_batch_size, "requests": len(self.completions),
                "output_tokens": self.output_tokens, "wall_s": self.wall_s, "tokens_per_s": self.tokens_per_s,
                "requests_per_s": len(self.completions) / self.wall_s,
                "mean_latency_s": statistics.fmean(lat), "max_latency_s": max(lat),
                "mean_latency_short_s": statistics.fmean(short) if short else None,
                "mean_latency_long_s": statistics.fmean(long_) if long_ else None,
                "mean_ttft_s": statistics.fmean(c.first_token_s for c in self.completions),
                "decode_steps": self.decode_steps, "mean_batch": self.mean_batch,
                "wasted_row_fraction": 1 - useful / self.computed_rows if self.computed_rows else 0.0}

    def frame(self):
        import pandas as pd

        return pd.DataFrame([{**c.to_dict(), "mode": self.mode} for c in self.completions]).drop(columns=["tokens"])


def _check(requests: Sequence[Request], batch: int, name: str) -> None:
    if not requests:
        raise ValueError("no requests: pass at least one")
    positive(name, batch)
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids must be unique")


def _completion(r: Request) -> Completion:
    return Completion(id=r.id, kind=r.kind, n_prompt=len(r.prompt_ids), max_new_tokens=r.max_new_tokens)


# ---------------------------------------------------------------------------------------------- static


def _tracked(c: Completion, r: Request, t0: float, stamp_finish: bool, device: Any = None) -> decoder.Sequence:
    """A decode sequence for request ``r`` that stamps its tokens' times (since ``t0``, on ``device``'s clock)
    into ``c``; ``stamp_finish``: its response is ready at its last token (continuous), not when its batch returns."""
    def on_token(token: int, reason: str | None) -> None:
        t = now(device) - t0
        if c.first_token_s is None:
            c.first_token_s = t
        c.tokens.append(token)
        c.last_token_s = t
        c.finish_reason = reason
        if reason is not None and stamp_finish:
            c.finished_s = t

    return decoder.Sequence(prompt_ids=list(r.prompt_ids), max_new_tokens=r.max_new_tokens, on_token=on_token)


def run_static(model: Any, requests: Sequence[Request], eos: set[int], pad_id: int, batch_size: int = 4) -> Run:
    """Static batches of ``batch_size`` in arrival order; a batch returns when its longest request is done."""
    _check(requests, batch_size, "batch_size")
    comps = {r.id: _completion(r) for r in requests}
    steps = rows = 0
    device = model_device(model)  # every stamp waits for this model's GPU, not the thread's current one
    t0 = now(device)
    for start in range(0, len(requests), batch_size):
        chunk = requests[start:start + batch_size]
        admitted = now(device) - t0
        seqs = []
        for r in chunk:
            comps[r.id].admitted_s = admitted
            seqs.append(_tracked(comps[r.id], r, t0, stamp_finish=False, device=device))
        stats = decoder.decode_batch(model, seqs, eos, pad_id, drop_finished=False)
        done = now(device) - t0
        for r in chunk:
            comps[r.id].finished_s = done  # generate() hands the batch back at once
        steps += stats.steps - 1  # decode_batch counts the prefill's token as a step
        rows += stats.computed_rows - len(chunk)
    wall = now(device) - t0
    return Run(mode="static" if batch_size > 1 else "one at a time", max_batch_size=batch_size, wall_s=wall,
               completions=[comps[r.id] for r in requests], decode_steps=steps, computed_rows=rows,
               prefills=-(-len(requests) // batch_size))


def run_continuous(model: Any, requests: Sequence[Request], eos: set[int], pad_id: int,
                   max_batch_size: int = 4, prefill_chunk_tokens: int = 0,
                   prefix_cache: PrefixCache | None = None) -> Run:
    """Continuous batching: admit at token boundaries, leave when done (see the module docstring)."""
    _check(requests, max_batch_size, "max_batch_size")
    waiting = deque(requests)
    comps = {r.id: _completion(r) for r in requests}
    engine = ContinuousEngine(model, eos, pad_id, prefill_chunk_tokens=prefill_chunk_tokens, prefix_cache=prefix_cache)
    device = model_device(model)
    t0 = now(device)

    while waiting or engine.busy:
        while waiting and engine.load < max_batch_size:  # admit at this token boundary
            r = waiting.popleft()
            comps[r.id].admitted_s = now(device) - t0
            engine.admit(_tracked(comps[r.id], r, t0, stamp_finish=True, device=device))
        engine.step()
    wall = now(device) - t0
    return Run(mode="continuous", max_batch_size=max_batch_size, wall_s=wall,
               completions=[comps[r.id] for r in requests], decode_steps=engine.steps, computed_rows=engine.rows,
               prefills=engine.prefills)


def show_loop() -> Any:
    """The continuous-batching loop on screen: ``run_continuous`` and the engine step it calls each token."""
    import inspect
    import textwrap

    from IPython.display import Code

    parts = ["# labkit.serve.experiments.scheduler.run_continuous\n" + inspect.getsource(run_continuous),
             "# labkit.serve.continuous.ContinuousEngine.step\n" + textwrap.dedent(inspect.getsource(ContinuousEngine.step))]
    return Code("\n\n".join(parts), language="python")


def run(model: Any, requests: Sequence[Request], eos: set[int], pad_id: int, mode: str, batch_size: int = 4) -> Run:
    """``run_static`` or ``run_continuous`` by name (``mode`` in MODES)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
    fn = run_static if mode == "static" else run_continuous
    return fn(model, requests, eos, pad_id, batch_size)


def rounds(modes: dict[str, Callable[[], Run]], n: int) -> timing.Rounds:
    """Each mode run once per round, each round in a shuffled order, ``n`` rounds, and the first mode once more
    after the last round (``timing.rounds``): a machine that slows down mid-way slows every mode alike, round i of
    each mode forms a pair, and the first mode's extra pass (``.again``, not a round) shows how far it drifted."""
    positive("rounds", n)
    return timing.rounds(modes, n)


def mixed_workload(tokenizer: Any, n_requests: int = 8, long_every: int = 4, short_tokens: int = 16,
                   long_tokens: int = 64, path: Any = None) -> list[Request]:
    """A mixed workload from data/requests.json: one request in ``long_every`` has a long answer, the rest
    short ones. Short requests are the shortest answers in the file, long ones the longest; each request's
    answer limit is its recorded answer length capped at ``short_tokens`` / ``long_tokens``."""
    positive("n_requests", n_requests)
    positive("long_every", long_every)
    positive("short_tokens", short_tokens)
    positive("long_tokens", long_tokens)
    pool = sorted(paged.load_requests(path), key=lambda r: (r.answer_tokens, r.id))
    n_long = sum(1 for i in range(n_requests) if i % long_every == 0)
    shorts, longs = pool[: n_requests - n_long], pool[::-1][:n_long]
    if len(shorts) + len(longs) > len(pool) or set(r.id for r in shorts) & set(r.id for r in longs):
        raise ValueError(f"n_requests={n_requests}: the requests file holds only {len(pool)} requests")
    out = []
    si = li = 0
    for i in range(n_requests):
        if i % long_every == 0:
            r, cap, kind = longs[li], long_tokens, "long"
            li += 1
        else:
            r, cap, kind = shorts[si], short_tokens, "short"
            si += 1
        out.append(Request(id=r.id, prompt_ids=chat_ids(tokenizer, r.prompt), max_new_tokens=min(r.answer_tokens, cap),
                           kind=kind))
    return out


def compare_outputs(runs: Sequence[Run], reference: Run) -> dict[str, bool]:
    """For each run: are all its requests' tokens identical to the reference run's?"""
    ref = reference.outputs()
    return {r.mode: answers_check(r.outputs(), ref, set())["identical"] for r in runs}


def timeline_figure(runs: Sequence[Run], title: str = "When each request ran and when its response was ready"):
    """One row per (mode, request): a bar from admission to response, a dot at its last token."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = {"short": "#1f77b4", "long": "#d62728"}
    for run_ in runs:
        for c in run_.completions:
            y = f"{run_.mode} · {c.id}"
            fig.add_bar(y=[y], x=[c.finished_s - c.admitted_s], base=[c.admitted_s], orientation="h",
                        marker_color=colors.get(c.kind, "#7f7f7f"), showlegend=False,
                        hovertext=f"{c.kind}, {len(c.tokens)} tokens, latency {c.finished_s:.2f} s")
            fig.add_scatter(y=[y], x=[c.last_token_s], mode="markers", marker={"color": "black", "size": 5},
                            showlegend=False)
    fig.update_layout(title=title, xaxis_title="seconds from the start", template="plotly_white",
                      barmode="overlay", height=200 + 14 * sum(len(r.completions) for r in runs),
                      yaxis={"autorange": "reversed"})
    return fig


# ------------------------------------------------------------------- transformers' own continuous batching


def hf_continuous_batching(new_tokens: int = 4, timeout_s: float = 60.0) -> dict[str, Any]:
    """Does transformers' own continuous batching (``ContinuousBatchingManager``, behind ``generate_batch``,
    with paged attention) run on this device?

    Tries it on a tiny random Llama with a 4-token prompt. Returns ``available`` and, when not, the
    ``reason`` (the error its generation thread logged).
    """
    import importlib.metadata

    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

    device = env.device()
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, eos_token_id=0, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval().to(device)
    model.config._attn_implementation = "sdpa"  # transformers 5 pages it itself (sdpa_paged is gone)
    if not hasattr(model, "generate_batch"):
        return {"available": False, "reason": "this transformers has no generate_batch (continuous batching)",
                "device": device}
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # transformers 5: the paged cache's sizes have a config of their own (a block of 16 tokens is a page_size)
    paged = ContinuousBatchingConfig(page_size=16, num_blocks=8, max_batch_tokens=64)
    errors: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR and record.exc_info:
                exc = record.exc_info[1]
                errors.append(f"{type(exc).__name__}: {exc}")

    log = logging.getLogger("ContinuousBatchingLogger")
    handler, propagate = _Catch(), log.propagate
    log.addHandler(handler)
    log.propagate = False  # the notebook shows one line, not the generation thread's traceback
    got: list[int] = []
    try:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=paged)
        manager.start()
        manager.add_request([1, 2, 3, 4], max_new_tokens=new_tokens)
        deadline = time.monotonic() + timeout_s
        while manager.is_running() and not got and time.monotonic() < deadline:
            result = manager.get_result(timeout=0.5)
            if result is not None:
                got.append(len(result.generated_tokens))
        if not got and manager.is_running():
            errors.append(f"no result within {timeout_s:g} s")
        manager.stop(block=True, timeout=5.0)
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
    version = importlib.metadata.version("transformers")
    if got and got[0] > 0 and not errors:
        return {"available": True, "reason": "", "device": device, "transformers": version, "tokens": got[0]}
    reason = errors[0] if errors else "its generation thread stopped without a result"
    if device == "cpu" and "NoneType" in reason:
        # its PagedAttentionCache sizes the block pool from the accelerator's free memory
        reason += " (its paged KV cache sizes itself from CUDA/MPS free memory, which a CPU does not report)"
    return {"available": False, "device": device, "transformers": version,
            "reason": f"transformers {version} continuous batching (ContinuousBatchingManager) failed on {device}: "
                      f"{reason}"}


# ------------------------------------------------------------------------------ data/requests.json


def measure_requests(path: Any = None, max_batch_size: int = 8) -> dict[str, Any]:
    """Fill in data/requests.json's lengths with the default model: ``prompt_tokens`` (chat-formatted) and
    ``answer_tokens`` (its greedy answer up to end-of-sequence or the request's ``max_tokens``), measured
    with ``run_continuous``. Run once by ``python -m labkit requests``; the file keeps how it was made."""
    import datetime as dt
    import json
    from pathlib import Path

    path = Path(path) if path is not None else config.DATA_DIR / "requests.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    lm = models.load(dtype="fp32")
    reqs = [Request(id=r["id"], prompt_ids=chat_ids(lm.tokenizer, r["prompt"]), max_new_tokens=r["max_tokens"],
                    kind=r["kind"]) for r in data["requests"]]
    result = run_continuous(lm.model, reqs, decoder.eos_ids(lm.model, lm.tokenizer), lm.tokenizer.pad_token_id,
                            max_batch_size=max_batch_size)
    for raw, c in zip(data["requests"], result.completions):
        raw.update(prompt_tokens=c.n_prompt, answer_tokens=len(c.tokens), finish_reason=c.finish_reason)
    versions = env.versions(("torch", "transformers"))
    data["_about"] = (
        "Requests written for labkit: short questions, chat tasks, explanations, code, and questions about "
        "passages (the passages were written for this file too). max_tokens is the limit a chat client would "
        "send. prompt_tokens counts the chat-formatted prompt; answer_tokens is the length of the default "
        f"model's ({models.display_name()}, fp32) greedy answer, ending at end-of-sequence or max_tokens, "
        f"measured {dt.date.today().isoformat()} with torch {versions['torch']}, transformers "
        f"{versions['transformers']} by `python -m labkit requests` (labkit.serve.experiments.scheduler.measure_requests).")
    write_json_atomic(path, data)
    return result.summary()


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit requests``: measure the request mix and rewrite data/requests.json."""
    import argparse

    argparse.ArgumentParser(prog="python -m labkit requests", description=main.__doc__.splitlines()[0]).parse_args(argv)
    print(measure_requests())
    return 0

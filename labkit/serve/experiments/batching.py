"""Batching: a static batch-size sweep and the cost of padding.

Static batching runs B prompts as one left-padded batch through ``generate``: every decode step reads the
weights once for all B sequences, so total tokens/s grows with B while each user's tokens/s falls a little.
Every sweep row carries its quality: the greedy agreement of the batch's tokens with each prompt's tokens
decoded alone (padding and batched kernels change the arithmetic, and so sometimes the answer).
The server's engine, ``decode_batch`` (``labkit.serve.decoder``), runs ``labkit.decoding.decode``'s ``prefill``
then ``decode_one_token`` steps on a shared KV cache, dropping each sequence from the batch as soon as it
finishes (so a short answer does not ride along with the longest one, burning compute on padding).
"""
from __future__ import annotations

import statistics
import traceback
from collections.abc import Iterable
from collections.abc import Sequence as SequenceABC
from typing import Any

from ...core import timing
from ...core.checks import positive
from ...decoding import decode, generation
from ...decoding.quality import TokenRecorder, agreement
from ...model import dtypes, sizing
from ...model.models import chat_inputs
from ...model.prompts import cycle, load_prompts
from ..protocol import ServerConfig

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)
GPU_MAX_BATCH = 4096  # the GPU sweep doubles until memory runs out or this cap


# --------------------------------------------------------------------------------------------- padding


def padding_stats(lengths: SequenceABC[int]) -> dict[str, Any]:
    """Tokens a left-padded batch computes versus the tokens its prompts really have."""
    if not lengths or any(n <= 0 for n in lengths):
        raise ValueError(f"lengths={list(lengths)!r}: need at least one prompt, each with at least one token")
    longest = max(lengths)
    real = sum(lengths)
    padded = longest * len(lengths)
    return {"batch": len(lengths), "real_tokens": real, "padded_tokens": padded, "pad_tokens": padded - real,
            "wasted_fraction": (padded - real) / padded, "longest": longest, "shortest": min(lengths)}


def step_inputs(attention_mask: Any) -> tuple[Any, Any]:
    """The next decode step's inputs from the mask so far: the (B, T + 1) mask, where each row's new token is a
    real position, and the (B,) positions of the new tokens (each row counts its real tokens only). labkit's
    answer to notebook 06's exercise, on the decode core."""
    mask = decode.extend(attention_mask)
    return mask, decode.positions(mask)[:, -1]


def prompt_lengths(tokenizer: Any, prompts: SequenceABC[str]) -> list[int]:
    """Chat-formatted prompt lengths in tokens (what a batch really has to prefill)."""
    return [int(chat_inputs(tokenizer, p)["input_ids"].shape[1]) for p in prompts]


def padding_experiment(model: Any, tokenizer: Any, batch: int = 8, new_tokens: int = 8, long_repeat: int = 3,
                       repeats: int = 3) -> list[dict[str, Any]]:
    """Prefill and decode cost of padding: one long prompt among short ones, versus length buckets.

    Cases: the mixed batch padded to its longest prompt; the short prompts alone; the long prompt alone.
    Bucketing (short batch + long alone) is the remedy a server can apply; its cost is the sum of the two. One
    untimed warmup per case; then the cases run in ``repeats`` rounds (``timing.rounds``, each
    round in a shuffled order), every TTFT kept (``samples``, round i at index i; the bucketed row's are the
    round-by-round sums), so round i of two cases pairs up for ``verdict.compare(…, paired=True)``; each case's
    first round records its tokens.
    """
    positive("batch", batch)
    positive("repeats", repeats)
    if batch < 2:
        raise ValueError("batch must be at least 2: one long prompt plus short ones")
    shorts = cycle(load_prompts("questions"), batch - 1)
    long_prompt = "Summarise the following text. " + " ".join(load_prompts("prompts") * long_repeat)
    cases = {"mixed (padded to longest)": [long_prompt] + shorts, "short prompts only": shorts,
             "long prompt alone": [long_prompt]}
    rows, recorders = [], {}
    for prompts in cases.values():
        generation.generate(model, tokenizer, prompts, max_new_tokens=2, fixed_length=True)  # warmup at this shape

    def timed(case: str) -> Any:
        def once() -> Any:
            kw = {}
            if case not in recorders:  # the first round records the tokens the agreement is scored on
                recorders[case] = TokenRecorder()
                kw = recorders[case].kwargs()
            return generation.generate(model, tokenizer, cases[case], max_new_tokens=new_tokens, fixed_length=True, **kw)
        return once

    # the cases in rounds, each in a shuffled order: drift hits all alike, and round i of each case is a pair
    runs = timing.rounds({case: timed(case) for case in cases}, repeats, again=False)
    tokens = {case: r.tokens for case, r in recorders.items()}
    for case, prompts in cases.items():
        done = runs[case]
        rows.append({"case": case, **padding_stats(prompt_lengths(tokenizer, prompts)),
                     "ttft_s": statistics.median(r.ttft_s for r in done),
                     "tpot_s": statistics.median(r.tpot_s for r in done if r.tpot_s is not None),
                     "e2e_s": statistics.median(r.e2e_s for r in done), "agreement": None,
                     "samples": {"ttft_s": [r.ttft_s for r in done]}})
    # quality: the mixed batch's answers against the same prompts decoded in their buckets (long first)
    import torch

    bucketed_tokens = torch.cat([tokens["long prompt alone"], tokens["short prompts only"]])
    rows[0]["agreement"] = agreement(tokens["mixed (padded to longest)"], bucketed_tokens)
    short, alone = rows[1], rows[2]
    rows.append({"case": "bucketed (short batch, then long alone)", "batch": batch,
                 "real_tokens": short["real_tokens"] + alone["real_tokens"],
                 "padded_tokens": short["padded_tokens"] + alone["padded_tokens"],
                 "pad_tokens": short["pad_tokens"] + alone["pad_tokens"],
                 "wasted_fraction": (short["pad_tokens"] + alone["pad_tokens"]) /
                 (short["padded_tokens"] + alone["padded_tokens"]),
                 "longest": alone["longest"], "shortest": short["shortest"],
                 "ttft_s": short["ttft_s"] + alone["ttft_s"], "tpot_s": None,
                 "e2e_s": short["e2e_s"] + alone["e2e_s"], "agreement": 1.0,  # the baseline itself
                 "samples": {"ttft_s": [a + b for a, b in zip(short["samples"]["ttft_s"], alone["samples"]["ttft_s"])]}})
    return rows


# ------------------------------------------------------------------------------------ static sweep


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def default_batch_sizes(device: str) -> tuple[int, ...]:
    """1…16 on a CPU; on a GPU keep doubling until memory runs out (capped at GPU_MAX_BATCH)."""
    if str(device).startswith("cuda"):
        sizes, b = [], 1
        while b <= GPU_MAX_BATCH:
            sizes.append(b)
            b *= 2
        return tuple(sizes)
    return DEFAULT_BATCH_SIZES


def sweep_row(batch_size: int, runs: list[Any], lengths: list[int]) -> dict[str, Any]:
    """One sweep row from timed ``GenerationResult``s of a static batch (all sequences finish together)."""
    ttft = statistics.median(r.ttft_s for r in runs)
    e2e = statistics.median(r.e2e_s for r in runs)
    tpots = [r.tpot_s for r in runs if r.tpot_s is not None]
    tpot = statistics.median(tpots) if tpots else None
    n_out = runs[0].n_out
    pad = padding_stats(lengths)
    return {"batch_size": batch_size, "status": "ok", "n_out": n_out, "ttft_s": ttft, "tpot_s": tpot,
            "latency_s": e2e, "tokens_per_s_per_user": n_out / e2e, "total_tokens_per_s": batch_size * n_out / e2e,
            "decode_tokens_per_s_per_user": 1 / tpot if tpot else None, "pad_tokens": pad["pad_tokens"],
            "wasted_fraction": pad["wasted_fraction"], "repeats": len(runs),
            "samples": {"total_tokens_per_s": [batch_size * n_out / r.e2e_s for r in runs],
                        "tokens_per_s_per_user": [n_out / r.e2e_s for r in runs],
                        "ttft_s": [r.ttft_s for r in runs], "latency_s": [r.e2e_s for r in runs]}}


def static_sweep(model: Any, tokenizer: Any, batch_sizes: Iterable[int] | None = None, new_tokens: int = 32,
                 repeats: int = 1, prompts: SequenceABC[str] | None = None,
                 progress: bool = False) -> list[dict[str, Any]]:
    """Per-request latency, TTFT, TPOT and total output tokens/s for each static batch size, and its quality.

    Each batch holds ``batch_size`` prompts (round-robin from ``prompts``, mixed lengths, left padded) and
    generates exactly ``new_tokens`` tokens per sequence. One untimed warmup per size (in rising order: the first
    out-of-memory is found there), then ``repeats`` rounds over the sizes (``timing.rounds``: each round in a
    shuffled order, round i of every size at index i of its ``samples``, a pair for ``verdict.compare(…,
    paired=True)``) and batch 1 once more after the last round (not a round): medians reported, every round kept in
    ``samples``, ``drift`` = batch 1's extra pass time / its first. ``agreement``: the fraction of the batch's greedy
    tokens equal to each prompt's tokens decoded alone (each distinct prompt is decoded alone once, untimed; batch 1
    is its own baseline; the tokens are recorded on each size's first round). An out-of-memory becomes a row with
    status 'oom' and the sweep goes on without that size; on a GPU with the default sizes, the sweep stops growing
    after the first 'oom' row. ``progress`` is accepted for older callers and shows nothing.
    """
    import torch

    positive("new_tokens", new_tokens)
    positive("repeats", repeats)
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: need at least 2 to time decode")
    device = str(next(model.parameters()).device)
    auto = batch_sizes is None
    sizes = list(default_batch_sizes(device) if auto else batch_sizes)
    for b in sizes:
        positive("batch size", b)
    prompts = list(prompts) if prompts is not None else load_prompts("prompts")
    rows: dict[int, dict[str, Any]] = {}
    recorders: dict[int, TokenRecorder] = {}
    alone: dict[str, Any] = {}  # prompt -> its (1, new_tokens) greedy tokens decoded without company

    def attempt(b: int, **kw: Any) -> Any:
        """One run of batch ``b``; None (and an 'oom' row) once it ran out of memory."""
        if b in rows:
            return None
        error = ""
        try:
            return generation.generate(model, tokenizer, cycle(prompts, b), fixed_length=True, **kw)
        except (RuntimeError, MemoryError) as exc:
            if not isinstance(exc, MemoryError) and not _is_oom(exc):
                raise
            error = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            traceback.clear_frames(exc.__traceback__)  # the failed frames' locals hold the batch's tensors
        _free_memory()  # outside the except block: the exception and its traceback are gone, so their memory can go
        rows[b] = {"batch_size": b, "status": "oom", "error": error}
        return None

    for b in sizes:  # warmups in rising order: on a GPU the default sizes stop growing after the first out-of-memory
        if auto and rows:
            break
        attempt(b, max_new_tokens=2)
    live = [b for b in sizes if b not in rows and (not auto or not rows or b < min(rows))]

    def timed(b: int) -> Any:
        def once() -> Any:
            if b not in recorders:  # the first round records the tokens the agreement is scored on
                recorders[b] = TokenRecorder()
                return attempt(b, max_new_tokens=new_tokens, **recorders[b].kwargs())
            return attempt(b, max_new_tokens=new_tokens)
        return once

    runs = timing.rounds({b: timed(b) for b in live}, repeats, again=bool(live) and live[0] == sizes[0]) \
        if live else timing.Rounds({}, [], None)
    done = {b: results for b, results in runs.items() if b not in rows and all(r is not None for r in results)}
    drift = None
    if sizes[0] in done and runs.again is not None:
        drift = runs.again.e2e_s / done[sizes[0]][0].e2e_s
    for b in sizes:
        if b not in done:
            continue
        batch_prompts = cycle(prompts, b)
        if b == 1:
            alone.setdefault(batch_prompts[0], recorders[b].tokens)
        for p in dict.fromkeys(batch_prompts):
            if p not in alone:
                alone[p] = alone_tokens(model, tokenizer, p, new_tokens)
        baseline = torch.cat([alone[p] for p in batch_prompts])
        rows[b] = {**sweep_row(b, done[b], prompt_lengths(tokenizer, batch_prompts)),
                   "agreement": agreement(recorders[b].tokens, baseline), "drift": drift}
    return [rows[b] for b in sizes if b in rows]


def alone_tokens(model: Any, tokenizer: Any, prompt: str, new_tokens: int) -> Any:
    """(1, new_tokens) greedy tokens of one chat prompt decoded alone: no padding, no company."""
    recorder = TokenRecorder()
    generation.generate(model, tokenizer, prompt, max_new_tokens=new_tokens, fixed_length=True, **recorder.kwargs())
    return recorder.tokens


def memory_bound_gain(model: Any, tokenizer: Any, batch_size: int, new_tokens: int,
                      prompts: SequenceABC[str] | None = None) -> float:
    """Total tokens/s at ``batch_size`` over batch 1 if a decode step cost only its memory reads: every weight
    once per step, plus each sequence's KV cache at the sweep's mean context (its prompt plus half its answer)."""
    positive("batch_size", batch_size)
    est = sizing.estimate(model.config, dtype=dtypes.normalize_dtype(str(model.dtype)), context=1)
    lengths = prompt_lengths(tokenizer, list(prompts) if prompts is not None else load_prompts("prompts"))
    context = round(sum(lengths) / len(lengths)) + positive("new_tokens", new_tokens) // 2

    def read(b: int) -> int:
        return sizing.decode_bytes_per_step(est.weight_bytes, est.kv_bytes_per_token, context, b)

    return batch_size * read(1) / read(batch_size)


def pareto_front(rows: list[dict[str, Any]], x: str = "total_tokens_per_s",
                 y: str = "tokens_per_s_per_user") -> list[dict[str, Any]]:
    """Rows no other row beats on both ``x`` and ``y`` (higher is better), sorted by ``x``."""
    ok = [r for r in rows if r.get("status", "ok") == "ok" and r.get(x) is not None and r.get(y) is not None]
    front = [r for r in ok if not any(o[x] >= r[x] and o[y] >= r[y] and (o[x] > r[x] or o[y] > r[y]) for o in ok)]
    return sorted(front, key=lambda r: r[x])


def pareto_figure(rows: list[dict[str, Any]], title: str = "Static batching: each user's speed against the total"):
    """Scatter of tokens/s per user (y) against total tokens/s (x), labelled by batch size, front joined."""
    import plotly.graph_objects as go

    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    front = pareto_front(ok)
    fig = go.Figure()
    fig.add_scatter(x=[r["total_tokens_per_s"] for r in ok], y=[r["tokens_per_s_per_user"] for r in ok],
                    mode="markers+text", text=[f"B={r['batch_size']}" for r in ok], textposition="top center",
                    name="batch size", marker={"size": 10})
    fig.add_scatter(x=[r["total_tokens_per_s"] for r in front], y=[r["tokens_per_s_per_user"] for r in front],
                    mode="lines", name="Pareto front", line={"dash": "dot"})
    fig.update_layout(title=title, xaxis_title="total output tokens/s (all users)",
                      yaxis_title="output tokens/s per user", template="plotly_white")
    return fig


# ------------------------------------------------------------- what articles write about TGI, and what exists

TGI_ARTICLE_CALL = "text_generation.Client(url, max_batch_size=…, waiting_served_ratio=…)"


TGI_CLIENT_CALL = "text_generation.Client(base_url, headers=None, cookies=None, timeout=…)"  # its whole constructor
# TGI's launcher flags that shape batching (text-generation-launcher --help, TGI docs: reference/launcher),
# each with the labkit server option (serving.ServerConfig) that does that job here, or None.
TGI_BATCHING_FLAGS = (
    ("--max-batch-size", "most requests in one batch (the docs: for hardware without unpadded inference)",
     "max_batch_size", ""),
    ("--waiting-served-ratio", "once waiting requests reach this ratio of running ones (and fit), pause the "
     "running batch for one prefill that adds them", None,
     "none: a new batch starts when the running one ends; continuous batching (notebook 07) adds requests "
     "at every step"),
    ("--max-waiting-tokens", "decode steps the running batch may take before waiting requests are forced in",
     "max_wait_ms", "a time the oldest request waits for company, not a count of steps"),
    ("--max-batch-total-tokens", "prompt + generated tokens all running requests may hold: the KV-cache budget",
     None, "none: each request is bounded instead (max_prompt_tokens, max_tokens_limit)"),
    ("--max-batch-prefill-tokens", "prompt tokens one prefill may take", "max_prompt_tokens",
     "per request, not per prefill"),
    ("--max-concurrent-requests", "requests in flight before new ones are refused", "max_queue",
     "requests waiting beyond it get HTTP 503"),
)


def tgi_batching_options() -> list[dict[str, Any]]:
    """TGI's batching settings where they really live (launcher flags, not the client), next to the labkit
    server option that does the same job; every labkit name is checked against ``protocol.ServerConfig``."""
    from dataclasses import fields

    ours = {f.name: f.default for f in fields(ServerConfig)}
    rows = []
    for flag, meaning, option, note in TGI_BATCHING_FLAGS:
        assert option is None or option in ours, f"{option} is not a labkit server option ({sorted(ours)})"
        rows.append({"TGI launcher flag": flag, "what it does": meaning,
                     "labkit server": f"{option} (default {ours[option]})" if option else "—",
                     "note": note})
    return rows

"""Batching: a static batch-size sweep, the cost of padding, and the batched greedy decoder the server runs.

Static batching runs B prompts as one left-padded batch through ``generate``: every decode step reads the
weights once for all B sequences, so total tokens/s grows with B while each user's tokens/s falls a little.
Every sweep row carries its quality: the greedy agreement of the batch's tokens with each prompt's tokens
decoded alone (padding and batched kernels change the arithmetic, and so sometimes the answer).
``decode_batch`` is the server's engine: ``labkit.decode``'s ``prefill`` then ``decode_one_token`` steps on a shared KV cache,
dropping each sequence from the batch as soon as it finishes (so a short answer does not ride along with
the longest one, burning compute on padding).
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence as SequenceABC
from dataclasses import dataclass, field
from typing import Any

from . import config, decode, sizing
from .generation import generate
from .kv import TokenRecorder, agreement
from .sampling import Sampling, choose

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)
GPU_MAX_BATCH = 4096  # the GPU sweep doubles until memory runs out or this cap


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive integer")
    return value


def load_prompts(kind: str = "prompts") -> list[str]:
    """The fixed prompts in data/prompts.json: 'prompts' (mixed lengths) or 'questions' (short answers)."""
    data = json.loads((config.DATA_DIR / "prompts.json").read_text(encoding="utf-8"))
    choices = [k for k, v in data.items() if isinstance(v, list)]
    if kind not in choices:
        raise ValueError(f"prompt set {kind!r}: choose one of {choices}")
    return list(data[kind])


def cycle(prompts: SequenceABC[str], n: int) -> list[str]:
    """``n`` prompts taken round-robin from ``prompts``."""
    if not prompts:
        raise ValueError("no prompts: pass at least one string")
    return [prompts[i % len(prompts)] for i in range(_positive("n", n))]


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
    from .models import chat_inputs

    return [int(chat_inputs(tokenizer, p)["input_ids"].shape[1]) for p in prompts]


def padding_experiment(model: Any, tokenizer: Any, batch: int = 8, new_tokens: int = 8, long_repeat: int = 3,
                       repeats: int = 1) -> list[dict[str, Any]]:
    """Prefill and decode cost of padding: one long prompt among short ones, versus length buckets.

    Cases: the mixed batch padded to its longest prompt; the short prompts alone; the long prompt alone.
    Bucketing (short batch + long alone) is the remedy a server can apply; its cost is the sum of the two.
    """
    _positive("batch", batch)
    if batch < 2:
        raise ValueError("batch must be at least 2: one long prompt plus short ones")
    shorts = cycle(load_prompts("questions"), batch - 1)
    long_prompt = "Summarise the following text. " + " ".join(load_prompts("prompts") * long_repeat)
    cases = {"mixed (padded to longest)": [long_prompt] + shorts, "short prompts only": shorts,
             "long prompt alone": [long_prompt]}
    rows, tokens = [], {}
    for case, prompts in cases.items():
        lengths = prompt_lengths(tokenizer, prompts)
        generate(model, tokenizer, prompts, max_new_tokens=2, fixed_length=True)  # warmup at this shape
        recorder = TokenRecorder()
        runs = [generate(model, tokenizer, prompts, max_new_tokens=new_tokens, fixed_length=True,
                         **(recorder.kwargs() if i == 0 else {})) for i in range(repeats)]
        tokens[case] = recorder.tokens
        rows.append({"case": case, **padding_stats(lengths),
                     "ttft_s": statistics.median(r.ttft_s for r in runs),
                     "tpot_s": statistics.median(r.tpot_s for r in runs if r.tpot_s is not None),
                     "e2e_s": statistics.median(r.e2e_s for r in runs), "agreement": None})
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
                 "e2e_s": short["e2e_s"] + alone["e2e_s"], "agreement": 1.0})  # the baseline itself
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
            "wasted_fraction": pad["wasted_fraction"], "repeats": len(runs)}


def static_sweep(model: Any, tokenizer: Any, batch_sizes: Iterable[int] | None = None, new_tokens: int = 32,
                 repeats: int = 1, prompts: SequenceABC[str] | None = None,
                 progress: bool = True) -> list[dict[str, Any]]:
    """Per-request latency, TTFT, TPOT and total output tokens/s for each static batch size, and its quality.

    Each batch holds ``batch_size`` prompts (round-robin from ``prompts``, mixed lengths, left padded) and
    generates exactly ``new_tokens`` tokens per sequence. One untimed warmup per size, then ``repeats``
    timed runs (medians reported). ``agreement``: the fraction of the batch's greedy tokens equal to each
    prompt's tokens decoded alone (each distinct prompt is decoded alone once, untimed; batch 1 is its own
    baseline). An out-of-memory becomes a row with status 'oom' and the sweep goes on; on a GPU with the
    default sizes, the sweep stops growing after the first 'oom' row.
    """
    import torch
    from tqdm.auto import tqdm

    _positive("new_tokens", new_tokens)
    _positive("repeats", repeats)
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: need at least 2 to time decode")
    device = str(next(model.parameters()).device)
    auto = batch_sizes is None
    sizes = list(default_batch_sizes(device) if auto else batch_sizes)
    for b in sizes:
        _positive("batch size", b)
    prompts = list(prompts) if prompts is not None else load_prompts("prompts")
    rows: list[dict[str, Any]] = []
    alone: dict[str, Any] = {}  # prompt -> its (1, new_tokens) greedy tokens decoded without company
    for b in tqdm(sizes, desc="batch sizes", disable=not progress):
        batch_prompts = cycle(prompts, b)
        recorder = TokenRecorder()
        try:
            generate(model, tokenizer, batch_prompts, max_new_tokens=2, fixed_length=True)  # warmup
            runs = [generate(model, tokenizer, batch_prompts, max_new_tokens=new_tokens, fixed_length=True,
                             **(recorder.kwargs() if i == 0 else {})) for i in range(repeats)]
        except (RuntimeError, MemoryError) as exc:
            if not isinstance(exc, MemoryError) and not _is_oom(exc):
                raise
            _free_memory()
            rows.append({"batch_size": b, "status": "oom", "error": str(exc).splitlines()[0][:200]})
            if auto:
                break
            continue
        if b == 1:
            alone.setdefault(batch_prompts[0], recorder.tokens)
        for p in dict.fromkeys(batch_prompts):
            if p not in alone:
                alone[p] = alone_tokens(model, tokenizer, p, new_tokens)
        baseline = torch.cat([alone[p] for p in batch_prompts])
        rows.append({**sweep_row(b, runs, prompt_lengths(tokenizer, batch_prompts)),
                     "agreement": agreement(recorder.tokens, baseline)})
    return rows


def alone_tokens(model: Any, tokenizer: Any, prompt: str, new_tokens: int) -> Any:
    """(1, new_tokens) greedy tokens of one chat prompt decoded alone: no padding, no company."""
    recorder = TokenRecorder()
    generate(model, tokenizer, prompt, max_new_tokens=new_tokens, fixed_length=True, **recorder.kwargs())
    return recorder.tokens


def memory_bound_gain(model: Any, tokenizer: Any, batch_size: int, new_tokens: int,
                      prompts: SequenceABC[str] | None = None) -> float:
    """Total tokens/s at ``batch_size`` over batch 1 if a decode step cost only its memory reads: every weight
    once per step, plus each sequence's KV cache at the sweep's mean context (its prompt plus half its answer)."""
    _positive("batch_size", batch_size)
    est = sizing.estimate(model.config, dtype=sizing.normalize_dtype(str(model.dtype)), context=1)
    lengths = prompt_lengths(tokenizer, list(prompts) if prompts is not None else load_prompts("prompts"))
    context = round(sum(lengths) / len(lengths)) + _positive("new_tokens", new_tokens) // 2

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


# ------------------------------------------------------------------------ takeaways from this run's numbers


@dataclass
class Findings:
    """Notebook 06's takeaways: the numbers (``rows``) and the sentences they choose (``sentences``)."""

    rows: list[dict[str, Any]]
    sentences: list[str]


def findings(*, sweep: list[dict[str, Any]], memory_bound_gain: float, padding: list[dict[str, Any]],
             serving: list[dict[str, Any]], open_loop: list[dict[str, Any]], clients: int,
             request_rate: float) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``sweep``: static_sweep rows (batch 1 first); ``memory_bound_gain``: the sizing model's predicted total-tokens/s
    gain at the largest batch; ``padding``: padding_experiment rows (mixed first, bucketed last); ``serving``: the
    max_batch_size 1 and 8 rows (loadgen summaries plus max_batch_size); ``open_loop``: Poisson then bursty rows.
    """
    ok = [r for r in sweep if r.get("status", "ok") == "ok"]
    if not ok or not padding or len(serving) != 2 or len(open_loop) != 2:
        raise ValueError("findings need the sweep's ok rows, the padding rows, two server rows and two open-loop rows")
    first, last = ok[0], ok[-1]
    gain = last["total_tokens_per_s"] / first["total_tokens_per_s"]
    user = last["tokens_per_s_per_user"] / first["tokens_per_s_per_user"]
    ttft_x = last["ttft_s"] / first["ttft_s"]
    worst = min(ok, key=lambda r: r["agreement"])
    mixed, bucketed = padding[0], padding[-1]
    bucket_x = mixed["ttft_s"] / bucketed["ttft_s"]
    one, many = serving
    serve_x = many["output_tokens_per_s"] / one["output_tokens_per_s"]
    tpot_x = many["tpot_p50_s"] / one["tpot_p50_s"]
    poisson, bursty = open_loop
    burst_x = bursty["ttft_p90_s"] / poisson["ttft_p90_s"]
    sentences = [
        f"Batch {last['batch_size']} gave {gain:.1f}× the total tokens/s of batch 1 "
        f"({'more' if gain > memory_bound_gain else 'less'} than the memory-bound model's {memory_bound_gain:.1f}×); "
        f"each user got {user:.2f}× batch 1's speed and waited {ttft_x:.1f}× as long for the first token.",
        ("Batching changed no answer: every batch's greedy tokens equal each prompt's tokens decoded alone."
         if worst["agreement"] == 1 else
         f"Batching changed some answers: at batch {worst['batch_size']} only {worst['agreement']:.0%} of the tokens "
         "equal each prompt decoded alone (padded rows and other matrix shapes round differently)."),
        f"In the mixed batch {mixed['wasted_fraction']:.0%} of the prompt tokens were padding; bucketing by length "
        f"prefilled {bucket_x:.1f}× {'faster' if bucket_x > 1 else 'slower'}, and the mixed batch's tokens equal "
        f"the bucketed ones on {mixed['agreement']:.0%}.",
        f"With {clients} clients, max_batch_size {many['max_batch_size']} served {serve_x:.1f}× the tokens/s of "
        f"max_batch_size {one['max_batch_size']} (mean batch {many['mean_batch_size']:.1f}), each token coming "
        f"{tpot_x:.1f}× {'slower' if tpot_x > 1 else 'faster'}; {one['failed'] + many['failed']} requests failed.",
        f"At {request_rate:g} requests/s, bursty arrivals made the TTFT p90 {burst_x:.1f}× Poisson's "
        f"({'worse' if burst_x > 1 else 'better'}); goodput {poisson['goodput']:.2f} (Poisson) and "
        f"{bursty['goodput']:.2f} (bursty) requests/s.",
    ]
    rows = [
        {"finding": f"static batch {last['batch_size']} / batch 1, total tokens/s (×)", "value": gain},
        {"finding": "memory-bound prediction of that gain (×)", "value": memory_bound_gain},
        {"finding": f"static batch {last['batch_size']} / batch 1, tokens/s per user (×)", "value": user},
        {"finding": "lowest greedy agreement with prompts alone (share)", "value": worst["agreement"]},
        {"finding": "padding share of the mixed batch's prompt tokens", "value": mixed["wasted_fraction"]},
        {"finding": "prefill mixed / bucketed (×)", "value": bucket_x},
        {"finding": f"server max_batch_size {many['max_batch_size']} / {one['max_batch_size']}, tokens/s (×)",
         "value": serve_x},
        {"finding": "TTFT p90 bursty / Poisson (×)", "value": burst_x},
    ]
    return Findings(rows=rows, sentences=sentences)


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
    server option that does the same job; every labkit name is checked against ``serving.ServerConfig``."""
    from dataclasses import fields

    from .serving import ServerConfig

    ours = {f.name: f.default for f in fields(ServerConfig)}
    rows = []
    for flag, meaning, option, note in TGI_BATCHING_FLAGS:
        assert option is None or option in ours, f"{option} is not a labkit server option ({sorted(ours)})"
        rows.append({"TGI launcher flag": flag, "what it does": meaning,
                     "labkit server": f"{option} (default {ours[option]})" if option else "—",
                     "note": note})
    return rows


# ------------------------------------------------------------------------ the server's batched decoder


@dataclass
class Sequence:
    """One request inside ``decode_batch``. ``on_token(token_id, finish_reason)`` runs in the model thread;
    ``finish_reason`` is None until the last token ('stop' at end-of-sequence, 'length' at the limit).
    Tokens are greedy unless ``sampling`` says otherwise (``labkit.sampling``)."""

    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    on_token: Callable[[int, str | None], None] | None = None
    cancelled: Callable[[], bool] = lambda: False
    sampling: Sampling | None = None  # None: greedy
    owner: Any = None  # whoever submitted it (the server's request), for answering after a failure
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | cancelled | aborted

    def emit(self, token: int, eos: set[int]) -> bool:
        """Record one generated token, set ``finish_reason`` when it ends the sequence, call ``on_token``;
        True while the sequence goes on."""
        self.tokens.append(token)
        if token in eos and not self.ignore_eos:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.on_token is not None:
            self.on_token(token, self.finish_reason)
        if self.finish_reason is None and self.cancelled():
            self.finish_reason = "cancelled"
        return self.finish_reason is None


@dataclass
class BatchStats:
    """What one ``decode_batch`` call did: steps run and row-steps computed versus tokens kept."""

    batch_size: int
    prompt_tokens: int
    padded_prompt_tokens: int
    steps: int = 0
    computed_rows: int = 0  # sum over steps of the rows in the batch (padding rows count)
    output_tokens: int = 0

    @property
    def wasted_fraction(self) -> float:
        return 1 - self.output_tokens / self.computed_rows if self.computed_rows else 0.0


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends a sequence: the tokenizer's and the generation config's."""
    ids: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def decode_batch(model: Any, seqs: list[Sequence], eos: set[int], pad_id: int, *, drop_finished: bool = True,
                 should_abort: Callable[[], bool] = lambda: False) -> BatchStats:
    """Greedy-decode a batch of sequences together, streaming each token through ``Sequence.on_token``.

    ``drop_finished=True`` removes a finished (or cancelled) sequence from the batch and the KV cache at once;
    ``False`` keeps it computing until the longest sequence is done, the cost static batching pays.
    ``should_abort()`` is checked between steps; an abort marks unfinished sequences 'aborted'.
    """
    import torch

    if not seqs:
        raise ValueError("decode_batch needs at least one sequence")
    for s in seqs:
        if not s.prompt_ids:
            raise ValueError("every sequence needs at least one prompt token")
        _positive("max_new_tokens", s.max_new_tokens)
    device = next(model.parameters()).device
    input_ids, mask = decode.left_pad([s.prompt_ids for s in seqs], pad_id, device)
    stats = BatchStats(batch_size=len(seqs), prompt_tokens=sum(len(s.prompt_ids) for s in seqs),
                       padded_prompt_tokens=int(input_ids.numel()))
    active = list(range(len(seqs)))  # row r of the batch holds seqs[active[r]]
    with torch.inference_mode():
        logits, cache = decode.prefill(model, input_ids, mask)
        next_tokens = choose(logits, [s.sampling for s in seqs])
        pos = decode.positions(mask)[:, -1]
        while True:
            stats.steps += 1
            stats.computed_rows += len(active)
            chosen = next_tokens.tolist()  # one host sync per step for the whole batch
            keep = []
            for row, idx in enumerate(active):
                s = seqs[idx]
                if s.finish_reason is not None:  # finished earlier, kept because drop_finished=False
                    keep.append(row)
                    continue
                stats.output_tokens += 1
                if s.emit(int(chosen[row]), eos) or not drop_finished:
                    keep.append(row)
            if all(seqs[i].finish_reason is not None for i in active):
                break
            if should_abort():
                for i in active:
                    if seqs[i].finish_reason is None:
                        seqs[i].finish_reason = "aborted"
                break
            if len(keep) < len(active):  # shrink the batch: rows, mask and every layer's KV cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, pos, next_tokens = mask[index], pos[index], next_tokens[index]
                active = [active[r] for r in keep]
            # finished rows kept by drop_finished=False are fed padding and their output is ignored
            done = torch.tensor([seqs[i].finish_reason is not None for i in active], device=device)
            feed = next_tokens.masked_fill(done, pad_id)
            mask, pos = decode.extend(mask), pos + 1
            logits = decode.decode_one_token(model, feed, cache, pos, mask)
            next_tokens = choose(logits, [seqs[i].sampling for i in active])
    return stats

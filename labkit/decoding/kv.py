"""The KV cache, measured: its bytes against the sizing formula, cache on vs off, dynamic vs
static, attention implementations, and the prefill/decode split. Every speed row carries a
greedy-agreement column against its baseline (the first variant measured).

``generate`` feeds every token but the last through the model, so after a request of
``n_prompt`` prompt tokens and ``n_new`` new tokens the cache holds ``n_prompt + n_new - 1``
positions per sequence. The sizing model predicts 2 (K and V) × layers × KV heads × head_dim ×
bytes per position; ``cache_bytes`` sums the tensors actually held, so the two can be compared.

``python -m labkit kv reference`` measures dynamic/static caches with and without
torch.compile in full size and writes ``data/reference/05_kv_cache_compile.json`` (on a GPU,
``05_kv_cache_compile.<gpu>.json`` beside it): the notebook shows it in quick mode, where
compiling the model would take most of the time budget.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ..core import env, results, timing
from ..core.checks import model_device, positive
from ..core.timing import Measurement, now
from ..model import dtypes, models, sizing
from ..model.models import chat_inputs
from ..model.prompts import prompt_of_length
from . import cache_variants, decode, generation
from .cache_variants import CACHE_VARIANTS, REFERENCE_COMPILE, cache_variant_kwargs
from .quality import TokenRecorder, agreement

DEFAULT_PROMPT = generation.TIMED_PROMPT
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


# ---------------------------------------------------------------- measuring the cache itself

STATE_ATTRS = ("conv_states", "recurrent_states", "ssm_states")  # linear attention's fixed-size states


def _tensor(t: Any) -> bool:
    return t is not None and hasattr(t, "numel") and t.numel() > 0


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    """(key, value) tensors per attention layer from a transformers ``Cache`` (``.layers``; a linear-attention
    layer, which keeps no keys, is left out), transformers 4.57's hybrid cache (``key_cache``/``value_cache`` lists
    whose linear-attention entries are empty) or a legacy tuple."""
    if cache is None:
        raise ValueError("no cache: the model ran with use_cache=False, so there is nothing to measure")
    layers = getattr(cache, "layers", None)
    if layers is not None:
        pairs = [(layer.keys, layer.values) for layer in layers if hasattr(layer, "keys")]
    elif hasattr(cache, "key_cache"):
        pairs = [(k, v) for k, v in zip(cache.key_cache, cache.value_cache) if _tensor(k)]
    else:
        pairs = [(kv[0], kv[1]) for kv in cache]
    for k, v in pairs:
        assert k is not None and v is not None, "cache layer not initialised: run a forward pass first"
    return pairs


def _states(holder: Any, index: int | None = None) -> list[Any]:
    """The state tensors ``holder`` keeps (a layer's, or with ``index`` one layer's entry of cache-wide lists)."""
    out = []
    for attr in STATE_ATTRS:
        value = getattr(holder, attr, None)
        if value is None:
            continue
        if index is not None:
            value = value[index]
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        out += [t for t in items if _tensor(t)]
    return out


def layer_tensors(cache: Any) -> list[list[Any]]:
    """Every tensor the cache holds, layer by layer: keys, values and linear attention's states."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [[t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if _tensor(t)]
                + _states(layer) for layer in layers]
    if hasattr(cache, "key_cache"):  # transformers 4.57's hybrid cache: lists by layer
        return [[t for t in (k, v) if _tensor(t)] + _states(cache, i)
                for i, (k, v) in enumerate(zip(cache.key_cache, cache.value_cache))]
    return [[k, v] for k, v in cache_layers(cache)]


def cache_bytes(cache: Any) -> int:
    """Bytes of every tensor the cache holds (allocated size, padding included): keys, values and any
    linear-attention states."""
    if cache is None:
        raise ValueError("no cache: the model ran with use_cache=False, so there is nothing to measure")
    cache_layers(cache)  # a layer left uninitialised fails here
    return sum(t.numel() * t.element_size() for ts in layer_tensors(cache) for t in ts)


def cache_positions(cache: Any) -> int:
    """Positions per sequence the cache holds storage for: the longest layer's (a sliding layer holds fewer)."""
    return max(int(k.shape[-2]) for k, _ in cache_layers(cache))


@dataclass
class CacheSize:
    """One cache measured against the sizing formula for the same context and batch."""

    cache_class: str
    kv_dtype: str
    batch: int
    context: int  # positions predicted: n_prompt + n_new - 1
    positions: int  # positions the cache actually holds storage for
    measured_bytes: int
    predicted_bytes: int

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def _kv_dtype(model: Any) -> str:
    return dtypes.normalize_dtype(str(model.dtype))


def bytes_per_position(config: Any, bytes_per_value: float) -> int:
    """KV-cache bytes one position of one sequence takes: K and V, for every layer and KV head.

    Read from the model's config: ``num_key_value_heads`` (grouped-query attention caches fewer heads than it
    queries with) and ``head_dim`` where the config sets it (not always hidden_size / num_attention_heads).
    """
    s = sizing.shape(config)
    return int(2 * s.n_layers * s.n_kv_heads * s.head_dim * bytes_per_value)


def predicted_bytes(model: Any, context: int, batch: int = 1) -> int:
    """``labkit.model.sizing.kv_bytes`` for this model's config and compute dtype."""
    return sizing.kv_bytes(sizing.shape(model.config), _kv_dtype(model), context, batch)


def measure_cache(model: Any, tokenizer: Any, prompt: str = DEFAULT_PROMPT, new_tokens: int = 16,
                  batch: int = 1, **gen_kwargs: Any) -> CacheSize:
    """Generate ``new_tokens`` for ``batch`` copies of ``prompt`` and measure the returned cache.

    Identical prompts keep the batch unpadded, so every row holds the same number of positions.
    """
    import torch

    positive("max_new_tokens", new_tokens)  # the generate argument it becomes
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch={batch!r}: must be a positive integer")
    inputs = chat_inputs(tokenizer, [prompt] * batch, device=str(model_device(model)))
    n_prompt = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id, **gen_kwargs)
    cache = out.past_key_values
    context = n_prompt + new_tokens - 1  # the last sampled token is never fed back
    return CacheSize(cache_class=type(cache).__name__, kv_dtype=_kv_dtype(model), batch=batch, context=context,
                     positions=cache_positions(cache), measured_bytes=cache_bytes(cache),
                     predicted_bytes=predicted_bytes(model, context, batch))


def prefill_cache_sizes(model: Any, tokenizer: Any, contexts: Iterable[int], batch: int = 1) -> list[CacheSize]:
    """Cache bytes after prefilling prompts of each length: the growth line against the formula."""
    import torch

    rows = []
    with torch.inference_mode():
        for ctx in contexts:
            inputs = prompt_of_length(tokenizer, ctx, batch=batch, device=str(model_device(model)))
            _, cache = decode.prefill(model, inputs["input_ids"], inputs["attention_mask"])
            rows.append(CacheSize(cache_class=type(cache).__name__, kv_dtype=_kv_dtype(model), batch=batch,
                                  context=ctx, positions=cache_positions(cache), measured_bytes=cache_bytes(cache),
                                  predicted_bytes=predicted_bytes(model, ctx, batch)))
    return rows


def time_steps(steps: Iterable[Any], device: Any, n_prompt: int) -> tuple[generation.GenerationResult, Any]:
    """Run a decode loop that yields one (B,) token tensor per step, stamping each token as it arrives
    (device-synchronised): the same timings ``generate``'s streamer gives, and the (B, n) tokens."""
    import torch

    start = now(device)
    stamps, tokens = [], []
    for token in steps:
        stamps.append(now(device))
        tokens.append(token)
    return generation.GenerationResult.from_stamps(start, stamps, n_prompt), torch.stack(tokens, dim=1).cpu()


# ---------------------------------------------------------------- timing cache choices

def timed_generate(model: Any, tokenizer: Any, prompt: Any = DEFAULT_PROMPT, new_tokens: int = 64,
                   use_cache: bool = True, **gen_kwargs: Any) -> generation.GenerationResult:
    """Exactly ``new_tokens`` greedy tokens, every token stamped (use_cache=False re-runs the whole sequence)."""
    return generation.generate(model, tokenizer, prompt, max_new_tokens=new_tokens, fixed_length=True,
                               use_cache=use_cache, **gen_kwargs)


def per_token_rows(result: generation.GenerationResult, label: str) -> list[dict[str, Any]]:
    """One row per generated token: its position, ITL (the first is TTFT) and the time elapsed so far."""
    gaps = [result.ttft_s] + list(result.itl_s)
    rows, elapsed = [], 0.0
    for i, gap in enumerate(gaps, start=1):
        elapsed += gap
        rows.append({"variant": label, "token": i, "position": result.n_prompt + i - 1, "itl_s": gap,
                     "elapsed_s": elapsed})
    return rows


def elapsed_at(result: generation.GenerationResult, points: Iterable[int]) -> dict[int, float]:
    """Time from the call until token k arrived, for each k in ``points`` (read off the stamps)."""
    rows = per_token_rows(result, "")
    out = {}
    for k in points:
        if not 1 <= k <= len(rows):
            raise ValueError(f"token {k}: this run produced {len(rows)} tokens; choose points within 1..{len(rows)}")
        out[k] = rows[k - 1]["elapsed_s"]
    return out


def _stats(runs: list[generation.GenerationResult]) -> dict[str, Any]:
    """Medians of TTFT and TPOT over timed runs, the TPOT spread, and every sample kept (``samples``)."""
    ttfts = [r.ttft_s for r in runs]
    tpots = [r.tpot_s for r in runs if r.tpot_s is not None]
    tpot = Measurement.from_values("tpot", tpots)
    tpot.warn_if_noisy()
    return {"ttft_s": Measurement.from_values("ttft", ttfts).median, "tpot_s": tpot.median, "tpot_spread": tpot.spread,
            "decode_tokens_per_s": 1 / tpot.median, "n": tpot.n,
            "samples": {"ttft_s": ttfts, "tpot_s": tpots, "decode_tokens_per_s": [1 / t for t in tpots]}}


def compare_cache_variants(model: Any, tokenizer: Any, variants: Iterable[str] = CACHE_VARIANTS,
                           prompt: str = DEFAULT_PROMPT, new_tokens: int = 32, repeats: int = 3) -> list[dict[str, Any]]:
    """First call (it pays allocation, and for compile the whole compilation) and steady TPOT per variant, with
    the greedy agreement of its tokens against the first variant's (the baseline).

    Each variant's first call runs alone (it records the tokens); then the variants are timed in ``repeats``
    rounds, each in a shuffled order (static dynamic, dynamic static, …), the baseline timed once more after the last
    round (not a round); every round's figure kept, round i at index i, so two rows pair up round by round."""
    from contextlib import nullcontext

    positive("repeats", repeats)
    variants = list(variants)
    firsts, tokens = {}, {}
    for variant in variants:
        recorder = TokenRecorder()
        # an empty inductor cache, so the first call pays the whole compilation (as on a new machine)
        with cache_variants.fresh_compile_cache() if "compile" in variant else nullcontext():
            firsts[variant] = timed_generate(model, tokenizer, prompt, new_tokens, **cache_variant_kwargs(variant),
                                             **recorder.kwargs())
        tokens[variant] = recorder.tokens
    runs = timing.rounds({v: (lambda v=v: timed_generate(model, tokenizer, prompt, new_tokens, **cache_variant_kwargs(v)))
                          for v in variants}, repeats, again=False)  # no drift read here: no extra pass
    base = variants[0]
    return [{"variant": v, "new_tokens": new_tokens, "first_call_s": firsts[v].e2e_s, **_stats(runs[v]),
             "e2e_s": min(r.e2e_s for r in runs[v]), "agreement": agreement(tokens[v], tokens[base]), "baseline": base,
             "repeats": repeats, "timed": "interleaved rounds"} for v in variants]


def attention_status(device: str | None = None, dtype: Any = None) -> list[dict[str, Any]]:
    """Which attention implementations can run here for a model of ``dtype`` (its torch dtype or name), each
    unavailable one with its reason."""
    device = device or env.device()
    rows = [{"attn_implementation": "eager", "available": True, "reason": ""},
            {"attn_implementation": "sdpa", "available": True, "reason": ""}]
    fa = env.capability("flash-attn")
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    if not device.startswith("cuda"):
        reason = "flash_attention_2 needs a CUDA GPU; this run is on " + device
    elif name not in ("float16", "bfloat16", "fp16", "bf16"):
        reason = (f"flash_attention_2 runs fp16 or bf16 models only; this model is {name or 'of unknown dtype'} "
                  "(load it with dtype='fp16' or 'bf16')")
    elif not fa.available:
        reason = fa.reason
    else:
        reason = ""
    rows.append({"attn_implementation": "flash_attention_2", "available": not reason, "reason": reason})
    return rows


def compare_attention(model: Any, tokenizer: Any, implementations: Iterable[str], prompt_tokens: int = 512,
                      new_tokens: int = 16, repeats: int = 2) -> list[dict[str, Any]]:
    """TTFT on a ``prompt_tokens`` prompt and TPOT, for each attention implementation (switched in place), with
    the greedy agreement of its tokens against the first implementation's (the baseline). The implementations
    are timed in interleaved rounds, switched before each call (outside the timed interval)."""
    implementations = list(implementations)
    bad = [i for i in implementations if i not in ATTENTION_IMPLEMENTATIONS]
    if bad:
        raise ValueError(f"unknown attention implementation(s) {bad}; choose from {ATTENTION_IMPLEMENTATIONS}")
    positive("repeats", repeats)
    inputs = prompt_of_length(tokenizer, prompt_tokens, device=str(model_device(model)))
    before = model.config._attn_implementation
    first: dict[str, Any] = {}
    tokens: dict[str, Any] = {}

    def run(impl: str, n: int = new_tokens, **kw: Any) -> generation.GenerationResult:
        model.set_attn_implementation(impl)
        return timed_generate(model, tokenizer, inputs, n, **kw)

    try:
        for impl in implementations:
            run(impl, 2)  # untimed: first call after the switch
            recorder = TokenRecorder()
            first[impl] = run(impl, **recorder.kwargs())
            tokens[impl] = recorder.tokens
        runs = timing.rounds({impl: (lambda impl=impl: run(impl)) for impl in implementations}, repeats, again=False)
    finally:
        model.set_attn_implementation(before)
    base = implementations[0]
    return [{"attn_implementation": impl, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, **_stats(runs[impl]),
             "repeats": repeats, "agreement": agreement(tokens[impl], tokens[base]), "baseline": base,
             "answer_start": first[impl].text[:40], "timed": "interleaved rounds"} for impl in implementations]


def prefill_decode_split(model: Any, tokenizer: Any, prompt_tokens: Iterable[int], new_tokens: int = 16,
                         repeats: int = 2) -> list[dict[str, Any]]:
    """TTFT (prefill + first token) and TPOT (decode) for prompts of each length, both read off the stamps; the
    lengths timed in rounds, each in a shuffled order, every round's figure kept (round i at index i: two lengths
    pair up round by round)."""
    positive("repeats", repeats)
    lengths = list(prompt_tokens)
    inputs = {n: prompt_of_length(tokenizer, n, device=str(model_device(model))) for n in lengths}
    for n in lengths:
        timed_generate(model, tokenizer, inputs[n], 2)  # untimed warmup
    runs = timing.rounds({str(n): (lambda n=n: timed_generate(model, tokenizer, inputs[n], new_tokens)) for n in lengths},
                         repeats, again=False)
    rows = []
    for n in lengths:
        row = {"prompt_tokens": n, "new_tokens": new_tokens, **_stats(runs[str(n)]), "repeats": repeats}
        row["prefill_tokens_per_s"] = n / row["ttft_s"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------- what articles write, run here

ARTICLE_CLAIMS = (
    # (what popular articles write, what does that job in transformers)
    ('generate(..., cache_implementation="flash")',
     'attn_implementation="flash_attention_2" (the attention kernel) or cache_implementation="static" (the cache)'),
    ('model.set_attn_implementation("flash")', 'attn_implementation="flash_attention_2", "sdpa" or "eager"'),
)


def _outcome(fn: Any) -> str:
    """What a call does here: 'ran' with its result, or the exception's type and first line."""
    try:
        return f"ran: {fn()}"
    except (ValueError, ImportError, TypeError, RuntimeError, AttributeError) as exc:
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"


def audit_claims(model: Any, tokenizer: Any, new_tokens: int = 2) -> list[dict[str, Any]]:
    """Run the calls articles write next to the real API that does the job, on this model, and say what each
    did (a refused call is refused before any forward pass). The attention implementation is restored."""
    import torch

    inputs = chat_inputs(tokenizer, DEFAULT_PROMPT, device=str(model_device(model)))

    def gen(**kwargs: Any) -> str:
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True, **kwargs)
        return f"{out.sequences.shape[1] - inputs['input_ids'].shape[1]} tokens, {type(out.past_key_values).__name__}"

    def attn(impl: str) -> str:
        model.set_attn_implementation(impl)
        return f"attention is now {model.config._attn_implementation}"

    before = model.config._attn_implementation
    try:
        calls = [("article", ARTICLE_CLAIMS[0][0], lambda: gen(cache_implementation="flash"), ARTICLE_CLAIMS[0][1]),
                 ("real", 'generate(..., cache_implementation="static")',
                  lambda: gen(**cache_variant_kwargs("static")), ""),
                 ("article", ARTICLE_CLAIMS[1][0], lambda: attn("flash"), ARTICLE_CLAIMS[1][1]),
                 ("real", 'model.set_attn_implementation("sdpa")', lambda: attn("sdpa"), ""),
                 ("real", 'model.set_attn_implementation("flash_attention_2")', lambda: attn("flash_attention_2"), "")]
        rows = [{"source": src, "call": call, "what it does here": _outcome(fn), "the real API": real}
                for src, call, fn, real in calls]
    finally:
        model.set_attn_implementation(before)
    return rows


# ---------------------------------------------------------------- reference file for quick mode

def write_compile_reference(new_tokens: int = 64, repeats: int = 8, path: Any = None) -> Any:
    """Measure CACHE_VARIANTS at full size, in ``repeats`` rounds (pairs for the paired verdict), and save them as a
    reference result with provenance."""
    lm = models.load()
    res = results.Results(REFERENCE_COMPILE)
    res.notes["about"] = ("Dynamic vs static KV cache, with and without torch.compile of the decode step; "
                          "first_call_s includes compilation. Shown by notebook 05 in quick mode.")
    res.replace("cache_variants", compare_cache_variants(lm.model, lm.tokenizer, CACHE_VARIANTS,
                                                         new_tokens=new_tokens, repeats=repeats))
    res.env = {**env.environment(), "command": f"python -m labkit kv reference --new-tokens {new_tokens} --repeats {repeats}"}
    results.as_reference(res)
    # on a GPU the file is 05_kv_cache_compile.<gpu>.json: the CPU reference the notebooks read stays as it is
    return res.save(path or results.reference_dir() / f"{results.reference_name(REFERENCE_COMPILE, res.env)}.json")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m labkit kv", description="KV-cache reference measurements")
    ap.add_argument("what", choices=["reference"], help="reference: write data/reference/05_kv_cache_compile.json "
                                                        "(on a GPU: 05_kv_cache_compile.<gpu>.json)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=8, help="rounds, each in a shuffled order (pairs: 6 or more)")
    args = ap.parse_args(argv)
    path = write_compile_reference(new_tokens=args.new_tokens, repeats=args.repeats)
    print(json.dumps({"wrote": str(path)}))
    return 0


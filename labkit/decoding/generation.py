"""Generation metrics with vLLM's definitions, timed directly through a streamer hook.

TTFT   time from the call to the first generated token (prefill + first sample)
ITL    the gaps between consecutive generated tokens
TPOT   (E2E - TTFT) / (n_out - 1): mean time per output token after the first
E2E    time from the call to the last token
The streamer stamps each token as ``generate`` hands it over, so prefill and decode are
measured, not derived by subtracting one total from another.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core import timing
from ..core.checks import positive
from ..core.timing import Measurement, gaps, now, p99, percentile
from ..model.models import chat_inputs

TIMED_PROMPT = "Write a short story about a lighthouse keeper."  # the request every decode-speed figure times


class TimingStreamer:
    """A ``generate`` streamer that records when each step's tokens arrive, and how many.

    ``generate`` calls ``put`` once with the prompt, then once per decode step with a
    (batch,) tensor of new tokens; ``.cpu()`` inside generate has already synchronised CUDA.
    Plain decoding puts one token per sequence per forward pass; assisted (speculative) decoding
    puts every token one verify pass accepted, so ``puts`` counts them.
    """

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.start: float | None = None
        self.puts: list[tuple[float, int]] = []  # (when, tokens in this put)
        self._prompt_seen = False

    @property
    def stamps(self) -> list[float]:
        """When each put arrived."""
        return [t for t, _ in self.puts]

    def begin(self) -> None:
        self.start = now(self.device)
        self.puts = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate hands over the prompt first
            self._prompt_seen = True
            return
        self.puts.append((now(self.device), int(value.numel())))

    def end(self) -> None:
        pass


@dataclass
class GenerationResult:
    """One request's timings (seconds) and output."""

    n_prompt: int
    n_out: int
    ttft_s: float
    e2e_s: float
    itl_s: list[float] = field(default_factory=list)
    text: str = ""
    batch: int = 1

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.n_out - 1) if self.n_out > 1 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode rate after the first token, per sequence."""
        tpot = self.tpot_s
        return 1.0 / tpot if tpot else None

    @property
    def output_tokens_per_s(self) -> float:
        """All output tokens of the batch over the whole request, prefill included."""
        return self.n_out * self.batch / self.e2e_s if self.e2e_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(tpot_s=self.tpot_s, decode_tokens_per_s=self.decode_tokens_per_s,
                 output_tokens_per_s=self.output_tokens_per_s)
        return d

    @classmethod
    def from_stamps(cls, start: float, stamps: list[float], n_prompt: int, text: str = "", batch: int = 1) -> "GenerationResult":
        if not stamps:
            raise ValueError("no tokens were generated: raise max_new_tokens")
        itl = gaps(stamps)
        return cls(n_prompt=n_prompt, n_out=len(stamps), ttft_s=stamps[0] - start,
                   e2e_s=stamps[-1] - start, itl_s=itl, text=text, batch=batch)


def generate(model: Any, tokenizer: Any, prompt: str | list[str] | dict, max_new_tokens: int = 64, *,
             fixed_length: bool = False, **gen_kwargs: Any) -> GenerationResult:
    """Greedy-generate for one prompt (or a left-padded batch) and time every token.

    ``fixed_length=True`` suppresses end-of-sequence so every run produces exactly
    ``max_new_tokens`` tokens: use it for speed comparisons, not for answers.
    """
    import torch

    positive("max_new_tokens", max_new_tokens)
    # HF and ONNX Runtime (OrtCausalLM) models both expose .device; an ORT model has no parameters()
    device = getattr(model, "device", None) or next(model.parameters()).device
    inputs = prompt if isinstance(prompt, dict) else chat_inputs(tokenizer, prompt, device=str(device))
    batch, n_prompt = inputs["input_ids"].shape
    streamer = TimingStreamer(device)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, streamer=streamer,
                  pad_token_id=tokenizer.pad_token_id)
    if fixed_length:
        kwargs["min_new_tokens"] = max_new_tokens
    kwargs.update(gen_kwargs)
    with torch.inference_mode():
        streamer.begin()
        out = model.generate(**inputs, **kwargs)
    new = out[:, n_prompt:]
    text = tokenizer.decode(new[0], skip_special_tokens=True)
    assert streamer.start is not None
    return GenerationResult.from_stamps(streamer.start, streamer.stamps, n_prompt, text=text, batch=batch)


def aggregate(results: list[GenerationResult]) -> dict[str, Any]:
    """Percentiles over requests: TTFT, TPOT, ITL (pooled), E2E, and total output tokens/s."""
    if not results:
        raise ValueError("no results to aggregate")

    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"median": None, "p10": None, "p90": None, "p99": None, "mean": None}
        return {"median": statistics.median(values), "p10": percentile(values, 10), "p90": percentile(values, 90),
                "p99": p99(values), "mean": statistics.fmean(values)}

    tpots = [r.tpot_s for r in results if r.tpot_s is not None]
    itls = [x for r in results for x in r.itl_s]
    total_tokens = sum(r.n_out * r.batch for r in results)
    total_time = sum(r.e2e_s for r in results)
    return {
        "n": len(results),
        "ttft_s": stats([r.ttft_s for r in results]),
        "tpot_s": stats(tpots),
        "itl_s": stats(itls),
        "e2e_s": stats([r.e2e_s for r in results]),
        "output_tokens": total_tokens,
        "output_tokens_per_s": total_tokens / total_time if total_time > 0 else None,
    }


def measure_decode(model: Any, tokenizer: Any, batch: int = 1, new_tokens: int = 64, repeats: int = 3,
                   prompt: str = TIMED_PROMPT) -> dict[str, Any]:
    """Steady-state decode rate of ``batch`` identical greedy sequences of ``new_tokens`` tokens.

    One warmup request runs first; each timed repeat yields a TPOT (decode only, prefill excluded).
    Returns per-sequence and aggregate tokens/s from the median TPOT, plus the raw Measurement.
    """
    return decode_rounds(model, tokenizer, [batch], new_tokens=new_tokens, rounds=repeats, prompt=prompt,
                         drift=False)[0]


def checked_rounds(new_tokens: int, rounds: int) -> None:
    """Refuse a timed decode that cannot be timed (fewer than 2 new tokens) or a round count that is not a positive
    integer (a bool included); generation's decode rounds and compiled.measure_decoders share it."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: need at least 2 to time decode")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= 0:
        raise ValueError(f"rounds={rounds!r}: must be a positive integer")


def _decode_row(runs: list[GenerationResult], batch: int, new_tokens: int, drift: float | None) -> dict[str, Any]:
    """One row of decode speed from timed runs of one variant: medians, spread, and every sample kept."""
    tpots = [r.tpot_s for r in runs if r.tpot_s is not None]
    tpot = Measurement.from_values("tpot", tpots, unit="s", meta={"batch": batch, "new_tokens": new_tokens})
    tpot.warn_if_noisy()
    return {
        "batch": batch,
        "new_tokens": new_tokens,
        "tpot_s": tpot.median,
        "decode_tokens_per_s": 1.0 / tpot.median,
        "aggregate_tokens_per_s": batch / tpot.median,
        "ttft_s": statistics.median(r.ttft_s for r in runs),
        "spread": tpot.spread,
        "tpot": tpot,
        "n": tpot.n,
        "drift": drift,
        "samples": {"tpot_s": tpots, "decode_tokens_per_s": [1 / t for t in tpots],
                    "aggregate_tokens_per_s": [batch / t for t in tpots], "ttft_s": [r.ttft_s for r in runs]},
    }


def _drift(runs: list[GenerationResult]) -> float | None:
    tpots = [r.tpot_s for r in runs if r.tpot_s is not None]
    return tpots[-1] / tpots[0] if len(tpots) > 1 else None


def decode_rounds(model: Any, tokenizer: Any, batches: list[int], new_tokens: int = 64, rounds: int = 3,
                  prompt: str = TIMED_PROMPT, drift: bool = True) -> list[dict[str, Any]]:
    """``measure_decode`` for several batch sizes, interleaved: rounds of 1 4 8 1 4 8 … so drift hits all alike.

    Each round runs the sizes in a shuffled order (``timing.rounds``), so round i of every size forms a pair. With
    ``drift`` the first batch runs once more after the last round (not a round) and every row carries ``drift`` =
    that pass's TPOT / its first. Each row keeps its samples (``samples``: tpot_s, aggregate_tokens_per_s).
    """
    for batch in batches:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
            raise ValueError(f"batch={batch!r}: must be a positive integer")
    checked_rounds(new_tokens, rounds)
    for b in batches:
        generate(model, tokenizer, [prompt] * b, max_new_tokens=min(8, new_tokens), fixed_length=True)  # warmup
    calls = {str(b): (lambda b=b: generate(model, tokenizer, [prompt] * b, max_new_tokens=new_tokens,
                                           fixed_length=True)) for b in batches}
    runs = timing.rounds(calls, rounds, again=drift)
    moved = _drift(runs.ends()) if drift else None
    return [_decode_row(runs[str(b)], b, new_tokens, moved) for b in batches]


def decode_variants(variants: dict[str, tuple[Any, Any]], new_tokens: int = 64, rounds: int = 3,
                    prompt: str = TIMED_PROMPT) -> dict[str, dict[str, Any]]:
    """Decode speed of several loaded models (name → (model, tokenizer)), timed in interleaved rounds.

    One warmup request each, then rounds of one greedy request per model, each round in a shuffled order, and the
    first (the baseline) once more after the last round; each row as ``decode_rounds`` gives it, ``drift`` the
    baseline's.
    """
    if not variants:
        raise ValueError("decode_variants() needs at least one (model, tokenizer)")
    checked_rounds(new_tokens, rounds)
    for model, tokenizer in variants.values():
        generate(model, tokenizer, [prompt], max_new_tokens=min(8, new_tokens), fixed_length=True)  # warmup
    calls = {name: (lambda m=m, t=t: generate(m, t, [prompt], max_new_tokens=new_tokens, fixed_length=True))
             for name, (m, t) in variants.items()}
    runs = timing.rounds(calls, rounds)
    moved = _drift(runs.ends())
    return {name: _decode_row(runs[name], 1, new_tokens, moved) for name in variants}


# ------------------------------------------------------------------------------- transformers' generate



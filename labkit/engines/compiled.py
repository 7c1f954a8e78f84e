"""A static-cache decoder on the decode core, eager or compiled: ``StaticDecoder`` runs a prompt through a
``StaticCache`` of fixed size, so ``torch.compile`` sees one shape and builds once. ``measure_decoder`` times
its TTFT and decode rate (the first, untimed run pays the build), ``measure_decoders`` several in interleaved
rounds (the pairs of a paired verdict), ``decoder_quality`` compares its logits with
a reference, and ``count_eager_ops`` counts the kernels one eager decode step launches.
"""
from __future__ import annotations

import contextlib
from typing import Any

from ..core import timing
from ..core.checks import model_device
from ..core.timing import Measurement, now
from ..decoding import cache_variants, decode, quality
from ..decoding.generation import TIMED_PROMPT, GenerationResult, checked_rounds
from .fusion import decode_step_ops

DEFAULT_PROMPT = TIMED_PROMPT
DEFAULT_MAX_CACHE_LEN = 256  # static cache positions: prompt + generated tokens must fit
REFERENCE = "08_tensorrt"  # data/reference/08_tensorrt.json (CPU, full mode): the engines and ONNX Runtime levels


# ------------------------------------------------------------------ torch: static cache, prefill, decode


def static_step(model: Any, token: Any, position: Any, cache: Any) -> Any:
    """``labkit.decoding.decode.decode_one_token`` on a static cache: (1,) token at (1,) position in, (1, V) logits out,
    the cache written in place at that position. Every call has the same shapes, so a compiled version is
    built once and reused."""
    return decode.decode_one_token(model, token, cache, position_ids=position, cache_position=position)


class StaticDecoder:
    """Greedy decoding with a static KV cache, eager or with ``static_step`` compiled.

    ``compile=True`` wraps the decode step in ``torch.compile(dynamic=False)`` with ``backend`` (inductor,
    or 'tensorrt' from torch-tensorrt on a GPU). The first decode call traces and builds it; ``build_s``
    is that call's duration, measured against an empty inductor cache when ``fresh_cache`` (as on a new
    machine) and ``kernels`` what inductor generated.
    """

    def __init__(self, model: Any, max_cache_len: int = DEFAULT_MAX_CACHE_LEN, compile: bool = False,
                 backend: str = "inductor", mode: str | None = None, fresh_cache: bool = True) -> None:
        import torch
        from transformers import StaticCache

        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len <= 1:
            raise ValueError(f"max_cache_len={max_cache_len!r}: must be an integer above 1")
        self.model = model
        self.max_cache_len = max_cache_len
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        self.compiled = compile
        self.fresh_cache = fresh_cache
        self.build_s: float | None = None
        self.kernels: dict[str, int] = {}
        self._step = torch.compile(static_step, backend=backend, mode=mode, dynamic=False) if compile \
            else static_step

    def _first_compiled_step(self, *args: Any) -> Any:
        from torch._inductor import metrics

        metrics.reset()
        with cache_variants.fresh_compile_cache() if self.fresh_cache else contextlib.nullcontext():
            t0 = now(model_device(self.model))
            logits = self._step(*args)
            self.build_s = now(model_device(self.model)) - t0
        self.kernels = {"ir_nodes_before_fusion": metrics.ir_nodes_pre_fusion,
                        "generated_kernels": metrics.generated_kernel_count}
        return logits

    def generate(self, input_ids: Any, new_tokens: int, feed: Any = None, keep_logits: bool = False
                 ) -> tuple[GenerationResult, list[int], list[Any]]:
        """Greedy tokens after the (1, T) prompt, each stamped as it arrives.

        ``feed``: (new_tokens - 1,) tokens to feed instead of the model's own choices (teacher forcing,
        for quality). Returns the timing, the chosen tokens and, with ``keep_logits``, each step's logits.
        """
        import torch

        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
            raise ValueError(f"new_tokens={new_tokens!r}: must be a positive integer")
        n_prompt = input_ids.shape[1]
        if n_prompt + new_tokens > self.max_cache_len:
            raise ValueError(f"prompt {n_prompt} + {new_tokens} new tokens exceed max_cache_len={self.max_cache_len}; "
                             "build the decoder with a larger max_cache_len")
        device = input_ids.device
        kept: list[Any] = []
        tokens: list[int] = []
        stamps: list[float] = []
        with torch.inference_mode():
            self.cache.reset()  # its tensors were made in inference mode: zero them there
            start = now(device)
            logits, _ = decode.prefill(self.model, input_ids, cache=self.cache)
            for i in range(new_tokens):
                if i > 0:
                    token = (feed[i - 1] if feed is not None else next_token).view(1)
                    position = torch.tensor([n_prompt + i - 1], device=device)
                    if self.compiled and self.build_s is None:
                        logits = self._first_compiled_step(self.model, token, position, self.cache)
                    else:
                        logits = self._step(self.model, token, position, self.cache)
                next_token = logits.argmax(-1)
                tokens.append(int(next_token))  # the host sync: this token is ready
                stamps.append(now(device))
                if keep_logits:
                    kept.append(logits[0].detach().to("cpu", torch.float32).clone())
        return GenerationResult.from_stamps(start, stamps, n_prompt), tokens, kept


def measure_decoder(dec: StaticDecoder, input_ids: Any, new_tokens: int = 32, repeats: int = 3) -> dict[str, Any]:
    """TTFT and steady decode rate of ``dec`` (one untimed warmup run first; it pays any compilation)."""
    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: need at least 2 to time decode")
    dec.generate(input_ids, min(4, new_tokens))  # warmup (and the compile, when compiled)
    runs = [dec.generate(input_ids, new_tokens) for _ in range(repeats)]
    return {**_figures(dec, runs, new_tokens),
            "samples": {"decode_tokens_per_s": [1 / r.tpot_s for r, _, _ in runs if r.tpot_s]}}


def _figures(dec: StaticDecoder, runs: list[tuple[GenerationResult, list[int], list[Any]]],
             new_tokens: int) -> dict[str, Any]:
    """A decoder's figures over its timed runs: best TTFT, median TPOT and its spread, its build and kernels."""
    tpot = Measurement.from_values("tpot", [r.tpot_s for r, _, _ in runs if r.tpot_s is not None])
    return {"ttft_s": min(r.ttft_s for r, _, _ in runs), "tpot_s": tpot.median, "tpot_spread": tpot.spread,
            "decode_tokens_per_s": 1 / tpot.median, "new_tokens": new_tokens, "repeats": len(runs),
            "build_s": dec.build_s, **dec.kernels, "tokens": runs[0][1]}


def measure_decoders(decoders: dict[str, StaticDecoder], input_ids: Any, new_tokens: int = 32,
                     rounds: int = 8) -> dict[str, dict[str, Any]]:
    """``measure_decoder`` for several decoders at once, in interleaved rounds (``timing.rounds``: each round's order
    shuffled, no extra pass), after one untimed warm-up run each (it pays any build): per name the same figures,
    its ``samples`` one decode rate per round, round i at index i (None where a run timed no decode), so round i of
    two decoders is a pair for ``verdict.compare(..., paired=True)`` (``rounds_paired``)."""
    checked_rounds(new_tokens, rounds)
    for dec in decoders.values():
        dec.generate(input_ids, min(4, new_tokens))  # warmup (and the compile, when compiled)
    done = timing.rounds({name: (lambda d=dec: d.generate(input_ids, new_tokens)) for name, dec in decoders.items()},
                         rounds, again=False)
    return {name: {**_figures(decoders[name], runs, new_tokens), "rounds_paired": True,
                   "samples": {"decode_tokens_per_s": [1 / r.tpot_s if r.tpot_s else None for r, _, _ in runs]}}
            for name, runs in done.items()}


def decoder_quality(dec: StaticDecoder, ref: Any) -> Any:
    """Teacher-force the reference's greedy continuations through ``dec``'s own decode path: the share of
    positions where its argmax is the reference's token, and KL(reference ‖ dec) per token (nats)."""
    import torch

    agree = n = 0
    kl_sum, kl_max = 0.0, 0.0
    rows = []
    device = model_device(dec.model)
    for text, seq, n_prompt, ref_lp in zip(ref.prompts, ref.sequences, ref.n_prompt, ref.logprobs):
        cont = seq[0, n_prompt:].to(device)
        _, _, logits = dec.generate(seq[:, :n_prompt].to(device), len(cont), feed=cont[:-1], keep_logits=True)
        logits = torch.stack(logits)
        same = int((logits.argmax(-1) == cont.cpu()).sum())
        kl = quality.kl_divergence(ref_lp, logits)
        rows.append({"prompt": text, "agreement": same / len(cont), "kl": float(kl.mean()), "n_tokens": len(cont)})
        agree, n = agree + same, n + len(cont)
        kl_sum, kl_max = kl_sum + float(kl.sum()), max(kl_max, float(kl.max()))
    return quality.Agreement(agreement=agree / n, kl=kl_sum / n, kl_max=kl_max, n_tokens=n, per_prompt=rows)


def count_eager_ops(model: Any, input_ids: Any) -> int:
    """How many PyTorch (aten) operators one eager decode step calls (``fusion.STEP_OPS_COUNTED``: the same count
    notebooks 01 and 10 quote): each is a kernel launch and a round trip of its inputs and outputs through memory."""
    return len(decode_step_ops(model, input_ids))

"""The lab's CPU paths beside llama.cpp on the same prompts, and ONNX Runtime's 4-bit block quantisation.

Every engine decodes the same chat-formatted prompt greedily for the same number of tokens; each row has
decode tokens/s, TTFT, the bytes of its weights, and its quality against the fp32 reference (greedy
agreement and KL, teacher-forced, ``labkit.decoding.quality``) and whether its greedy answer is the fp32 answer.

ONNX Runtime's ``MatMulNBits`` (``onnxruntime.quantization.matmul_nbits_quantizer``) is the same idea as
llama.cpp's Q4_0/Q4_1/Q8_0 blocks: weights in 4 (or 8) bits with one scale (and zero point) per block of
``block_size`` weights along the input dimension. ``accuracy_level=4`` lets its kernel quantise the
activations to int8 too and use integer dot products, as llama.cpp does with its Q8 activation blocks.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..core.checks import positive
from ..core.timing import Measurement
from ..decoding import generation, profiling, quality
from ..model import onnx
from ..model.models import chat_inputs
from . import llamacpp

# ------------------------------------------------------------------------------ the same-prompt table


def _row(engine: str, fmt: str, weight_bytes: int | None, timings: list[dict[str, Any]], text: str,
         ref_text: str | None, quality: Any, prepare_s: float | None) -> dict[str, Any]:
    tpots = Measurement.from_values("tpot", [t["tpot_s"] for t in timings], unit="s")
    tpot = tpots.median
    return {"engine": engine, "format": fmt, "status": "ok", "weight_bytes": weight_bytes,
            "ttft_s": statistics.median(t["ttft_s"] for t in timings), "tpot_s": tpot,
            "decode_tokens_per_s": 1 / tpot, "decode_spread": tpots.spread, "repeats": len(timings),
            "samples": {"tpot_s": tpots.samples, "decode_tokens_per_s": [1 / t for t in tpots.samples]},
            "achieved_gbs": weight_bytes / tpot / 1e9 if weight_bytes else None,
            "agreement": quality.agreement, "kl": quality.kl, "kl_max": quality.kl_max,
            "same_answer_as_fp32": None if ref_text is None else text == ref_text, "answer": text,
            "prepare_s": prepare_s}


def measure_hf(engine: str, fmt: str, model: Any, tokenizer: Any, prompt: str, new_tokens: int, repeats: int,
               ref: Any, ref_text: str | None = None, weight_bytes: int | None = None,
               prepare_s: float | None = None) -> dict[str, Any]:
    """A PyTorch or ONNX Runtime (``OrtCausalLM``) model: one warmup, ``repeats`` timed greedy runs of exactly
    ``new_tokens`` tokens on ``prompt``, then agreement/KL against ``ref``."""
    positive("repeats", repeats)
    generation.generate(model, tokenizer, prompt, max_new_tokens=min(4, new_tokens), fixed_length=True)  # warmup
    runs = [generation.generate(model, tokenizer, prompt, max_new_tokens=new_tokens, fixed_length=True)
            for _ in range(repeats)]
    timings = [{"ttft_s": r.ttft_s, "tpot_s": r.tpot_s} for r in runs]
    return _row(engine, fmt, weight_bytes, timings, runs[0].text, ref_text, quality.compare(model, ref), prepare_s)


def measure_ort(fmt: str, model: Any, provider: str, tokenizer: Any, prompt: str, new_tokens: int, repeats: int,
                ref: Any, ref_text: str | None = None, weight_bytes: int | None = None,
                prepare_s: float | None = None) -> dict[str, Any]:
    """An ONNX Runtime model's row (``measure_hf``) labelled with the providers its session really got
    (``providers``). A session that no longer runs on ``provider`` after the timed runs is a failed row with
    the reason (``onnx.check_providers``): its numbers would be another provider's."""
    row = measure_hf("ONNX Runtime", fmt, model, tokenizer, prompt, new_tokens, repeats, ref, ref_text,
                     weight_bytes, prepare_s)
    got = onnx.session_providers(model)
    problem = onnx.check_providers(provider, got)
    if problem:
        return failed_row("ONNX Runtime", fmt, f"failed while measuring: {problem}")
    return {**row, "providers": got}


def ort_row(fmt: str, folder: Path, tokenizer: Any, device: str, prompt: str, new_tokens: int, repeats: int,
            ref: Any, ref_text: str | None = None, prepare_s: float | None = None) -> dict[str, Any]:
    """ONNX Runtime on the model in ``folder`` with the provider ``device`` calls for (``onnx.ort_provider``),
    measured by ``measure_ort``; a session that did not get that provider is a failed row with the reason."""
    provider = onnx.ort_provider(device)
    try:
        model, _ = onnx.ort_model(folder, tokenizer, provider, device=device)
    except onnx.ProviderFallback as why:
        return failed_row("ONNX Runtime", fmt, str(why))
    try:
        return measure_ort(fmt, model, provider, tokenizer, prompt, new_tokens, repeats, ref, ref_text,
                           onnx.onnx_bytes(folder), prepare_s)
    finally:
        del model


def measure_llamacpp(engine: str, fmt: str, path: Path, tokenizer: Any, prompt: str, new_tokens: int, repeats: int,
                     ref: Any, ref_text: str | None = None, prepare_s: float | None = None) -> dict[str, Any]:
    """llama.cpp on the GGUF at ``path``: the same prompt ids (the GGUF's vocabulary is the tokenizer's), one
    warmup, ``repeats`` timed runs, its own timers, and agreement/KL through teacher-forced logits."""
    positive("repeats", repeats)
    ids = chat_inputs(tokenizer, prompt)["input_ids"][0].tolist()
    llm = llamacpp.load(path, n_ctx=max(512, len(ids) + new_tokens + 8))
    llamacpp.timed_greedy(llm, ids, min(4, new_tokens))  # warmup
    llamacpp.reset_perf(llm)
    runs = [llamacpp.timed_greedy(llm, ids, new_tokens) for _ in range(repeats)]
    own = llamacpp.perf(llm)
    text = tokenizer.decode(runs[0]["tokens"], skip_special_tokens=True)
    del llm
    longest = max(s.shape[1] for s in ref.sequences)
    scorer = llamacpp.load(path, n_ctx=max(512, longest + 8), logits_all=True)
    q = quality.compare(llamacpp.logits_fn(scorer), ref)
    del scorer
    row = _row(engine, fmt, Path(path).stat().st_size, runs, text, ref_text, q, prepare_s)
    row.update(llamacpp_eval_ms_per_token=own["eval_ms_per_token"], llamacpp_eval_tokens=own["eval_tokens"])
    return row


def failed_row(engine: str, fmt: str, reason: str) -> dict[str, Any]:
    return {"engine": engine, "format": fmt, "status": reason}


def decode_breakdown(model: Any, tokenizer: Any, prompt_tokens: int = 64) -> dict[str, Any]:
    """torch.profiler over one PyTorch decode step: self time in matmuls, attention and everything else,
    and how many operator calls the step makes (each a trip through Python and the dispatcher)."""
    prof = profiling.profile_prefill_decode(model, tokenizer, prompt_tokens=prompt_tokens)[1]
    groups = prof.groups().set_index("group")["self_us"]
    calls = sum(o["calls"] for o in prof.ops)
    return {"step_self_ms": prof.total_us / 1e3, "matmul_ms": groups["matmul"] / 1e3,
            "attention_ms": groups["attention"] / 1e3, "other_ms": groups["other"] / 1e3,
            "matmul_share": groups["matmul"] / prof.total_us, "op_calls": calls, "profile": prof}


def best_lab_row(rows: list[dict[str, Any]], min_agreement: float = 0.0) -> dict[str, Any] | None:
    """The fastest lab (non-llama.cpp) row that ran, among those whose agreement is at least ``min_agreement``."""
    ok = [r for r in rows if r.get("status") == "ok" and not r["engine"].startswith("llama.cpp")
          and r["agreement"] >= min_agreement]
    return max(ok, key=lambda r: r["decode_tokens_per_s"]) if ok else None

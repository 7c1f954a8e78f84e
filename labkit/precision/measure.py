"""One measurement for every precision variant: speed, memory and quality on the same inputs, one row each.

``reference_inputs`` loads fp32 once and keeps what every variant is compared with (its greedy continuations and
log-probs, the evaluation tokens, the questions); ``measure_variant`` turns one loaded ``variants.Variant`` into a
row (footprint, load time, TTFT, decode tokens/s, perplexity, agreement, KL, answers); ``run`` loads, measures
and releases each variant in turn, fp32 first, so each memory reading is that variant's alone. A variant that
cannot run, or fails while measuring for want of a backend, is a row whose status says why; labkit's own
errors surface. ``rounds`` re-times the rows' decode in interleaved rounds.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import config, env, memory, timing
from ..decoding import generation, quality
from ..model import prompts
from ..model.onnx import check_providers, session_providers
from . import variants


@dataclass
class Settings:
    """What every variant is measured with (same prompts and token counts for all)."""

    new_tokens: int = 32  # decode tokens per timed run
    repeats: int = 3  # timed runs (after one warmup)
    answer_tokens: int = 24  # tokens per side-by-side answer
    n_questions: int = 5
    ppl_window_tokens: int = 512
    ppl_stride_tokens: int = 512
    ppl_max_tokens: int | None = None  # None: the whole evaluation text
    ref_prompts: int = 12
    ref_new_tokens: int = 32

    @classmethod
    def default(cls) -> "Settings":
        """Full counts normally, small ones in quick mode (same code path)."""
        pick = config.pick
        return cls(new_tokens=pick(32, 8), repeats=pick(3, 1), answer_tokens=pick(24, 12), n_questions=pick(5, 1),
                   ppl_window_tokens=512, ppl_stride_tokens=512, ppl_max_tokens=None if not config.quick() else 256,
                   ref_prompts=pick(12, 3), ref_new_tokens=pick(32, 12))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Inputs:
    """The reference (fp32 greedy continuations and log-probs), eval tokens and questions."""

    reference: Any
    eval_ids: list[int]
    questions: list[str]
    settings: Settings


def prepare_inputs(reference_variant: variants.Variant, settings: Settings | None = None) -> Inputs:
    """Build the shared inputs once, with the fp32 variant as the reference."""
    settings = settings or Settings.default()
    if not reference_variant.ok:
        raise ValueError(f"the reference variant {reference_variant.name} did not load: {reference_variant.status}")
    ref = quality.reference(reference_variant.model, reference_variant.tokenizer,
                            prompts.load_prompts("prompts")[: settings.ref_prompts], new_tokens=settings.ref_new_tokens)
    return Inputs(reference=ref, eval_ids=prompts.eval_tokens(reference_variant.tokenizer),
                  questions=prompts.load_prompts("questions")[: settings.n_questions], settings=settings)


def _peak_memory(v: variants.Variant) -> tuple[int | None, str]:
    if v.device.startswith("cuda"):
        if v.backend == "onnxruntime":
            return None, "ONNX Runtime allocates outside PyTorch's CUDA allocator: no allocator peak"
        peak = memory.cuda_peak(v.device)
        if peak.bytes is None:
            return None, peak.reason
        if v.cuda_resident_bytes is None:
            return None, "no allocator reading from before the load: the peak would count other tensors on the GPU"
        return (peak.bytes - v.cuda_resident_bytes,
                f"cuda_peak above resident: PyTorch allocator peak over load and runs, minus the "
                f"{v.cuda_resident_bytes / 2**20:.0f} MiB already allocated before the load (other tensors on the GPU)")
    if v.rss_sampler is None or v.rss_before_bytes is None:
        return None, "RSS not sampled for this variant"
    v.rss_sampler.stop()
    return (max(v.rss_sampler.peak_bytes, v.load_peak_rss_bytes or 0) - v.rss_before_bytes,
            f"rss peak growth: highest process RSS over load and timed runs ({v.rss_sampler.describe()}), "
            "minus the RSS before the load")


def _peak_phases(v: variants.Variant) -> dict[str, int | None]:
    """The RSS peak growth of the load (which may export or quantise once: ``prepare_s``) and of the runs after it,
    apart; None on a GPU, whose allocator peak covers both."""
    if v.device.startswith("cuda") or v.rss_before_bytes is None or v.load_peak_rss_bytes is None:
        return {"load_peak_memory_bytes": None, "run_peak_memory_bytes": None}
    return {"load_peak_memory_bytes": v.load_peak_rss_bytes - v.rss_before_bytes,
            "run_peak_memory_bytes": v.rss_sampler.peak_bytes - v.rss_before_bytes}


def measure_variant(v: variants.Variant, inputs: Inputs) -> dict[str, Any]:
    """One row: footprint, load time, TTFT, decode tokens/s, perplexity, agreement, KL, answers."""
    row: dict[str, Any] = v.summary()
    if not v.ok:
        return row
    s = inputs.settings
    # rounded weights compute in fp32: timing them would time fp32, not the format
    fake = variants.SPECS[v.name].fake_format
    timing = (dict.fromkeys(("ttft_s", "tpot_s", "decode_tokens_per_s", "spread")) if fake
              else generation.measure_decode(v.model, v.tokenizer, new_tokens=s.new_tokens, repeats=s.repeats))
    if v.backend == "onnxruntime":  # ONNX Runtime may also fall back while running: label what really ran
        problem = check_providers(v.options["provider"], session_providers(v.model))
        if problem:
            return {**row, "status": f"failed while measuring: {problem}"}
    peak, source = _peak_memory(v)  # read before the quality passes allocate their own buffers
    phases = _peak_phases(v)
    ppl = quality.perplexity(v.model, inputs.eval_ids, window_tokens=s.ppl_window_tokens,
                             stride_tokens=s.ppl_stride_tokens, max_tokens=s.ppl_max_tokens)
    agree = quality.compare(v.model, inputs.reference)
    answers = quality.answers(v.model, v.tokenizer, inputs.questions, max_new_tokens=s.answer_tokens)
    row.update(ttft_s=timing["ttft_s"], tpot_s=timing["tpot_s"], decode_tokens_per_s=timing["decode_tokens_per_s"],
               decode_spread=timing["spread"], perplexity=ppl.perplexity, ppl_tokens=ppl.n_tokens,
               agreement=agree.agreement, kl=agree.kl, kl_max=agree.kl_max, kl_tokens=agree.n_tokens,
               kl_per_prompt=[p["kl"] for p in agree.per_prompt], peak_memory_bytes=peak,
               peak_memory_source=source, **phases, answers=answers)
    return row


def reference_inputs(settings: Settings | None = None, model_name: str | None = None,
                     device: str | None = None) -> Inputs:
    """Load fp32, build the shared inputs (its greedy continuations and log-probs), release it."""
    ref = variants.load_variant("fp32", model_name, device)
    try:
        return prepare_inputs(ref, settings)
    finally:
        ref.release()


def run(variant_names: Sequence[str] | None = None, settings: Settings | None = None,
        model_name: str | None = None, device: str | None = None, progress: bool = True,
        options: dict[str, dict[str, Any]] | None = None, inputs: Inputs | None = None) -> Iterator[dict[str, Any]]:
    """Load, measure and release each variant in turn (fp32 first: it is the reference).

    ``inputs`` (from ``reference_inputs``) is built here when not given. Yields one row per
    variant; a variant that cannot run yields a row whose status says why.
    """
    variant_names = list(variant_names) if variant_names is not None else variants.names()
    for n in variant_names:
        variants.check_name(n)
    options = options or {}
    # the reference is built first and released; fp32 is then reloaded like any other variant,
    # so its memory reading does not include the reference data
    if inputs is None:
        inputs = reference_inputs(settings, model_name, device)
    elif settings is not None and settings != inputs.settings:
        raise ValueError("pass settings or inputs built with them, not both with different values")
    order = sorted(variant_names, key=lambda n: n != "fp32")
    bar = _progress(order, progress)
    for n in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(n)
        t0 = timing.clock()
        v = variants.load_variant(n, model_name, device, **options.get(n, {}))
        try:
            row = measure_variant(v, inputs)
            row["measure_s"] = timing.clock() - t0  # wall time of this row: load, prepare and all passes
        except Exception as exc:  # a backend's failure mid-run (out of memory, ONNX Runtime's own errors) becomes a row
            if not (isinstance(exc, MemoryError) or env.backend_failure(exc)):
                raise  # labkit's own bug: surface it
            row = {**v.summary(), "status": f"failed while measuring: {type(exc).__name__}: {str(exc)[:200]}"}
        finally:
            v.release()
        yield row


def _progress(items: list[str], enabled: bool) -> Any:
    if not enabled or not config.progress_bars():
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="variants", unit="variant")


def best_of(rows: Sequence[dict[str, Any]], candidates: Sequence[str]) -> dict[str, Any] | None:
    """The better-quality row among ``candidates`` that ran: lowest KL against fp32, then highest agreement (agreement
    over a few tokens moves in coarse steps; KL averages every position's whole distribution)."""
    ok = [r for r in rows if r.get("variant") in candidates and r.get("status") == "ok"]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["kl"], -r["agreement"]))

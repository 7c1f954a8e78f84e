"""Notebook 08's takeaways: RMSNorm fused against eager, the compiled decode step and its pay-back, ONNX Runtime's
graph levels, int8 calibration's scale choices, and the fastest engine timed beside eager PyTorch.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from ...core import results, verdict
from ..findings import Findings, compile_sentence


def fusion_verdict(row: Mapping[str, Any]) -> verdict.Verdict:
    """Fused against eager on one shape, paired on the rounds they were timed in (the row's ``samples``, round i of
    each at index i); a fused kernel cannot beat a plain copy of the same rows."""
    return verdict.compare(verdict.samples(row, "compiled_us"), verdict.samples(row, "eager_us"), higher_is_better=False,
                           paired=True, bound=row["eager_us"] / row["copy_us"], bound_why="a fused kernel cannot beat a plain copy of its rows")


def ort_verdict(new: Mapping[str, Any], base: Mapping[str, Any]) -> verdict.Verdict:
    """Two rows timed in the same rounds (``generation.decode_variants``: eager and every ONNX Runtime level), judged
    paired on their decode tokens/s, round i of each at index i of its ``samples``."""
    return verdict.compare(verdict.samples(new, "decode_tokens_per_s"), verdict.samples(base, "decode_tokens_per_s"),
                           paired=True)


def takeaways(*, fusion: Mapping[str, Any], fusion_rows: int, max_abs_diff: float, compiled: Mapping[str, Any] | None,
              story: Any, levels: tuple[str, str], ort: tuple[Mapping[str, Any], Mapping[str, Any]], layer: str,
              kl_by_method: Mapping[str, list[float]], percentile: float, clip: float, rounds: list[Mapping[str, Any]],
              sizes: list[Mapping[str, Any]] | None = None, cache: tuple[int, str] | None = None,
              all_levels: list[str] | None = None) -> Findings:
    """``fusion``: the largest shape's fusion row (eager_ops, fused_kernels, speedup, eager_us/compiled_us/copy_us
    with samples); ``compiled``: the compiled decode row (where, build_s, gain, break_even tokens, the verdict on its
    decode speed against eager's) or None, told
    through ``story`` where it is a reference; ``levels``/``ort``: ONNX Runtime's first and last graph level and their
    rows (decode_tokens_per_s with samples, agreement); ``kl_by_method``: the calibration's KL per held-out prompt, per
    scale (``calibration_said`` judges them);
    ``clip``: the percentile scale's KL over absmax's; ``rounds``: the rows timed in one set of interleaved rounds,
    eager PyTorch first (engine, decode_tokens_per_s with samples, agreement, kl). The headline: the fastest of
    those rounds over eager. ``sizes``/``cache``: every fusion row and the last-level cache (bytes, source), for
    ``cache_sentence``; ``all_levels``: every ONNX Runtime level timed, in order, for ``steps_sentence``."""
    v_big = fusion_verdict(fusion)
    first, last = levels
    ort_v = ort_verdict(ort[1], ort[0])
    base = rounds[0]
    best = max(rounds, key=lambda r: r["decode_tokens_per_s"])
    best_v = ort_verdict(best, base)
    if compiled is None:
        compile_said = "torch.compile: not measured here (no reference of this GPU ships)."
    elif results.is_reference(compiled["where"]):
        compile_said = f"{compile_sentence(story)}."
    else:
        v = compiled["verdict"]  # compiled against eager decode tokens/s, on their timed runs
        compile_said = (f"The whole decode step compiled ({compiled['where']}): " + verdict.phrase(v, "eager's speed")
                        + f" after a {compiled['build_s']:.0f} s build; " + verdict.pick(
                            v, better=(f"it pays back after {compiled['break_even']:,.0f} tokens there."
                                       if compiled["break_even"] is not None else "no gain to pay the build back."),
                            worse="no gain to pay the build back.",
                            same="no gain this run can read to pay the build back."))
    says = [f"Fusion, one operator chain timed alone (not a whole decode step): RMSNorm's {int(fusion['eager_ops'])} "
            f"eager kernels became {int(fusion['fused_kernels'])}; on {fusion_rows} rows "
            f"{v_big.word('faster', 'slower')} ({fusion['speedup']:.2f}×; {v_big.reason}), with "
            f"outputs equal to {max_abs_diff:.1g}.",
            compile_said,
            f"ONNX Runtime '{last}' against '{first}': {ort_v.word()} ({ort_v.ratio:.2f}×; {ort_v.reason}), agreement "
            f"{ort[1]['agreement']:.3f}: " + ("its rewrites kept the answers." if ort[1]["agreement"] == 1
                                             else "its rewrites changed some answers."),
            f"int8 on {layer}: " + calibration_said(kl_by_method, percentile)[1],
            "Fastest decode in this run's interleaved rounds: " + (
                "eager PyTorch itself (dynamic cache): no engine timed beside it beat it." if best is base else
                f"{best['engine']}, {verdict.than(best_v)} eager ({best_v.ratio:.2f}×; {best_v.reason}), agreement "
                f"{best['agreement']:.3f}, KL {best['kl']:.2g}.")]
    said = " ".join(x for x in (levels_sentence(rounds, last), steps_sentence(rounds, all_levels or list(levels))) if x)
    if said:
        says.insert(3, said)
    said = cache_sentence(list(sizes or []), *cache) if cache else ""
    if said:
        says.insert(1, said)
    says.insert(0, says.pop())  # the whole decode step first: one operator chain's fusion is a smaller claim
    rows = [{"finding": f"fastest decode in the rounds ({best['engine']}) / eager (×)", "value": best_v.ratio,
             "verdict": best_v.kind},
            {"finding": f"fused RMSNorm speedup, {fusion_rows} rows (×)", "value": fusion["speedup"], "verdict": v_big.kind},
            {"finding": f"ONNX Runtime '{last}' / '{first}' decode (×)", "value": ort_v.ratio, "verdict": ort_v.kind},
            {"finding": f"p{percentile:g} / absmax scale, mean KL (×)", "value": clip}]
    if compiled is not None:
        rows.append({"finding": f"compiled / eager decode, static cache ({compiled['where']}) (×)",
                     "value": compiled["gain"]})
    return Findings(rows=rows, sentences=says)


def levels_sentence(rounds: list[Mapping[str, Any]], last: str) -> str:
    """Where ONNX Runtime's ``last`` (most optimised) level was not faster than a lower level timed in the same rounds
    (engine "ONNX Runtime, <level>", decode_tokens_per_s with samples): the verdict against the fastest lower level,
    and why that can happen. '' when ``last`` beat every lower level, or fewer than two levels ran."""
    ort = {r["engine"].split(", ", 1)[1]: r for r in rounds if str(r["engine"]).startswith("ONNX Runtime, ")}
    if last not in ort or len(ort) < 2:
        return ""
    lower = max((lv for lv in ort if lv != last), key=lambda lv: ort[lv]["decode_tokens_per_s"])
    v = ort_verdict(ort[last], ort[lower])
    if v.kind == verdict.BETTER:
        return ""
    said = f"ONNX Runtime '{last}' decoded {verdict.than(v)} '{lower}' ({v.ratio:.2f}×; {v.reason}): "
    return said + verdict.pick(
        v, better="",
        worse=("more fusions are not always faster: a fused or re-laid-out kernel can take a slower path on this CPU "
               "and shape than the plain operators it replaced, at one token a step."),
        same=("its extra fusions bought no speed this run could see on this CPU and shape, and the gap between the two "
              "levels is no larger than the spread of the rounds."),
        unsure="too few rounds to tell the two levels apart: raise ROUNDS.",
        wild="the machine moved between rounds, so no level's rewrites can be read from it.")


def steps_sentence(rounds: list[Mapping[str, Any]], levels: list[str]) -> str:
    """Each ONNX Runtime level against the one below it, timed in the same rounds: which step the gain came from
    ('basic' drops shape bookkeeping without fusing anything; the higher levels fuse). '' with fewer than two."""
    ort = {r["engine"].split(", ", 1)[1]: r for r in rounds if str(r["engine"]).startswith("ONNX Runtime, ")}
    ran = [lv for lv in levels if lv in ort]
    if len(ran) < 2:
        return ""
    steps = []
    for lo, hi in zip(ran, ran[1:]):
        v = ort_verdict(ort[hi], ort[lo])
        steps.append((hi, lo, v))
    parts = [f"'{hi}' over '{lo}' " + verdict.phrase(v, "") for hi, lo, v in steps]
    real = [s for s in steps if s[2].kind == verdict.BETTER]
    most = max(real, key=lambda s: s[2].gain) if real else None
    return ("Step by step: " + "; ".join(parts) + "." + (f" Most of the gain came from the step to '{most[0]}'."
                                                        if most and len(steps) > 1 else ""))


def cache_sentence(sizes: list[Mapping[str, Any]], cache_bytes: int, cache_source: str) -> str:
    """Which fusion sizes fit in the last-level cache, and the bandwidth each reached: a working set inside the cache
    can pass DRAM's GB/s, a tiny one is bound by each call's fixed cost; only a size above it streams from DRAM. ``sizes``: the
    fusion rows (input, working_set_bytes, fused_gbs); '' without them."""
    if not sizes:
        return ""
    size = lambda b: f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"  # noqa: E731  # fact: a unit
    parts = [f"{r['input']} ({size(r['working_set_bytes'])} in and out, "
             f"{'inside' if r['working_set_bytes'] <= cache_bytes else 'above'} the cache) "  # fact: bytes, not timed
             f"{r['fused_gbs']:.1f} GB/s"
             for r in sizes]
    inside = [r for r in sizes if r["working_set_bytes"] <= cache_bytes]  # fact: bytes against the cache's size
    said = (f"The fused kernel's achieved bandwidth against a {cache_bytes / 2**20:.0f} MiB last-level cache "
            f"({cache_source}): " + "; ".join(parts) + ".")
    small = (" A size inside the cache may read faster than DRAM allows, but a small one is held back by each call's "
             "fixed cost (dispatch, a new output tensor), not by any memory: its GB/s is bytes over that cost.")
    if inside and len(inside) < len(sizes):
        return said + small + (" Only the size above the cache streams from DRAM, and it too allocates a fresh output "
                               "on every call, so its GB/s sits below notebook 01's bandwidth probe.")
    if inside:
        return said + small + " Every size fits in the cache: none of these GB/s measures DRAM."
    return said


def calibration_said(kl_by_method: Mapping[str, list[float]], percentile: float) -> tuple[str | None, str]:
    """Which activation scale disturbed the model least, judged on the KL of each held-out prompt (lower is better):
    (the best method, or None where the verdict against the runner-up is not real, and the sentence, which also
    says what clipping at ``percentile`` did against absmax by the same verdict)."""
    mean = {m: statistics.fmean(v) for m, v in kl_by_method.items()}
    best, second = sorted(mean, key=mean.get)[:2]
    v = verdict.compare(kl_by_method[best], kl_by_method[second], higher_is_better=False)
    said = (f"{best} disturbed the outputs least (mean KL {mean[best]:.2g} nats; against {second}: {v.reason})" if v.real
            else f"no scale can be named best: {best} (mean KL {mean[best]:.2g} nats) against {second}, {v.label} "
                 f"({v.reason})")
    clipped, absmax = f"static, p{percentile:g} scale", "static, absmax scale"
    if clipped in kl_by_method and absmax in kl_by_method:
        c = verdict.compare(kl_by_method[clipped], kl_by_method[absmax], higher_is_better=False)
        said += (f"; clipping at p{percentile:g} gave {mean[clipped] / mean[absmax]:.2f}× absmax's mean KL: "
                 + verdict.pick(c, better="clipping the outliers helps this layer",
                                worse="the outliers it clips carry signal this layer needs",
                                same=f"{c.label} ({c.reason}), so this run cannot say whether clipping helps"))
    return (best if v.real else None), said + "."

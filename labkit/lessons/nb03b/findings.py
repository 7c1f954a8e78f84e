"""Notebook 03b's takeaways: FP8 and FP4 on one layer and on the whole model beside int8, int4 and NF4, why NVFP4
loses less than MXFP4 (the four corners of block size and scale format, and the layers), and FP8's GEMMs on this
machine beside a GPU's.
"""
from __future__ import annotations

import statistics
from typing import Any

from ...core import cpu, verdict
from ...model import gpus, roofline, sizing
from ...precision import formats, fp8_gemm, variants
from ..findings import UNPAIRED, Findings, kl_per_prompt

FORMAT_ROWS = ("fp32", "fp8-tensor", "fp8-channel", "int8-channel", "bnb-int8", "ort-int8-tensor", "ort-int8-channel", "nvfp4", "mxfp4",
               "int4-g64", "bnb-nf4")  # the formats table's order: 8 bits, then 4


def fp4_split(w: Any) -> Any:
    """E2M1 blocks of ``w`` (out, in) with each pairing of block size (16, 32) and scale (a power of two, E8M0; an
    E4M3 number under an fp32 tensor scale): relative weight error and bits per weight. MXFP4 and NVFP4 are two
    corners; the other two say which difference pays."""
    import pandas as pd

    rows = []
    for block in (16, 32):
        for scale, fmt in (("power of two (E8M0)", formats.Format(f"e8m0-{block}", "e2m1", "block", "e8m0", block)),
                           ("E4M3 + tensor scale", formats.Format(f"e4m3-{block}", "e2m1", "block", "e4m3", block, True))):
            named = next((n for n, f in formats.FORMATS.items() if (f.element, f.scale_format, f.block) ==
                          (fmt.element, fmt.scale_format, fmt.block)), "")
            rows.append({"block": block, "scale": scale, "standard": named,
                         "bits_per_weight": formats.bits_per_weight(fmt, shape=tuple(w.shape)),
                         "weight_error": formats.relative_error(w, fmt)})
    return pd.DataFrame(rows).set_index(["block", "scale"])


def formats_table(rows: list[dict[str, Any]], shape: Any) -> Any:
    """One row per format that ran (``FORMAT_ROWS`` order): bits per quantised weight (``sizing.bits_per_weight``,
    scales included), weight error where the weights were rounded here, perplexity, agreement and KL against fp32,
    weight bytes as stored (``stored_MiB``: the checkpoint's for rounded rows, the library's own for the others)
    and as ``labkit.model.sizing`` predicts a serving engine holds them (``predicted_MiB``)."""
    import pandas as pd

    by = {r["variant"]: r for r in rows if r.get("status") == "ok"}
    out = []
    for v in (n for n in FORMAT_ROWS if n in by):
        r = by[v]
        dtype = variants.SIZING_DTYPE[v]
        out.append({"variant": v, "bits_per_weight": sizing.bits_per_weight(shape, dtype),
                    "weight_error": r.get("weight_error"), "perplexity": r.get("perplexity"),
                    "agreement": r.get("agreement"), "kl": r.get("kl"),
                    "stored_MiB": r["weight_bytes"] / 2 ** 20 if r.get("weight_bytes") else None,
                    "predicted_MiB": (r["predicted_weight_bytes"] / 2 ** 20 if r.get("predicted_weight_bytes")
                                      else None)})
    return pd.DataFrame(out).set_index("variant")


def layer_errors(rows: list[dict[str, Any]], names: list[str]) -> Any:
    """The per-layer weight errors the rounded rows ``names`` carry (``layer_errors``): layer, kind (its last name
    part: q_proj, down_proj …), index (its decoder layer), variant, relative_error."""
    import pandas as pd

    out = []
    for r in rows:
        if r["variant"] in names and r.get("status") == "ok":
            for e in r.get("layer_errors") or []:
                parts = e["layer"].split(".")
                index = next((int(p) for p in parts if p.isdigit()), None)
                out.append({"layer": e["layer"], "kind": parts[-1], "index": index, "variant": r["variant"],
                            "relative_error": e["relative_error"]})
    return pd.DataFrame(out, columns=["layer", "kind", "index", "variant", "relative_error"])


def layer_sentence(layers: Any, a: str = "mxfp4", b: str = "nvfp4") -> str:
    """How often and by how much ``a``'s weight error exceeds ``b``'s, layer by layer, and where most."""
    wide = layers.pivot_table(index="layer", columns="variant", values="relative_error")
    if a not in wide or b not in wide or not len(wide):
        return f"No per-layer errors of both {a} and {b} in this run."
    ratio = (wide[a] / wide[b]).dropna()
    judged = [verdict.versus(wide[a][name], wide[b][name]).kind for name in ratio.index]  # one value a layer each
    above, tied = judged.count(verdict.BETTER), judged.count(verdict.TIED)
    kinds = ratio.groupby(ratio.index.str.rsplit(".", n=1).str[-1]).median()
    return (f"{a}'s weight error was above {b}'s in {above} of {len(ratio)} layers"
            + (f" and a {verdict.TIE_LABEL} in {tied}" if tied else "") + f" (median "
            f"{ratio.median():.2f}×; by kind from {kinds.min():.2f}× in {kinds.idxmin()} to {kinds.max():.2f}× in "
            f"{kinds.idxmax()}).")


def gemm_table(rows: list[dict[str, Any]], base: str = "fp32") -> Any:
    """``labkit.precision.fp8_gemm`` rows as one line per (shape, variant): µs per call, TFLOP/s, the gain over
    ``base`` (its median / the variant's) and the verdict, judged now from the samples the rows kept (a saved run's
    stored verdict may come from older rules: the samples are the facts): paired round by round where the rows say
    ``paired`` (timed in rounds here), by the unpaired rule where a saved run recorded no rounds that pair up; twins
    held against each other (``fp8_gemm.pair_twins``)."""
    import pandas as pd

    fresh = fp8_gemm.pair_twins([{**r, **fp8_gemm.gemm_row(r["M"], r["K"], r["N"], r["samples"], r.get("fp8_error"),
                                                           paired=bool(r.get("paired")))}
                                 if r.get("samples") else r for r in rows])
    out = []
    for r in fresh:
        judged = r.get(f"verdict_vs_{base}", {})
        for v in r["variants"]:
            out.append({"shape": f"{r['M']}×{r['K']}×{r['N']}", "what": r.get("what", ""), "variant": v,
                        "us_per_call": r[f"{v}_us"], "tflops": r[f"{v}_tflops"],
                        f"gain_vs_{base}": r.get(f"speedup_vs_{base}", {}).get(v, 1.0 if v == base else None),
                        "verdict": verdict.Verdict(**judged[v]).label if v in judged else ("baseline" if v == base else "")})
    return pd.DataFrame(out)


def takeaways(*, hand: Any, fmt_table: Any, rows: list[dict[str, Any]], split: Any, layers: Any,
                      gemm: list[dict[str, Any]], gpu_gemm: Any = None, gemm_on: str = "cpu") -> Findings:
    """Notebook 03b's takeaways, each read from its run: one layer by hand (``hand``: bytes and errors by form), the
    whole model per format (``fmt_table``, from ``rows``), the split of NVFP4's gain over MXFP4 (``split``) and
    the layers' (``layers``), FP8's GEMMs on this machine (``gemm``); ``gpu_gemm``, a saved GPU run of the same
    GEMMs (a ``labkit.core.results.Results``), is said apart with its provenance; ``gemm_on``: where ``gemm`` ran
    ("cpu", or the GPU's name)."""
    out: list[dict[str, Any]] = []
    says: list[str] = []
    best, undecided = closest_4bit(rows, fmt_table)
    t = fmt_table.dropna(subset=["kl"])
    four = t[t.bits_per_weight < 6]  # fact: the 4-bit formats (4.25–5 bits a weight), not the 8-bit ones
    if len(four):
        low = four.kl.idxmin()
        out.append({"finding": f"KL against fp32 of the lowest-KL 4-bit row ({low})", "value": float(four.kl[low])})
        says.append(f"Closest to fp32 at 4 bits: {best} (KL {four.kl[best]:.3g} nats/token)." if best else
                    f"At 4 bits no row can be named closest to fp32 in this run: {undecided}.")
    ratio = hand.output_error["fp8 per-channel"] / hand.output_error["int8 per-channel"]
    out.append({"finding": "FP8 per-channel / int8 per-channel output error, one layer", "value": ratio})
    grids = verdict.versus(hand.output_error["fp8 per-channel"], hand.output_error["int8 per-channel"],
                           higher_is_better=False)  # one layer, one value each
    says.append(f"On one real layer, FP8 E4M3 per-channel gave {ratio:.2f}× int8 per-channel's output error "
                f"({hand.output_error['fp8 per-channel']:.2%} against {hand.output_error['int8 per-channel']:.2%}) in "
                "the same bytes: " + verdict.pick(
                    grids, worse=("int8's even steps (absmax / 127) are finer than E4M3's 3-bit mantissa for most of a "
                                  "row's weights."),
                    better="E4M3's finer steps near zero won on this layer.",
                    same=f"a {verdict.TIE_LABEL}: on this layer the two grids round alike."))
    if len(t):
        parts = [f"{v} {r.bits_per_weight:.2f} bits, KL {r.kl:.3g}, agreement {r.agreement:.0%}" for v, r in t.iterrows()
                 if v != "fp32"]
        says.append("Per format, bits per weight and distance from fp32 over the reference prompts: "
                    + "; ".join(parts) + ".")
    if split is not None and len(split):
        says.append(split_sentence(split))
    if layers is not None and len(layers):
        says.append(layer_sentence(layers))
    ones = [r for r in gemm if r["M"] == 1 and "verdict_vs_fp32" in r]
    if ones:
        where = "this CPU" if gemm_on == "cpu" else gemm_on
        judged = {v: [verdict.Verdict(**r["verdict_vs_fp32"][v]) for r in ones] for v in ones[0]["verdict_vs_fp32"]}
        shapes = " and ".join(f"{r['M']}×{r['K']}×{r['N']}" for r in ones)
        parts = [f"{v} {statistics.median(r['speedup_vs_fp32'][v] for r in ones):.2f}× ({shape_labels(js, ones)})"
                 for v, js in judged.items()]
        said = f"One decode step's GEMMs ({shapes}) against fp32 on {where}, median over them: " + ", ".join(parts)
        fp8 = [v for v in judged if v.startswith("fp8")]
        if gemm_on == "cpu" and fp8 and all(j.kind == verdict.WORSE for v in fp8 for j in judged[v]):
            said += (". Every FP8 variant was slower: here each FP8 weight is converted to fp32 before it is "
                     "multiplied, work that Hopper's tensor cores, which multiply FP8 directly, do not do")
        if any(j.kind == verdict.ANOMALOUS for js in judged.values() for j in js):
            said += (". One matrix's fp32 ran far off its twin's (the same bytes and FLOPs), so its ratios measure "
                     "that anomaly: rerun before reading them")
        says.append(said + ".")
        if "fp8_scaled_mm" in judged:
            out.append({"finding": "fp8 _scaled_mm / fp32 speed at M = 1", "value": fp8_gemm.decode_step_gain(
                gemm, "fp8_scaled_mm"), "verdict": judged["fp8_scaled_mm"][0].kind})
    if gpu_gemm is not None:
        says.append(gpu_gemm_sentence(gpu_gemm))
    return Findings(rows=out, sentences=says)


def shape_labels(judged: list[verdict.Verdict], shapes: list[dict[str, Any]]) -> str:
    """One variant's verdicts over the GEMM shapes they judged (one each, in order): one label where they agree, else
    each label beside its shape, so "better" and "within noise" are never read as one verdict."""
    if len({j.label for j in judged}) == 1:
        return judged[0].label
    return ", ".join(f"{j.label} at {r['M']}×{r['K']}×{r['N']}" for j, r in zip(judged, shapes))


def split_sentence(split: Any) -> str:
    """Which of NVFP4's two differences from MXFP4 (blocks of 16, an E4M3 scale) lowers the error, from
    ``fp4_split``'s four corners: each gain is the error without it / the error with it."""
    e = split.weight_error
    p2, e4 = "power of two (E8M0)", "E4M3 + tensor scale"
    scale_gain = {b: e[(b, p2)] / e[(b, e4)] for b in (16, 32)}
    block_gain = {sc: e[(32, sc)] / e[(16, sc)] for sc in (p2, e4)}
    main = verdict.pick(verdict.versus(scale_gain[32], block_gain[p2]), better="the E4M3 scale",
                        worse="the smaller block", same="the E4M3 scale and the smaller block alike")
    return (f"On one layer, an E4M3 scale in place of a power of two changed the weight error by "
            f"{scale_gain[32]:.2f}× at blocks of 32 ({scale_gain[16]:.2f}× at 16); blocks of 16 in place of 32 by "
            f"{block_gain[p2]:.2f}× with a power-of-two scale and {block_gain[e4]:.2f}× with an E4M3 one (above 1: "
            f"lower error). Most of NVFP4's gain over MXFP4 comes from {main}: a power of two can only land a block's "
            "absmax somewhere in [4, 8), an E4M3 scale lands it within E4M3's rounding of 6.")


def judged_how(res: Any) -> str:
    """How a saved GEMM run's verdicts are read: "judged paired" where every row says its samples are rounds that
    pair up, else "judged unpaired, recorded DATE" (a run recorded before paired rounds, by the rule of its day)."""
    rows = res.section("gemm")
    if rows and all(r.get("paired") for r in rows):
        return "judged paired"
    return f"{UNPAIRED} {str(res.env.get('date') or 'an unrecorded date')[:10]}"


def gpu_gemm_sentence(res: Any) -> str:
    """The saved GPU run's FP8 GEMM against bf16, shape by shape, grouped by what bounds each shape on that GPU
    (``roofline.gemm_regime`` from the GPU catalog's bandwidth and bf16 peak): compute-bound shapes are where FP8's
    doubled tensor-core FLOPs can pay, memory-bound ones where its halved bytes can, and a call bound by its fixed
    cost (launch and latency) gains from neither. Each gain carries the verdict its samples allow: paired round by
    round where the run says ``paired``, else by the unpaired rule it was recorded under (the sentence says so)."""
    rows = [r for r in res.section("gemm") if "fp8_scaled_mm" in r.get("speedup_vs_bf16", {})]
    if not rows:
        return "The saved GPU run has no _scaled_mm row."
    name = res.env.get("hardware", {}).get("gpu") or "a GPU"
    date = str(res.env.get("date") or "an unrecorded date")[:10]
    try:
        spec = gpus.gpu(str(name).replace("NVIDIA ", ""))
    except ValueError:
        spec = None
    paired = all(r.get("paired") for r in rows)
    judged = {id(r): verdict.compare(r["samples"]["fp8_scaled_mm"], r["samples"]["bf16"], higher_is_better=False,
                                     paired=paired) for r in rows}
    n = min(v.n for v in judged.values())
    kinds = {v.kind for v in judged.values()}
    how = "judged paired" if paired else f"{UNPAIRED} {date}"  # as judged_how words it
    shape = lambda r: f"{r['M']}×{r['K']}×{r['N']}"  # noqa: E731
    if kinds == {verdict.NO_VERDICT}:  # too few samples a cell: say it once, then the ratios alone
        unit = "pair" if paired else "sample"
        head = (f"On {name} (a probe run on {date}, not this run; {n} {unit}{'s' * (n != 1)} a cell, {how}, so "
                f"{verdict.NO_VERDICT} on any of them)")
        gain = lambda r: f"{shape(r)} {judged[id(r)].gain:.2f}×"  # noqa: E731
    else:
        head = f"On {name} (a probe run on {date}, not this run; {how})"
        gain = lambda r: f"{shape(r)} {verdict.phrase(judged[id(r)], '')}"  # noqa: E731
    if spec is None or not spec.bf16_tflops:
        return head + ", FP8 _scaled_mm against bf16: " + "; ".join(gain(r) for r in rows) + "."
    regime = {id(r): roofline.gemm_regime(r["M"], r["K"], r["N"], r["bf16_us"] * 1e-6, spec.bandwidth_gbs,
                                          spec.bf16_tflops * 1e12) for r in rows}
    parts = []
    for kind in ("compute-bound", roofline.RIDGE, "memory-bound", roofline.FIXED_COST):
        mine = [r for r in rows if regime[id(r)] == kind]
        if mine:
            parts.append(f"{kind}: " + ", ".join(gain(r) for r in mine))
    fixed = [r for r in rows if regime[id(r)] == roofline.FIXED_COST]
    said = head + ", FP8 _scaled_mm against bf16, by what bounds each shape there (the catalog's " + (
        f"{spec.bandwidth_gbs:,.0f} GB/s and {spec.bf16_tflops:,.0f} bf16 TFLOP/s): " + "; ".join(parts) + ".")
    if fixed:
        times = [r[f"{v}_us"] for r in fixed for v in ("bf16", "fp8_scaled_mm") if r.get(f"{v}_us")]
        said += (f" The {roofline.FIXED_COST} shapes took {min(times):.0f}–{max(times):.0f} µs in both precisions, "
                 f"{roofline.FIXED_COST_FACTOR:g}× their roofline time or more: no precision shortens a launch.")
    return said + (" Compute-bound shapes are where FP8's doubled tensor-core FLOPs can pay, memory-bound ones where its "
                   "halved bytes can; only a verdict from repeated samples says whether they did.")


FP8_KV_ISA = ("avx512f", "amx_bf16", "amx_int8")  # vLLM's CPU FP8 KV cache: "x86 with AVX-512 or AMX"


def fp8_kv_said(ref: Any, here_isa: list[str]) -> str:
    """What the shipped llm-compressor run (``ref``: its "served" rows) found of vLLM's FP8 KV cache, rendered now
    from its facts: on which machine (its recorded CPU and instruction sets), what vLLM answered, and where this
    machine (``here_isa``: ``cpu.cpu_isa()``) differs in what that answer turns on, how to run it here."""
    row = next((r for r in ref.section("served") if r.get("name") == "fp32-fp8-kv"), None)
    there = cpu.machine_line(ref.env.get("hardware") or {})
    if row is None:
        return f"The reference run (on {there}) did not try an FP8 KV cache."
    base = next((r for r in ref.section("served") if r.get("name") == "fp32"), {})
    if row.get("status") != "refused":
        said = f"On the reference machine ({there}) vLLM served an FP8 KV cache"
        if row.get("kv_cache_tokens") and base.get("kv_cache_tokens"):
            said += (f": {row['kv_cache_tokens']:,} KV tokens against {base['kv_cache_tokens']:,} "
                     f"({row['kv_cache_tokens'] / base['kv_cache_tokens']:.2f}×)")
        return said + "."
    said = f"On the reference machine ({there}) vLLM refused an FP8 KV cache: {str(row.get('reason')).rstrip('.')}."
    there_isa = set((ref.env.get("hardware") or {}).get("cpu_isa") or ())
    has = [f for f in FP8_KV_ISA if f in here_isa]
    if has and not there_isa & set(FP8_KV_ISA):
        return said + (f" This machine has {', '.join(has)}, which that check asks for: run it here with `make llmc "
                       "vllm`, then `python -m bench.llm_compressor` (or `--kv-cache-dtype fp8` on any `vllm serve`).")
    return said + (" This machine lacks them too." if not has else "")


def closest_4bit(rows: list[dict[str, Any]], table: Any) -> tuple[str | None, str]:
    """The 4-bit row of ``table`` (``formats_table``) with the lowest KL, judged against the runner-up by
    ``verdict.compare`` on their KL per prompt: (its name, "") when the difference is real, else (None, why)."""
    four = table[table.bits_per_weight < 6].dropna(subset=["kl"]).sort_values("kl")  # fact: the 4-bit formats
    if len(four) < 2:
        return (four.index[0] if len(four) else None), ("" if len(four) else "no 4-bit row ran")
    by = {r["variant"]: r for r in rows}
    best, second = four.index[0], four.index[1]
    kb, ks = kl_per_prompt(by[best]), kl_per_prompt(by[second])
    if min(statistics.median(kb), statistics.median(ks)) <= 0:
        return best, ""
    v = verdict.compare(kb, ks, higher_is_better=False)
    return (best, "") if v.real else (None, f"{best} and {second}: {verdict.said(v)}")

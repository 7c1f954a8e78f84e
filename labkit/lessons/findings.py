"""Takeaway sentences chosen from a notebook's own measurements (batching, the KV cache, quantisation, warmup).

Each function takes the numbers a notebook measured and returns a ``Findings``: the sentences to print,
each worded by what the numbers say, never typed ahead of the run.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..core import machine, verdict
from ..core.verdict import IMPLAUSIBLE, NOISE, Verdict
from ..engines.warmup import GROWTH_SOURCES, NOISE_SHARE, ColdStart
from ..model import sizing

# ------------------------------------------------------------------------ takeaways from this run's numbers


@dataclass
class Findings:
    """Notebook 06's takeaways: the numbers (``rows``) and the sentences they choose (``sentences``)."""

    rows: list[dict[str, Any]]
    sentences: list[str]


def batching(*, sweep: list[dict[str, Any]], memory_bound_gain: float, padding: list[dict[str, Any]],
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
    total_v, user_v = batch_verdicts(first, last, memory_bound_gain)
    gain, user = total_v.gain, user_v.ratio
    ttft_x = last["ttft_s"] / first["ttft_s"]
    worst = min(ok, key=lambda r: r["agreement"])
    mixed, bucketed = padding[0], padding[-1]
    bucket_x = mixed["ttft_s"] / bucketed["ttft_s"]
    bucket_v = verdict.compare(verdict.samples(bucketed, "ttft_s"), verdict.samples(mixed, "ttft_s"), higher_is_better=False)
    one, many = serving
    serve_x = many["output_tokens_per_s"] / one["output_tokens_per_s"]
    tpot_x = many["tpot_p50_s"] / one["tpot_p50_s"]
    poisson, bursty = open_loop
    burst_x = bursty["ttft_p90_s"] / poisson["ttft_p90_s"]
    burst_v = verdict.compare(verdict.samples(bursty, "ttft_s"), verdict.samples(poisson, "ttft_s"),
                              higher_is_better=False)  # per-request TTFTs: does the whole distribution move?
    sentences = [
        throughput_sentence(last["batch_size"], total_v, memory_bound_gain)
        + f" Each user got {user:.2f}× batch 1's speed ({user_v.word('faster', 'slower')}"
        + (f": {user_v.reason}" if not user_v.real else "") + f") and waited {ttft_x:.1f}× as long for the first token.",
        ("Batching changed no answer: every batch's greedy tokens equal each prompt's tokens decoded alone."
         if worst["agreement"] == 1 else
         f"Batching changed some answers: at batch {worst['batch_size']} only {worst['agreement']:.0%} of the tokens "
         "equal each prompt decoded alone (padded rows and other matrix shapes round differently)."),
        f"In the mixed batch {mixed['wasted_fraction']:.0%} of the prompt tokens were padding; bucketing by length "
        f"prefilled {_than(bucket_v)} the mixed batch ({bucket_x:.2f}× its speed; {bucket_v.reason}), and the mixed "
        f"batch's tokens equal the bucketed ones on {mixed['agreement']:.0%}.",
        f"With {clients} clients, max_batch_size {many['max_batch_size']} served {serve_x:.1f}× the tokens/s of "
        f"max_batch_size {one['max_batch_size']} (mean batch {many['mean_batch_size']:.1f}), each token coming "
        f"{tpot_x:.1f}× {'slower' if tpot_x > 1 else 'faster'}; {one['failed'] + many['failed']} requests failed.",
        f"At {request_rate:g} requests/s, bursty arrivals made the TTFT p90 {burst_x:.1f}× Poisson's; per request, "
        f"their TTFTs were {burst_v.word('shorter', 'longer')} ({burst_v.reason}); goodput {poisson['goodput']:.2f} "
        f"(Poisson) and {bursty['goodput']:.2f} (bursty) requests/s.",
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


def batch_verdicts(first: dict[str, Any], last: dict[str, Any], memory_bound_gain: float) -> tuple[Verdict, Verdict]:
    """Total and per-user tokens/s of the largest batch against batch 1, each against its physical limits.

    Total: at most the memory-bound model's gain, at least batch 1's (one weight read serves every row).
    Per user: never faster than alone (each step does a batch's work)."""
    total = verdict.compare(verdict.samples(last, "total_tokens_per_s"), verdict.samples(first, "total_tokens_per_s"),
                            bound=memory_bound_gain, bound_why="the memory-bound model of this batch",
                            floor=1.0, floor_why="one weight read serves every row, so a batch cannot lose to batch 1")
    user = verdict.compare(verdict.samples(last, "tokens_per_s_per_user"),
                           verdict.samples(first, "tokens_per_s_per_user"), bound=1.0,
                           bound_why="each step does the whole batch's work, so no user can get faster than alone")
    return total, user


def throughput_sentence(batch: int, v: Verdict, model_gain: float) -> str:
    """The sentence a batch's total-throughput verdict chooses (never 'gave more' on noise)."""
    if v.kind == IMPLAUSIBLE:
        return (f"Batch {batch}'s total tokens/s came out {v.gain:.2f}× batch 1's: implausible — rerun ({v.reason}); "
                f"the machine, not batching, moved this number. {machine.last_line()}.")
    if v.kind == NOISE:
        return (f"Batch {batch} and batch 1 gave total tokens/s within noise ({v.gain:.2f}×, {v.reason}): "
                "raise SWEEP_REPEATS or close other programs.")
    if v.kind == verdict.WORSE:
        return f"Batch {batch} gave less total throughput than batch 1 ({v.gain:.2f}×)."
    return (f"Batch {batch} gave {v.gain:.1f}× the total tokens/s of batch 1 "
            f"(the memory-bound model allows up to {model_gain:.1f}×).")


def _than(v: Verdict) -> str:
    """The comparison words for a verdict on times: 'faster than' / 'slower than' only when the difference is real."""
    return {verdict.BETTER: "faster than", verdict.WORSE: "slower than", NOISE: "within noise of"}.get(
        v.kind, "implausibly far from (rerun)")


def _times(new: Any, base: Any, key: str, **kw: Any) -> Verdict:
    """Verdict on two result rows' times (lower is better), from the samples each row kept."""
    return verdict.compare(verdict.samples(new, key), verdict.samples(base, key), higher_is_better=False, **kw)


def kv_cache(*, loop_agreement: float, core_identical: bool, tokens: int, speedup: float,
             step_growth: dict[str, float], kv_sizes: Any, bytes_per_position: int, split: Any, variants: Any,
             attention: Any, decode_shares: dict[str, Any], weight_bytes: int | None = None) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the verdicts.

    ``step_growth``: last step's time / first decode step's, per 'cache on' / 'cache off'. ``kv_sizes``: rows with
    'measured / formula'. ``split``: prefill_decode_split rows, shortest prompt first. ``variants``: rows indexed
    by cache variant ('dynamic', 'static') with tpot_s and agreement. ``attention``: rows indexed by
    implementation ('eager', 'sdpa') with ttft_s and agreement. Rows that kept ``samples`` are judged by
    ``verdict.compare``; a row without them counts as one sample (within noise). ``decode_shares``: group → share
    of a decode step, or → the shares of each profiled repeat. ``weight_bytes``: the bytes a decode step reads
    besides the cache, for the growth the bytes predict.
    """
    fit = kv_sizes["measured / formula"]
    short, long_ = split.iloc[0], split.iloc[-1]
    prompt_x, ttft_x, tpot_x = (long_.prompt_tokens / short.prompt_tokens, long_.ttft_s / short.ttft_s,
                                long_.tpot_s / short.tpot_s)
    tpot_said = _times(long_, short, "tpot_s", bound=1.0, bound_why="a longer cache cannot make a step faster")
    predicted = None
    if weight_bytes:
        step_bytes = [sizing.decode_bytes_per_step(weight_bytes, bytes_per_position,
                                                   r.prompt_tokens + r.get("new_tokens", 1) / 2, 1) for r in (short, long_)]
        predicted = step_bytes[1] / step_bytes[0]  # weights plus the cache one step reads, long ÷ short prompt
    static_x = variants.loc["static"].tpot_s / variants.loc["dynamic"].tpot_s
    static_said = _times(variants.loc["static"], variants.loc["dynamic"], "tpot_s")
    sdpa_x = attention.loc["sdpa"].ttft_s / attention.loc["eager"].ttft_s
    sdpa_said = _times(attention.loc["sdpa"], attention.loc["eager"], "ttft_s")
    share = {g: (list(v) if isinstance(v, (list, tuple)) else [float(v)]) for g, v in decode_shares.items()}
    matmul_s, attn_s = share.get("matmul", [0.0]), share.get("attention", [0.0])
    matmul, attn = statistics.median(matmul_s), statistics.median(attn_s)
    split_said = verdict.compare(matmul_s, attn_s) if min(matmul_s + attn_s) > 0 else None
    on_g, off_g = step_growth["cache on"], step_growth["cache off"]
    if split_said is not None and split_said.kind == verdict.BETTER:
        where_time = ("reading the weights dominates, so fewer bytes per weight (notebooks 02, 03) help decode more "
                      "than a faster attention kernel.")
    elif split_said is not None and split_said.kind == verdict.WORSE:
        where_time = "attention dominates here, so a faster attention kernel helps decode more than smaller weights."
    else:
        why = split_said.reason if split_said is not None else "one group recorded no time"
        where_time = f"this run cannot say which dominates ({why}: raise REPEATS, close other programs)."
    sentences = [
        f"With the cache your loop made {tokens} tokens {speedup:.1f}× {'faster' if speedup > 1 else 'slower'} than "
        f"without it. From the first decode steps to the last, a step's time changed {on_g:.2f}× with the cache and "
        f"{off_g:.2f}× without: "
        + ("without the cache each step grows with the sequence it recomputes." if off_g > max(1.1, on_g * 1.1) else
           "this run cannot tell the two apart (too few tokens, or a noisy machine: raise LOOP_TOKENS)."),
        f"Your loop agreed with generate on {loop_agreement:.0%} of its tokens, and labkit's decode core gave "
        f"{'the same tokens as' if core_identical else 'different tokens from'} generate.",
        f"The cache holds {bytes_per_position:,} bytes per position and sequence; the tensors measured "
        f"{fit.min():.3f}–{fit.max():.3f}× the formula"
        + (" — the formula is the cache." if fit.min() > 0.99 and fit.max() < 1.01 else
           " — not the formula: look at the positions each cache holds."),
        f"A {prompt_x:.0f}× longer prompt made TTFT {ttft_x:.1f}× longer and TPOT {tpot_x:.2f}×"
        + (f" (the bytes a step reads predict {predicted:.2f}×)" if predicted else "") + ": prefill "
        f"{'grows with the prompt' if ttft_x > 1.5 else 'barely grew'}; a decode step "
        + ({verdict.WORSE: "grew (each step reads the whole, longer cache)", NOISE: f"did not change beyond noise "
            f"({tpot_said.reason})"}.get(tpot_said.kind, f"got faster, which no cache can do ({tpot_said.reason}): rerun"))
        + ".",
        f"Without compiling, the static cache decoded {_than(static_said)} the dynamic one "
        f"({static_x:.2f}× its time per token; {static_said.reason}), with "
        f"{variants.loc['static'].agreement:.0%} of its tokens equal.",
        f"sdpa prefilled the long prompt {_than(sdpa_said)} eager ({sdpa_x:.2f}× its TTFT; {sdpa_said.reason}); "
        f"{attention.loc['sdpa'].agreement:.0%} of its tokens equal eager's.",
        f"A decode step spent {matmul:.0%} of its time in matrix multiplication and {attn:.0%} in attention "
        f"(median of {len(matmul_s)} profiled step{'s' * (len(matmul_s) != 1)}): " + where_time,
    ]
    rows = [
        {"finding": f"cache on vs off, {tokens} new tokens (speedup ×)", "value": speedup},
        {"finding": "loop tokens equal to generate (share)", "value": loop_agreement},
        {"finding": "KV bytes measured / formula (min)", "value": float(fit.min())},
        {"finding": "KV bytes measured / formula (max)", "value": float(fit.max())},
        {"finding": f"TTFT, {prompt_x:.0f}× longer prompt (×)", "value": ttft_x},
        {"finding": f"TPOT, {prompt_x:.0f}× longer prompt (×)", "value": tpot_x},
        {"finding": f"TPOT, {prompt_x:.0f}× longer prompt, predicted from bytes (×)", "value": predicted},
        {"finding": "TPOT static / dynamic cache (×)", "value": static_x},
        {"finding": "static cache tokens equal to dynamic (share)", "value": float(variants.loc["static"].agreement)},
        {"finding": "TTFT sdpa / eager (×)", "value": sdpa_x},
        {"finding": "sdpa tokens equal to eager (share)", "value": float(attention.loc["sdpa"].agreement)},
        {"finding": "decode step spent in matmul (share)", "value": matmul},
    ]
    return Findings(rows=rows, sentences=sentences)


def quantisation(*, table: Any, hand: Any, agree: Any, routes: dict[str, str], layer_error: dict[str, float],
                 claims: Any, layers: Any = None) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``table``: variant rows indexed by name (status, weight_bytes, decode_tokens_per_s, agreement, kl);
    ``hand``: the hand-written layer table (bytes, output_error by form); ``agree``: ``library_agreement``;
    ``routes``: bitsandbytes kernel per kind; ``layer_error``: worst ONNX Runtime layer error by form;
    ``claims``: the claims table; ``layers``: ONNX Runtime's error per probed layer (layer, form, relative_error).
    Speeds are judged by ``verdict.compare``: int8 decode gains at most fp32's bytes over its own (memory-bound),
    times what ONNX Runtime's fp32 engine gains over PyTorch's for the ``ort-`` rows."""
    rows: list[dict[str, Any]] = []
    says: list[str] = []
    ratio = hand.output_error["per-tensor"] / hand.output_error["per-channel"]
    rows.append({"finding": "per-tensor / per-channel output error, hand-written", "value": ratio})
    says.append(f"On one real layer, one scale per tensor gave {ratio:.1f}× the output error of one scale per row "
                f"({hand.output_error['per-tensor']:.2%} vs {hand.output_error['per-channel']:.2%}); NF4 gave "
                f"{hand.output_error['nf4']:.2%} in {hand.fraction_of_fp32['nf4']:.1%} of fp32's bytes "
                f"(int8: {hand.fraction_of_fp32['per-channel']:.1%}).")
    if "equal_values" in agree:
        full = agree.dropna(subset=["equal_values"])
        parts = []
        for r in full.itertuples():
            same = "identical" if r.equal_values == r.values else f"{r.equal_values / r.values:.4%} equal"
            parts.append(f"{r.library}: {same} values, {'the same' if r.our_bytes == r.their_bytes else 'other'} bytes")
        says.append("The libraries against the hand-written quantiser — " + "; ".join(parts) + ".")
    base = table.loc["fp32"]
    ok = table[table.status == "ok"]
    for v in ("bnb-int8", "bnb-nf4", "ort-int8-channel"):
        if v in ok.index:
            frac = ok.weight_bytes[v] / base.weight_bytes
            rows.append({"finding": f"{v} weight bytes / fp32", "value": frac})
    int8 = ok[ok.index.isin(INT8_VARIANTS)]
    if len(int8):
        fast, label = fastest_int8(table)
        v = int8_verdict(table, fast)
        rows.insert(0, {"finding": label, "value": v.gain, "verdict": v.kind})
        if v.kind == IMPLAUSIBLE:
            said = (f"decoded {v.gain:.2f}× fp32's speed: implausible — rerun ({v.reason}; {machine.last_line()})")
        elif v.kind == NOISE:
            said = f"decoded {v.gain:.2f}× fp32's speed, within noise of fp32 ({v.reason})"
        else:
            said = f"decoded {v.gain:.2f}× fp32's speed ({v.word()} than fp32)"
        where = _devices_said(table, fast)
        says.append(f"The fastest int8 variant here{where}, {fast}, {said}, with {int8.agreement[fast]:.0%} greedy "
                    f"agreement and KL {int8.kl[fast]:.3g}; the most faithful int8, {int8.agreement.idxmax()}, agreed "
                    f"on {int8.agreement.max():.0%}.")
    loses = _where_int8_loses(table, hand, layers)
    if loses:
        says.append(loses)
    for kind, route in routes.items():
        says.append(f"bitsandbytes {kind} on this machine: {route}.")
    if layer_error:
        lo = min(layer_error, key=layer_error.get)
        says.append(f"In ONNX Runtime's kernel the lowest worst-layer error came from {lo} "
                    f"({layer_error[lo]:.3f}, against {', '.join(f'{k} {v:.3f}' for k, v in layer_error.items() if k != lo)}).")
    if "memory_holds" in claims:
        held = claims.dropna(subset=["memory_holds"])
        both = held[held.memory_holds.astype(bool) & held.accuracy_holds.astype(bool)]
        says.append(f"Of {len(held)} published claims measured here, {len(both)} held on both memory and accuracy"
                    + (f" ({', '.join(both.variant)})" if len(both) else "") + ".")
    return Findings(rows=rows, sentences=says)


INT8_VARIANTS = ("bnb-int8", "ort-int8-tensor", "ort-int8-channel")


def _device_kind(device: Any) -> str:
    """'cuda' for 'cuda', 'cuda:0'; 'cpu' for 'cpu': rows of one run on one GPU compare by kind."""
    return str(device).split(":")[0]


def _devices(table: Any, variant: str) -> tuple[str, str]:
    """(variant's device, fp32's device); ('', '') where the table records no devices."""
    if "device" not in table:
        return "", ""
    return str(table.device[variant]), str(table.device["fp32"])


def fastest_int8(table: Any) -> tuple[str | None, str]:
    """The fastest int8 row that ran on fp32's device, and a label saying what it is compared with.

    On a GPU, ONNX Runtime's dynamic int8 runs on the CPU provider while fp32 runs on the GPU: a speed ratio
    across devices is no int8 gain. Only where no int8 row ran on fp32's device is another device's row chosen,
    and then the label names both devices. (None, '') when no int8 row ran."""
    ok = table[(table.status == "ok") & table.index.isin(INT8_VARIANTS)]
    if not len(ok):
        return None, ""
    if "device" not in table:
        return ok.decode_tokens_per_s.idxmax(), f"fastest int8 ({ok.decode_tokens_per_s.idxmax()}) decode / fp32"
    base = _device_kind(table.device["fp32"])
    same = ok[ok.device.map(_device_kind) == base]
    fast = (same if len(same) else ok).decode_tokens_per_s.idxmax()
    dev, base_dev = _devices(table, fast)
    if len(same):
        return fast, f"fastest int8 on {base} ({fast}) decode / fp32 on {base}"
    return fast, f"fastest int8 ({fast}, on {dev}) decode / fp32 (on {base_dev}): different devices"


def _devices_said(table: Any, variant: str) -> str:
    """' on cuda' when ``variant`` ran where fp32 did; ' (on cpu, fp32 on cuda: different devices)' otherwise."""
    dev, base_dev = _devices(table, variant)
    if not dev:
        return ""
    if _device_kind(dev) == _device_kind(base_dev):
        return f" on {_device_kind(dev)}"
    return f" (on {dev}; fp32 ran on {base_dev}: different devices, so no int8 gain can be read from it)"


def int8_verdict(table: Any, variant: str) -> Verdict:
    """``variant``'s decode speed against fp32's, bounded by the bytes it no longer reads (and ONNX Runtime's
    own fp32 gain for an ``ort-`` row: the engine, not int8, may be the faster part)."""
    base, row = table.loc["fp32"], table.loc[variant]
    byte_x = base.weight_bytes / row.weight_bytes
    engine = 1.0
    if variant.startswith("ort-") and "ort-fp32" in table.index and table.status["ort-fp32"] == "ok":
        engine = max(1.0, table.decode_tokens_per_s["ort-fp32"] / base.decode_tokens_per_s)
    return verdict.compare(verdict.samples(row, "decode_tokens_per_s"), verdict.samples(base, "decode_tokens_per_s"),
                           bound=byte_x * engine,
                           bound_why=f"fp32 reads {byte_x:.2f}× its weight bytes"
                                     + (f", ONNX Runtime fp32 ran {engine:.2f}× PyTorch" if engine > 1 else ""))


def _where_int8_loses(table: Any, hand: Any, layers: Any) -> str:
    """Why ONNX Runtime's int8 costs more perplexity than weight-only int8, read from the per-layer errors."""
    ok = table[table.status == "ok"]
    ort = [v for v in ("ort-int8-channel", "ort-int8-tensor") if v in ok.index]
    if layers is None or not len(layers) or not ort or "fp32" not in ok.index:
        return ""
    v = ort[0]
    rise = ok.perplexity[v] / ok.perplexity["fp32"] - 1
    worst = layers.loc[layers.relative_error.idxmax()]
    weight_only = hand.output_error["per-channel"]
    compare = ""
    if "bnb-int8" in ok.index:
        compare = f" (bitsandbytes int8, weights only with fp16 outliers: {ok.perplexity['bnb-int8'] / ok.perplexity['fp32'] - 1:+.1%})"
    return (f"Why ONNX Runtime int8 costs perplexity: {v} raised it {rise:+.1%}{compare}. Its kernel also quantises "
            f"each layer's activations to uint8 with one scale per call; on the probed layers its output error reached "
            f"{worst.relative_error:.3f} (layer {worst.layer}, {worst.form}), {worst.relative_error / weight_only:.1f}× the "
            f"{weight_only:.3f} of weights-only per-channel int8 on layer 0 by hand, and every layer adds its error to the "
            "next one's input.")


def warmup(*, cold: "ColdStart", warmed: "ColdStart", steady_s: float, one_time_share: float,
             memory_growth: dict[str, int | None], weight_bytes: int, loop_warmup_calls: int | None, loop_calls: int,
             summary: Any, compile_rows: Any) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``memory_growth``: what the first request added, by source (``warmup.first_request_growth``: the RSS on a
    CPU, the CUDA allocator and NVML on a GPU, where the weights live).

    ``summary``: rows indexed by series ('cold', 'warmed') with first_s, median_s and agreement;
    ``compile_rows``: the compile table (target, where, break_even_calls, and max_abs_diff / agreement where known);
    a row with ``tokens_per_call`` (a whole model's requests) pays back in tokens, the unit notebooks 05 and 08 use."""
    phases = {k: v for k, v in cold.phases().items() if v is not None and k != "second_request_s"}
    largest = max(phases, key=phases.get)
    before = sum(v for k, v in phases.items() if k != "first_request_s")
    ratio = cold.first_request_s / steady_s
    rows = [{"finding": "first request / steady, cold process", "value": ratio},
            {"finding": "one-time share of the first request", "value": one_time_share},
            {"finding": f"largest phase ({largest.removesuffix('_s')}), seconds", "value": phases[largest]}]
    measured = {src: b for src, b in memory_growth.items() if b is not None}
    rows += [{"finding": f"{src} growth of the first request / weight bytes", "value": b / weight_bytes}
             for src, b in measured.items()]
    grew = ("; ".join(f"{GROWTH_SOURCES[src]} grew by {b / 2**20:.0f} MiB, {b / weight_bytes:.2f}× the weights"
                      for src, b in measured.items()) or
            "no memory source could be read here: " + ", ".join(memory_growth))
    says = [f"The largest phase of this cold start was {largest.removesuffix('_s').replace('_', ' ')} "
            f"({phases[largest]:.2f} s); {before:.2f} s passed before the first request.",
            (f"The first request took {ratio:.1f}× a steady one ({cold.first_request_s * 1e3:.0f} vs "
             f"{steady_s * 1e3:.0f} ms): {one_time_share:.0%} of it was one-time cost." if one_time_share > NOISE_SHARE else
             f"The first request was no slower than a steady one ({cold.first_request_s * 1e3:.0f} vs "
             f"{steady_s * 1e3:.0f} ms): no one-time cost showed above this run's noise.")
            + f" During it {grew}."]
    if loop_warmup_calls is None:
        says.append(f"The warmup loop written here did not settle within {loop_calls} calls.")
    else:
        says.append(f"The warmup loop written here settled after {loop_warmup_calls} warmup call(s) "
                    f"({loop_calls} calls with the steady window).")
    c, w = summary.loc["cold"], summary.loc["warmed"]
    gain = c.first_s / w.first_s
    rows.append({"finding": "request 1, cold / after warmup", "value": gain})
    word = "faster" if gain > 1.05 else "slower" if gain < 0.95 else "about as fast"
    same = "identical answers" if min(c.agreement, w.agreement) == 1 else \
        f"greedy agreement down to {min(c.agreement, w.agreement):.0%}"
    says.append(f"After a warmup, request 1 was {word} ({w.first_s * 1e3:.0f} ms vs {c.first_s * 1e3:.0f} ms cold), with "
                f"{same} against the cold process's first answer.")
    if warmed.warmup is not None:
        rep = warmed.warmup
        says.append("labkit's warmup in the second process " + (f"settled after {rep.warmup_calls} call(s)."
                    if rep.settled else f"did not settle within {rep.calls} calls."))
    for r in compile_rows.to_dict("records"):
        be, per_call = r.get("break_even_calls"), r.get("tokens_per_call")
        pay = ("never pays back (compiled calls were not faster)" if be is None or be != be else
               f"pays back after {be * per_call:,.0f} tokens" if per_call and per_call == per_call else
               f"pays back after {be:,.0f} calls")
        says.append(f"torch.compile, {r['target']} ({r['where']}): first call {r['compiled_first_s']:.2f} s vs "
                    f"{r['eager_first_s']:.3f} s eager; {pay}.")
    return Findings(rows=rows, sentences=says)

"""Notebook 03's takeaways: per-tensor against per-channel scales, the libraries against the hand-written quantiser,
int8's speed against its bytes bound, why ONNX Runtime's int8 costs perplexity, and the published claims.
"""
from __future__ import annotations

import statistics
from typing import Any

from ...core import verdict
from ...core.verdict import Verdict
from ..findings import Findings, kl_per_prompt


def takeaways(*, table: Any, hand: Any, agree: Any, routes: dict[str, str], layer_error: dict[str, float],
              claims: Any, layers: Any = None, probe_layer: str = "0", quick: bool = False) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``table``: variant rows indexed by name (status, weight_bytes, decode_tokens_per_s, agreement, kl);
    ``hand``: the hand-written layer table (bytes, output_error by form); ``agree``: ``library_agreement``;
    ``routes``: bitsandbytes kernel per kind; ``layer_error``: worst ONNX Runtime layer error by form;
    ``claims``: the claims table; ``layers``: ONNX Runtime's error per probed layer (layer, form, relative_error);
    ``probe_layer``: the layer quantised by hand (its index), where ONNX Runtime's error is compared with the
    hand-written one; ``quick``: the run's mode (few reference tokens). ``claims`` may carry ``embedding_share`` and
    ``tied_embedding`` (the model's): a missed memory claim then says what the tied embedding costs. Speeds are judged by
    ``verdict.compare(..., paired=True)`` on the rows' per-round samples (every row was timed in the same rounds, round
    i at index i): int8 decode against its own engine's fp32
    (``int8_base``) gains at most that fp32's bytes over its own (memory-bound); the engine's gain over PyTorch is
    a sentence of its own."""
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
        v, against = int8_verdict(table, fast), int8_base(table, fast)
        rows.insert(0, {"finding": label.replace("/ fp32", f"/ {against}"), "value": v.gain, "verdict": v.kind})
        said = "decoded " + verdict.phrase(v, f"{against}'s speed", f"faster than {against}", f"slower than {against}")
        where = _devices_said(table, fast)
        says.append(f"The fastest int8 variant here{where}, {fast}, {said}, with {int8.agreement[fast]:.0%} greedy "
                    f"agreement and KL {int8.kl[fast]:.3g}; the most faithful int8, {int8.agreement.idxmax()}, agreed "
                    f"on {int8.agreement.max():.0%}.")
        if against != "fp32":  # the engine's own gain, apart from int8's
            engine = verdict.compare(verdict.samples(table.loc[against], "decode_tokens_per_s"),
                                     verdict.samples(base, "decode_tokens_per_s"), paired=True)
            says.append(f"That compares int8 with fp32 in the same engine; the engine itself, {against} against PyTorch "
                        "fp32, decoded " + verdict.phrase(engine, "PyTorch's speed") + verdict.pick(
                            engine, better=": that part is ONNX Runtime's gain, not int8's.",
                            worse=": ONNX Runtime's fp32 was slower than PyTorch's, so against PyTorch int8 gains less.",
                            same=": the engine itself added nothing this run could see; the gain is int8's.",
                            unsure=": no gain of the engine can be read from it."))
    loses = _where_int8_loses(table, hand, layers, probe_layer)
    if loses:
        says.append(loses)
    says += [s for s in (forms_sentence(table, quick), peak_sentence(table)) if s]
    for kind, route in routes.items():
        says.append(f"bitsandbytes {kind} on this machine: {route}." + (bnb_int8_speed(table) if kind == "int8" else ""))
    if layer_error:
        tied = verdict.smallest(layer_error)  # one sample a layer: a tie within verdict.TIE names no winner
        others = ", ".join(f"{k} {v:.3f}" for k, v in layer_error.items() if k not in tied)
        if len(tied) > 1:
            says.append(f"In ONNX Runtime's kernel the worst-layer errors of {' and '.join(tied)} tie "
                        f"({', '.join(f'{layer_error[k]:.3f}' for k in tied)}; one sample a layer: a {verdict.TIE_LABEL})"
                        + (f"; {others}" if others else "") + ".")
        else:
            says.append(f"In ONNX Runtime's kernel the lowest worst-layer error came from {tied[0]} "
                        f"({layer_error[tied[0]]:.3f}, against {others}).")
    if "memory_holds" in claims:
        held = claims.dropna(subset=["memory_holds"])
        both = held[held.memory_holds.astype(bool) & held.accuracy_holds.astype(bool)]
        says.append(f"Of {len(held)} checks of the published claims here, {len(both)} held on both memory and accuracy"
                    + (f" ({', '.join(both.variant)})" if len(both) else "") + ".")
        for r in held.itertuples():
            why = memory_reason(r.memory_change, r.memory_claim, getattr(r, "embedding_share", None),
                                bool(getattr(r, "tied_embedding", False)))
            if why:
                says.append(f"{r.claim} memory ({r.variant}): {r.memory_change:+.0%} against the claimed "
                            f"{r.memory_claim:+.0%}: {why}.")
    return Findings(rows=rows, sentences=says)


INT8_VARIANTS = ("bnb-int8", "ort-int8-tensor", "ort-int8-channel")


def bnb_int8_speed(table: Any) -> str:
    """bitsandbytes int8's decode against PyTorch fp32's, and why LLM.int8 is no speed-up on a CPU where it is not:
    every call quantises the activations row by row, splits out the outlier columns to multiply them in fp16,
    multiplies the rest as int8 (or, without an int8 kernel, converts back to floating point), dequantises the result
    and adds the two: passes fp32's single matmul does not make. '' where either row did not run."""
    ok = table[table.status == "ok"]
    if not {"bnb-int8", "fp32"} <= set(ok.index):
        return ""
    v = verdict.compare(verdict.samples(ok.loc["bnb-int8"], "decode_tokens_per_s"),
                        verdict.samples(ok.loc["fp32"], "decode_tokens_per_s"), paired=True)
    return " It decoded " + verdict.phrase(v, "fp32's speed") + verdict.pick(
        v, better=": the int8 matmul outran the passes LLM.int8 adds around it on this CPU.",
        worse=(": LLM.int8 wraps every matmul in more passes (quantise the activations row by row, split the outlier "
               "columns out to fp16, dequantise the product and add them back), which a CPU pays in full; it was made "
               "to save GPU memory, not time."),
        same=": the int8 matmul saved about what the passes around it cost.")


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


def int8_base(table: Any, variant: str) -> str:
    """The fp32 row an int8 row is judged against: the same engine's (``ort-fp32`` for ONNX Runtime's int8, where
    it ran), else PyTorch's ``fp32``. Against another engine's fp32, the engine's own gain would pass as int8's."""
    if variant.startswith("ort-") and "ort-fp32" in table.index and table.status["ort-fp32"] == "ok":
        return "ort-fp32"
    return "fp32"


def int8_verdict(table: Any, variant: str) -> Verdict:
    """``variant``'s decode speed against its engine's fp32 (``int8_base``), bounded by the bytes it no longer reads."""
    against = int8_base(table, variant)
    base, row = table.loc[against], table.loc[variant]
    byte_x = base.weight_bytes / row.weight_bytes
    return verdict.compare(verdict.samples(row, "decode_tokens_per_s"), verdict.samples(base, "decode_tokens_per_s"),
                           paired=True, bound=byte_x, bound_why=f"{against} reads {byte_x:.2f}× its weight bytes")


def _where_int8_loses(table: Any, hand: Any, layers: Any, probe_layer: str = "0") -> str:
    """Why ONNX Runtime's int8 costs more perplexity than weight-only int8, read from the per-layer errors."""
    ok = table[table.status == "ok"]
    ort = [v for v in ("ort-int8-channel", "ort-int8-tensor") if v in ok.index]
    if layers is None or not len(layers) or not ort or "fp32" not in ok.index:
        return ""
    v = ort[0]
    rise = ok.perplexity[v] / ok.perplexity["fp32"] - 1
    weight_only = hand.output_error["per-channel"]
    compare = ""
    if "bnb-int8" in ok.index:
        compare = f" (bitsandbytes int8, weights only with fp16 outliers: {ok.perplexity['bnb-int8'] / ok.perplexity['fp32'] - 1:+.1%})"
    said = (f"Why ONNX Runtime int8 costs perplexity: {v} raised it {rise:+.1%}{compare}. Its kernel also quantises "
            "each layer's activations to uint8 with one scale per call")
    form = ort_form(table, v)
    ran = layers[layers.form == form] if form else layers.iloc[:0]
    if not len(ran):
        return said + f"; the per-layer probe did not run {v}'s form, so it cannot say where."
    worst, same = ran.loc[ran.relative_error.idxmax()], ran[ran.layer.astype(str) == str(probe_layer)]
    here = (f"on layer {probe_layer} its output error was {same.relative_error.iloc[0]:.3f}, "
            f"{same.relative_error.iloc[0] / weight_only:.1f}× the {weight_only:.3f} of weights-only per-channel int8 on "
            "that layer by hand; " if len(same) else "")
    return (said + f". In the form it ran ({form}), {here}its worst probed layer reached {worst.relative_error:.3f} "
            f"(layer {worst.layer}), and every layer adds its error to the next one's input.")


def ort_form(table: Any, variant: str) -> str | None:
    """The form of the per-layer probe that ``variant`` ran: 'per-tensor', or per-channel with 8-bit or, with
    ``reduce_range``, 7-bit weights; None where the probe has no such form (per-tensor with reduce_range)."""
    options = table.options[variant] if "options" in table and isinstance(table.options[variant], dict) else {}
    seven = bool(options.get("reduce_range"))
    if variant.endswith("tensor"):
        return None if seven else "per-tensor"
    return "per-channel, 7-bit" if seven else "per-channel, 8-bit"


def forms_sentence(table: Any, quick: bool = False) -> str:
    """ONNX Runtime's per-tensor against per-channel int8 over the reference prompts: per-channel's KL per prompt
    judged against per-tensor's by ``verdict.compare`` (lower is better). Where the verdict cannot tell them apart
    and the run is in quick mode, it says why: too few prompts and tokens. '' when either row did not run."""
    ok = table[table.status == "ok"]
    if not {"ort-int8-tensor", "ort-int8-channel"} <= set(ok.index):
        return ""
    t, c = ok.loc["ort-int8-tensor"], ok.loc["ort-int8-channel"]
    kt, kc = kl_per_prompt(t), kl_per_prompt(c)
    tokens = int(t["kl_tokens"]) if "kl_tokens" in ok and t["kl_tokens"] == t["kl_tokens"] else None
    over = f"{len(kt)} prompt{'s' * (len(kt) != 1)}" + (f" × {tokens // len(kt)} tokens" if tokens else "")
    said = (f"ONNX Runtime per-tensor against per-channel int8 over {over}: agreement {t['agreement']:.0%} against "
            f"{c['agreement']:.0%}, KL {t['kl']:.3g} against {c['kl']:.3g} nats/token")
    if min(statistics.median(kt), statistics.median(kc)) <= 0:
        return said + ": one form matched fp32 exactly, so there is no ratio to judge."
    v = verdict.compare(kc, kt, higher_is_better=False)
    said += f"; per-channel's KL per prompt was {v.ratio:.2f}× per-tensor's"
    if v.real:
        return said + f", {v.word('lower', 'higher')} ({v.reason})."
    said += f", {verdict.said(v)}"
    if quick:
        return (said + f". Quick mode scores {tokens or 'few'} tokens in all: too few for the two forms' difference "
                "to rise above the spread between prompts; a full run scores more prompts and tokens.")
    return said + ": on these prompts the two forms cannot be told apart."


def embedding_kept_change(claim_change: float, share: float, kept_fraction: float = 0.5) -> float:
    """The memory change a claim (``claim_change`` of fp32's bytes, e.g. -0.75) predicts when the embedding matrix,
    ``share`` of the weights, keeps ``kept_fraction`` of its fp32 bytes (0.5: 2 bytes a weight) instead."""
    return share * kept_fraction + (1 - share) * (1 + claim_change) - 1


def memory_reason(change: float, claim_change: float, share: float | None, tied: bool) -> str:
    """Why a memory claim missed, where the tied embedding explains it: '' when it held (within 5 points) or the model
    does not tie its embedding to lm_head."""
    if verdict.holds(change, claim_change) or not tied or share is None:
        return ""
    kept = embedding_kept_change(claim_change, share)
    said = (f"this model ties its input embedding to lm_head, one matrix holding {share:.0%} of the weights, which "
            f"stays at 2 bytes a weight (bitsandbytes leaves embeddings in fp16; ONNX Runtime's int8 graph stores it "
            f"twice, for the lookup and transposed for lm_head), so {claim_change:+.0%} becomes {kept:+.0%} at best")
    if verdict.holds(change, kept):
        return said + f", which the measured {change:+.0%} matches"
    return said + f"; the measured {change:+.0%} is further off still, so more than the embedding is kept wide"


def peak_sentence(table: Any) -> str:
    """Where a variant's peak memory came from its load rather than from decoding, both peaks apart, with the load's
    cause: an export or quantisation now (``prepare_s``, once), bitsandbytes quantising in memory (every load), a
    half-precision cast of the fp32 checkpoint (every load), or ONNX Runtime building its session."""
    if "load_peak_memory_bytes" not in table:
        return ""
    parts = []
    for v, r in table[table.status == "ok"].iterrows():
        load, run, prep = r["load_peak_memory_bytes"], r["run_peak_memory_bytes"], r.get("prepare_s")
        if load is None or load != load or run is None or run != run or verdict.versus(load, run).kind != verdict.BETTER:
            continue  # a load peak within verdict.TIE of the runs' is the runs' peak
        if prep is not None and prep == prep and prep > 0:
            cause = f"it exported or quantised the model now ({prep:.0f} s, once: later runs reuse the file)"
        elif str(v).startswith("bnb"):
            cause = "bitsandbytes quantises the weights in memory at every load"
        elif str(v).startswith("ort"):
            cause = "ONNX Runtime holds the file and builds its session's own copy while loading"
        else:
            cause = "the fp32 checkpoint is read and cast to this precision at every load, both copies held at once"
        parts.append(f"{v} {load / 2**20:.0f} MiB while loading against {run / 2**20:.0f} MiB while decoding ({cause})")
    if not parts:
        return "Every variant peaked while decoding, not while loading: each peak is its runs'."
    return "Peaks from the load, not from decoding: " + "; ".join(parts) + "."

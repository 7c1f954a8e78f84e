# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] slideshow={"slide_type": "slide"}
# # 02 · FP16 and BF16: half the bytes — at what price?
#
# Storing weights in 16 bits instead of 32 halves the memory a model needs and the bytes each
# decode step must read. Two 16-bit formats compete, and they split their 16 bits differently
# between range (exponent) and precision (mantissa).

# %% [markdown] slideshow={"slide_type": "notes"}
# This notebook takes the formats apart on single
# numbers — you round fp32 to bf16 by hand, find a format's largest value from its bits and keep a
# running sum in 16 bits — then loads the model in all three precisions and measures footprint, load
# time, time to first token, decode speed and quality against the fp32 reference, on this machine.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Find which 16-bit format overflows on 70000 and which cannot tell 1 from 1 + 1/1024, and why, from
#   each format's bits; derive a format's largest finite value (exercise).
# - Round fp32 to bf16 by hand (round to nearest, ties to even, on the bit pattern) and match `tensor.bfloat16()`.
# - Keep a running sum in a 16-bit format (exercise) and see why matmuls accumulate in fp32.
# - Predict weight bytes per precision with `labkit.model.sizing`, then check them against the loaded model.
# - Measure TTFT and decode tokens/s per precision, and read from this machine's numbers whether half
#   precision is faster or slower here, and why.
# - Read three quality columns against fp32: [perplexity](../docs/glossary.md#perplexity) (how surprised the model is by a
#   text), [greedy agreement](../docs/glossary.md#greedy-agreement) (the same top token) and [KL divergence](../docs/glossary.md#kl-divergence)
#   (how far apart the next-token distributions are).

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: take a show of hands for each prediction in section 1 (which format overflows, which cannot
# tell 1 from 1 + 1/1024) before running it. The bf16 rounding cell is short enough to read aloud line by
# line. Before section 4, ask whether fp16 will decode faster or slower than fp32 on this machine; the
# answer differs between laptops in the room, which is the point of the class table at the end.

# %% slideshow={"slide_type": "slide"}
import math

import pandas as pd
import torch

import labkit
from labkit.core import config, env, machine, results, timing, verdict
from labkit.model import hardware, models, prompts, sizing
from labkit.decoding import quality
from labkit.precision import measure, rounds
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb02

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})
print("CPU:", env.hardware()["cpu"], "| GPU:", env.hardware()["gpu"])
print("half precision on this run's device:", hardware.half_precision_features())

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
VARIANTS = ["fp32", "fp16", "bf16"]  # fp32 first: it is the reference
NEW_TOKENS = config.pick(32, 8)  # decode tokens per timed run
REPEATS = config.pick(8, 6)  # timed rounds over the variants, each in a shuffled order (after one warmup each): pairs
PPL_WINDOW = 512  # tokens per perplexity window
PPL_MAX_TOKENS = config.pick(None, 128)  # tokens of data/eval text scored (None: all of it)
REF_PROMPTS = config.pick(12, 3)  # prompts from data/prompts.json for agreement and KL
REF_NEW_TOKENS = config.pick(32, 12)  # reference continuation tokens per prompt
QUESTIONS = config.pick(5, 1)  # questions answered side by side
ANSWER_TOKENS = config.pick(24, 12)  # tokens per answer
MATMUL_TOKENS = 64  # rows (tokens) of the prefill-like matmul in section 5
MATMUL_REPEATS = config.pick(10, 5)  # timed repeats per matmul
ROUND_SAMPLES = 100_000  # random fp32 values rounded to bf16 by hand and by torch
ACCUM_START, ACCUM_STEP, ACCUM_STEPS = 1.0, 1e-4, 10_000  # the running sum of section 2: start + step, ACCUM_STEPS times

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Three formats, one number at a time
#
# A float is sign × significand × 2^exponent. More **exponent** bits = wider range; more
# **mantissa** bits = finer steps. fp32 has 8 exponent and 23 mantissa bits; fp16 and bf16 spend their
# 16 bits differently. Predict before running: which format turns 70000 into `inf`? Which one cannot
# tell 1 from 1 + 1/1024?

# %% slideshow={"slide_type": "fragment"}
PREDICT_OVERFLOW = None  # your prediction: which turns 70000 into inf: "fp16", "bf16", "both" or "neither"
PREDICT_BLIND = None  # your prediction: which rounds 1 + 1/1024 to 1: "fp16", "bf16", "both" or "neither"

# %% slideshow={"slide_type": "fragment"}
samples = torch.tensor([70000.0, 1e-6, 3.14159265, 1 + 2**-10, 300.5], device="cpu")  # number formats: any device shows them
demo = pd.DataFrame({"fp32": samples.tolist(), "fp16": samples.half().float().tolist(),
                     "bf16": samples.bfloat16().float().tolist()})
choices = ["fp16", "bf16", "both", "neither"]


def which(hit: dict) -> str:
    """'fp16', 'bf16', 'both' or 'neither', from {format: bool}."""
    found = [f for f in ("fp16", "bf16") if hit[f]]
    return "both" if len(found) == 2 else found[0] if found else "neither"


overflows = which({f: math.isinf(demo[f][0]) for f in ("fp16", "bf16")})
blind = which({f: demo[f][3] == 1.0 for f in ("fp16", "bf16")})
exercises.reveal_choice("70000 becomes inf in", PREDICT_OVERFLOW, overflows, choices)
exercises.reveal_choice("1 + 1/1024 rounds to 1 in", PREDICT_BLIND, blind, choices)
demo

# %% slideshow={"slide_type": "fragment"}
def layout(dtype: torch.dtype) -> dict:
    fi = torch.finfo(dtype)
    mantissa = round(-torch.log2(torch.tensor(fi.eps)).item())
    return {"dtype": str(dtype).replace("torch.", ""), "bits": fi.bits, "exponent_bits": fi.bits - 1 - mantissa,
            "mantissa_bits": mantissa, "smallest_normal": fi.tiny, "eps": fi.eps}  # no max: exercise 02.float_max


formats = pd.DataFrame([layout(d) for d in (torch.float32, torch.float16, torch.bfloat16)]).set_index("dtype")
print(f"70000 → fp16: {demo.fp16[0]}, bf16: {demo.bf16[0]:g} (exponent bits: fp16 {formats.exponent_bits['float16']}, "
      f"bf16 {formats.exponent_bits['bfloat16']}, fp32 {formats.exponent_bits['float32']})")
print(f"1 + 1/1024 → fp16: {demo.fp16[3]:.6f}, bf16: {demo.bf16[3]:.6f} "
      f"(mantissa bits: fp16 {formats.mantissa_bits['float16']}, bf16 {formats.mantissa_bits['bfloat16']})")
formats

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Where does a format's largest value come from?
#
# An IEEE-754-style format with *e* exponent bits stores the exponent plus a bias of 2^(e−1) − 1, keeps
# the all-ones exponent pattern for `inf` and NaN, and puts an implicit leading 1 before its *m*
# mantissa bits (1.m in binary). Write its largest finite value from *e* and *m*.

# %% labkit={"exercise": "02.float_max"} slideshow={"slide_type": "skip"} tags=["exercise"]
def float_max(exponent_bits, mantissa_bits):
    """Largest finite value of an IEEE-754-style binary format with these many exponent and mantissa bits."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("02.float_max", float_max)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Rounding fp32 to bf16, by hand
#
# bf16 is the top half of an fp32: the same sign and 8 exponent bits, the first 7 of the 23 mantissa bits.
# Converting drops the low 16 bits, rounding to the nearest bf16 and, on an exact tie, to the one whose last
# kept bit is 0 (*round to nearest, ties to even*). Here it is on the bit patterns, as integers:

# %% tags=["mechanism"]
def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 (N,) → (N,) int32 holding each value's bf16 bit pattern in its low 16 bits."""
    bits = x.view(torch.int32)  # (N,) the same 32 bits as integers: sign | 8 exponent | 23 mantissa
    last_kept = (bits >> 16) & 1  # (N,) the lowest bit bf16 keeps
    rounded = bits + 0x7FFF + last_kept  # a dropped half above 0x8000 carries into the kept bits; exactly
                                         # 0x8000 (a tie) carries only when the last kept bit is 1: ties to even
    return (rounded >> 16) & 0xFFFF  # (N,) the top 16 bits: sign, exponent, 7 mantissa bits

# %% slideshow={"slide_type": "fragment"}
gen = torch.Generator(device="cpu").manual_seed(0)
x = torch.randn(ROUND_SAMPLES, generator=gen, device="cpu")  # number formats: any device rounds the same way
x = torch.cat([x * 2.0 ** torch.randint(-120, 120, (ROUND_SAMPLES,), generator=gen, device="cpu"),
               torch.tensor([0.0, -0.0, 70000.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), float("inf")], device="cpu")])
mine = bf16_bits(x).to(torch.int16).view(torch.bfloat16)  # the low 16 bits, read as bf16
theirs = x.bfloat16()
truncated = (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)  # dropping the bits, no rounding
print(f"bf16 by hand vs tensor.bfloat16() on {x.numel():,} values: "
      f"{'the same bytes' if torch.equal(mine.view(torch.int16), theirs.view(torch.int16)) else 'DIFFERENT bytes'}; "
      f"plain truncation differs in {(truncated.view(torch.int16) != theirs.view(torch.int16)).float().mean():.1%} of them")
pd.DataFrame({"fp32": x[-7:].tolist(), "bits by hand": [f"{b:04x}" for b in bf16_bits(x[-7:]).tolist()],
              "bfloat16()": theirs[-7:].float().tolist(), "truncated": truncated[-7:].float().tolist()})

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · Adding small numbers: a running total in 16 bits
#
# A matmul adds up one product per input feature for every output. If the running total lives in a 16-bit
# format, every addition rounds it to that format's spacing. Predict: starting from `ACCUM_START`, after
# adding `ACCUM_STEP` `ACCUM_STEPS` times, what does the fp16 total end at?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FP16_TOTAL = None  # your prediction: the fp16 running total at the end

# %% labkit={"exercise": "02.accumulate"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def accumulate(start, step, n, dtype):
    """``start`` plus ``step``, ``n`` times, with the running total kept in ``dtype`` (a torch dtype):
    rounded to that format after every addition. Returns the final total as a Python float."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("02.accumulate", accumulate)

# %% slideshow={"slide_type": "fragment"}
running = exercises.use("02.accumulate", accumulate, nb02.checks.running_sum)
totals = pd.DataFrame([{"dtype": name, "running total in dtype": running(ACCUM_START, ACCUM_STEP, ACCUM_STEPS, d),
                        "torch.sum in dtype": ACCUM_START + torch.full((ACCUM_STEPS,), ACCUM_STEP, dtype=d,
                                                                       device="cpu").sum().item(),  # number formats
                        "exact": ACCUM_START + ACCUM_STEP * ACCUM_STEPS}
                       for name, d in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16))])
totals = totals.set_index("dtype")
exercises.reveal("fp16 running total", PREDICT_FP16_TOTAL, totals.loc["fp16", "running total in dtype"])
stalled = [d for d in totals.index if totals.loc[d, "running total in dtype"] < ACCUM_START + 0.5 * ACCUM_STEP * ACCUM_STEPS]
err = (totals.drop(columns="exact").sub(totals.exact, axis=0)).abs()  # distance from the exact total
wider = [d for d in ("fp16", "bf16") if err.loc[d, "torch.sum in dtype"] < err.loc[d, "running total in dtype"]]
print(f"the running total stalled (ended below halfway) in: {', '.join(stalled) or 'none'}; torch.sum of the same "
      f"numbers landed closer to the exact total in: {', '.join(wider) or 'none'}"
      + (" — it accumulates in a wider type inside, as matmul kernels accumulate fp16/bf16 products in fp32" if wider else ""))
totals

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Predict the footprint
#
# `labkit.model.sizing` counts parameters on a meta-device model and multiplies by bytes per parameter.

# %% slideshow={"slide_type": "fragment"}
MODEL = models.resolve()  # the model the variants load: LABKIT_MODEL, else the default
predicted = {d: sizing.estimate(MODEL, dtype=d, context=1).weight_bytes for d in VARIANTS}
pd.DataFrame({"dtype": VARIANTS, "predicted_MiB": [predicted[d] / 2**20 for d in VARIANTS]})

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · Measure: load, TTFT, decode, quality
#
# Each variant is loaded, scored on `data/eval/labkit_eval.txt` (English and Chinese) and
# [teacher-forced](../docs/glossary.md#teacher-forcing) on the fp32
# model's own continuations of the prompts in `data/prompts.json` (fed those tokens, scored at each position),
# then released; then all are loaded
# together and their decode timed in `REPEATS` rounds of `NEW_TOKENS` greedy tokens, each round in a shuffled
# order (bf16 fp32 fp16, fp16 bf16 fp32, …), so a busy minute slows all of them alike. Round i of fp16 and round i
# of fp32 ran side by side: each variant is judged against fp32 pair by pair (a
# [paired test](../docs/glossary.md#paired-test), at least 6 pairs).
# Predict: how many times as fast as fp32 do fp16 and bf16 decode on this machine?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FP16_DECODE_RATIO = None  # your prediction: fp16 decode tokens/s ÷ fp32's
PREDICT_BF16_DECODE_RATIO = None  # your prediction: bf16 decode tokens/s ÷ fp32's

# %% slideshow={"slide_type": "fragment"}
settings = measure.Settings(new_tokens=NEW_TOKENS, repeats=REPEATS, answer_tokens=ANSWER_TOKENS, n_questions=QUESTIONS,
                            ppl_window_tokens=PPL_WINDOW, ppl_stride_tokens=PPL_WINDOW, ppl_max_tokens=PPL_MAX_TOKENS,
                            ref_prompts=REF_PROMPTS, ref_new_tokens=REF_NEW_TOKENS)
inputs = measure.reference_inputs(settings)  # fp32's greedy continuations and log-probs, made once
print(models.reference_note())
machine.check("variants")
rows, drift = rounds.run(VARIANTS, inputs)  # each alone for memory and quality, then decode timed in rounds
print(f"decode timed in {REPEATS} rounds, each in a shuffled order; fp32 timed first and again after the last round: "
      f"again / first = {drift:.2f}" if drift else "decode timed in rounds, each in a shuffled order")
table = pd.DataFrame(rows).set_index("variant")
table[["status", "load_s", "weight_bytes", "predicted_weight_bytes", "ttft_s", "decode_tokens_per_s",
       "decode_spread", "doubts", "perplexity", "agreement", "kl"]]  # decode_spread: (p90 − p10) / median of the timed
# rounds; doubts: what makes a row rough on any machine, a wide spread or a drifting baseline (verdict.doubts)

# %% slideshow={"slide_type": "subslide"}
ok = table[table.status == "ok"]
plots.predicted_vs_measured(list(ok.index), list(ok.predicted_weight_bytes / 2**20), list(ok.weight_bytes / 2**20),
                            "Weight memory: sizing prediction vs loaded parameters", "MiB").show()
speed = ok.reset_index().melt(id_vars="variant", value_vars=["ttft_s", "tpot_s"], var_name="metric", value_name="seconds")
plots.bar(speed, x="variant", y="seconds", color="metric", title="Time to first token and time per output token",
          y_title="seconds (lower is better)").show()
speedup = {v: ok.decode_tokens_per_s[v] / ok.decode_tokens_per_s["fp32"] for v in ok.index if v != "fp32"}
for v, guess in (("fp16", PREDICT_FP16_DECODE_RATIO), ("bf16", PREDICT_BF16_DECODE_RATIO)):
    if v in speedup:
        exercises.reveal(f"{v} decode speed ÷ fp32's", guess, speedup[v], "×")
    else:
        print(f"{v}: not run here — {table.status[v]}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · Is half precision faster here?
#
# Prefill multiplies whole matrices (many FLOPs per weight byte); decode multiplies one vector per step
# by every weight (few: notebook 01's roofline placed both on this machine). A device without fp16/bf16
# matmul instructions converts half-precision weights back to fp32 as it computes: it saves bytes, not
# arithmetic. Below, both shapes timed directly, on this run's device, with the decode-like matmul's
# achieved GB/s (its weight bytes ÷ its time) beside each.

# %% slideshow={"slide_type": "fragment"}
shape = sizing.shape(MODEL)  # the lm_head's matrix: vocabulary × hidden size, the largest in the model
device = env.device()  # timed where the model ran: the GPU when there is one
def matmul_s(dtype: torch.dtype, rows: int) -> float:
    x = torch.randn(rows, shape.hidden_size, dtype=dtype, device=device)
    w = torch.randn(shape.vocab_size, shape.hidden_size, dtype=dtype, device=device)
    return timing.measure(lambda: torch.nn.functional.linear(x, w), repeats=MATMUL_REPEATS, warmup=1,
                          name=f"{dtype} × {rows} rows", device=device).median

shapes = pd.DataFrame([{"device": device, "dtype": str(d).replace("torch.", ""), "prefill-like (s)": matmul_s(d, MATMUL_TOKENS),
                        "decode-like (s)": matmul_s(d, 1)} for d in (torch.float32, torch.float16, torch.bfloat16)])
weight_bytes = shapes.dtype.map({"float32": 4, "float16": 2, "bfloat16": 2}) * shape.vocab_size * shape.hidden_size
shapes["decode-like GB/s"] = weight_bytes / shapes["decode-like (s)"] / 1e9  # achieved: weight bytes read / time
shapes

# %% slideshow={"slide_type": "fragment"}
rows_by = {r["variant"]: r for r in rows}
for v in (v for v in ok.index if v != "fp32"):
    ttft_v = verdict.compare(verdict.samples(rows_by[v], "ttft_s"), verdict.samples(rows_by["fp32"], "ttft_s"),
                             higher_is_better=False, paired=True)  # round i of each ran side by side: a pair
    dec_v = verdict.compare(verdict.samples(rows_by[v], "decode_tokens_per_s"),
                            verdict.samples(rows_by["fp32"], "decode_tokens_per_s"), paired=True)
    print(f"{v}: TTFT {ttft_v.ratio:.2f}× fp32's ({verdict.said(ttft_v, 'shorter', 'longer')}); "
          f"decode speed {dec_v.ratio:.2f}× fp32's ({verdict.said(dec_v)})")
reason = hardware.fast_half_matmul_reason()
print(f"half-precision arithmetic on {device}:", hardware.native_half_said(device))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · Quality: did halving the bytes change the answers?
#
# **Perplexity** on the evaluation text (lower is better), **agreement**: the share of positions where
# the variant's top token is fp32's greedy token, **KL**: how far its next-token distribution is
# from fp32's, in nats (0 = identical).

# %% slideshow={"slide_type": "fragment"}
table[["perplexity", "agreement", "kl", "kl_max"]]

# %% slideshow={"slide_type": "fragment"}
qs = prompts.load_prompts("questions")[:QUESTIONS]
quality.side_by_side(qs, {v: table.answers[v] for v in ok.index})

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
res = results.Results("02_fp16_bf16")
res.notes.update(settings=settings.to_dict(), cpu_features=hardware.cpu_features(), half_matmul_reason=reason,
                 half_precision=hardware.half_precision_features())
res.replace("variants", [{k: v for k, v in r.items() if k != "options"} for r in rows])
res.replace("matmul", shapes.to_dict("records"))
res.replace("accumulation", totals.reset_index().to_dict("records"))
mm = shapes.set_index("dtype").rename(index={"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"})
matmul_times = {v: {"prefill": mm.loc[v, "prefill-like (s)"], "decode": mm.loc[v, "decode-like (s)"]} for v in mm.index}
found = nb02.findings.takeaways(rows=rows, matmul_s=matmul_times, half_reason=reason,
                                mantissa_bits=formats.mantissa_bits.to_dict(),
                                rounded={"fp16": demo.fp16.tolist(), "bf16": demo.bf16.tolist()},
                                sums=totals["running total in dtype"].to_dict(),
                                accumulation=(ACCUM_START, ACCUM_STEP, ACCUM_STEPS),
                                matmul_gbs=mm["decode-like GB/s"].to_dict())
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)
res.frame("variants")[["variant", "weight_bytes", "load_s", "ttft_s", "decode_tokens_per_s", "perplexity", "agreement", "kl"]]

# %% slideshow={"slide_type": "subslide"}
# the same measurements from a GPU, where one ships (data/reference/02_fp16_bf16.<gpu>.json, each with its provenance)
_ = references.show("02_fp16_bf16", ["variants", "matmul"], source="gpu")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The two exercises sit where their mechanism is taught: `02.float_max` in section 1 and `02.accumulate`
# in section 2 (the totals table uses your function once it is correct). Change an answer, run its check
# cell again, then the cells after it. To go further:
#
# 1. Change `bf16_bits` to round half away from zero instead of ties to even: on how many of the values do
#    you now differ from `tensor.bfloat16()`?
# 2. On a GPU (set `LABKIT_DEVICE=cuda`), re-run section 4: which of TTFT and decode speed improves
#    with fp16, and by how much against the 2× that bytes alone would predict?

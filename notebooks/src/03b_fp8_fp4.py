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
# # 03b · FP8 and FP4: the formats Hopper and Blackwell serve with
#
# H100, H200 and B200 serve LLMs in FP8: 8-bit floats with a scale per row. Blackwell adds 4-bit floats in small
# blocks (NVFP4, MXFP4). Write each format, measure what it costs in answers, and time FP8 here, beside GPUs
# that have it.

# %% [markdown] slideshow={"slide_type": "notes"}
# Notebook 03 came first: its absmax scales, blocks and NF4 are the ideas these formats refine. Every quality
# number here is measured on this machine; no kernel for FP8 or FP4 runs on a laptop CPU, so the formats are
# *fake-quantised* (rounded, then held in fp32) for quality, and only FP8's GEMM is timed.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Write FP8 E4M3 rounding from its definition (binades, a 3-bit mantissa, subnormals, saturation at 448) and
#   use it with a per-channel scale on a real layer.
# - Write the NVFP4 and MXFP4 block quantisers (E2M1 values; an E4M3 or a power-of-two, [E8M0](../docs/glossary.md#e8m0), scale per block) and
#   compute each format's bits per weight, scales included.
# - Put FP8 and FP4 beside int8, int4 and NF4 on the whole model in one quality table (perplexity, agreement,
#   KL against fp32), and read from the per-layer errors why NVFP4 loses less than MXFP4.
# - Time FP8 GEMMs on this CPU against fp32 and bf16 with verdicts, and read why they are slower here than on
#   Hopper and Blackwell, beside a GPU's measured and vendors' published figures.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: three exercises (E4M3 rounding, NVFP4, MXFP4), about six minutes each. Collect the predictions
# before each reveal: FP8 against int8 on one layer (most guess FP8 is closer; per-channel int8 wins on a
# trained layer), MXFP4 against NVFP4, the 4-bit row closest to fp32, and FP8's speed here (most guess
# "faster": on a CPU it is far slower). The model-wide table takes about a minute in quick mode: talk through
# the split table meanwhile. `make gpu-check` on a GPU runs [vLLM](../docs/glossary.md#vllm)'s real FP8 path (`--quantization fp8`) and an
# FP8 KV cache; `python -m bench.llm_compressor` writes real compressed-tensors checkpoints.

# %% slideshow={"slide_type": "slide"}
import labkit
import pandas as pd
import torch
from IPython.display import display
from labkit.core import config, cpu, env, machine, results
from labkit.model import models, prompts, sizing
from labkit.precision import formats, fp8_gemm, measure, quantisers
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb03b

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("torch", "transformers", "bitsandbytes")})
print("FP8/FP4 dtypes in this torch:", [d for d in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn_x2")
                                        if hasattr(torch, d)])

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
FORMAT_VARIANTS = config.pick(["fp8-tensor", "fp8-channel", "int8-channel", "nvfp4", "mxfp4", "int4-g64"],  # rounded
                              ["fp8-channel", "int8-channel", "nvfp4", "mxfp4"])  # (labkit.precision.variants); quick:
# the three standards and weights-only int8 beside FP8 (the same bytes, an even grid)
LIBRARY_VARIANTS = ["bnb-int8", "bnb-nf4"]  # the real int8 and NF4 of notebook 03, measured the same way
PPL_WINDOW = 512  # tokens per perplexity window
PPL_MAX_TOKENS = config.pick(None, 128)  # tokens of data/eval text scored (None: all of it)
REF_PROMPTS = config.pick(12, 3)  # prompts from data/prompts.json for agreement and KL (a verdict needs 3)
REF_NEW_TOKENS = config.pick(32, 12)  # reference continuation tokens per prompt
GEMM_M = config.pick((1, 16, 256), (1, 256))  # GEMM rows timed: 1 is one decode step, 256 a prefill
GEMM_ROUNDS = config.pick(8, 6)  # rounds per shape, each in a shuffled order: pairs for the paired verdict
PROBE_LAYER = "model.layers.0.mlp.down_proj"  # the Linear quantised by hand, as in notebook 03
ORIGINAL_WEIGHTS = False  # full mode: True makes the original bf16 checkpoint the reference (a hub download)

# %% slideshow={"slide_type": "fragment"}
original = models.use_original_weights(ORIGINAL_WEIGHTS, config.quick())  # "" unless ORIGINAL_WEIGHTS is set
if original:
    print(original)
lm = models.load(dtype="fp32")  # the fp32 reference
print(models.reference_note())
PROBE_LAYER = models.down_proj_of(lm.model, PROBE_LAYER)  # a mixture of experts: that layer's shared or first expert's
mods = dict(lm.model.named_modules())
seen = {}
hook = mods[PROBE_LAYER].register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach()))
with torch.inference_mode():
    lm.model(**models.chat_inputs(lm.tokenizer, prompts.load_prompts("questions")[0], device=lm.device))
hook.remove()
w = mods[PROBE_LAYER].weight.detach().float()  # (out, in)
x = seen["x"].float().reshape(1, -1, w.shape[1])  # (1, T, in) its real input (an expert sees its tokens flattened)
y = x @ w.T  # the fp32 output, the reference
s8 = quantisers.absmax_scale(w, per_channel=True)  # notebook 03's int8: one absmax / 127 per row
q8, w_int8 = quantisers.int8_round_trip(w, s8)
code = torch.tensor(quantisers.NF4_CODE, device=w.device)  # notebook 03's NF4: 16 values, blocks of 64
idx, amax = quantisers.nf4_quantize(w.reshape(-1, 64), code)
w_nf4 = (code[idx] * amax).reshape(w.shape)
hand = pd.DataFrame(columns=["bytes", "weight_error", "output_error", "fraction_of_fp32"], dtype=float)
hand.loc["fp32"] = {"bytes": w.numel() * w.element_size(), "weight_error": 0.0, "output_error": 0.0, "fraction_of_fp32": 1.0}
for form, w_hat, stored in (("int8 per-channel", w_int8, q8.numel() * q8.element_size() + s8.numel() * s8.element_size()),
                            ("nf4", w_nf4, w.numel() // 2 + amax.numel() * amax.element_size())):
    hand.loc[form] = {"bytes": stored, "weight_error": ((w_hat - w).norm() / w.norm()).item(),
                      "output_error": ((x @ w_hat.T - y).norm() / y.norm()).item(),
                      "fraction_of_fp32": stored / hand.bytes["fp32"]}
print(f"{lm.name} on {lm.device}; {PROBE_LAYER}: weight {tuple(w.shape)}, input {tuple(x.shape)}")
hand

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · FP8: E4M3, by hand
#
# On an H100, H200 or B200 the default way to serve is FP8: weights (and activations) as 8-bit *floats*.
# An E4M3 value is a sign, 4 exponent bits (bias 7) and 3 mantissa bits: 8 values between two powers of two,
# so the step doubles with every binade, up to 448 (no infinity: E4M3 saturates). Below the smallest normal,
# 2^-6, the step stops shrinking at 2^-9 (the *subnormals*). E5M2 trades a mantissa bit for range. The table
# derives each element format's range from its bits (`labkit.precision.formats`). Write the rounding: the binade
# `floor(log2|x|)` (never below -6), the step `2^(binade − 3)`, the nearest multiple (ties to even:
# `torch.round`), saturating at ±448.

# %% slideshow={"slide_type": "fragment"}
pd.DataFrame([{"element": e.name, "bits": e.bits, "exponent_bits": e.exponent_bits, "mantissa_bits": e.mantissa_bits,
               "max": e.max, "min_normal": e.min_normal, "min_subnormal": e.min_subnormal}
              for e in formats.ELEMENTS.values()]).set_index("element")

# %% labkit={"exercise": "03.e4m3_round"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 values → the nearest FP8 E4M3 value of each, as fp32: ties to the even mantissa, saturating at ±448,
    subnormals (step 2^-9) below 2^-6. Without torch's float8 dtype: the check compares with its cast."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("03.e4m3_round", e4m3_round)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Per channel, on the same layer
#
# FP8 weights get a scale like int8's: `absmax / 448` per tensor or per output row, so the largest weight lands
# on E4M3's largest value. Both spend 8 bits a weight. Predict: on `PROBE_LAYER`, FP8 per-channel's output error
# as a multiple of int8 per-channel's (the table above)? Under 1: FP8 is closer to fp32.

# %% slideshow={"slide_type": "fragment"}
PREDICT_FP8_OVER_INT8 = None  # your prediction: FP8 per-channel output error / int8 per-channel output error (×)

# %% slideshow={"slide_type": "fragment"} tags=["mechanism"]
e4m3 = exercises.use("03.e4m3_round", e4m3_round, formats.round_e4m3)


def add_form(form: str, w_hat: torch.Tensor, fmt: str) -> None:
    """A row of `hand`: the layer's bytes at the format's bits per weight (scales included), its errors vs fp32."""
    stored = w.numel() * formats.bits_per_weight(fmt, shape=tuple(w.shape)) / 8
    hand.loc[form] = {"bytes": stored, "weight_error": ((w_hat - w).norm() / w.norm()).item(),
                      "output_error": ((x @ w_hat.T - y).norm() / y.norm()).item(),
                      "fraction_of_fp32": stored / hand.bytes["fp32"]}


for form, fmt, per_channel in (("fp8 per-tensor", "fp8-e4m3-tensor", False), ("fp8 per-channel", "fp8-e4m3-channel", True)):
    scale = quantisers.absmax_scale(w, per_channel, qmax=formats.E4M3.max)  # notebook 03's absmax, 448 for 127
    add_form(form, e4m3(w / scale) * scale, fmt)  # quantise, dequantise: the scale brings each row into E4M3's range
exercises.reveal("output error, FP8 per-channel / int8 per-channel", PREDICT_FP8_OVER_INT8,
                 hand.output_error["fp8 per-channel"] / hand.output_error["int8 per-channel"], "×")
hand

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · FP4: NVFP4 and MXFP4, one scale per small block
#
# E2M1 (2 exponent bits, 1 mantissa bit) has 8 magnitudes: 0, 0.5, 1, 1.5, 2, 3, 4, 6. Too few for a whole row,
# so every small block of weights along the input dim gets its own scale, as NF4's blocks of 64 did. Two standards:
#
# - **MXFP4** (OCP Microscaling): blocks of 32, the scale a power of two stored as E8M0 (an exponent alone),
#   `2^(floor(log2(absmax)) − 2)`: the block's absmax lands in [4, 8), and above 6 it clips.
# - **NVFP4** (Blackwell): blocks of 16, the scale an E4M3 number (`absmax / 6`, rounded to E4M3), and one fp32
#   scale per tensor (`absmax / (448 × 6)`) that brings the block scales into E4M3's range.
#
# `round_e2m1` and `round_e4m3` are labkit's (the same as yours). Write both quantisers: (out, in) → the
# dequantised (out, in); a block of zeros comes back as zeros.

# %% slideshow={"slide_type": "fragment"}
print("E2M1 values:", sorted(set(formats.e2m1_code_points())))
pd.DataFrame([{"format": n, "element_bits": f.element_bits, "scale_format": f.scale_format,
               "weights_per_scale": f.block or ("a row" if f.scale == "channel" else "the tensor"),
               "bits_per_weight": formats.bits_per_weight(n, shape=tuple(w.shape))}  # on PROBE_LAYER's shape
              for n, f in formats.FORMATS.items()]).set_index("format")

# %% labkit={"exercise": "03.nvfp4_quantize"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch
from labkit.precision.formats import round_e2m1, round_e4m3


def nvfp4_quantize(w: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32 weight → its NVFP4 round trip (out, in): blocks of 16 along the input dim, each with an E4M3
    scale (block absmax / 6, in units of the tensor scale absmax / (448 × 6)); E2M1 values; zero blocks stay zero."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("03.nvfp4_quantize", nvfp4_quantize)

# %% labkit={"exercise": "03.mxfp4_quantize"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch
from labkit.precision.formats import round_e2m1


def mxfp4_quantize(w: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32 weight → its MXFP4 round trip (out, in): blocks of 32 along the input dim, each with the
    power-of-two scale 2^(floor(log2(absmax)) − 2); E2M1 values; zero blocks stay zero."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("03.mxfp4_quantize", mxfp4_quantize)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 4.5 bits against 4.25 on the same layer
#
# NVFP4 spends a quarter bit more per weight than MXFP4. Predict: MXFP4's output error on `PROBE_LAYER` as a
# multiple of NVFP4's (above 1: MXFP4 is further from fp32). Then a table splits the two
# differences apart: block size and scale format.

# %% slideshow={"slide_type": "fragment"}
PREDICT_MXFP4_OVER_NVFP4 = None  # your prediction: MXFP4 output error / NVFP4 output error (×)

# %% slideshow={"slide_type": "fragment"} tags=["mechanism"]
nvfp4 = exercises.use("03.nvfp4_quantize", nvfp4_quantize, lambda w: formats.fake_quant(w, "nvfp4"))
mxfp4 = exercises.use("03.mxfp4_quantize", mxfp4_quantize, lambda w: formats.fake_quant(w, "mxfp4"))
add_form("nvfp4", nvfp4(w), "nvfp4")
add_form("mxfp4", mxfp4(w), "mxfp4")
add_form("int4 g64", formats.fake_quant(w, "int4-g64"), "int4-g64")  # the lab's int4 layout, beside NF4
exercises.reveal("output error, MXFP4 / NVFP4", PREDICT_MXFP4_OVER_NVFP4,
                 hand.output_error["mxfp4"] / hand.output_error["nvfp4"], "×")
split = nb03b.findings.fp4_split(w)  # E2M1 in blocks of 16 or 32, with a power-of-two or an E4M3 scale
display(hand)
split

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · The whole model in each format, quality first
#
# Every linear layer of the decoder rounded to each format (`FORMAT_VARIANTS`: `fp8-tensor`, `fp8-channel`,
# `int8-channel`, `nvfp4`, `mxfp4`, `int4-g64`; quick mode runs `fp8-channel`, `int8-channel`, `nvfp4` and `mxfp4`),
# the weights then held in fp32: what the format costs in answers, on the same prompts, against fp32's own answers.
# `int8-channel` is weights-only int8 with one scale per row, FP8 per-channel's twin in bytes: an even grid against
# E4M3's. No kernel for these formats runs on this CPU, so these rows
# have no speed (section 4 times FP8). `stored_MiB` is what a checkpoint holds, scales included;
# `predicted_MiB` is `labkit.model.sizing`'s figure for the format, what a serving engine holds. bitsandbytes'
# int8 and NF4 (notebook 03) run for real beside them. Predict: which
# 4-bit row comes closest to fp32 in KL?

# %% slideshow={"slide_type": "fragment"}
PREDICT_BEST_4BIT = None  # your prediction: "nvfp4", "mxfp4", "int4-g64" or "bnb-nf4"

# %% slideshow={"slide_type": "fragment"}
settings = measure.Settings(new_tokens=2, repeats=1, answer_tokens=2, n_questions=1,  # answers: notebook 03
                            ppl_window_tokens=PPL_WINDOW, ppl_stride_tokens=PPL_WINDOW, ppl_max_tokens=PPL_MAX_TOKENS,
                            ref_prompts=REF_PROMPTS, ref_new_tokens=REF_NEW_TOKENS)  # speed is section 4's, not this table's
inputs = measure.reference_inputs(settings)  # fp32's greedy continuations and log-probs, made once
machine.check("formats")
rows = list(measure.run(["fp32", *LIBRARY_VARIANTS, *FORMAT_VARIANTS], inputs=inputs, progress=False))
fmt_table = nb03b.findings.formats_table(rows, sizing.shape(lm.model.config))
closest, undecided = nb03b.findings.closest_4bit(rows, fmt_table)  # judged on KL per prompt
exercises.reveal_choice("4-bit row closest to fp32 (lowest KL)", PREDICT_BEST_4BIT, closest,
                        ["nvfp4", "mxfp4", "int4-g64", "bnb-nf4"], undecided=undecided)
print(models.four_bit_note())  # the reference's own 4-bit grid and what it does to these rows ("" for your own model)
fmt_table

# %% slideshow={"slide_type": "subslide"}
# layer by layer: the same rows' weight errors, NVFP4 against MXFP4
layers = nb03b.findings.layer_errors(rows, ["nvfp4", "mxfp4"])
plots.bar(layers.groupby(["kind", "variant"], as_index=False).relative_error.median(), x="kind", y="relative_error",
          color="variant", title="Median weight error per kind of layer",
          y_title="‖W − q(W)‖ / ‖W‖", text_auto=False).show()
print(nb03b.findings.layer_sentence(layers))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · FP8's speed: here, and where the hardware has it
#
# FP8 weights read a quarter of fp32's bytes; an FP8 GEMM does twice bf16's tensor-core FLOPs on Hopper. Neither
# helps without FP8 hardware: this CPU has none (`torch._scaled_mm` runs, emulated). Timed here on the model's
# own MLP shapes in `GEMM_ROUNDS` rounds, each in a shuffled order, and judged against fp32 round by round (a paired
# test): bf16, int8 and FP8 weights stored in one byte and
# upcast at every call (weight-only: the same bytes, two grids), and `torch._scaled_mm` (x and W both E4M3). At
# M = 1 (one decode step) a variant gains at most its bytes (fp32's 4 against FP8's 1): a verdict beyond that says
# rerun. The up and down matrices read the same bytes, so each one's fp32 is held against the other's: a baseline
# far off its twin is called anomalous. Predict: `torch._scaled_mm`'s speed against fp32 here, at M = 1 (the
# median over both matrices).

# %% slideshow={"slide_type": "fragment"}
PREDICT_SCALED_MM = None  # your prediction: fp8_scaled_mm speed / fp32 speed at M = 1 (×)

# %% slideshow={"slide_type": "fragment"}
machine.check("fp8 gemm")
on_gpu = str(lm.device).startswith("cuda")  # the model's device: a GPU times with CUDA events and bf16 activations
gemm_device, act = (str(lm.device), torch.bfloat16) if on_gpu else ("cpu", torch.float32)
gemm_on = torch.cuda.get_device_name(lm.device) if on_gpu else "cpu"
gemm = [{"what": what, **fp8_gemm.time_shape(m, k, n, gemm_device, act, rounds=GEMM_ROUNDS,
                                              sample_s=config.pick(0.005, 0.002) if on_gpu else config.pick(0.05, 0.01))}
        for m, k, n, what in fp8_gemm.model_shapes(GEMM_M, models.resolve())]
gemm = fp8_gemm.pair_twins(gemm)  # up and down read the same bytes: each baseline is held against its twin's
gemm_table = nb03b.findings.gemm_table(gemm)
scaled_mm_x = fp8_gemm.decode_step_gain(gemm, "fp8_scaled_mm")  # the median over both M = 1 shapes
if scaled_mm_x is not None:
    exercises.reveal("fp8_scaled_mm / fp32 speed at M = 1", PREDICT_SCALED_MM, scaled_mm_x, "×")
else:
    print("torch._scaled_mm does not run here:", next(r for r in gemm if r["M"] == 1)["fp8_error"])
print("timed on", gemm_on if on_gpu else cpu.machine_line(env.environment()["hardware"]))
gemm_table

# %% slideshow={"slide_type": "subslide"}
# the same GEMMs on a lent H200 (one probe run; its provenance below), then published FP8 and FP4 figures
h200 = results.load(config.DATA_DIR / "measured_gpu" / "fp8_gemm.nvidia-h200.json")
print("Measured on a lent GPU, not in this run:", results.provenance(h200), "|", h200.notes["note"],
      "| its verdicts:", nb03b.findings.judged_how(h200))
display(nb03b.findings.gemm_table(h200.section("gemm"), base="bf16"))
_ = references.show("03", source="published", precision=("FP8", "FP4"))  # vendor and project tables, each with its source and date

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · The real tools: llm-compressor writes the checkpoints, vLLM serves them
#
# What serves FP8 and FP4 in production is a checkpoint in the compressed-tensors format, written by
# [llm-compressor](https://github.com/vllm-project/llm-compressor), and vLLM, which picks a kernel for it at load.
# `make llmc` builds llm-compressor's own environment and `python -m bench.llm_compressor --save-to data/reference`
# writes FP8_DYNAMIC, NVFP4A16 and MXFP4A16 checkpoints of this model and serves each beside the fp32 folder, then
# tries an FP8 KV cache (five `vllm serve` starts: not in this notebook's run). Below: the run that ships, with where and when it was measured.
# On a GPU, `make gpu-check` runs vLLM's own FP8 (`--quantization fp8`) and an FP8 KV cache.

# %% slideshow={"slide_type": "fragment"}
tools_run = config.DATA_DIR / "reference" / "llm_compressor.json"
if tools_run.is_file():
    tools = results.load(tools_run)
    print("Measured by bench/llm_compressor.py, not in this run:", results.provenance(tools))
    display(tools.frame("checkpoints").reindex(columns=["scheme", "status", "format", "bytes", "seconds"]))
    display(tools.frame("served").reindex(columns=["name", "status", "tokens_vs_fp32", "equal_tokens", "compared_tokens",
                                                    "tpot_over_fp32", "kv_cache_tokens", "reason"]))
    print(nb03b.findings.fp8_kv_said(tools, cpu.cpu_isa()))  # its facts, rendered against this machine's ISA
else:
    print("No run of bench/llm_compressor.py ships: `make llmc vllm`, then `python -m bench.llm_compressor --save-to "
          "data/reference`.")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
res = results.Results("03b_fp8_fp4")
res.notes.update(settings=settings.to_dict(), probe_layer=PROBE_LAYER, gemm_m=list(GEMM_M), gemm_rounds=GEMM_ROUNDS)
res.replace("hand_quantised", hand.reset_index().to_dict("records"))
res.replace("variants", [{k: v for k, v in r.items() if k not in ("layer_errors", "answers")} for r in rows])
res.replace("formats", fmt_table.reset_index().to_dict("records"))
res.replace("fp4_split", split.reset_index().to_dict("records"))
res.replace("layer_errors", layers.to_dict("records"))
res.replace("fp8_gemm", [{k: v for k, v in r.items() if k != "samples"} for r in gemm])
found = nb03b.findings.takeaways(hand=hand, fmt_table=fmt_table, rows=rows, split=split, layers=layers, gemm=gemm,
                                 gpu_gemm=h200, gemm_on=gemm_on)
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The three exercises sit where their mechanism is taught: `03.e4m3_round` in section 1, `03.nvfp4_quantize`
# and `03.mxfp4_quantize` in section 2 (the layer tables use them once they pass). Change an answer, run its
# check cell again, then the cells after it. To go further:
# 1. **E5M2 for weights?** Add `("fp8 e5m2", "fp8-e5m2-channel", …)` to section 1's loop with
#    `formats.round_e5m2`: predict its error against E4M3's first. Why do FP8 recipes keep E5M2 for gradients?
# 2. **The MX clip.** Find the blocks of `PROBE_LAYER` whose absmax lands above 6 after MXFP4's scale: what
#    fraction of the layer's weights saturate, and does `2^ceil(log2(absmax / 6))` lower the error?
# 3. **Which layers hurt most?** On a copy of the model, round one kind of layer at a time to NVFP4
#    (`formats.fake_quant` on each `nn.Linear` whose name ends in that kind) and rank the kinds by KL against fp32.

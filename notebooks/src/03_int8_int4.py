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
# # 03 · INT8 and INT4: bitsandbytes and [ONNX Runtime](../docs/glossary.md#onnx-runtime)
#
# Quantisation stores weights in 8 or 4 bits. Published summaries promise a lot — "INT8: −75 %
# memory, about 2 % accuracy loss". Whether that holds depends on *how* a model is quantised and on
# the hardware that runs it.

# %% [markdown] slideshow={"slide_type": "notes"}
# Here every variant is measured in one run on this machine: weight bytes,
# peak memory, time to first token, decode speed, and three quality columns against fp32.
# ONNX Runtime runs a model exported to ONNX, an open format for computation graphs.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Write [absmax](../docs/glossary.md#absmax) int8 quantisation (the largest magnitude maps to 127), with one scale per tensor
#   or one per output row ([per-tensor, per-channel](../docs/glossary.md#per-tensor-per-channel)), and apply it to a real
#   layer of the model: its error against fp32 and its bytes, scales included.
# - Quantise a block of 64 weights to the nearest of NF4's 16 values, and measure the error.
# - Show that bitsandbytes and ONNX Runtime store what your quantiser computes (same int8 values, same bytes).
# - Load the same model as bitsandbytes [LLM.int8](../docs/glossary.md#llm-int8) (int8 matmuls, outlier features in fp16) and
#   NF4, and as ONNX Runtime fp32 and [dynamic int8](../docs/glossary.md#dynamic-quantisation) (activation scales at run time),
#   through one loader (`labkit.precision.variants`); put speed and quality side by side.
# - Read which kernel bitsandbytes ran on this machine, and why: it depends on the CPU's
#   [instruction sets](../docs/glossary.md#cpu-instruction-sets) (AVX2, AVX-512, VNNI, AMX).
# - Tell the real ONNX Runtime quantisation API from the one articles invent, and test published claims.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: the three exercises (per-channel scale, int8 round trip, nearest NF4 code) take ten minutes
# together; the layer table uses them once they pass. Collect predictions of the per-tensor / per-channel
# error ratio and of the bytes before the layer cell, and of the int8 speedup before the variants run,
# which takes several minutes on a laptop CPU: talk through the kernel question (integers or floats?)
# while it runs, then read the answer off the profiled operators. For "faster and wrong", show the
# per-tensor and per-channel rows' agreement and KL over all the reference prompts (section 7 prints
# them) and the per-layer errors of section 8, never one answer: one answer that happens to match
# proves nothing, and one that differs may be a single flipped token.

# %% slideshow={"slide_type": "slide"}
import labkit
import pandas as pd
import torch
from labkit.core import config, env, machine, memory, results, verdict
from labkit.model import hardware, models, onnx, prompts
from labkit.decoding import quality
from labkit.precision import libraries, measure, quantisers, rounds, variants
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb03

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("torch", "transformers", "bitsandbytes", "onnxruntime", "onnxscript")})
print("int8-relevant CPU flags:", {k: v for k, v in hardware.cpu_features().items()
                                   if "vnni" in k or k in ("avx2", "amx_int8", "asimddp", "i8mm")})
env.capabilities_frame().query("name in ['cuda', 'bitsandbytes', 'onnxruntime', 'onnx-export']")

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
VARIANTS = ["fp32", "fp16", "bnb-int8", "bnb-nf4", "ort-fp32", "ort-int8-tensor", "ort-int8-channel"]  # bf16: notebook 02
NEW_TOKENS = config.pick(32, 8)  # decode tokens per timed run
REPEATS = config.pick(8, 6)  # timed rounds over the variants, each in a shuffled order (after one warmup each): pairs
PPL_WINDOW = 512  # tokens per perplexity window
PPL_MAX_TOKENS = config.pick(None, 128)  # tokens of data/eval text scored (None: all of it)
REF_PROMPTS = config.pick(12, 3)  # prompts from data/prompts.json for agreement and KL (a verdict needs 3)
REF_NEW_TOKENS = config.pick(32, 12)  # reference continuation tokens per prompt
QUESTIONS = config.pick(5, 1)  # questions answered side by side
ANSWER_TOKENS = config.pick(24, 10)  # tokens per answer
LAYER_STEP = config.pick(1, 3)  # section 7 probes every LAYER_STEP-th decoder layer
PROBE_LAYER = "model.layers.0.mlp.down_proj"  # the Linear quantised by hand in sections 1-3
NF4_BLOCK = 64  # weights per NF4 block (one absmax each), as bitsandbytes stores them
ORIGINAL_WEIGHTS = False  # full mode: True makes the original bf16 checkpoint the reference (a hub download)

# %% slideshow={"slide_type": "fragment"}
original = models.use_original_weights(ORIGINAL_WEIGHTS, config.quick())  # "" unless ORIGINAL_WEIGHTS is set
if original:
    print(original)
lm = models.load(dtype="fp32")  # the fp32 reference, whose layers are quantised by hand below
print(models.reference_note())
qs = prompts.load_prompts("questions")[:QUESTIONS]
PROBE_LAYER = models.down_proj_of(lm.model, PROBE_LAYER)  # a mixture of experts: that layer's shared or first expert's
probe = [models.down_proj_of(lm.model, f"model.layers.{i}.mlp.down_proj")
         for i in range(0, lm.model.config.num_hidden_layers, LAYER_STEP)]
acts, mods = {}, dict(lm.model.named_modules())
hooks = [mods[n].register_forward_pre_hook(lambda m, a, n=n: acts.__setitem__(n, a[0].detach()))
         for n in {*probe, PROBE_LAYER}]
with torch.inference_mode():
    lm.model(**models.chat_inputs(lm.tokenizer, qs[0], device=lm.device))  # one real input per probed layer
for h in hooks:
    h.remove()
w = mods[PROBE_LAYER].weight.detach().float()  # (out, in)
x = acts[PROBE_LAYER].float().reshape(1, -1, w.shape[1])  # (1, T, in) its input (an expert sees (T, in): tokens flattened)
print(f"{lm.name} on {lm.device}; {PROBE_LAYER}: weight {tuple(w.shape)}, input {tuple(x.shape)}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Absmax int8, by hand
#
# int8 stores each weight as an integer code in [-127, 127] and one floating-point *scale*: the weight is
# about `code × scale`. Absmax picks the scale that maps the largest magnitude to 127. One scale for the
# whole matrix (*per tensor*), or one per output row (*per channel*): a row is one output feature, and
# rows of a trained layer differ in range. Write the per-channel scale.

# %% labkit={"exercise": "03.per_channel_scale"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def per_channel_scale(w: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32 weight → (out, 1) absmax int8 scales, one per output row."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("03.per_channel_scale", per_channel_scale)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The round trip: quantise, then dequantise
#
# Quantising divides by the scale and rounds to the nearest integer code, kept inside [-127, 127] and
# stored in one byte; dequantising multiplies the code by its scale again. Write both.

# %% labkit={"exercise": "03.int8_round_trip"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def int8_round_trip(w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) weight and its scale, (1, 1) or (out, 1) → (q, w_hat): the int8 codes (torch.int8, in
    [-127, 127]) and the dequantised weight (fp32, q × scale)."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("03.int8_round_trip", int8_round_trip)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Predict, then measure on a real layer
#
# Both forms on `PROBE_LAYER`'s real weight and its real input from one prompt. Predict: how many times
# larger is the layer's output error with one scale per tensor than with one scale per row? And what
# fraction of the fp32 layer's bytes does the int8 layer take, scales included?

# %% slideshow={"slide_type": "fragment"}
PREDICT_TENSOR_OVER_CHANNEL = None  # your prediction: output error per-tensor / per-channel (×)
PREDICT_LAYER_INT8_FRACTION = None  # your prediction: int8 layer bytes (codes + scales) / fp32 bytes

# %% slideshow={"slide_type": "fragment"} tags=["mechanism"]
scale_of = exercises.use("03.per_channel_scale", per_channel_scale, lambda w: quantisers.absmax_scale(w, per_channel=True))
round_trip = exercises.use("03.int8_round_trip", int8_round_trip, quantisers.int8_round_trip)
y = x @ w.T  # (1, T, out): the fp32 output, the reference
rows, quantised = [{"form": "fp32", "bytes": w.numel() * w.element_size(), "weight_error": 0.0, "output_error": 0.0}], {}
for form, scale in {"per-tensor": w.abs().max().reshape(1, 1) / 127, "per-channel": scale_of(w)}.items():
    q, w_hat = round_trip(w, scale)  # (out, in) int8 codes, (out, in) fp32 dequantised
    quantised[form] = q, scale, w_hat
    rows.append({"form": form, "bytes": q.numel() * q.element_size() + scale.numel() * scale.element_size(),
                 "weight_error": ((w_hat - w).norm() / w.norm()).item(),  # ‖Ŵ − W‖ / ‖W‖
                 "output_error": ((x @ w_hat.T - y).norm() / y.norm()).item()})  # ‖x Ŵᵀ − x Wᵀ‖ / ‖x Wᵀ‖
hand = pd.DataFrame(rows).set_index("form")
hand["fraction_of_fp32"] = hand.bytes / hand.bytes["fp32"]
hand

# %% slideshow={"slide_type": "fragment"}
ratio_tc = hand.output_error["per-tensor"] / hand.output_error["per-channel"]
exercises.reveal("output error, per-tensor / per-channel", PREDICT_TENSOR_OVER_CHANNEL, ratio_tc, "×")
exercises.reveal("int8 layer bytes / fp32", PREDICT_LAYER_INT8_FRACTION, hand.fraction_of_fp32["per-channel"])
row_range = w.abs().amax(dim=1)  # (out,) each row's absmax
print(f"row absmax runs from {row_range.min():.3g} to {row_range.max():.3g}: with one scale for all rows, the median "
      f"row's largest weight lands on code {127 * row_range.median() / row_range.max():.0f} of 127")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · NF4: 16 values, one absmax per block
#
# 4 bits give 16 codes. NF4 does not space them evenly: its 16 values are quantiles of a normal distribution
# scaled to [-1, 1], denser near zero where most weights are. Each block of 64 weights is divided by its own
# absmax, and each value is stored as the index of the nearest code. Below: the 16 values, read from the
# installed bitsandbytes. Write the quantiser.

# %% slideshow={"slide_type": "fragment"}
BNB = env.capability("bitsandbytes")
if BNB.available:
    from bitsandbytes.functional import get_4bit_type

    code = get_4bit_type("nf4", device=lm.device)  # (16,) the NF4 values bitsandbytes stores indices into
    print("NF4 code:", [round(v, 4) for v in code.tolist()])
else:
    print("bitsandbytes is not available here:", BNB.reason, "— sections 2-3 use labkit's copy of the NF4 values")
    code = torch.tensor(quantisers.NF4_CODE, device=lm.device)

# %% labkit={"exercise": "03.nf4_quantize"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def nf4_quantize(blocks: torch.Tensor, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 64) values and the (16,) NF4 code values → (indices, absmax): for each value the index (0…15) of
    the nearest code value after dividing its block by the block's absmax, (n, 64); each block's absmax, (n, 1)."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("03.nf4_quantize", nf4_quantize)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### One block, then the whole layer
#
# Predict: on the same layer, how many times larger is NF4's output error than per-channel int8's?

# %% slideshow={"slide_type": "fragment"}
PREDICT_NF4_OVER_INT8 = None  # your prediction: NF4 output error / per-channel int8 output error (×)

# %% slideshow={"slide_type": "fragment"} tags=["mechanism"]
nf4 = exercises.use("03.nf4_quantize", nf4_quantize, quantisers.nf4_quantize)
block = w.flatten()[:NF4_BLOCK]  # the layer's first 64 weights
idx, amax = nf4(block[None], code)  # (1, 64) code indices, (1, 1) absmax
pd.DataFrame({"weight": block.tolist(), "÷ absmax": (block / amax[0]).tolist(), "index": idx[0].tolist(),
              "code": code[idx[0]].tolist(), "dequantised": (code[idx[0]] * amax[0]).tolist()}).head(8).T.round(4)

# %% slideshow={"slide_type": "fragment"}
idx, amax = nf4(w.reshape(-1, NF4_BLOCK), code)  # every block of the layer
w_nf4 = (code[idx] * amax).reshape(w.shape)  # dequantised (out, in)
print(f"first block: absmax {block.abs().max():.4g}, error {(code[idx[0]] * amax[0] - block).norm() / block.norm():.3%}")
hand.loc["nf4"] = {"bytes": w.numel() // 2 + amax.numel() * amax.element_size(),  # two 4-bit codes per byte + absmax
                   "weight_error": ((w_nf4 - w).norm() / w.norm()).item(),
                   "output_error": ((x @ w_nf4.T - y).norm() / y.norm()).item(),
                   "fraction_of_fp32": (w.numel() // 2 + amax.numel() * amax.element_size()) / hand.bytes["fp32"]}
exercises.reveal("output error, NF4 / per-channel int8", PREDICT_NF4_OVER_INT8,
                 hand.output_error["nf4"] / hand.output_error["per-channel"], "×")
print(models.four_bit_note())  # what the reference's own 4-bit grid does to a 4-bit row ("" for your own model)
hand

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · The libraries compute the same thing
#
# bitsandbytes' loader casts each weight to fp16 and quantises it per row (`int8_vectorwise_quant`); its NF4
# uses `quantize_4bit` with blocks of 64. ONNX Runtime's `quantize_dynamic` (what `labkit.precision.variants` runs)
# stores int8 weights with symmetric absmax scales. Each is given the same weight as your quantiser: are
# the int8 values, the errors and the bytes the same?

# %% slideshow={"slide_type": "fragment"}
agree = libraries.library_agreement(w, x, quantised["per-channel"], w_nf4, hand, round_trip, scale_of)
for r in (agree.dropna(subset=["values"]) if "values" in agree else agree.iloc[:0]).itertuples():  # libraries that ran
    unit = " step" if "int8" in str(r.form) else ""  # NF4 rows compare dequantised values (see the form)
    same = "identical" if r.equal_values == r.values else \
        f"{r.values - r.equal_values:,} of {r.values:,} differ, by at most {r.max_value_diff:g}{unit}"
    print(f"{r.library}: values {same}; bytes {'equal' if r.our_bytes == r.their_bytes else 'differ'} "
          f"({r.our_bytes:,} vs {r.their_bytes:,})")
agree

# %% [markdown] slideshow={"slide_type": "fragment"}
# Where a few int8 values differ by one step, look at how each side divides: bitsandbytes computes
# `w × (127 / absmax)`, the quantiser above `w / (absmax / 127)`. For a value within a rounding error of a
# half step the two land on different sides of it.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · Predict: the whole model, every variant
#
# bitsandbytes quantises the decoder's linear layers and keeps embeddings, norms and the lm_head in fp16.
# ONNX Runtime's dynamic quantisation turns every weight into int8, embeddings included, and gives the
# tied lm_head its own int8 copy. Predict each variant's weight bytes as a fraction of fp32's, and how
# much faster the fastest int8 variant decodes than the same engine's fp32 (ONNX Runtime int8 against
# `ort-fp32`, bitsandbytes against PyTorch's `fp32`), on the device fp32 runs on.

# %% slideshow={"slide_type": "fragment"}
PREDICT_INT8_FRACTION = None  # your prediction: bnb-int8 weight bytes / fp32 weight bytes
PREDICT_NF4_FRACTION = None  # your prediction: bnb-nf4 weight bytes / fp32 weight bytes
PREDICT_INT8_SPEEDUP = None  # your prediction: fastest int8 variant's decode tokens/s / its engine's fp32's (×)

# %% slideshow={"slide_type": "fragment"}
pred = pd.DataFrame({"variant": VARIANTS, "predicted_MiB": [variants.predicted_weight_bytes(v) / 2**20 for v in VARIANTS]})
pred["fraction_of_fp32"] = pred.predicted_MiB / pred.predicted_MiB[pred.variant == "fp32"].item()
pred  # labkit.model.sizing's prediction, from the config alone

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · Export to ONNX (once; cached)
#
# transformers' own exporter traces the model's decode step (`torch.export`, then `torch.onnx`) into one
# ONNX graph that takes the KV cache in and gives it back, and ONNX Runtime runs it with the decode loop of
# `labkit.model.ort_decoder` (the one notebook 05 writes by hand). The files land in
# `labkit.core.config.cache_dir()` and are reused (`make setup` exports the default model, about a minute and a
# half on two cores); int8 versions are made from them on first use.

# %% slideshow={"slide_type": "fragment"}
folder, export_s = onnx.export_onnx()
print(f"{config.shown(folder)}: {onnx.onnx_bytes(folder) / 2**20:.0f} MiB",
      f"exported in {export_s:.1f} s" if export_s is not None else "(reused from the cache: the set-up exports it once)")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · Measure every variant, one after another
#
# Same prompts, same token counts. Memory: on a CPU the growth of this process's resident set from
# before the load to after the timed runs; on a GPU PyTorch's allocator peak above what was already
# allocated before the load (the fp32 model of sections 1–3 moves to the CPU first). On a CPU the load's
# peak (`load_peak_MiB`: it includes a one-time export or quantisation) and the runs' (`run_peak_MiB`) are
# also shown apart. A variant this
# machine cannot run becomes a row whose `status` says why. On a GPU, ONNX Runtime's dynamic int8
# rows run on the CPU [execution provider](../docs/glossary.md#execution-provider) (their `device` column says so): its
# int8 operators have no CUDA kernels. What runs int8 *on* a GPU is bitsandbytes LLM.int8 (the `bnb-int8` row), or static
# ([QDQ](../docs/glossary.md#qdq): ONNX QuantizeLinear/DequantizeLinear pairs) int8 on [TensorRT](../docs/glossary.md#tensorrt),
# NVIDIA's inference compiler, whose scales are [calibrated](../docs/glossary.md#calibration) ahead from sample inputs
# (notebook 08).

# %% slideshow={"slide_type": "fragment"}
settings = measure.Settings(new_tokens=NEW_TOKENS, repeats=REPEATS, answer_tokens=ANSWER_TOKENS, n_questions=QUESTIONS,
                            ppl_window_tokens=PPL_WINDOW, ppl_stride_tokens=PPL_WINDOW, ppl_max_tokens=PPL_MAX_TOKENS,
                            ref_prompts=REF_PROMPTS, ref_new_tokens=REF_NEW_TOKENS)
if lm.device.startswith("cuda"):
    models.release_gpu(lm)  # sections 1-3's fp32 model leaves the GPU: each variant's peak is its own
inputs = measure.reference_inputs(settings)  # fp32's greedy continuations and log-probs, made once
machine.check("variants")
rows, drift = rounds.run(VARIANTS, inputs)  # each alone for memory and quality, then decode timed in rounds
print(f"decode timed in {REPEATS} rounds, each in a shuffled order (each speed judged against its fp32 round by round); "
      f"fp32 timed first and again after the last round: again / first = {drift:.2f}" if drift else
      "decode timed in rounds, each in a shuffled order")
table = pd.DataFrame(rows).set_index("variant")
table["weight_MiB"] = table.weight_bytes / 2**20
table["peak_MiB"] = table.peak_memory_bytes / 2**20
for phase in ("load", "run"):  # on a CPU: the load's peak (a one-time export or quantisation) apart from the runs'
    table[f"{phase}_peak_MiB"] = pd.to_numeric(table[f"{phase}_peak_memory_bytes"], errors="coerce") / 2**20
cols = ["status", "device", "weight_MiB", "peak_MiB", "ttft_s", "decode_tokens_per_s", "decode_spread", "doubts",
        "perplexity", "agreement", "kl", "load_peak_MiB", "run_peak_MiB"]  # decode_spread: (p90 − p10) / median of the
# timed rounds; doubts: what makes a row rough on any machine, a wide spread or a drifting baseline (verdict.doubts)
print("peak memory source:", memory.sources_said(table.peak_memory_source.dropna()))
print(nb03.findings.peak_sentence(table))
for v, note in table.note.items():
    if note:
        print(f"{v}: {note}")
table[cols]

# %% slideshow={"slide_type": "subslide"}
ok = table[table.status == "ok"].reset_index()
fig = plots.scatter(ok, x="kl", y="decode_tokens_per_s", text="variant", color="backend",
                    title="Speed vs quality (up = faster, left = closer to fp32)",
                    x_title="KL divergence from fp32 (nats/token)", y_title="decode tokens/s")
fig.show()
base = table.loc["fp32"]
fraction = table.weight_bytes / base.weight_bytes  # measured weight bytes / fp32's
for v, predicted in (("bnb-int8", PREDICT_INT8_FRACTION), ("bnb-nf4", PREDICT_NF4_FRACTION)):
    if table.status[v] == "ok":
        exercises.reveal(f"{v} weight bytes / fp32", predicted, fraction[v])
    else:
        print(f"{v}: not measured here ({table.status[v]})")
fast, label = nb03.findings.fastest_int8(table)  # an int8 row on fp32's device; else both devices are named
if fast is not None:
    same_engine = nb03.findings.int8_base(table, fast)  # ort-fp32 for ONNX Runtime's int8: int8's gain, not the engine's
    exercises.reveal(label.replace("/ fp32", f"/ {same_engine}"), PREDICT_INT8_SPEEDUP,
                     table.decode_tokens_per_s[fast] / table.decode_tokens_per_s[same_engine], "×")
    if same_engine != "fp32":
        print(f"the engine's own gain, apart: {same_engine} decodes "
              f"{table.decode_tokens_per_s[same_engine] / base.decode_tokens_per_s:.2f}× PyTorch fp32's speed")
    print(f"{fast}: greedy agreement with fp32 {table.agreement[fast]:.0%}, KL {table.kl[fast]:.3g} nats/token")
    v8 = nb03.findings.int8_verdict(table, fast)
    print(f"verdict against {nb03.findings.int8_base(table, fast)} (the same engine's fp32): {v8.label} ({v8.reason})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Which kernel did bitsandbytes run?
#
# A quantised weight can be multiplied as integers, or converted back to floating point first. The
# installed bitsandbytes chooses per machine (its `backends/cpu/ops.py`): on a CPU, int8 goes through
# `torch._int_mm` only where torch ≥ 2.6 reports AVX-512, and NF4 uses a fused kernel only where the CPU
# has AVX512-BF16; elsewhere each falls back. On a GPU (`backends/cuda/ops.py`) int8 runs bitsandbytes' own
# int8 matmul, and every 4-bit call goes through `bitsandbytes::gemm_4bit`: a fused kernel for a few input
# rows (a decode step), a dequantised copy and a float matmul for many. Below: the conditions as this machine
# answers them, and the operators one decode-sized call of each layer really dispatched (profiled on
# `PROBE_LAYER`'s weight, on the device the variants ran on).

# %% slideshow={"slide_type": "fragment"}
routes = {}
if BNB.available:
    token = x[:, -1:]  # (1, 1, in): one decode step's input, where section 1 recorded it (the variants' device)
    dev = str(token.device)  # bnb_layer quantises onto w's device, the same one
    if not dev.startswith("cuda"):
        print("what bitsandbytes reads here:", libraries.bnb_cpu_conditions())
    for kind in ("int8", "nf4"):
        ops = libraries.ops_called(libraries.bnb_layer(w, kind), token)
        routes[kind] = libraries.bnb_route(kind, ops, dev)
        print(f"{kind} on {dev}: {routes[kind]}\n    bitsandbytes/int ops: {[o for o in ops if 'bitsandbytes' in o or 'int_mm' in o]}")
else:
    print("bitsandbytes is not available here:", BNB.reason)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7 · Same question, every variant
#
# A '≠' marks an answer that differs from fp32's. Agreement and KL above say how often and how far
# the variants drift on many prompts; one answer is only an anecdote.

# %% slideshow={"slide_type": "fragment"}
print(nb03.findings.forms_sentence(table, config.quick()))  # many prompts' KL judged by the verdict, never one answer
quality.side_by_side(qs, {v: table.answers[v] for v in ok.variant})

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8 · Per-tensor vs per-channel in ONNX Runtime — and a CPU instruction
#
# The same two forms as in section 1, now in ONNX Runtime's int8 kernel, which also quantises the
# activations (uint8, one scale per call). On x86 CPUs without VNNI, that kernel adds pairs of uint8×int8
# products into **16-bit** sums, which can saturate when weights use the full int8 range. `reduce_range`
# (7-bit weights) avoids it; `labkit.precision.variants` turns it on where `int8_saturation_risk()` says so. Below:
# the real ONNX Runtime kernel on each probed layer's real weights and activations, error against fp32.
# Which form keeps the error lower, layer by layer?

# %% slideshow={"slide_type": "fragment"}
print("this CPU is at risk of int8 saturation:", hardware.int8_saturation_risk(),
      "| reduce_range used above:", {v: table.options[v].get("reduce_range") for v in ok.variant if v.startswith("ort-int8")})
forms = {"per-tensor": (False, False), "per-channel, 8-bit": (True, False), "per-channel, 7-bit": (True, True)}
err = pd.DataFrame([{"layer": n.split(".")[2], "form": f, "relative_error": libraries.ort_matmul_error(mods[n].weight, acts[n], *pr)}
                    for n in probe for f, pr in forms.items()])
plots.bar(err, x="layer", y="relative_error", color="form", title="ONNX Runtime int8 error per MLP down_proj layer",
          y_title="‖Y_int8 − Y_fp32‖ / ‖Y_fp32‖", text_auto=False).show()
worst = err.groupby("form").relative_error.max()
print("worst layer error by form:", worst.round(3).to_dict())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9 · "ONNX Runtime: `use_quantized=True`" — an API that does not exist
#
# Articles write `use_quantized=True` to run a model in int8 with ONNX Runtime. Each call below runs here,
# next to the API that does the job: what does each one do?

# %% slideshow={"slide_type": "fragment"}
int8_folder, _ = onnx.quantize_onnx(per_channel=True)  # the cached file the ort-int8-channel row ran
claims_ort = libraries.audit_ort_claims(folder, int8_folder)
for c in claims_ort:
    print(f"[{c['source']}] {c['call']}\n    here: {c['what it does here']}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 10 · Do the published claims hold here?
#
# Claims: **FP16: −50 % memory, < 0.5 % accuracy loss; INT8: −75 % memory, ~2 % accuracy loss.**
# Memory: weight bytes against fp32's (within 5 points of the claim counts as holding). Accuracy:
# the relative rise in perplexity on the evaluation text (we accept up to 3 % for "~2 %"), with
# top-1 disagreement shown beside it. `ort-int8` is the ONNX int8 form with the lower KL against fp32 (section 7
# says whether the two forms differ beyond noise in this run).
# `memory_if_embedding_kept`: the claim again, with the embedding matrix (tied to `lm_head`) at 2 bytes a weight.

# %% slideshow={"slide_type": "fragment"}
by_variant = {r["variant"]: r for r in rows}
best = measure.best_of(rows, ["ort-int8-tensor", "ort-int8-channel"])
if best is not None:
    by_variant["ort-int8"] = best
embed = lm.model.get_input_embeddings().weight  # tied to lm_head in SmolLM2: one matrix, two uses
embed_share = embed.numel() / sum(p.numel() for p in lm.model.parameters())  # a tied matrix is counted once
tied = bool(getattr(lm.model.config, "tie_word_embeddings", False))
print(f"embedding: {embed.numel() / 1e6:.1f} M weights, {embed_share:.1%} of the model; tied to lm_head: {tied}")
claims = [("fp16", "FP16", -0.50, 0.005), ("bnb-int8", "INT8", -0.75, 0.03), ("ort-int8", "INT8", -0.75, 0.03)]
checked = []
for variant, label, mem_claim, loss_claim in claims:
    r = by_variant.get(variant, {"status": "not run"})
    if r["status"] != "ok":
        checked.append({"variant": variant, "claim": label, "note": f"not measured here: {r['status']}"})
        continue
    mem = r["weight_bytes"] / base.weight_bytes - 1
    loss = r["perplexity"] / base.perplexity - 1
    checked.append({"variant": r["variant"], "claim": label, "memory_change": mem, "memory_claim": mem_claim,
                    "memory_holds": verdict.holds(mem, mem_claim), "perplexity_rise": loss, "loss_claim": loss_claim,
                    "accuracy_holds": loss <= loss_claim, "top1_disagreement": 1 - r["agreement"],
                    "embedding_share": embed_share, "tied_embedding": tied,
                    "memory_if_embedding_kept": nb03.findings.embedding_kept_change(mem_claim, embed_share)})
checked = pd.DataFrame(checked)
checked

# %% slideshow={"slide_type": "fragment"}
for v in checked.itertuples():
    if hasattr(v, "memory_change") and pd.notna(v.memory_change):
        print(f"{v.claim} ({v.variant}): memory {v.memory_change:+.0%} vs claimed {v.memory_claim:+.0%} → "
              f"{'holds' if v.memory_holds else 'does not hold'}; perplexity {v.perplexity_rise:+.1%} vs ≤{v.loss_claim:.1%} → "
              f"{'holds' if v.accuracy_holds else 'does not hold'} on this machine")
        why = nb03.findings.memory_reason(v.memory_change, v.memory_claim, v.embedding_share, v.tied_embedding)
        if why:
            print(f"    memory: {why}")

# %% slideshow={"slide_type": "subslide"}
# the same measurements from a GPU, where one ships (data/reference/03_int8_int4.<gpu>.json, each with its provenance)
_ = references.show("03_int8_int4", "variants", ["variant", "status", "device", "weight_bytes", "peak_memory_bytes",
                                                 "ttft_s", "decode_tokens_per_s", "perplexity", "agreement", "kl"],
                    source="gpu")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
res = results.Results("03_int8_int4")
res.notes.update(settings=settings.to_dict(), cpu_features=hardware.cpu_features(),
                 int8_saturation_risk=hardware.int8_saturation_risk(), export_s=export_s, bnb_routes=routes)
res.replace("variants", [{k: v for k, v in r.items()} for r in rows])
res.replace("hand_quantised", hand.reset_index().to_dict("records"))
res.replace("library_agreement", agree.to_dict("records"))
res.replace("layer_error", err.to_dict("records"))
res.replace("ort_api", claims_ort)
res.replace("claims", checked.to_dict("records"))
found = nb03.findings.takeaways(table=table, hand=hand, agree=agree, routes=routes, layer_error=worst.to_dict(), claims=checked,
                                layers=err, probe_layer=PROBE_LAYER.split(".")[2], quick=config.quick())
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The three exercises sit where their mechanism is taught: `03.per_channel_scale` and `03.int8_round_trip`
# in section 1 (the layer table uses them), `03.nf4_quantize` in section 2. Change an answer, run its check
# cell again, then the cells after it. Notebook 03b takes the same ideas to FP8 and FP4, the formats Hopper and
# Blackwell serve with. To go further:
# 1. **Which layers hurt most?** Quantise one kind of layer at a time (q, k, v, o, gate, up, down,
#    lm_head) with `libraries.layer_sensitivity` and rank them by KL. What is special about the inputs of
#    the worst one?
# 2. **Block size.** Re-run section 2 with `NF4_BLOCK = 32` and `256`: predict the error and the bytes of
#    the absmax values first.

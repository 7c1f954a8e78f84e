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
# # 01 · Hardware sizing: will it fit, and how fast can it decode at most?
#
# Before buying a GPU or picking a precision, two questions decide almost everything: do the
# weights and the [KV cache](../docs/glossary.md#kv-cache) fit in memory, and how many tokens per second can decoding reach at
# best?

# %% [markdown] slideshow={"slide_type": "notes"}
# The KV cache holds the keys and values of every earlier token. Both answers follow from the model's
# config and two numbers about the hardware: how many bytes per
# second its memory delivers, and how many floating-point operations per second
# ([FLOP/s](../docs/glossary.md#flops)) its matrix units compute. You write the sizing formulas, measure both numbers on this machine, and place prefill and decode on the
# [roofline](../docs/glossary.md#roofline) they draw: the lower of the two limits, at each operation's FLOPs
# per byte.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Compute weight bytes per precision from a config (exercise): [fp16](../docs/glossary.md#fp16) and [bf16](../docs/glossary.md#bf16) are
#   16-bit floats, [int8](../docs/glossary.md#int8) 8-bit integers, [NF4](../docs/glossary.md#nf4) 4-bit codes; [FP8](../docs/glossary.md#fp8), [NVFP4](../docs/glossary.md#nvfp4)
#   and [MXFP4](../docs/glossary.md#mxfp4) are 8- and 4-bit floats with scales. Then KV-cache bytes per token,
#   with grouped-query attention ([GQA](../docs/glossary.md#gqa): query heads share key/value heads).
# - See how the KV cache grows with context and batch until it dwarfs the weights.
# - Read a GPU catalog: which GPU fits which model.
# - Measure this machine's memory bandwidth, write the [decode ceiling](../docs/glossary.md#decode-ceiling) (bandwidth ÷ bytes read per
#   step, exercise), measure real decode, and explain the gap with the operators one step runs.
# - Measure [matmul](../docs/glossary.md#matmul) (matrix multiplication) FLOP/s, compute a matmul's
#   [arithmetic intensity](../docs/glossary.md#arithmetic-intensity) (FLOPs per byte), and place prefill
#   and decode on the roofline: which of the two roofs limits each.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: ask the room for three numbers before the probes run and write them on the board: this
# laptop's memory bandwidth in GB/s, its decode tokens/s at batch 1, and its matmul GFLOP/s. The two
# exercises (weight bytes, decode ceiling) feed the tables after them; give five minutes each. The
# roofline chart is the slide to stay on: ask which roof each point sits under before revealing.

# %% slideshow={"slide_type": "slide"}
import collections
import pathlib

import pandas as pd
import torch

import labkit
from labkit.core import config, env, machine, memory, results, timing
from labkit.model import gpus, hardware, models, prompts, roofline, size_tables, sizing
from labkit.decoding import decode, generation, profiling
from labkit.engines import fusion
from labkit.lessons import exercises, findings, plots, widgets
from labkit.lessons import nb01

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})
print(env.hardware())

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
PUBLIC_MODELS = ["SmolLM2-135M-Instruct", "Qwen2.5-1.5B-Instruct", "Llama-2-7b", "Mistral-7B-v0.1",
                 "Llama-3.1-8B", "Qwen2-7B"]  # configs shipped in data/configs
DTYPES = ["fp32", "fp16", "fp8", "int8", "nf4", "nvfp4", "mxfp4"]  # weight precisions compared
KV_MODELS = ["Llama-2-7b", "Llama-3.1-8B"]  # full multi-head attention vs grouped-query attention
CONTEXTS = [512, 2048, 8192, 32768]  # tokens per sequence
BATCHES = [1, 4, 16]  # sequences
FIT_CONTEXT = 4096  # tokens per sequence for the fit table
PROBE_BYTES = 2**30  # bandwidth probe working set, bytes (far above the last-level cache)
DECODE_TOKENS = config.pick(64, 12)  # new tokens per timed decode
DECODE_BATCHES = config.pick([1, 2, 4, 8], [1, 4])  # batch sizes for the ceiling-vs-measured sweep
REPEATS = config.pick(5, 3)  # timed repeats per point (decode: rounds over the batch sizes, interleaved)
MATMUL_N = 2048  # the FLOP/s probe multiplies two n × n fp32 matrices (2n³ FLOPs)
PREFILL_TOKENS = config.pick(256, 128)  # prompt tokens of the prefill placed on the roofline
PREFILL_REPEATS = config.pick(5, 3)  # timed prefills (after one warmup)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Weights per precision
#
# A Llama-architecture decoder holds: the token embedding (vocabulary × hidden); per layer, four
# attention projections (`q_proj` and `o_proj` with `num_attention_heads` heads of `head_dim`, `k_proj`
# and `v_proj` with `num_key_value_heads`), three MLP matrices (`gate_proj`, `up_proj`, `down_proj`,
# hidden × intermediate) and two [RMSNorm](../docs/glossary.md#rmsnorm) weights (hidden each: a learned scale applied after
# normalising each token's vector); a final RMSNorm; and an output head ([`lm_head`](../docs/glossary.md#lm-head),
# vocabulary × hidden) unless `tie_word_embeddings` reuses the embedding. No biases. Write the bytes.

# %% labkit={"exercise": "01.weight_bytes"} slideshow={"slide_type": "skip"} tags=["exercise"]
def weight_bytes(config, bytes_per_param):
    """Bytes of a Llama-architecture model's weights, from its transformers config.

    ``config``: ``vocab_size``, ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``tie_word_embeddings``.
    ``bytes_per_param``: 4 for fp32, 2 for fp16/bf16.
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("01.weight_bytes", weight_bytes)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Your formula, labkit's count, the loaded tensors
#
# labkit does not use a formula: it builds the model on PyTorch's *meta* device (shapes, no memory) and
# counts its parameters, which is exact for any architecture. int8, fp8, nf4, nvfp4 and mxfp4
# [quantise](../docs/glossary.md#quantisation) the decoder's linear layers (store them in fewer bits) and add their
# scales: one per output row for int8 and fp8 (E4M3, what Hopper serves), one fp32 per 64 weights for nf4, one byte
# per 16 weights for nvfp4 and per 32 for mxfp4 (E2M1 elements, Blackwell's FP4); the rest stays fp16.

# %% slideshow={"slide_type": "fragment"}
cfg = {m: str(config.DATA_DIR / "configs" / m) for m in PUBLIC_MODELS}
bytes_of = exercises.use("01.weight_bytes", weight_bytes, lambda c, b: sizing.shape(c).n_params * b)
small = sizing.load_config(cfg["SmolLM2-135M-Instruct"])
print(f"SmolLM2-135M in fp32: {bytes_of(small, 4):,} bytes from the formula, "
      f"{sizing.weight_bytes(sizing.shape(small), 'fp32'):,} from the meta-device count")
prec = size_tables.precision_table(list(cfg.values()), DTYPES)
plots.bar(prec, x="model", y="weight_gib", color="dtype", title="Weight memory by precision", y_title="GiB").show()
print("bits per weight, scales included:", prec[prec.model == prec.model.iloc[0]].set_index("dtype")
      .bits_per_weight.round(2).to_dict())
prec.pivot(index="model", columns="dtype", values="weight_gib").round(2)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · The KV cache grows with context × batch
#
# Per token: 2 (K and V) × layers × KV heads × head_dim × bytes. Llama-3.1-8B has 8 KV heads for its
# 32 query heads (grouped-query attention); Llama-2-7b keeps 32 of each. How far apart do their lines
# sit, and where does the cache overtake the weights?

# %% slideshow={"slide_type": "fragment"}
kvt = size_tables.kv_table([cfg[m] for m in KV_MODELS], CONTEXTS, BATCHES)
kvt["series"] = kvt["model"] + " · batch " + kvt["batch"].astype(str)
plots.line(kvt, x="context", y="kv_gib", color="series", title="KV cache (fp16) vs context", x_title="context (tokens)",
           y_title="GiB", log_x=True, log_y=True).show()
big = kvt.iloc[kvt["kv_gib"].idxmax()]
per_tok = kvt.groupby("model").kv_bytes_per_token.first()
print(f"{big.model} at {big.context:,} tokens × batch {big.batch}: KV {big.kv_gib:.1f} GiB vs weights {big.weight_gib:.1f} GiB "
      f"({big.kv_gib / big.weight_gib:.1f}×); per token: " + ", ".join(f"{m} {b:,} bytes" for m, b in per_tok.items()))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The models of 2026 break the formula
#
# Each layer keeps what its kind keeps, and config.json says which kind it is (`layer_types`):
# - **[sliding-window](../docs/glossary.md#sliding-window)** layers keep only the last `sliding_window` tokens (Gemma 4: 25 of 30 layers, window 1024;
#   its 5 full layers use their own `global_head_dim` 512 and `num_global_key_value_heads`);
# - **linear-attention** layers (Qwen3.5's Gated DeltaNet, 3 of every 4 layers) keep a fixed-size state per
#   sequence, whatever the context;
# - **[latent attention](../docs/glossary.md#latent-attention)** (DeepSeek-V3, Kimi K2, `kv_lora_rank`): a serving engine keeps one latent of
#   `kv_lora_rank + qk_rope_head_dim` = 576 values per token and layer, no × 2 for K and V (transformers 4.57's
#   own cache kept the expanded keys and values instead; `transformers_gib` says what this run's transformers keeps).
#
# Predict first: at 32,768 tokens, how many GiB of bf16 KV cache does Gemma 4 26B-A4B keep for one sequence?
# The naive formula (2 × 30 layers × 8 KV heads × 256 × 2 bytes per token) says 7.5 GiB.

# %% slideshow={"slide_type": "fragment"}
PREDICT_GEMMA4_KV_GIB = None  # your prediction, GiB at 32,768 tokens

# %% slideshow={"slide_type": "fragment"}
NEW_MODELS = ["Llama-3.1-8B", "Mistral-7B-v0.1", "gemma-4-26B-A4B", "Qwen3.5-27B", "DeepSeek-V3"]
new_cfg = {m: str(config.DATA_DIR / "configs" / m) for m in NEW_MODELS}
layered = size_tables.kv_compare(list(new_cfg.values()), context=32768, dtype="bf16")
gemma4 = layered.set_index("model").loc["gemma-4-26B-A4B"]
exercises.reveal("Gemma 4 KV at 32k tokens, layer by layer", PREDICT_GEMMA4_KV_GIB, float(gemma4.layer_by_layer_gib), "GiB",
                 kind="computed")
print("naive: 2 × layers × KV heads × head_dim (hidden / heads where the config gives none; latent attention has "
      "no single head size: transformers' qk_rope_head_dim, so its naive figure is arbitrary); layer_by_layer: what "
      "each layer keeps; DeepSeek-V3's layer_by_layer is a serving engine's latent, transformers_gib this "
      "transformers' own cache")
layered.round(3)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Write it layer by layer
#
# One sequence's KV bytes at `context` tokens for a config dict with `layer_types` (a config without it is full
# attention everywhere, or sliding everywhere when it sets `sliding_window`). A full layer keeps every token, at
# `global_head_dim` and `num_global_key_value_heads` where the config gives them; a sliding layer keeps
# `min(context, sliding_window)` tokens; a linear-attention layer keeps no tokens (its fixed state is left out here).

# %% labkit={"exercise": "01.kv_layer_by_layer"} slideshow={"slide_type": "skip"} tags=["exercise"]
def kv_layer_by_layer(config, context, bytes_per_value):
    """KV-cache bytes one sequence of ``context`` tokens keeps, summed over the layers (a dict: config.json's
    decoder part). Each token of a layer keeps K and V: KV heads × head_dim values each."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("01.kv_layer_by_layer", kv_layer_by_layer)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### A [mixture of experts](../docs/glossary.md#mixture-of-experts) reads only its active experts
#
# Each token is routed to `num_experts_per_tok` of the `n_routed_experts` experts in every MoE layer: a decode
# step at batch 1 reads the active parameters, not all of them, and the bandwidth ceiling follows the active bytes.
# The memory still has to hold every expert. The ceilings below are one GPU's (`MOE_GPU`, its datasheet bandwidth):
# what its memory could stream if the weights fit, not a measurement.

# %% slideshow={"slide_type": "fragment"}
MOE_GPU, MOE_CONTEXT = "H200", 4096  # the GPU whose datasheet bandwidth the ceilings divide (data/gpus.json); tokens
moe = [sizing.estimate(str(config.DATA_DIR / "configs" / m), "bf16", context=MOE_CONTEXT, gpu=MOE_GPU)
       for m in ("DeepSeek-V3", "Kimi-K2-Instruct")]
print(f"decode ceilings at batch 1 on one {MOE_GPU} ({moe[0].bandwidth_gbs:,.0f} GB/s, the datasheet's), bf16, "
      f"{MOE_CONTEXT:,} tokens of context: an upper bound from bytes, not a measurement")
pd.DataFrame([{"model": pathlib.Path(e.model).name, "params_b": e.n_params / 1e9, "active_b": e.active_params / 1e9,
               "weights_gib": e.weight_bytes / 2**30, "read_per_token_gib": e.active_weight_bytes / 2**30,
               f"ceiling on {MOE_GPU}, tokens/s (active)": e.decode_tokens_per_s_ceiling,
               f"ceiling on {MOE_GPU} if all were read": e.bandwidth_gbs * 1e9 / (e.weight_bytes + e.kv_bytes)}
              for e in moe]).round(1)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Which GPU fits which model?
#
# Weights + KV at the context below must fit in 90 % of the card's memory (the rest goes to the
# CUDA context and activations). Figures from the vendors' datasheets, `data/gpus.json`.

# %% slideshow={"slide_type": "fragment"}
gpu_names = [g.name for g in gpus.catalog()]
fit = size_tables.fit_table([cfg[m] for m in PUBLIC_MODELS], gpu_names, ["fp16", "nf4"], context=FIT_CONTEXT)
fit.pivot_table(index=["model", "dtype"], columns="gpu", values="fits", aggfunc="first")[gpu_names]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · The first roof: memory bandwidth
#
# The probe reads a `PROBE_BYTES` working set, far larger than the last-level cache, and times each full
# read on this run's device. Predict: how many GB/s does this machine's memory deliver?

# %% slideshow={"slide_type": "fragment"}
PREDICT_BANDWIDTH_GBS = None  # your prediction, GB/s

# %% slideshow={"slide_type": "fragment"}
bw = hardware.bandwidth(device=env.device(), size_bytes=PROBE_BYTES, repeats=REPEATS * 3)
exercises.reveal(f"read bandwidth on {bw.device}", PREDICT_BANDWIDTH_GBS, bw.gbs, "GB/s")
print(f"best of {bw.read.n} reads; median {bw.median_gbs:.1f} GB/s")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The decode ceiling
#
# A decode step reads every weight once, for the whole batch, plus each sequence's KV cache so far, and
# yields one token per sequence. Bandwidth ÷ the bytes one step reads bounds the steps per second. Write
# the ceiling on aggregate tokens/s.

# %% labkit={"exercise": "01.decode_ceiling"} slideshow={"slide_type": "skip"} tags=["exercise"]
def decode_ceiling(weight_bytes, kv_bytes_per_token, context, batch, bandwidth_bytes_per_s):
    """The most tokens/s (all sequences together) decoding can reach at this bandwidth.

    ``weight_bytes``: the model's weights; ``kv_bytes_per_token``: KV cache per position of one sequence;
    ``context``: positions each sequence holds; ``batch``: sequences decoded together.
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("01.decode_ceiling", decode_ceiling)

# %% slideshow={"slide_type": "fragment"}
ceiling_of = exercises.use("01.decode_ceiling", decode_ceiling, sizing.decode_ceiling)
lm = models.load(dtype="fp32")
weight_b = memory.param_bytes(lm.model).bytes
kv_tok = sizing.kv_bytes_per_token(sizing.shape(lm.model.config), "fp32")  # the model that runs (LABKIT_MODEL too)
ctx = 32 + DECODE_TOKENS // 2  # mean context while decoding
ceiling_1 = ceiling_of(weight_b, kv_tok, ctx, 1, bw.gbs * 1e9)
print(f"{lm.name} on {lm.device}: weights {weight_b / 2**20:.0f} MiB, KV {kv_tok:,} bytes per token "
      f"→ ceiling {ceiling_1:.1f} tokens/s at batch 1 (labkit's sizing.decode_ceiling: "
      f"{sizing.decode_ceiling(weight_b, kv_tok, ctx, 1, bw.gbs * 1e9):.1f})")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · Measure: real decode against the ceiling, batch by batch
#
# [Greedy](../docs/glossary.md#greedy) decoding takes the most likely token at every step. The batch sizes are timed in
# [interleaved rounds](../docs/glossary.md#interleaved-rounds) (1 4 1 4 …, so drift hits each alike); each row keeps its
# [spread](../docs/glossary.md#spread), (p90 − p10) ÷ median of its samples.
#
# Predict: how many tokens/s does greedy decoding reach at batch 1 here, against the ceiling above?

# %% slideshow={"slide_type": "fragment"}
PREDICT_DECODE_TPS = None  # your prediction, tokens/s at batch 1

# %% slideshow={"slide_type": "fragment"}
res = results.Results("01_hardware_sizing")
res.add("bandwidth", **bw.to_dict())
machine.check("decode sweep")
decoded = generation.decode_rounds(lm.model, lm.tokenizer, DECODE_BATCHES, new_tokens=DECODE_TOKENS, rounds=REPEATS)
for d in decoded:  # batch sizes interleaved: 1 4 1 4 1 4 … 1, so drift hits every size alike
    b = d["batch"]
    ceiling = ceiling_of(weight_b, kv_tok, ctx, b, bw.gbs * 1e9)
    res.add("decode", batch=b, ceiling_tokens_per_s=ceiling, measured_tokens_per_s=d["aggregate_tokens_per_s"],
            ratio=d["aggregate_tokens_per_s"] / ceiling, tpot_s=d["tpot_s"], spread=d["spread"], n=d["n"],
            samples=d["samples"])
print("timed runs: " + ", ".join(f"batch {d['batch']} {d['n']}" for d in decoded) + f" (batch {decoded[0]['batch']} "
      "first and last: "
      f"last / first TPOT = {decoded[0]['drift']:.2f})")
dec = res.frame("decode")
plots.predicted_vs_measured([f"batch {b}" for b in dec.batch], list(dec.ceiling_tokens_per_s),
                            list(dec.measured_tokens_per_s), "Decode: roofline ceiling vs measured", "tokens/s").show()
one = dec.iloc[0]
exercises.reveal("decode at batch 1", PREDICT_DECODE_TPS, one.measured_tokens_per_s, "tokens/s")
print(f"batch 1: measured {one.measured_tokens_per_s:.1f} tokens/s = {one.ratio:.2f}× of the ceiling")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · The second roof: matmul FLOP/s
#
# The probe multiplies two `MATMUL_N` × `MATMUL_N` fp32 matrices: 2n³ FLOPs over 3n² values read or
# written, hundreds of FLOPs per byte, so what it measures is how fast the matrix units compute (each
# operation runs as one [kernel](../docs/glossary.md#kernel), a routine on the device).
# Predict: how many GFLOP/s does this run's device reach?

# %% slideshow={"slide_type": "fragment"}
PREDICT_GFLOPS = None  # your prediction, GFLOP/s (fp32)

# %% slideshow={"slide_type": "fragment"}
mm = hardware.matmul_flops(device=str(lm.device), n=MATMUL_N, dtype="fp32", repeats=REPEATS + 1)
peak_gflops = mm.tflops * 1e3
exercises.reveal(f"fp32 matmul on {mm.device}", PREDICT_GFLOPS, peak_gflops, "GFLOP/s")
res.add("flops", **mm.to_dict())
ridge = roofline.ridge_intensity(bw.gbs, peak_gflops)
print(f"the two roofs meet at {ridge:.1f} FLOPs per byte: a kernel doing fewer waits for memory, more for arithmetic")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Arithmetic intensity: FLOPs per byte moved
#
# Every linear layer multiplies T token rows by an (out, in) weight. Its FLOPs grow with T; the weight's
# bytes do not. The model's intensity is the sum over its linear layers (attention's own products are
# left out). Prefill keeps only the last position's [logits](../docs/glossary.md#logits) (one score per vocabulary token), so
# its output head runs one row.

# %% tags=["mechanism"]
def matmul_cost(tokens, out_features, in_features, bytes_per_value):
    """(tokens, in) activations × an (out, in) weight → (tokens, out): its FLOPs and the bytes it moves."""
    flops = 2 * tokens * out_features * in_features  # one multiply and one add per weight, per token row
    moved = (out_features * in_features  # the weight: read once, however many rows
             + tokens * in_features  # activations in
             + tokens * out_features) * bytes_per_value  # results out
    return flops, moved


def model_cost(model, rows, head_rows):
    """FLOPs and bytes of every nn.Linear in one forward over `rows` token rows (the output head: `head_rows`)."""
    head, flops, moved = model.get_output_embeddings(), 0, 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):  # weight (out_features, in_features)
            f, b = matmul_cost(head_rows if m is head else rows, m.out_features, m.in_features, m.weight.element_size())
            flops, moved = flops + f, moved + b
    return flops, moved

# %% slideshow={"slide_type": "fragment"}
shape = sizing.shape(lm.model.config)
rows = [dict(zip(("tokens", "flops", "bytes"), (t, *matmul_cost(t, shape.vocab_size, shape.hidden_size, 4))))
        for t in (1, 8, 64, 512, 4096)]
grid = pd.DataFrame(rows).assign(flops_per_byte=lambda d: d.flops / d.bytes)
same = all(matmul_cost(t, o, i, b) == roofline.matmul_cost(t, o, i, b) for t, o, i, b in [(1, 49152, 576, 4), (96, 1536, 576, 2)])
same &= model_cost(lm.model, 7, 1) == roofline.linear_traffic(lm.model, 7, 1)
print(f"the lm_head's ({shape.vocab_size} × {shape.hidden_size}) fp32 matmul, by token rows; "
      f"labkit's roofline.matmul_cost and linear_traffic {'agree' if same else 'DISAGREE'}")
grid

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7 · Prefill and decode on the roofline
#
# Decode at batch B runs B rows through each weight; a prefill of `PREFILL_TOKENS` tokens runs that many.
# Predict: which roof limits each, the bandwidth slope ([memory-bound](../docs/glossary.md#memory-bound)) or the compute flat
# (compute-bound)?

# %% slideshow={"slide_type": "fragment"}
PREDICT_DECODE_BOUND = None  # your prediction for decode at batch 1: "memory-bound" or "compute-bound"
PREDICT_PREFILL_BOUND = None  # your prediction for the prefill: "memory-bound" or "compute-bound"

# %% slideshow={"slide_type": "fragment"}
prompt = prompts.prompt_of_length(lm.tokenizer, PREFILL_TOKENS, device=lm.device)["input_ids"]  # (1, T) on the model's device
with torch.inference_mode():
    pre = timing.measure(lambda: decode.prefill(lm.model, prompt), repeats=PREFILL_REPEATS, warmup=1, name="prefill",
                         device=lm.device)
points = [("prefill", PREFILL_TOKENS, *model_cost(lm.model, PREFILL_TOKENS, 1), pre.median)]
points += [(f"decode, batch {r.batch}", r.batch, *model_cost(lm.model, r.batch, r.batch), r.tpot_s) for r in dec.itertuples()]
roof = pd.DataFrame(points, columns=["label", "rows", "flops", "bytes", "seconds"])
roof["intensity"] = roof.flops / roof.bytes
roof["gflops"] = roof.flops / roof.seconds / 1e9
roof["roof_gflops"] = [roofline.roof_gflops(i, bw.gbs, peak_gflops) for i in roof.intensity]
roof["bound"] = [roofline.bound(i, ridge) for i in roof.intensity]  # near the ridge: both roofs bind
roof["of_roof"] = roof.gflops / roof.roof_gflops
plots.roofline(bw.gbs, peak_gflops, roof, f"Roofline on {lm.device}: this run's probes and steps").show()
choices = ["memory-bound", "compute-bound"]
for what, guess, found in (("decode at batch 1", PREDICT_DECODE_BOUND, roof.bound.iloc[1]),
                           (f"prefill of {PREFILL_TOKENS} tokens", PREDICT_PREFILL_BOUND, roof.bound.iloc[0])):
    exercises.reveal_choice(what, guess, None if found == roofline.RIDGE else found, choices,
                            undecided=roofline.RIDGE_WHY)
res.replace("roofline", roof.to_dict("records"))
roof.round(3)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8 · Why the gap?
#
# The ceiling assumes every byte streams at full bandwidth and nothing else costs time. How many
# operators does one decode step run, and how many of them are matrix-vector products against a weight?
# Each operator has a fixed cost (on a GPU, a kernel launch). Counted below, on one step of this model.

# %% slideshow={"slide_type": "fragment"}
ids = models.chat_inputs(lm.tokenizer, generation.TIMED_PROMPT, device=lm.device)["input_ids"]
ops = fusion.decode_step_ops(lm.model, ids)  # the one count of "one decode step" notebooks 08 and 10 quote too
print("counted:", fusion.STEP_OPS_COUNTED)
n_linear = ops.count("linear")  # one per weight matrix: each a matrix-vector product at batch 1
n_attention = sum(profiling.op_group("aten::" + o) == "attention" for o in ops)
print(f"one decode step ran {len(ops)} operators: {n_linear} matrix-vector products against a weight, "
      f"{n_attention} attention kernels and {len(ops) - n_linear - n_attention} others; most frequent: "
      + ", ".join(f"{o} {n}" for o, n in collections.Counter(ops).most_common(6)))
_ = res.add("ops", total=len(ops), linear=n_linear, attention=n_attention, other=len(ops) - n_linear - n_attention)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Does the kernel stream the weight at full bandwidth?
#
# The same bytes read as the same matrix-vector product, on this run's device, with the weight stored as
# `nn.Linear` keeps it (out × in) and transposed. Do they reach the probe's bandwidth?

# %% slideshow={"slide_type": "fragment"}
probe = hardware.linear_layout_probe(out_features=shape.vocab_size, in_features=shape.hidden_size,
                                     repeats=REPEATS * 5, device=lm.device)  # this model's lm_head size
res.add("layout", device=probe["device"], linear_gbs=probe["linear_gbs"], transposed_gbs=probe["transposed_gbs"],
        weight_bytes=probe["weight_bytes"])
print(f"lm_head-sized matvec on {probe['device']}: nn.Linear layout {probe['linear_gbs']:.1f} GB/s, "
      f"transposed {probe['transposed_gbs']:.1f} GB/s, probe {bw.gbs:.1f} GB/s")

# %% [markdown] slideshow={"slide_type": "fragment"}
# Split each decode step into the time its bytes need at the probed bandwidth and the rest.
# As the batch grows, one step's fixed costs are shared by more sequences: does the time per
# generated token beyond the bytes shrink, and does the ratio to the ceiling rise with it? Then batch 1's
# step in three pieces: the bytes at the probe's bandwidth, the extra because the matrix-vector kernel
# reads slower than that (the layout probe above), and what its operators cost beyond both.

# %% slideshow={"slide_type": "fragment"}
dec["ideal_step_ms"] = [sizing.decode_bytes_per_step(weight_b, kv_tok, ctx, b) / (bw.gbs * 1e9) * 1e3 for b in dec.batch]
dec["overhead_ms_per_token"] = (dec.tpot_s * 1e3 - dec.ideal_step_ms) / dec.batch
plots.bar(dec, x="batch", y="overhead_ms_per_token", title="Time per generated token beyond the bandwidth bound",
          y_title="ms per token").show()
first, last = dec.iloc[0], dec.iloc[-1]
print(f"time per token beyond the bytes: {first.overhead_ms_per_token:.1f} ms at batch {int(first.batch)} → "
      f"{last.overhead_ms_per_token:.1f} ms at batch {int(last.batch)}; ratio to ceiling {first.ratio:.2f} → {last.ratio:.2f}")
gap = hardware.decode_gap(first.tpot_s, sizing.decode_bytes_per_step(weight_b, kv_tok, ctx, 1), bw.gbs, len(ops),
                          lm.device, gemv_gbs=probe["linear_gbs"], weight_bytes=weight_b)  # the counts and probes above
res.add("decode_gap", **gap)
print(gap["explanation"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9 · Try it live: does it fit, how fast at most?

# %% slideshow={"slide_type": "fragment"}
widgets.sizing_panel()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
res.replace("decode", dec.to_dict("records"))
fp = prec[prec.model == "SmolLM2-135M-Instruct"].set_index("dtype").weight_gib * 2**10
d1, pf = roof.iloc[1], roof.iloc[0]
found = nb01.findings.takeaways(weights_mib=fp.to_dict(), model="SmolLM2-135M", big=big, device=bw.device, gbs=bw.gbs,
                                peak_gflops=peak_gflops, ridge=ridge, decode=d1, prefill=pf, prefill_tokens=PREFILL_TOKENS,
                                ceiling=one, operators=len(ops), linear=n_linear, gap=gap, first=first, last=last)
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)
dec[["batch", "ceiling_tokens_per_s", "measured_tokens_per_s", "ratio", "overhead_ms_per_token", "spread"]].round(3)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The two exercises sit where their mechanism is taught: `01.weight_bytes` in section 1 (the table uses your
# formula once it is correct) and `01.decode_ceiling` in section 4 (the decode sweep's ceilings are yours
# once it is correct). Change an answer, run its check cell again, then the cells after it. To go further:
#
# 1. At what context does Llama-3.1-8B's fp16 KV cache (batch 1) outgrow its weights?
# 2. Predict the batch-1 decode ceiling of Qwen2.5-1.5B in nf4 on a T4, then in fp16 on an L4.
# 3. With `matmul_cost`, find the number of token rows at which the lm_head's matmul crosses this machine's
#    ridge; then set `PREFILL_TOKENS` below and above it and rerun section 7.

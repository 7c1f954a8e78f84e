# %% md slide
# # 01 · Hardware sizing: will it fit, and how fast can it decode at most?
#
# Before buying a GPU or picking a precision, two questions decide almost everything: do the
# weights and the KV cache fit in memory, and how many tokens per second can decoding reach at
# best? Both follow from the model's config and two numbers about the hardware. We predict them,
# then measure this machine and see how close a real decode gets to the prediction.

# %% md subslide
# ## Learning objectives
#
# - Compute weight bytes per precision and KV-cache bytes per token from a config (GQA aware).
# - See how the KV cache grows with context and batch until it dwarfs the weights.
# - Read a GPU catalog: which GPU fits which model.
# - Measure this machine's memory bandwidth, predict the decode ceiling (bandwidth ÷ bytes read per
#   token), measure real decode, and explain the gap.

# %% slide
import labkit
from labkit import config, engines, env, generation, hardware, memory, models, plots, results, sizing, widgets

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})
print(env.hardware())

# %% subslide parameters
PUBLIC_MODELS = ["SmolLM2-135M-Instruct", "Qwen2.5-1.5B-Instruct", "Llama-2-7b", "Mistral-7B-v0.1",
                 "Llama-3.1-8B", "Qwen2-7B"]  # configs shipped in data/configs
DTYPES = ["fp32", "fp16", "int8", "nf4"]  # weight precisions compared
KV_MODELS = ["Llama-2-7b", "Llama-3.1-8B"]  # full multi-head attention vs grouped-query attention
CONTEXTS = [512, 2048, 8192, 32768]  # tokens per sequence
BATCHES = [1, 4, 16]  # sequences
FIT_CONTEXT = 4096  # tokens per sequence for the fit table
PROBE_BYTES = 2**30  # bandwidth probe working set, bytes (far above the last-level cache)
DECODE_TOKENS = config.pick(64, 24)  # new tokens per timed decode
DECODE_BATCHES = config.pick([1, 2, 4, 8], [1, 4])  # batch sizes for the ceiling-vs-measured sweep
REPEATS = config.pick(3, 2)  # timed repeats per point

# %% md slide
# ## 1 · Weights per precision
#
# Parameters are counted on a model built on the *meta* device (no memory, exact for any
# architecture: biases, tied embeddings, GQA). Bytes per parameter: fp32 4, fp16/bf16 2;
# int8 and nf4 quantise the decoder's linear layers and add their scales, the rest stays fp16.

# %% fragment
cfg = {m: str(config.DATA_DIR / "configs" / m) for m in PUBLIC_MODELS}
prec = sizing.precision_table(list(cfg.values()), DTYPES)
plots.bar(prec, x="model", y="weight_gib", color="dtype", title="Weight memory by precision", y_title="GiB").show()
prec.pivot(index="model", columns="dtype", values="weight_gib").round(2)

# %% md slide
# ## 2 · The KV cache grows with context × batch
#
# Per token: 2 (K and V) × layers × KV heads × head_dim × bytes. Grouped-query attention
# (Llama-3.1: 8 KV heads for 32 query heads) shrinks it 4× against full multi-head attention (Llama-2).

# %% fragment
kv = sizing.kv_table([cfg[m] for m in KV_MODELS], CONTEXTS, BATCHES)
kv["series"] = kv["model"] + " · batch " + kv["batch"].astype(str)
plots.line(kv, x="context", y="kv_gib", color="series", title="KV cache (fp16) vs context", x_title="context (tokens)",
           y_title="GiB", log_x=True, log_y=True).show()
big = kv.iloc[kv["kv_gib"].idxmax()]
print(f"{big.model} at {big.context:,} tokens × batch {big.batch}: KV {big.kv_gib:.1f} GiB vs weights {big.weight_gib:.1f} GiB "
      f"({big.kv_gib / big.weight_gib:.1f}×)")

# %% md slide
# ## 3 · Which GPU fits which model?
#
# Weights + KV at the context below must fit in 90 % of the card's memory (the rest goes to the
# CUDA context and activations). Figures from the vendors' datasheets, `data/gpus.json`.

# %% fragment
gpus = [g.name for g in hardware.catalog()]
fit = sizing.fit_table([cfg[m] for m in PUBLIC_MODELS], gpus, ["fp16", "nf4"], context=FIT_CONTEXT)
fit.pivot_table(index=["model", "dtype"], columns="gpu", values="fits", aggfunc="first")[gpus]

# %% md slide
# ## 4 · Predict: this machine's bandwidth and the decode ceiling
#
# A decode step reads every weight once (plus the KV cache so far). So tokens/s can be at most
# **bandwidth ÷ bytes read per token** — the roofline ceiling. First measure the bandwidth with a
# working set far larger than the last-level cache.

# %% fragment
bw = hardware.bandwidth(size_bytes=PROBE_BYTES, repeats=REPEATS * 3)
lm = models.load(dtype="fp32")
weight_b = memory.param_bytes(lm.model).bytes
shape = sizing.shape("default")
kv_tok = sizing.kv_bytes_per_token(shape, "fp32")
ctx = 32 + DECODE_TOKENS // 2  # mean context while decoding
ceiling_1 = sizing.decode_ceiling(weight_b, kv_tok, ctx, 1, bw.gbs * 1e9)
print(f"bandwidth {bw.gbs:.1f} GB/s (median {bw.median_gbs:.1f}) · weights {weight_b / 2**20:.0f} MiB "
      f"→ predicted ceiling {ceiling_1:.1f} tokens/s at batch 1")

# %% md slide
# ## 5 · Measure: real decode against the ceiling, batch by batch

# %% fragment
res = results.Results("01_hardware_sizing")
res.add("bandwidth", **bw.to_dict())
for b in DECODE_BATCHES:
    d = generation.measure_decode(lm.model, lm.tokenizer, batch=b, new_tokens=DECODE_TOKENS, repeats=REPEATS)
    ceiling = sizing.decode_ceiling(weight_b, kv_tok, ctx, b, bw.gbs * 1e9)
    res.add("decode", batch=b, ceiling_tokens_per_s=ceiling, measured_tokens_per_s=d["aggregate_tokens_per_s"],
            ratio=d["aggregate_tokens_per_s"] / ceiling, tpot_s=d["tpot_s"], spread=d["spread"])
dec = res.frame("decode")
plots.predicted_vs_measured([f"batch {b}" for b in dec.batch], list(dec.ceiling_tokens_per_s),
                            list(dec.measured_tokens_per_s), "Decode: roofline ceiling vs measured", "tokens/s").show()
one = dec.iloc[0]
print(f"batch 1: measured {one.measured_tokens_per_s:.1f} tokens/s = {one.ratio:.2f}× of the ceiling")

# %% md slide
# ## 6 · Why the gap?
#
# The ceiling assumes every byte streams at full bandwidth and nothing else costs time. A
# 135M-parameter model runs ~200 small matrix-vector products and ~700 other small operators per
# token; each has a fixed overhead (on a GPU, a kernel launch), and a matrix-vector product may not
# reach full bandwidth in the library's kernel. Below, on this run's device, the same bytes read as
# the same matrix-vector product, weight stored as `nn.Linear` keeps it (out × in) and transposed.

# %% fragment
probe = hardware.linear_layout_probe(repeats=REPEATS * 5, device=lm.device)
res.add("layout", device=probe["device"], linear_gbs=probe["linear_gbs"], transposed_gbs=probe["transposed_gbs"],
        weight_bytes=probe["weight_bytes"])
print(f"lm_head-sized matvec on {probe['device']}: nn.Linear layout {probe['linear_gbs']:.1f} GB/s, "
      f"transposed {probe['transposed_gbs']:.1f} GB/s, probe {bw.gbs:.1f} GB/s")

# %% md fragment
# Split each decode step into the time the bytes need at the probed bandwidth and the rest
# (overhead). Per *generated token*, the overhead shrinks as the batch grows: one step's fixed
# costs — operator launches, Python, weight reads the kernel does not stream at full speed — are
# shared by more sequences. Whether the *ratio* to the ceiling rises too depends on how well the
# BLAS kernels scale from matrix-vector to small matrix-matrix products on this machine.

# %% fragment
dec["ideal_step_ms"] = [sizing.decode_bytes_per_step(weight_b, kv_tok, ctx, b) / (bw.gbs * 1e9) * 1e3 for b in dec.batch]
dec["overhead_ms_per_token"] = (dec.tpot_s * 1e3 - dec.ideal_step_ms) / dec.batch
plots.bar(dec, x="batch", y="overhead_ms_per_token", title="Time per generated token beyond the bandwidth bound",
          y_title="ms per token").show()
first, last = dec.iloc[0], dec.iloc[-1]
print(f"overhead per token: {first.overhead_ms_per_token:.1f} ms at batch {first.batch} → "
      f"{last.overhead_ms_per_token:.1f} ms at batch {last.batch}; ratio to ceiling {first.ratio:.2f} → {last.ratio:.2f}")
ids = models.chat_inputs(lm.tokenizer, "Write a short story about a lighthouse keeper.", device=lm.device)["input_ids"]
gap = hardware.decode_gap(first.tpot_s, sizing.decode_bytes_per_step(weight_b, kv_tok, ctx, 1), bw.gbs,
                          engines.count_eager_ops(lm.model, ids), lm.device)  # operators (kernel launches) per token
res.add("decode_gap", **gap)
print(gap["explanation"])
res.replace("decode", dec.to_dict("records"))
path = res.save()
print("saved", path)

# %% md slide
# ## 7 · Try it live: does it fit, how fast at most?

# %% fragment
widgets.sizing_panel()

# %% md slide
# ## Takeaways

# %% fragment
dec[["batch", "ceiling_tokens_per_s", "measured_tokens_per_s", "ratio", "overhead_ms_per_token", "spread"]].round(3)

# %% md fragment
# - Memory = weights (parameters × bytes) + KV (2 × layers × KV heads × head_dim × bytes × context × batch).
# - At long context or large batch the KV cache, not the weights, decides whether a model fits.
# - Decode at batch 1 is memory-bound: the ceiling is bandwidth ÷ bytes per token. Lower precision
#   raises it; batching shares each weight read across sequences.
# - A small model sits well below its ceiling: per-operator overhead (on a GPU, one kernel launch per
#   operator) and kernel efficiency, not bandwidth, dominate. The ratio and the explanation above say
#   by how much, and why, on this machine; a bigger `LABKIT_MODEL` moves decode towards the ceiling.
#
# ## Exercises
# 1. At what context does Llama-3.1-8B's fp16 KV cache (batch 1) outgrow its weights?
# 2. Predict the batch-1 decode ceiling of Qwen2.5-1.5B in nf4 on a T4, then in fp16 on an L4.

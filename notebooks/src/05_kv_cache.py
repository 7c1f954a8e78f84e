# %% md slide
# # 05 · The KV cache and attention: where decode time goes
#
# Each new token attends to every token before it. Without a cache the model recomputes the keys
# and values of the whole sequence at every step; with one it computes them once and keeps them.
# That trade — memory for time — is the KV cache. This notebook measures both sides: the bytes
# it holds against the sizing formula, the time it saves, static vs dynamic caches, attention
# kernels, and — with the profiler — which operators a prefill and a decode step spend time in.

# %% md subslide
# ## Learning objectives
#
# - Predict the KV cache's bytes from the config, then measure the tensors a `generate` returns.
# - See per-token latency stay flat with the cache and grow without it, and total time diverge.
# - Separate prefill (TTFT) from decode (TPOT) for short and long prompts.
# - Compare a dynamic and a static cache (with and without `torch.compile`) and attention
#   implementations (`eager`, `sdpa`, `flash_attention_2`).
# - Read a profiler table: how much of a step is matrix multiplication, attention, and the rest.

# %% slide
import pandas as pd

import labkit
from labkit import config, env, kv, models, plots, profiling, results, sizing

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "flash-attn")})
env.capabilities_frame().query("name in ['cuda', 'flash-attn', 'torch.compile']")

# %% subslide parameters
DTYPE = "fp16" if env.device() == "cuda" else "fp32"  # weights and KV cache precision
PROMPT = "Write a short story about a lighthouse keeper."
KV_NEW_TOKENS = 16  # new tokens for the cache-size check
KV_BATCHES = [1, 4]  # sequences per cache-size check
KV_CONTEXTS = config.pick([128, 512, 1024, 2048], [64, 256, 512])  # prompt tokens for the growth line
ON_TOKENS = config.pick(512, 64)  # new tokens with the cache
OFF_TOKENS = config.pick(256, 64)  # new tokens without it (every step re-runs the sequence)
POINTS = [16, 32, 64, 128, 256, 512]  # new-token counts at which total time is read off
SPLIT_PROMPTS = config.pick([32, 256, 1024], [32, 512])  # prompt tokens for prefill vs decode
SPLIT_TOKENS = config.pick(32, 12)  # new tokens per prefill/decode run
VARIANT_TOKENS = config.pick(64, 24)  # new tokens per cache-variant run
REPEATS = config.pick(3, 1)  # timed repeats per point
ATTN_PROMPT = config.pick(1024, 512)  # prompt tokens for the attention comparison
PROFILE_PROMPT = 128  # prompt tokens for the profiled prefill
COMPILE_HERE = not config.quick()  # compile the decode step here (too slow for quick mode on a CPU)

# %% md slide
# ## 1 · Predict: how many bytes does the cache hold?
#
# Per position: 2 (K and V) × layers × KV heads × head_dim × bytes per value. `generate` feeds
# every token but the last through the model, so a request of *p* prompt tokens and *n* new
# tokens leaves *p + n − 1* positions per sequence.

# %% fragment
lm = models.load(dtype=DTYPE)
shape = sizing.shape(lm.model.config)
per_pos = sizing.kv_bytes_per_token(shape, DTYPE)
print(f"{lm.name}: {shape.n_layers} layers × {shape.n_kv_heads} KV heads × {shape.head_dim} dims × 2 × "
      f"{sizing.DTYPE_BYTES[DTYPE]:g} bytes = {per_pos:,} bytes per position ({per_pos / 2**10:.0f} KiB)")

# %% md slide
# ## 2 · Measure: the tensors in the returned cache
#
# `generate(..., return_dict_in_generate=True)` hands back the cache; we sum the bytes of every
# key and value tensor and set them against `sizing.kv_bytes` for the same context and batch.

# %% fragment
sizes = [kv.measure_cache(lm.model, lm.tokenizer, PROMPT, KV_NEW_TOKENS, batch=b) for b in KV_BATCHES]
sizes.append(kv.measure_cache(lm.model, lm.tokenizer, PROMPT, KV_NEW_TOKENS, batch=1,
                              **kv.cache_variant_kwargs("static")))
sizes += kv.prefill_cache_sizes(lm.model, lm.tokenizer, KV_CONTEXTS)
kvdf = pd.DataFrame([s.to_dict() for s in sizes])
grow = kvdf.iloc[len(KV_BATCHES) + 1:]
plots.predicted_vs_measured([f"{c} tokens" for c in grow.context], list(grow.predicted_bytes / 2**20),
                            list(grow.measured_bytes / 2**20), "KV cache after prefill: formula vs tensors", "MiB").show()
print(f"measured / predicted over {len(kvdf)} caches: min {kvdf.ratio.min():.4f}, max {kvdf.ratio.max():.4f}")
kvdf

# %% md slide
# ## 3 · Cache on vs off: latency per token
#
# Predict: with the cache a decode step processes one new token, so its time should stay flat.
# Without it, step *t* re-runs all *p + t* tokens, so each step should be slower than the last.

# %% fragment
on = kv.timed_generate(lm.model, lm.tokenizer, PROMPT, ON_TOKENS, use_cache=True)
off = kv.timed_generate(lm.model, lm.tokenizer, PROMPT, OFF_TOKENS, use_cache=False)
tokens = pd.DataFrame(kv.per_token_rows(on, "cache on") + kv.per_token_rows(off, "cache off"))
plots.line(tokens, x="token", y="itl_s", color="variant", title="Time per generated token (first = TTFT)",
           x_title="generated token", y_title="seconds", markers=False).show()
n = min(on.n_out, off.n_out)
early = tokens[tokens.token.between(2, 9)].groupby("variant").itl_s.median()
late = tokens[tokens.token.between(n - 7, n)].groupby("variant").itl_s.median()
print(f"median step, tokens 2-9 → {n - 7}-{n}: cache on {early['cache on'] * 1e3:.0f} → {late['cache on'] * 1e3:.0f} ms, "
      f"cache off {early['cache off'] * 1e3:.0f} → {late['cache off'] * 1e3:.0f} ms")

# %% md subslide
# ### Total time for *n* new tokens
#
# Read off the same runs: the time from the call until token *n* arrived (greedy decoding makes
# the first *n* tokens of a long run identical to an *n*-token run).

# %% fragment
rows = []
for label, run in (("cache on", on), ("cache off", off)):
    pts = [p for p in POINTS if p <= run.n_out]
    rows += [{"variant": label, "new_tokens": n, "seconds": s} for n, s in kv.elapsed_at(run, pts).items()]
totals = pd.DataFrame(rows)
plots.bar(totals, x="new_tokens", y="seconds", color="variant", title="Total time for n new tokens",
          y_title="seconds").show()
wide = totals.pivot(index="new_tokens", columns="variant", values="seconds").dropna()
wide["speedup"] = wide["cache off"] / wide["cache on"]
print(f"at {wide.index[-1]} new tokens the cache is {wide.speedup.iloc[-1]:.1f}× faster")
wide

# %% md slide
# ## 4 · Prefill vs decode: TTFT and TPOT, short and long prompts
#
# Predict: prefill processes the whole prompt at once (matrix × matrix: compute-bound), so TTFT
# grows with the prompt; a decode step processes one token (matrix × vector: bandwidth-bound), so
# TPOT should barely move.

# %% fragment
split = pd.DataFrame(kv.prefill_decode_split(lm.model, lm.tokenizer, SPLIT_PROMPTS, SPLIT_TOKENS, repeats=REPEATS))
melted = split.melt(id_vars="prompt_tokens", value_vars=["ttft_s", "tpot_s"], var_name="metric", value_name="seconds")
plots.bar(melted.astype({"prompt_tokens": str}), x="prompt_tokens", y="seconds", color="metric",
          title="Prefill (TTFT) vs decode (TPOT)", y_title="seconds").show()
short, long_ = split.iloc[0].to_dict(), split.iloc[-1].to_dict()
n_short, n_long = int(short["prompt_tokens"]), int(long_["prompt_tokens"])
print(f"{n_long / n_short:.0f}× longer prompt: TTFT {long_['ttft_s'] / short['ttft_s']:.1f}×, "
      f"TPOT {long_['tpot_s'] / short['tpot_s']:.2f}×")
split

# %% md slide
# ## 5 · Dynamic vs static cache, with and without torch.compile
#
# A *dynamic* cache grows by concatenation at every step. A *static* cache allocates every
# position once and writes in place: its shapes never change, which is what lets `torch.compile`
# (and CUDA graphs on a GPU) compile the decode step once. The first call pays for that.

# %% fragment
variants = ["dynamic", "static"] + (["static+compile"] if COMPILE_HERE and env.capability("torch.compile").available else [])
vrows = [dict(r, where="this run") for r in
         kv.compare_cache_variants(lm.model, lm.tokenizer, variants, PROMPT, VARIANT_TOKENS, repeats=REPEATS)]
if "static+compile" not in variants:
    ref = results.reference(kv.REFERENCE_COMPILE)
    print("torch.compile of the decode step runs in full mode only (too slow for quick mode on a CPU); "
          "reference rows from", results.provenance(ref))
    vrows += [dict(r, where="reference") for r in ref.frame("cache_variants").to_dict("records")]
vdf = pd.DataFrame(vrows)
plots.bar(vdf, x="variant", y="tpot_s", color="where", title="Decode time per token by cache", y_title="seconds").show()
vdf[["variant", "where", "new_tokens", "first_call_s", "ttft_s", "tpot_s", "decode_tokens_per_s"]]

# %% md slide
# ## 6 · Attention implementations
#
# `eager` writes attention as matmul → softmax → matmul in PyTorch; `sdpa` calls PyTorch's fused
# `scaled_dot_product_attention`; `flash_attention_2` is a fused CUDA kernel for fp16/bf16 on
# NVIDIA GPUs. A long prompt shows the difference best: attention grows with its square.

# %% fragment
status = pd.DataFrame(kv.attention_status())
for r in status[~status.available].itertuples():
    print(f"{r.attn_implementation}: not run here — {r.reason}")
impls = list(status[status.available].attn_implementation)
attn = pd.DataFrame(kv.compare_attention(lm.model, lm.tokenizer, impls, ATTN_PROMPT, SPLIT_TOKENS, repeats=REPEATS))
plots.bar(attn, x="attn_implementation", y="ttft_s", title=f"TTFT for a {ATTN_PROMPT}-token prompt",
          y_title="seconds").show()
attn

# %% md slide
# ## 7 · Profiler view: where does one step spend its time?
#
# `torch.profiler` records every operator of one prefill and of the decode step after it. Self
# time counts each operator once (`aten::linear` calls `aten::mm`; only `aten::mm` gets the time).

# %% fragment
profiles = profiling.profile_prefill_decode(lm.model, lm.tokenizer, prompt_tokens=PROFILE_PROMPT)
profiling.groups_figure(profiles).show()
top = profiling.top_ops_frame(profiles, top=6)
dec = top[top.step.str.startswith("decode")].iloc[0]
print(f"decode: {dec['name']} takes {dec.share:.0%} of the step ({dec.calls} calls)")
top.assign(ms=top.self_us / 1e3).drop(columns="self_us").round(3)

# %% subslide
# the same measurements from a GPU, where one ships (data/reference/05_kv_cache.<gpu>.json, each with its provenance)
results.show_gpu_references("05_kv_cache", ["cache_on_off", "prefill_decode", "cache_variants", "attention"])

# %% md slide
# ## Takeaways

# %% fragment
res = results.Results("05_kv_cache")
res.replace("kv_bytes", kvdf.to_dict("records"))
res.replace("cache_on_off", totals.to_dict("records"))
res.replace("prefill_decode", split.to_dict("records"))
res.replace("cache_variants", vrows)
res.replace("attention", attn.to_dict("records"))
res.replace("profile_groups", profiling.groups_frame(profiles).to_dict("records"))
groups = profiling.groups_frame(profiles).set_index(["step", "group"]).share
dyn, sta = (vdf[(vdf.variant == v) & (vdf["where"] == "this run")].tpot_s.iloc[0] for v in ("dynamic", "static"))
res.replace("summary", [
    {"finding": "KV bytes measured / predicted", "value": kvdf.ratio.median()},
    {"finding": f"cache on vs off, {wide.index[-1]} new tokens (speedup ×)", "value": wide.speedup.iloc[-1]},
    {"finding": f"TTFT, {n_long} vs {n_short}-token prompt (×)", "value": long_["ttft_s"] / short["ttft_s"]},
    {"finding": f"TPOT, {n_long} vs {n_short}-token prompt (×)", "value": long_["tpot_s"] / short["tpot_s"]},
    {"finding": "TPOT static / dynamic cache (×)", "value": sta / dyn},
    {"finding": "decode step spent in matmul (share)", "value": groups[(profiles[1].step, "matmul")]},
])
print("saved", res.save())
res.frame("summary").round(3)

# %% md fragment
# - The cache's bytes follow the formula — layers × KV heads × head_dim × 2 × bytes, per position
#   and per sequence (the measured/predicted ratio above). Grouped-query attention keeps it small.
# - With the cache a decode step costs about the same at every position; without it, each step
#   re-runs the sequence and total time grows with the square of the length.
# - TTFT scales with the prompt, TPOT hardly does: prefill and decode are different workloads.
# - Read the profiler's matmul share: where decode is mostly matrix multiplication reading the
#   weights, fewer bytes per weight (notebooks 02, 03) speed it up more than a faster attention kernel.
#
# ## Exercises
# 1. Predict the KV-cache bytes of a batch of 8 sequences of 4096 tokens for this model in fp16,
#    then check with `kv.prefill_cache_sizes` (smaller context if memory is short).
# 2. Switch `DTYPE` to `"bf16"`: how do the measured cache bytes change, and does TPOT improve?
# 3. Profile with `attn_implementation="eager"`: which operators appear, and which group do they
#    fall into?

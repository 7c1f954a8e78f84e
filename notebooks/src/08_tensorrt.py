# %% md slide
# # 08 · TensorRT and compiled engines: what an inference compiler buys
#
# An eager framework runs a model one operator at a time: each reads its inputs from memory, writes
# its output back, and costs a launch. An inference compiler sees the whole graph first. It **fuses**
# chains of small operators into one kernel, **rewrites the graph** (folds constants, drops no-op
# reshapes, swaps recognised patterns for fused implementations), and **chooses precision** per
# layer, calibrating int8 scales on sample data. TensorRT does all three on NVIDIA GPUs; here we
# watch the same ideas with what runs on any machine: `torch.compile` and ONNX Runtime's graph
# optimiser, and measure what each costs to build and what it gives back.

# %% md subslide
# ## Learning objectives
#
# - Count the operators one eager decode step runs, and how many kernels a compiler fuses them into.
# - Measure `torch.compile` of the decode step (static KV cache): compile time against steady-state
#   tokens/s, and when it pays off.
# - Compare ONNX Runtime's graph optimisation levels (disabled, basic, extended, all): operators
#   left in the graph, session build time, TTFT and decode speed.
# - See why int8 needs calibration: choose one layer's activation scale from sample data three ways.
# - Read every row with its quality against the fp32 reference (greedy agreement, KL).

# %% slide
import pandas as pd

import labkit
from labkit import config, engines, env, generation, models, plots, quality, results

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "onnxruntime", "tensorrt")})
engines.capabilities_frame()

# %% subslide parameters
PROMPT = "Write a short story about a lighthouse keeper."  # the timed request
NEW_TOKENS = config.pick(32, 8)  # tokens per timed decode
REPEATS = config.pick(3, 1)  # timed runs per engine (after one warmup)
MAX_CACHE_LEN = 256  # static KV cache positions (prompt + new tokens must fit)
COMPILE_HERE = not config.quick()  # compiling the decode step takes minutes on 2 CPU cores: full mode only
ORT_LEVELS = engines.ORT_LEVELS  # ONNX Runtime graph optimisation levels compared
REF_PROMPTS = config.pick(6, 2)  # prompts in the quality reference
REF_TOKENS = config.pick(24, 8)  # greedy tokens per reference prompt
CALIBRATION_PROMPTS = config.pick(8, 3)  # prompts whose activations choose the int8 scale
PERCENTILE = 99.99  # the clipping percentile for calibration

# %% fragment
res = results.Results("08_tensorrt")
lm = models.load()
ids = models.chat_inputs(lm.tokenizer, PROMPT, device=lm.device)["input_ids"]
prompts = quality.prompts("prompts")
ref = quality.reference(lm.model, lm.tokenizer, prompts[:REF_PROMPTS], new_tokens=REF_TOKENS)
print(f"{lm.name} ({lm.dtype}) on {lm.device}; quality reference: {ref.n_tokens} greedy tokens of fp32 eager")

# %% md slide
# ## 1 · Predict: how many operators does one token cost?
#
# Every operator below is a kernel launch plus a trip of its inputs and outputs through memory.
# Most are tiny element-wise steps (RMSNorm's square, mean, rsqrt, multiply; rotary embeddings;
# SiLU × up-projection): a compiler can run each chain as one kernel, reading once and writing once.

# %% fragment
n_ops = engines.count_eager_ops(lm.model, ids, MAX_CACHE_LEN)
print(f"one eager decode step: {n_ops} PyTorch operators, {n_ops / lm.model.config.num_hidden_layers:.0f} per layer")

# %% md subslide
# ## Measure: eager with a static cache, then the same step compiled
#
# A static KV cache gives the decode step the same shapes at every token, so `torch.compile` builds
# it once (first call: trace, fuse, generate C++ or Triton, compile) and reuses it for every token.

# %% fragment
rows = []
eager = engines.StaticDecoder(lm.model, MAX_CACHE_LEN)
for name, dec in (("PyTorch eager, static cache", eager),):
    m = engines.measure_decoder(dec, ids, NEW_TOKENS, REPEATS)
    q = engines.decoder_quality(dec, ref)
    rows.append({"engine": name, "where": "this run", "build_s": None, "ttft_s": m["ttft_s"],
                 "decode_tokens_per_s": m["decode_tokens_per_s"], "agreement": q.agreement, "kl": q.kl})
dyn = generation.measure_decode(lm.model, lm.tokenizer, new_tokens=NEW_TOKENS, repeats=REPEATS, prompt=PROMPT)
rows.insert(0, {"engine": "PyTorch eager, dynamic cache", "where": "this run", "build_s": None, "ttft_s": dyn["ttft_s"],
                "decode_tokens_per_s": dyn["decode_tokens_per_s"], "agreement": 1.0, "kl": 0.0})
pd.DataFrame(rows).round(4)

# %% fragment
if COMPILE_HERE and engines.capability("torch.compile").available:
    compiled = engines.StaticDecoder(lm.model, MAX_CACHE_LEN, compile=True)  # an empty inductor cache: a cold build
    m = engines.measure_decoder(compiled, ids, NEW_TOKENS, REPEATS)
    q = engines.decoder_quality(compiled, ref)
    rows.append({"engine": "torch.compile (inductor), static cache", "where": "this run", "build_s": m["build_s"],
                 "ttft_s": m["ttft_s"], "decode_tokens_per_s": m["decode_tokens_per_s"], "agreement": q.agreement,
                 "kl": q.kl, "ir_nodes_before_fusion": m["ir_nodes_before_fusion"],
                 "generated_kernels": m["generated_kernels"], "eager_ops_per_step": n_ops})
else:
    reference = results.reference(engines.REFERENCE)
    why = "quick mode" if not COMPILE_HERE else engines.capability("torch.compile").reason
    print(f"torch.compile not run here ({why}: a cold compile takes minutes on 2 CPU cores); reference row from "
          + results.provenance(reference))
    rows += [dict(r, where="reference") for r in reference.section("engines") if r["engine"].startswith("torch.compile")]
torch_rows = pd.DataFrame(rows)
torch_rows.drop(columns=["section"], errors="ignore").round(4)

# %% subslide
tc = torch_rows[torch_rows.engine.str.startswith("torch.compile")].iloc[0]
st = torch_rows[torch_rows.engine == "PyTorch eager, static cache"].iloc[0]
gain_s_per_token = 1 / st.decode_tokens_per_s - 1 / tc.decode_tokens_per_s
print(f"{tc['where']}: inductor fused {tc.ir_nodes_before_fusion:.0f} IR nodes into {tc.generated_kernels:.0f} kernels; "
      f"compile {tc.build_s:.0f} s; decode {tc.decode_tokens_per_s:.1f} vs {st.decode_tokens_per_s:.1f} tokens/s eager "
      + (f"→ pays off after {tc.build_s / gain_s_per_token:,.0f} tokens" if gain_s_per_token > 0 else "→ no gain here"))

# %% md slide
# ## 2 · Graph-level optimisation: ONNX Runtime's levels
#
# The model exported once to ONNX (cached, as in notebook 03), then opened at each level:
# **basic** folds constants and removes redundant nodes; **extended** adds fusions of known patterns
# (layer norms, GELU, attention, MatMul + Add); **all** adds layout changes. The session's build time
# is the optimiser's work; the operator counts are read from the graph it produced.

# %% fragment
ort_rows, ops = [], {}
for level in ORT_LEVELS:
    built = engines.load_ort(level, count_ops=True)
    d = generation.measure_decode(built["model"], built["tokenizer"], new_tokens=NEW_TOKENS, repeats=REPEATS, prompt=PROMPT)
    q = quality.compare(built["model"], ref)
    ops[level] = built["ops"]
    ort_rows.append({"engine": f"ONNX Runtime, {level}", "where": "this run", "build_s": built["build_s"],
                     "ttft_s": d["ttft_s"], "decode_tokens_per_s": d["decode_tokens_per_s"], "agreement": q.agreement,
                     "kl": q.kl, "graph_ops": sum(built["ops"].values())})
    del built
pd.DataFrame(ort_rows).round(4)

# %% subslide
op_df = pd.DataFrame(ops).fillna(0).astype(int)
top = op_df.loc[op_df.max(axis=1).sort_values(ascending=False).index[:12]]
plots.bar(top.T.reset_index(names="level").melt(id_vars="level", var_name="operator", value_name="count"), x="level",
          y="count", color="operator", title="Operators in the optimised graph, by level", y_title="operators").show()
fused = engines.fused_ops(ops["disable_all"], ops["all"])
print(f"{sum(ops['disable_all'].values())} operators unoptimised → {sum(ops['all'].values())} at 'all'; "
      f"fused operators that appear: {fused}")

# %% md slide
# ## 3 · Precision calibration
#
# int8 stores a tensor as integers times one scale. For weights the scale is known ahead; for
# activations a static engine (TensorRT's int8) must fix it *before* serving, from sample inputs.
# Taking the largest value seen keeps every outlier but leaves few levels for the bulk; a
# percentile clips rare outliers. Dynamic int8 (notebook 03) measures each input at run time instead.

# %% fragment
cal = engines.calibrate_layer(lm.model, lm.tokenizer, prompts[:CALIBRATION_PROMPTS], quality.prompts("questions"),
                              percentile=PERCENTILE)
res.add("calibration", **{k: v for k, v in cal.to_dict().items() if k != "errors"}, **cal.errors)
print(f"{cal.layer}: absmax {cal.absmax:.2f}, p{PERCENTILE:g} {cal.percentile_value:.2f} over "
      f"{cal.calibration_values:,} calibration values")
lowest = min(cal.errors, key=cal.errors.get)
print(f"lowest error on held-out prompts: {lowest} ({cal.errors[lowest]:.4f})")
pd.Series(cal.errors, name="relative error of int8 activations (held-out prompts)").round(4)

# %% md slide
# ## 4 · TensorRT (NVIDIA GPU)
#
# With a GPU and TensorRT installed: ONNX Runtime's `TensorrtExecutionProvider` builds an engine from
# the exported graph, and torch-tensorrt compiles the decode step as a `torch.compile` backend. (Whole
# LLM engines come from TensorRT-LLM's `LLM` API, in its own environment; transformers has no
# TensorRT model class.)

# %% fragment
trt_rows = engines.tensorrt_rows(new_tokens=NEW_TOKENS, repeats=REPEATS, ref=ref, prompt=PROMPT)
for r in trt_rows:
    print(f"{r['engine']}: {'built' if r['status'] == 'ok' else 'not run — ' + r['status']}")
trt_rows = [dict(r, where="this run") for r in trt_rows if r["status"] == "ok"]

# %% md slide
# ## The table: build cost, speed and quality
#
# Every row decodes the same prompt greedily; quality is measured against fp32 eager on the
# reference prompts (agreement 1.0 and KL ≈ 0 mean the same answers).

# %% fragment
table = pd.DataFrame(rows + ort_rows + trt_rows)
res.replace("engines", table.drop(columns=["section"], errors="ignore").to_dict("records"))
res.save()
plots.bar(table, x="engine", y="decode_tokens_per_s", color="where", title="Decode tokens/s by engine",
          y_title="tokens/s").show()
table[["engine", "where", "build_s", "ttft_s", "decode_tokens_per_s", "agreement", "kl"]].round(4)

# %% subslide
# the same measurements from a GPU, where one ships (data/reference/08_tensorrt.<gpu>.json, each with its provenance)
results.show_gpu_references("08_tensorrt", "engines", ["engine", "where", "status", "build_s", "ttft_s", "decode_tokens_per_s", "agreement", "kl"])

# %% md slide
# ## Takeaways

# %% fragment
best = table.loc[table.decode_tokens_per_s.idxmax()]
base = table[table.engine == "PyTorch eager, dynamic cache"].iloc[0]
print(f"fastest decode: {best.engine} ({best['where']}), {best.decode_tokens_per_s / base.decode_tokens_per_s:.2f}× "
      f"eager, agreement {best.agreement:.3f}, KL {best.kl:.2g}")

# %% md fragment
# - A compiler's gains come from doing less per token: fewer launches, fewer trips through memory.
#   On a small model the per-operator overhead is a large share of each step, so fusion helps; on a
#   large model the matrix multiplications dominate, and precision (bytes per weight) matters more.
# - Compilation has a price paid before the first token: count it against the tokens it will serve.
# - Graph optimisation levels trade build time for speed; pure rewrites keep fp32 results (agreement
#   1.0, KL ≈ 0 up to rounding order). Precision changes are where quality must be checked.
# - int8 without calibration data is a guess: the scale decides how much of the range survives.
#
# ## Exercises
# 1. How many tokens must the compiled decoder serve before its compile time is paid back?
# 2. Calibrate `model.layers.0.self_attn.q_proj` instead: is the gap between absmax and the
#    percentile larger or smaller, and why might that be?

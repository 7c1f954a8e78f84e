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
# # 08 · TensorRT and compiled engines: what an inference compiler buys
#
# An eager framework runs a model one operator at a time: each reads its inputs from memory, writes
# its output back, and costs a launch. An inference compiler sees the whole graph first.

# %% [markdown] slideshow={"slide_type": "notes"}
# It **fuses**
# chains of small operators into one kernel, **rewrites the graph** (folds constants, drops no-op
# reshapes, swaps recognised patterns for fused implementations), and **chooses precision** per
# layer, calibrating int8 scales on sample data. TensorRT does all three on NVIDIA GPUs; here we
# open each idea with what runs on any machine: you write the chain a compiler fuses and count the
# memory it saves, then measure `torch.compile`, ONNX Runtime's graph optimiser and int8 calibration,
# each with what it costs to build and what it does to the answers.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Count the operators one eager decode step runs.
# - Write RMSNorm (exercise), see it as one eager kernel per operator, then as the kernel `torch.compile`
#   generates; count the memory traffic fusion saves (exercise) and time both; see what breaks a graph.
# - Measure `torch.compile` of the whole decode step (static KV cache): build time against
#   steady-state tokens/s, and when it pays off, comparing figures from the same machine only.
# - Compare ONNX Runtime's graph optimisation levels: operators left, build time, TTFT and decode speed.
# - Choose one layer's int8 activation scale from sample data and score each choice by the model's outputs.
# - Tell the real TensorRT routes from the one articles invent. Every row carries its quality against
#   the fp32 reference (greedy agreement, KL).

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: start with the RMSNorm exercise; then ask whether compiling the whole decode step will pay
# for its build time within one answer, before the compile cell (quick mode on a CPU reads the compile row
# from the reference file and says so). TensorRT rows need a GPU; the ONNX Runtime levels run everywhere.

# %% slideshow={"slide_type": "slide"}
import dataclasses

import pandas as pd
import torch

import labkit
from labkit.core import config, cpu, env, machine, results, verdict
from labkit.model import models, onnx, prompts
from labkit.decoding import cache_variants, generation, quality
from labkit.precision import calibration
from labkit.engines import compiled, fusion, onnxruntime, tensorrt
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb08

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "onnxruntime", "tensorrt")})
env.capabilities_frame()

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
PROMPT = generation.TIMED_PROMPT  # the timed request
NEW_TOKENS = config.pick(32, 6)  # tokens per timed decode
REPEATS = config.pick(5, 3)  # timed runs per engine (after one warmup)
ROUNDS = config.pick(8, 6)  # rounds of eager and every ONNX Runtime level, each round in a shuffled order
# (also the rounds of eager against compiled static-cache decode, where the step is compiled here: its pairs)
MAX_CACHE_LEN = 256  # static KV cache positions (prompt + new tokens must fit)
FUSION_ROWS = 256  # rows (tokens) of the activations normalised in the fusion section: a prefill's worth
FUSION_REPEATS = config.pick(10, 8)  # rounds of eager, fused and a plain copy in the fusion section (one sample each)
COMPILE_HERE = cache_variants.compile_here()[0]  # compile the decode step: full mode, or on a GPU (CPU: minutes)
ORT_LEVELS = config.pick(onnxruntime.ORT_LEVELS, ("disable_all", "basic", "all"))  # ONNX Runtime graph optimisation levels compared
REF_PROMPTS = config.pick(6, 2)  # prompts in the quality reference
REF_TOKENS = config.pick(24, 8)  # greedy tokens per reference prompt
CALIBRATION_PROMPTS = config.pick(8, 3)  # prompts whose activations choose the int8 scale
HELD_OUT_PROMPTS = config.pick(5, 3)  # questions the scales are scored on
CALIBRATED_LAYER = "model.layers.0.mlp.down_proj"  # the Linear whose input is quantised
PERCENTILE = 99.99  # the clipping percentile for calibration

# %% slideshow={"slide_type": "fragment"}
res = results.Results("08_tensorrt")
lm = models.load()
ids = models.chat_inputs(lm.tokenizer, PROMPT, device=lm.device)["input_ids"]
chat_prompts = prompts.load_prompts("prompts")
ref = quality.reference(lm.model, lm.tokenizer, chat_prompts[:REF_PROMPTS], new_tokens=REF_TOKENS)
print(f"{lm.name} ({lm.dtype}) on {lm.device}; quality reference: {ref.n_tokens} greedy tokens of fp32 eager")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · How many operators does one token cost?
#
# Every operator an eager step runs is a kernel launch plus a trip of its inputs and outputs
# through memory. How many does one decode step of this model run, all layers together?

# %% slideshow={"slide_type": "fragment"}
PREDICT_OPS_PER_TOKEN = None  # your prediction: PyTorch operators in one eager decode step

# %% slideshow={"slide_type": "fragment"}
n_ops = compiled.count_eager_ops(lm.model, ids)  # the same count notebooks 01 and 10 quote
print("counted:", fusion.STEP_OPS_COUNTED)
exercises.reveal("operators per decode step", PREDICT_OPS_PER_TOKEN, n_ops)
print(f"{n_ops / lm.model.config.num_hidden_layers:.0f} per layer, over {lm.model.config.num_hidden_layers} layers")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · What a compiler fuses: RMSNorm
#
# Every layer normalises its input twice with RMSNorm: each token's hidden vector is divided by
# its root mean square, then scaled by a learned weight per channel. Write it as the model does.

# %% labkit={"exercise": "08.rms_norm"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., hidden) activations, (hidden,) weight → (..., hidden): x / sqrt(mean(x²) + eps) × weight,
    the mean taken over each row's hidden values."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("08.rms_norm", rms_norm)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## One kernel per operator eager, one graph for the compiler
#
# The model's own final norm and yours agree; eager PyTorch runs your chain as one kernel per
# operator. `torch._dynamo.explain` shows what the compiler's front end captures: one graph, no
# break. A read of a value on the host (`.item()` for a Python `if`) ends the graph: nothing fuses
# across a break.

# %% slideshow={"slide_type": "fragment"}
norm = exercises.use("08.rms_norm", rms_norm, fusion.rms_norm)
final_norm = lm.model.model.norm  # the model's last RMSNorm
weight, eps = final_norm.weight.detach().float(), final_norm.variance_epsilon  # fp32 here, whatever the model's dtype
h = torch.randn(FUSION_ROWS, weight.shape[0], device=lm.device)  # fp32 activations, on the model's device
with torch.inference_mode():
    print("same output as the model's RMSNorm:", torch.allclose(norm(h, weight, eps), final_norm(h), rtol=1e-5, atol=1e-6))
print("eager kernels, in order:", fusion.eager_ops(norm, h, weight, eps))


def norm_with_host_read(x, weight, eps):
    if x.abs().max().item() > 1e4:  # the host needs this value to choose a branch
        x = x.clamp(-1e4, 1e4)
    return norm(x, weight, eps)


pd.DataFrame({"as written": fusion.explain(norm, h, weight, eps),
              "with a host read": fusion.explain(norm_with_host_read, h, weight, eps)}).T

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Count the memory traffic
#
# Compiled, the chain becomes one kernel that reads each row once and writes the result once; the
# intermediates (x², y) stay in registers and cache. Eager, every kernel reads its inputs from
# memory and writes its output back. Count the bytes of `(rows, hidden)` tensors each way.

# %% labkit={"exercise": "08.norm_traffic"} slideshow={"slide_type": "skip"} tags=["exercise"]
def norm_traffic(rows: int, hidden: int, bytes_per_value: int) -> tuple[int, int]:
    """(eager_bytes, fused_bytes): bytes of (rows, hidden) tensors RMSNorm reads and writes.

    Eager runs x.pow(2) → mean(-1) → + eps → rsqrt → x * r → y * weight, one kernel each. Count each
    read and each write of a (rows, hidden) tensor; leave out the (rows, 1) statistics and the (hidden,)
    weight, which are small. Fused: one kernel that reads x and writes the output.
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("08.norm_traffic", norm_traffic)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Predict, then measure: eager against fused
#
# `torch.compile` builds the chain for three inputs: one decode token (a single row), `FUSION_ROWS`
# tokens, and a tensor twice the size of the last-level cache: the smaller ones stay in the cache between
# calls, so their GB/s can pass DRAM's (`fits_in_cache` says which). How many times faster will the fused
# kernel run on `FUSION_ROWS` rows?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FUSION_SPEEDUP = None  # your prediction: eager time ÷ fused time on FUSION_ROWS rows (×)

# %% slideshow={"slide_type": "fragment"}
traffic = exercises.use("08.norm_traffic", norm_traffic, fusion.rms_norm_traffic)
cache_bytes, cache_source = (cpu.llc() if lm.device == "cpu" else  # a GPU's last-level cache is its L2
                              (getattr(torch.cuda.get_device_properties(lm.device), "L2_cache_size", 0)
                               or cpu.LLC_FALLBACK_BYTES, "the GPU's L2 cache"))
above_rows = 2 * cache_bytes // (weight.shape[0] * h.element_size()) + 1  # the input alone twice the cache
inputs = {"one decode token": (h[:1].clone(), weight, eps), f"{FUSION_ROWS} tokens": (h, weight, eps),
          f"{above_rows} tokens": (torch.randn(above_rows, weight.shape[0], device=h.device, dtype=h.dtype),
                                   weight, eps)}  # like h: the model's device and h's dtype
fused = {label: fusion.compile_fused(norm, *args) for label, args in inputs.items()}
fusion_table = pd.DataFrame(fusion.fusion_rows(norm, fused, inputs, repeats=FUSION_REPEATS))
moved = [traffic(n_rows, hidden, h.element_size()) for n_rows, hidden in fusion_table["shape"]]  # (eager, fused) bytes
fusion_table["eager_gbs"] = [e / t / 1e3 for (e, _), t in zip(moved, fusion_table.eager_us)]  # achieved bandwidth, GB/s
fusion_table["fused_gbs"] = [f / t / 1e3 for (_, f), t in zip(moved, fusion_table.compiled_us)]
fusion_table["working_set_bytes"] = [f for _, f in moved]  # the input read and the output written, once each
fusion_table["fits_in_cache"] = fusion_table.working_set_bytes <= cache_bytes
print(f"last-level cache: {cache_bytes / 2**20:.0f} MiB ({cache_source})")
res.replace("fusion", fusion_table.to_dict("records"))
print("kernels inductor generated:", {label: f.kernels for label, f in fused.items()})
fusion_table.drop(columns=["samples"]).round(3)

# %% slideshow={"slide_type": "fragment"}
big = fusion_table.set_index("input", drop=False).loc[f"{FUSION_ROWS} tokens"]  # the size the prediction asked about
exercises.reveal(f"fused RMSNorm speedup, {FUSION_ROWS} rows", PREDICT_FUSION_SPEEDUP, big.speedup, "×")
eager_b, fused_b = traffic(FUSION_ROWS, weight.shape[0], h.element_size())

fusion_said = {r["input"]: nb08.findings.fusion_verdict(r) for _, r in fusion_table.iterrows()}  # rows as Series: they keep samples
v_big = fusion_said[big.input]
print(f"Eager, fused and a plain copy timed in {FUSION_REPEATS} rounds, each in a shuffled order (eager timed first and "
      f"again after the last round: {big.drift:.2f}×), judged paired round by round. "
      f"Fusion cut the (rows, hidden) traffic {eager_b / fused_b:.1f}× and on {FUSION_ROWS} rows ran "
      f"{v_big.word('faster', 'slower')} ({v_big.gain:.2f}×: {v_big.reason}); on one row "
      f"{fusion_said[fusion_table.iloc[0].input].word('faster', 'slower')} ({fusion_table.iloc[0].speedup:.2f}×). "
      f"Outputs differ by at most {fusion_table.max_abs_diff.max():.1g}. First call "
      f"(trace, fuse, generate, build): {fusion_table.first_call_s.sum():.1f} s for all {len(fusion_table)} shapes, with "
      + ("an empty inductor cache: a cold build" if min(f.cache_entries_before for f in fused.values()) == 0 else
         "inductor's on-disk cache from earlier runs (notebook 04 times a truly cold compile)"))
print(nb08.findings.cache_sentence(fusion_table.to_dict("records"), cache_bytes, cache_source))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · The whole decode step, compiled
#
# A static KV cache gives the decode step the same shapes at every token, so `torch.compile` builds
# it once (first call: trace, fuse, generate C++ or Triton, compile) and reuses it for every token.
# How much faster than eager (static cache) will the compiled step decode?

# %% slideshow={"slide_type": "fragment"}
PREDICT_COMPILE_SPEEDUP = None  # your prediction: compiled ÷ eager decode tokens/s, static cache (×)

# %% slideshow={"slide_type": "fragment"}
rows = []
eager = compiled.StaticDecoder(lm.model, MAX_CACHE_LEN)
m = compiled.measure_decoder(eager, ids, NEW_TOKENS, REPEATS)
q = compiled.decoder_quality(eager, ref)
rows.append({"engine": "PyTorch eager, static cache", "where": results.HERE, "build_s": None, "ttft_s": m["ttft_s"],
             "decode_tokens_per_s": m["decode_tokens_per_s"], "agreement": q.agreement, "kl": q.kl,
             "samples": m["samples"]})
dyn = generation.measure_decode(lm.model, lm.tokenizer, new_tokens=NEW_TOKENS, repeats=REPEATS, prompt=PROMPT)
rows.insert(0, {"engine": "PyTorch eager, dynamic cache", "where": results.HERE, "build_s": None, "ttft_s": dyn["ttft_s"],
                "decode_tokens_per_s": dyn["decode_tokens_per_s"], "agreement": 1.0, "kl": 0.0})
pd.DataFrame(rows).round(4)

# %% slideshow={"slide_type": "fragment"}
if COMPILE_HERE and env.capability("torch.compile").available:
    compiled_dec = compiled.StaticDecoder(lm.model, MAX_CACHE_LEN, compile=True)  # an empty inductor cache: a cold build
    both = compiled.measure_decoders({"eager": eager, "compiled": compiled_dec}, ids, NEW_TOKENS, ROUNDS)
    m = both["compiled"]  # eager's row becomes its runs in the same rounds: round i of each is a pair
    next(r for r in rows if r["engine"] == "PyTorch eager, static cache").update(
        {k: both["eager"][k] for k in ("ttft_s", "decode_tokens_per_s", "samples", "rounds_paired")})
    q = compiled.decoder_quality(compiled_dec, ref)
    rows.append({"engine": "torch.compile (inductor), static cache", "where": results.HERE, "build_s": m["build_s"],
                 "ttft_s": m["ttft_s"], "decode_tokens_per_s": m["decode_tokens_per_s"], "agreement": q.agreement,
                 "kl": q.kl, "samples": m["samples"], "rounds_paired": True,
                 "ir_nodes_before_fusion": m["ir_nodes_before_fusion"],
                 "generated_kernels": m["generated_kernels"], "eager_ops_per_step": n_ops})
else:
    why = cache_variants.compile_here()[1] or "COMPILE_HERE = False"
    story = cache_variants.compile_story()  # this kind of machine's reference (notebooks 04 and 05 show it too)
    print(f"torch.compile not run here ({why}); " + (f"the compiled row and the eager row it is compared with both "
          f"come from {story.provenance}" if story is not None else "no compile reference of this GPU ships"))
    rows += [{"engine": "PyTorch eager, static cache", "where": story.where, "build_s": None,
              "decode_tokens_per_s": story.eager_tokens_per_s, "agreement": 1.0},
             {"engine": "torch.compile (inductor), static cache", "where": story.where, "build_s": story.extra_first_s,
              "decode_tokens_per_s": story.compiled_tokens_per_s, "agreement": story.agreement}] if story is not None else []
torch_rows = pd.DataFrame(rows)
torch_rows.drop(columns=["section"], errors="ignore").round(4)

# %% slideshow={"slide_type": "subslide"}
compiled_rows = torch_rows[torch_rows.engine.str.startswith("torch.compile")]
tc = compiled_rows.iloc[0] if len(compiled_rows) else None  # None: not compiled here and no reference of this GPU
st = torch_rows[(torch_rows.engine == "PyTorch eager, static cache") & (torch_rows["where"] == tc["where"])].iloc[0] \
    if tc is not None else None
compile_gain = tc.decode_tokens_per_s / st.decode_tokens_per_s if tc is not None else None  # both from one machine
compile_v = verdict.compare(verdict.samples(tc, "decode_tokens_per_s"), verdict.samples(st, "decode_tokens_per_s"),
                            paired=tc.get("rounds_paired") == 1) \
    if tc is not None else None  # compiled here: its rounds beside eager's, paired (a reference: its story judges)
if tc is not None:
    exercises.reveal(f"compiled ÷ eager decode ({tc['where']})", PREDICT_COMPILE_SPEEDUP, compile_gain, "×")
gain_s_per_token = 1 / st.decode_tokens_per_s - 1 / tc.decode_tokens_per_s if tc is not None else 0
break_even = tc.build_s / gain_s_per_token if gain_s_per_token > 0 else None
if tc is None:
    print("no compiled decode step to compare: not compiled here, and no reference of this GPU ships")
elif results.is_reference(tc["where"]):
    print(findings.compile_sentence(story))
else:
    print(f"{tc['where']}: inductor fused {tc.ir_nodes_before_fusion:.0f} IR nodes into {tc.generated_kernels:.0f} kernels; "
          f"a {tc.build_s:.0f} s build for {tc.decode_tokens_per_s:.2f} vs {st.decode_tokens_per_s:.2f} tokens/s eager, "
          + verdict.phrase(compile_v, "eager's speed") + " → "
          + verdict.pick(compile_v, better=(f"pays off after {break_even:,.0f} tokens on that machine" if break_even
                                            else "no gain to pay the build back"),
                         worse="no gain to pay the build back", same="no gain this run can read to pay the build back"))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · Graph-level optimisation: ONNX Runtime's levels
#
# The model exported once to ONNX (cached, as in notebook 03), then opened at each level:
# **basic** folds constants and removes redundant nodes; **extended** adds fusions of known patterns
# (layer norms, GELU, attention, MatMul + Add); **all** adds layout changes. The session's build time
# is the optimiser's work; the operator counts are read from the graph it produced. How many times
# faster than the unoptimised graph will the most optimised one decode?

# %% slideshow={"slide_type": "fragment"}
PREDICT_ORT_SPEEDUP = None  # your prediction: decode tokens/s at the last level ÷ at 'disable_all' (×)

# %% slideshow={"slide_type": "fragment"}
machine.check("ONNX Runtime levels")
built = {level: onnxruntime.load_ort(level, count_ops=True) for level in ORT_LEVELS}  # every level open at once
ops = {level: b["ops"] for level, b in built.items()}
eager_name = "PyTorch eager, dynamic cache"
timed = generation.decode_variants({eager_name: (lm.model, lm.tokenizer),
                                    **{f"ONNX Runtime, {level}": (b["model"], b["tokenizer"]) for level, b in built.items()}},
                                   new_tokens=NEW_TOKENS, rounds=ROUNDS, prompt=PROMPT)  # shuffled rounds, eager again after the last
ort_rows = []
for level, b in built.items():
    d, q = timed[f"ONNX Runtime, {level}"], quality.compare(b["model"], ref)
    ort_rows.append({"engine": f"ONNX Runtime, {level}", "where": results.HERE, "build_s": b["build_s"], "ttft_s": d["ttft_s"],
                     "decode_tokens_per_s": d["decode_tokens_per_s"], "agreement": q.agreement, "kl": q.kl,
                     "graph_ops": sum(b["ops"].values()), "samples": d["samples"]})
del built
d = timed[eager_name]  # the eager row, now from the same rounds as the levels it is compared with
rows[0].update(ttft_s=d["ttft_s"], decode_tokens_per_s=d["decode_tokens_per_s"], samples=d["samples"])
print(f"eager and every level timed in {ROUNDS} rounds, each in a shuffled order; eager timed first and again after the "
      f"last round: drift {d['drift']:.2f}×")
pd.DataFrame(ort_rows).drop(columns=["samples"]).round(4)

# %% slideshow={"slide_type": "subslide"}
op_df = pd.DataFrame(ops).fillna(0).astype(int)
top = op_df.loc[op_df.max(axis=1).sort_values(ascending=False).index[:12]]
plots.bar(top.T.reset_index(names="level").melt(id_vars="level", var_name="operator", value_name="count"), x="level",
          y="count", color="operator", title="Operators in the optimised graph, by level", y_title="operators").show()
first, last = ORT_LEVELS[0], ORT_LEVELS[-1]
ort_said = nb08.findings.ort_verdict(ort_rows[-1], ort_rows[0])  # paired, round by round
ort_gain = ort_said.ratio
exercises.reveal(f"ONNX Runtime '{last}' ÷ '{first}' decode", PREDICT_ORT_SPEEDUP, ort_gain, "×")
ort_ref = {r["engine"]: r["decode_tokens_per_s"] for r in results.reference(compiled.REFERENCE).section("engines")}
print(results.beside_reference(f"'{last}' ÷ '{first}' decode", ort_gain, results.reference(compiled.REFERENCE),
                               ort_ref.get(f"ONNX Runtime, {last}", 0) / ort_ref.get(f"ONNX Runtime, {first}", 1)))
print(f"{sum(ops[first].values())} operators at '{first}' → {sum(ops[last].values())} at '{last}'; "
      f"fused operators that appear: {onnx.fused_ops(ops[first], ops[last])}")
print(nb08.findings.levels_sentence(ort_rows, last) or f"'{last}' decoded faster than every lower level here.",
      nb08.findings.steps_sentence(ort_rows, list(ORT_LEVELS)))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · Precision calibration
#
# int8 stores a tensor as integers times one scale. For weights the scale is known ahead; for
# activations a static engine (TensorRT's int8) must fix it *before* serving, from sample inputs:
# the largest value seen (absmax) keeps every outlier, a percentile clips the rarest ones to give the
# bulk finer steps. Dynamic int8 (notebook 03) measures each input at run time instead, per prompt or
# per token. Each choice is scored by running the model with this one layer's input quantised: the
# layer's output error, and the KL of the next-token distributions against fp32, per held-out prompt.
# Which choice will disturb the model least?

# %% slideshow={"slide_type": "fragment"}
SCALE_CHOICES = ["static, absmax scale", f"static, p{PERCENTILE:g} scale", "dynamic, per-prompt scale",
                 "dynamic, per-token scale"]
PREDICT_BEST_SCALE = None  # your prediction: one of SCALE_CHOICES, the lowest mean KL

# %% slideshow={"slide_type": "fragment"}
cal = calibration.calibrate_layer(lm.model, lm.tokenizer, chat_prompts[:CALIBRATION_PROMPTS],
                              prompts.load_prompts("questions")[:HELD_OUT_PROMPTS], layer=CALIBRATED_LAYER, percentile=PERCENTILE)
summary = pd.DataFrame(cal.summary()).T
res.replace("calibration", [dict(cal.to_dict(), method=k, **v) for k, v in cal.summary().items()])
print(f"{cal.layer}: absmax {cal.absmax:.2f}, p{PERCENTILE:g} {cal.percentile_value:.2f} over "
      f"{cal.calibration_values:,} calibration values")
kl_by_method = cal.frame().groupby("method").kl.apply(list).to_dict()  # each held-out prompt's KL, per scale
best_scale, calibration_line = nb08.findings.calibration_said(kl_by_method, PERCENTILE)
exercises.reveal_choice("lowest mean KL", PREDICT_BEST_SCALE, best_scale, SCALE_CHOICES, undecided=calibration_line)
summary.round(5)

# %% slideshow={"slide_type": "fragment"}
per_prompt = cal.frame().pivot(index="prompt", columns="method", values="kl")[SCALE_CHOICES]
scored = cal.frame().set_index("method")
prompt_max = scored.loc["dynamic, per-prompt scale"]  # its scale × 127 is each prompt's largest |x|
print(f"each held-out prompt's largest |x|: {(prompt_max.scale * 127).round(2).tolist()} at token "
      f"{prompt_max.max_at_token.tolist()} (calibration absmax {cal.absmax:.2f}); one token's largest |x| is "
      f"{scored.loc['dynamic, per-token scale'].scale.mean() * 127:.2f} on average")
if prompt_max.max_at_token.nunique() == 1 and (prompt_max.scale * 127 - cal.absmax).abs().max() < 1e-4:
    at = int(prompt_max.max_at_token.iloc[0])
    peak = lm.tokenizer.decode(models.chat_inputs(lm.tokenizer, prompt_max.prompt.iloc[0], device="cpu")["input_ids"][0, at])
    print(f"every prompt peaks at the same token, {at} ({peak!r}), at the calibration absmax: "
          "the per-prompt scale is the absmax scale")
clip = summary.loc[f"static, p{PERCENTILE:g} scale"].kl / summary.loc["static, absmax scale"].kl
print(calibration_line)  # the best scale and what clipping did, each by the verdict on the prompts' KL
per_prompt.round(5)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · TensorRT (NVIDIA GPU)
#
# With a GPU and TensorRT installed: ONNX Runtime's `TensorrtExecutionProvider` builds an engine from
# the exported graph, and torch-tensorrt compiles the decode step as a `torch.compile` backend.

# %% slideshow={"slide_type": "fragment"}
trt_rows = tensorrt.tensorrt_rows(new_tokens=NEW_TOKENS, repeats=REPEATS, ref=ref, prompt=PROMPT)
for r in trt_rows:
    print(f"{r['engine']}: {'built' if r['status'] == 'ok' else 'not run — ' + r['status']}")
trt_rows = [dict(r, where=results.HERE) for r in trt_rows if r["status"] == "ok"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Read in articles: `TensorRTForCausalLM.from_pretrained(...)`
#
# transformers has no TensorRT model class. The real routes to a TensorRT engine for an LLM:
#
# | route | call | what it builds |
# | --- | --- | --- |
# | TensorRT-LLM's LLM API (its own environment) | `from tensorrt_llm import LLM`; `LLM(model="<hub id or folder>")`, then `llm.generate(prompts, SamplingParams(...))` | a whole serving engine: paged KV cache, in-flight batching, fused attention |
# | torch-tensorrt | `import torch_tensorrt`, then `torch.compile(model, backend="torch_tensorrt")` (also registered as `"tensorrt"`) | TensorRT engines for the subgraphs it supports, PyTorch for the rest |
# | ONNX Runtime | `InferenceSession(path, providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])` | an engine from the exported ONNX graph (section 4's export) |
#
# What this machine says about each:

# %% slideshow={"slide_type": "fragment"}
import onnxruntime as ort
import transformers

print("transformers.TensorRTForCausalLM exists:", hasattr(transformers, "TensorRTForCausalLM"))
print("torch.compile backends registered now:", torch._dynamo.list_backends(), "| TensorRT's among them:",
      [b for b in ("torch_tensorrt", "tensorrt") if b in torch._dynamo.list_backends()], "(importing torch_tensorrt adds them)")
print("ONNX Runtime providers here:", ort.get_available_providers())
pd.DataFrame([c.__dict__ for c in env.capabilities() if c.name in ("tensorrt-llm", "torch-tensorrt", "ort-tensorrt")])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## The table: build cost, speed and quality
#
# Every row decodes the same prompt greedily; quality is measured against fp32 eager on the
# reference prompts (agreement 1.0 and KL ≈ 0 mean the same answers). Rows marked `reference`
# come from the machine named above, not this one: compare them with each other only.

# %% slideshow={"slide_type": "fragment"}
table = pd.DataFrame(rows + ort_rows + trt_rows)
res.replace("engines", table.drop(columns=["section"], errors="ignore").to_dict("records"))
res.save()
plots.bar(table, x="engine", y="decode_tokens_per_s", color="where", title="Decode tokens/s by engine",
          y_title="tokens/s", facet="where").show()
table[["engine", "where", "build_s", "ttft_s", "decode_tokens_per_s", "agreement", "kl"]].round(4)

# %% slideshow={"slide_type": "subslide"}
# the same measurements from a GPU, where one ships (data/reference/08_tensorrt.<gpu>.json, each with its provenance)
_ = references.show("08_tensorrt", "engines", ["engine", "where", "status", "build_s", "ttft_s", "decode_tokens_per_s", "agreement", "kl"], source="gpu")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
compiled_row = None if tc is None else {"where": tc["where"], "build_s": tc.build_s, "gain": compile_gain,
                                        "break_even": break_even, "verdict": compile_v}
found = nb08.findings.takeaways(fusion=big, fusion_rows=FUSION_ROWS, max_abs_diff=fusion_table.max_abs_diff.max(),
                                compiled=compiled_row, story=story if tc is not None and results.is_reference(tc["where"]) else None,
                                levels=(first, last), ort=(ort_rows[0], ort_rows[-1]), layer=cal.layer,
                                kl_by_method=kl_by_method, percentile=PERCENTILE, clip=clip,
                                rounds=[rows[0]] + ort_rows,  # timed in the same interleaved rounds
                                sizes=fusion_table.to_dict("records"), cache=(cache_bytes, cache_source),
                                all_levels=list(ORT_LEVELS))
findings.record(res, found)
res.save()
findings.show(found)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Exercises
#
# Your two exercises above, as the checks see them now (run the cells above again after a change):

# %% slideshow={"slide_type": "fragment"}
pd.DataFrame([dataclasses.asdict(exercises.evaluate(i, a))
              for i, a in (("08.rms_norm", rms_norm), ("08.norm_traffic", norm_traffic))])

# %% [markdown] slideshow={"slide_type": "fragment"}
# To go further: set `CALIBRATED_LAYER = "model.layers.0.self_attn.q_proj"` and rerun section 5 (is
# the gap between the scale choices larger or smaller there, and why might that be?); set
# `FUSION_ROWS` to 4096 and rerun section 2 (does the speedup approach the traffic ratio?).

# %% md slide
# # 02 · FP16 and BF16: half the bytes — at what price?
#
# Storing weights in 16 bits instead of 32 halves the memory a model needs and the bytes each
# decode step must read. Two 16-bit formats compete: **fp16** keeps more precision, **bf16**
# keeps fp32's range. This notebook shows the difference on single numbers, then loads the
# model in all three precisions and measures footprint, load time, time to first token, decode
# speed and quality against the fp32 reference — on this machine, whatever it is.

# %% md subslide
# ## Learning objectives
#
# - Explain why 70000 overflows in fp16 but not in bf16, and what bf16 pays for that range.
# - Predict weight bytes per precision with `labkit.sizing`, then check them against the loaded model.
# - Measure TTFT and decode tokens/s per precision and say why half precision can be *slower* on a
#   CPU without native half-precision matmul instructions.
# - Read three quality columns: perplexity, greedy agreement and KL divergence against fp32.

# %% slide
import labkit
import pandas as pd
import torch
from labkit import config, env, plots, quality, results, sizing, timing, variants

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})
print("CPU:", env.hardware()["cpu"], "| GPU:", env.hardware()["gpu"])
print("half precision on this run's device:", variants.half_precision_features())

# %% subslide parameters
VARIANTS = ["fp32", "fp16", "bf16"]  # fp32 first: it is the reference
NEW_TOKENS = config.pick(32, 8)  # decode tokens per timed run
REPEATS = config.pick(3, 1)  # timed runs per variant (after one warmup)
PPL_WINDOW = 512  # tokens per perplexity window
PPL_MAX_TOKENS = config.pick(None, 256)  # tokens of data/eval text scored (None: all of it)
REF_PROMPTS = config.pick(12, 3)  # prompts from data/prompts.json for agreement and KL
REF_NEW_TOKENS = config.pick(32, 12)  # reference continuation tokens per prompt
QUESTIONS = config.pick(5, 1)  # questions answered side by side
ANSWER_TOKENS = config.pick(24, 12)  # tokens per answer
MATMUL_TOKENS = 64  # rows (tokens) of the prefill-like matmul in section 4
MATMUL_REPEATS = config.pick(10, 2)  # timed repeats per matmul

# %% md slide
# ## 1 · Three formats, one number at a time
#
# A float is sign × mantissa × 2^exponent. More **exponent** bits = wider range; more
# **mantissa** bits = finer steps. Predict before running: which format turns 70000 into `inf`?
# Which one cannot tell 1 from 1 + 1/1024?

# %% fragment
def layout(dtype: torch.dtype) -> dict:
    fi = torch.finfo(dtype)
    mantissa = round(-torch.log2(torch.tensor(fi.eps)).item())
    return {"dtype": str(dtype).replace("torch.", ""), "bits": fi.bits, "exponent_bits": fi.bits - 1 - mantissa,
            "mantissa_bits": mantissa, "max": fi.max, "smallest_normal": fi.tiny, "eps": fi.eps}

pd.DataFrame([layout(d) for d in (torch.float32, torch.float16, torch.bfloat16)])

# %% fragment
samples = torch.tensor([70000.0, 1e-6, 3.14159265, 1 + 2**-10, 300.5], device="cpu")  # number formats: any device shows them
demo = pd.DataFrame({"fp32": samples.tolist(), "fp16": samples.half().float().tolist(),
                     "bf16": samples.bfloat16().float().tolist()})
demo

# %% fragment
print(f"70000 → fp16: {demo.fp16[0]}, bf16: {demo.bf16[0]:g} (bf16 has fp32's {layout(torch.bfloat16)['exponent_bits']} exponent bits)")
print(f"1 + 1/1024 → fp16: {demo.fp16[3]:.6f}, bf16: {demo.bf16[3]:.6f} "
      f"(bf16 keeps {layout(torch.bfloat16)['mantissa_bits']} mantissa bits, fp16 {layout(torch.float16)['mantissa_bits']})")

# %% md slide
# ## 2 · Predict the footprint
#
# `labkit.sizing` counts parameters on a meta-device model and multiplies by bytes per parameter.

# %% fragment
predicted = {d: sizing.estimate("default", dtype=d, context=1).weight_bytes for d in VARIANTS}
pd.DataFrame({"dtype": VARIANTS, "predicted_MiB": [predicted[d] / 2**20 for d in VARIANTS]})

# %% md slide
# ## 3 · Measure: load, TTFT, decode, quality
#
# Each variant is loaded, timed (one warmup, then `REPEATS` runs of `NEW_TOKENS` greedy tokens),
# scored on `data/eval/labkit_eval.txt` (English and Chinese) and teacher-forced on the fp32
# model's own continuations of the prompts in `data/prompts.json`, then released.

# %% fragment
settings = variants.Settings(new_tokens=NEW_TOKENS, repeats=REPEATS, answer_tokens=ANSWER_TOKENS, n_questions=QUESTIONS,
                             ppl_window_tokens=PPL_WINDOW, ppl_stride_tokens=PPL_WINDOW, ppl_max_tokens=PPL_MAX_TOKENS,
                             ref_prompts=REF_PROMPTS, ref_new_tokens=REF_NEW_TOKENS)
inputs = variants.reference_inputs(settings)  # fp32's greedy continuations and log-probs, made once
rows = list(variants.run(VARIANTS, inputs=inputs))
table = pd.DataFrame(rows).set_index("variant")
table[["status", "load_s", "weight_bytes", "predicted_weight_bytes", "ttft_s", "decode_tokens_per_s",
       "perplexity", "agreement", "kl"]]

# %% subslide
ok = table[table.status == "ok"]
plots.predicted_vs_measured(list(ok.index), list(ok.predicted_weight_bytes / 2**20), list(ok.weight_bytes / 2**20),
                            "Weight memory: sizing prediction vs loaded parameters", "MiB").show()
speed = ok.reset_index().melt(id_vars="variant", value_vars=["ttft_s", "tpot_s"], var_name="metric", value_name="seconds")
plots.bar(speed, x="variant", y="seconds", color="metric", title="Time to first token and time per output token",
          y_title="seconds (lower is better)").show()

# %% md slide
# ## 4 · Is half precision faster here?
#
# Prefill multiplies whole matrices (compute-bound); decode multiplies one vector per step by every
# weight (memory-bound). A CPU without fp16/bf16 matmul instructions converts half-precision
# weights back to fp32 as it computes: it saves bytes, not arithmetic. We time both shapes directly.

# %% fragment
shape = sizing.shape("default")  # the lm_head's matrix: vocabulary × hidden size, the largest in the model
device = env.device()  # timed where the model ran: the GPU when there is one
def matmul_s(dtype: torch.dtype, rows: int) -> float:
    x = torch.randn(rows, shape.hidden_size, dtype=dtype, device=device)
    w = torch.randn(shape.vocab_size, shape.hidden_size, dtype=dtype, device=device)
    return timing.measure(lambda: torch.nn.functional.linear(x, w), repeats=MATMUL_REPEATS, warmup=1,
                          name=f"{dtype} × {rows} rows", device=device).median

shapes = pd.DataFrame([{"device": device, "dtype": str(d).replace("torch.", ""), "prefill-like (s)": matmul_s(d, MATMUL_TOKENS),
                        "decode-like (s)": matmul_s(d, 1)} for d in (torch.float32, torch.float16, torch.bfloat16)])
shapes

# %% fragment
ratio = {v: {"ttft": ok.ttft_s[v] / ok.ttft_s["fp32"], "decode": ok.decode_tokens_per_s[v] / ok.decode_tokens_per_s["fp32"]}
         for v in ok.index if v != "fp32"}
for v, r in ratio.items():
    print(f"{v}: TTFT {r['ttft']:.2f}× fp32's ({'slower' if r['ttft'] > 1 else 'faster'}), "
          f"decode speed {r['decode']:.2f}× fp32's ({'faster' if r['decode'] > 1 else 'slower'})")
reason = variants.fast_half_matmul_reason()
print("why:", reason or "this machine has native half-precision matmul instructions (or a GPU), so both can speed up")

# %% md slide
# ## 5 · Quality: did halving the bytes change the answers?
#
# **Perplexity** on the evaluation text (lower is better), **agreement**: the share of positions where
# the variant's top token is fp32's greedy token, **KL**: how far its next-token distribution is
# from fp32's, in nats (0 = identical).

# %% fragment
table[["perplexity", "agreement", "kl", "kl_max"]]

# %% fragment
qs = quality.prompts("questions")[:QUESTIONS]
quality.side_by_side(qs, {v: table.answers[v] for v in ok.index})

# %% md slide
# ## Takeaways

# %% fragment
res = results.Results("02_fp16_bf16")
res.notes.update(settings=settings.to_dict(), cpu_features=variants.cpu_features(), half_matmul_reason=reason,
                 half_precision=variants.half_precision_features())
res.replace("variants", [{k: v for k, v in r.items() if k != "options"} for r in rows])
res.replace("matmul", shapes.to_dict("records"))
print("saved", res.save())
res.frame("variants")[["variant", "weight_bytes", "load_s", "ttft_s", "decode_tokens_per_s", "perplexity", "agreement", "kl"]]

# %% subslide
# the same measurements from a GPU, where one ships (data/reference/02_fp16_bf16.<gpu>.json, each with its provenance)
results.show_gpu_references("02_fp16_bf16", ["variants", "matmul"])

# %% md fragment
# - fp16 and bf16 halve the weight bytes exactly as predicted (compare the two bars above).
# - bf16 keeps fp32's exponent range, so large activations do not overflow; it pays with a coarser
#   mantissa (see the layout table): compare its KL and agreement with fp16's in the table above.
# - Whether half precision is *faster* depends on the hardware: memory-bound decode gains from
#   reading fewer bytes, compute-bound prefill loses wherever there are no native half-precision
#   matmul instructions (section 4 measured both on this machine).
#
# ## Exercises
# 1. Add 0.0001 to 1.0 ten thousand times in fp32, fp16 and bf16. What does each end at, and why
#    do GPUs accumulate half-precision matmuls in fp32?
# 2. On a GPU (set `LABKIT_DEVICE=cuda`), re-run section 3: which of TTFT and decode speed improves
#    with fp16, and by how much against the 2× that bytes alone would predict?

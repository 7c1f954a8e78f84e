# %% md slide
# # 03 · INT8 and INT4: bitsandbytes and ONNX Runtime
#
# Quantisation stores weights in 8 or 4 bits. Published summaries promise a lot — "INT8: −75 %
# memory, about 2 % accuracy loss". Whether that holds depends on *how* a model is quantised and on
# the hardware that runs it. Here every variant is measured in one run on this machine: weight bytes,
# peak memory, time to first token, decode speed, and three quality columns against fp32.

# %% md subslide
# ## Learning objectives
#
# - Load the same model as bitsandbytes LLM.int8 and NF4, and as ONNX Runtime fp32 and dynamic int8,
#   through one loader (`labkit.variants`).
# - Predict weight bytes per format, then measure them honestly (quantisation scales included).
# - Put speed and quality side by side, and recognise a fast variant that answers wrong.
# - Explain per-tensor vs per-channel scales, and why one CPU instruction can wreck an int8 model.
# - Test published claims against your own table.

# %% slide
import labkit
import pandas as pd
import torch
from labkit import config, env, models, plots, quality, results, variants

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("torch", "transformers", "bitsandbytes", "onnxruntime", "optimum-onnx")})
print("int8-relevant CPU flags:", {k: v for k, v in variants.cpu_features().items()
                                   if "vnni" in k or k in ("avx2", "amx_int8", "asimddp", "i8mm")})
env.capabilities_frame().query("name in ['cuda', 'bitsandbytes', 'onnxruntime', 'optimum-onnx']")

# %% subslide parameters
VARIANTS = ["fp32", "fp16", "bnb-int8", "bnb-nf4", "ort-fp32", "ort-int8-tensor", "ort-int8-channel"]  # bf16: notebook 02
NEW_TOKENS = config.pick(32, 8)  # decode tokens per timed run
REPEATS = config.pick(3, 1)  # timed runs per variant (after one warmup)
PPL_WINDOW = 512  # tokens per perplexity window
PPL_MAX_TOKENS = config.pick(None, 256)  # tokens of data/eval text scored (None: all of it)
REF_PROMPTS = config.pick(12, 3)  # prompts from data/prompts.json for agreement and KL
REF_NEW_TOKENS = config.pick(32, 12)  # reference continuation tokens per prompt
QUESTIONS = config.pick(5, 1)  # questions answered side by side
ANSWER_TOKENS = config.pick(24, 12)  # tokens per answer
LAYER_STEP = config.pick(1, 3)  # section 5 probes every LAYER_STEP-th decoder layer

# %% md slide
# ## 1 · Predict: bytes per format
#
# bitsandbytes quantises the decoder's linear layers (int8 with one scale per row, or 4-bit NF4 with
# one absmax per 64 weights) and keeps embeddings, norms and the lm_head in fp16. ONNX Runtime's
# dynamic quantisation turns every weight into int8, embeddings included, and gives the tied
# lm_head its own int8 copy.

# %% fragment
pred = pd.DataFrame({"variant": VARIANTS, "predicted_MiB": [variants.predicted_weight_bytes(v) / 2**20 for v in VARIANTS]})
pred["fraction_of_fp32"] = pred.predicted_MiB / pred.predicted_MiB[pred.variant == "fp32"].item()
pred

# %% md slide
# ## 2 · Export to ONNX (once; cached)
#
# optimum-onnx traces the model into an ONNX graph with a KV cache. The files land in
# `labkit.config.cache_dir()` and are reused; int8 versions are made from them on first use.

# %% fragment
folder, export_s = variants.export_onnx()
print(f"{folder}: {variants.onnx_bytes(folder) / 2**20:.0f} MiB",
      f"exported in {export_s:.1f} s" if export_s is not None else "(reused from the cache)")

# %% md slide
# ## 3 · Measure every variant, one after another
#
# Same prompts, same token counts. Memory: on a CPU the growth of this process's resident set from
# before the load to after the timed runs; on a GPU PyTorch's allocator peak. A variant this
# machine cannot run becomes a row whose `status` says why. On a GPU, ONNX Runtime's dynamic int8
# rows run on the CPU provider (their `device` column says so): its int8 operators have no CUDA
# kernels. What runs int8 *on* a GPU is bitsandbytes LLM.int8 (the `bnb-int8` row), or static (QDQ)
# int8 on TensorRT, whose scales are calibrated ahead (notebook 08).

# %% fragment
settings = variants.Settings(new_tokens=NEW_TOKENS, repeats=REPEATS, answer_tokens=ANSWER_TOKENS, n_questions=QUESTIONS,
                             ppl_window_tokens=PPL_WINDOW, ppl_stride_tokens=PPL_WINDOW, ppl_max_tokens=PPL_MAX_TOKENS,
                             ref_prompts=REF_PROMPTS, ref_new_tokens=REF_NEW_TOKENS)
inputs = variants.reference_inputs(settings)  # fp32's greedy continuations and log-probs, made once
rows = list(variants.run(VARIANTS, inputs=inputs))
table = pd.DataFrame(rows).set_index("variant")
table["weight_MiB"] = table.weight_bytes / 2**20
table["peak_MiB"] = table.peak_memory_bytes / 2**20
cols = ["status", "device", "weight_MiB", "peak_MiB", "ttft_s", "decode_tokens_per_s", "perplexity", "agreement", "kl"]
print("peak memory source:", "; ".join(sorted(set(table.peak_memory_source.dropna()))))
for v, note in table.note.items():
    if note:
        print(f"{v}: {note}")
table[cols]

# %% subslide
ok = table[table.status == "ok"].reset_index()
fig = plots.scatter(ok, x="kl", y="decode_tokens_per_s", text="variant", color="backend",
                    title="Speed vs quality (up = faster, left = closer to fp32)",
                    x_title="KL divergence from fp32 (nats/token)", y_title="decode tokens/s")
fig.show()
base = table.loc["fp32"]
print(f"fastest: {ok.loc[ok.decode_tokens_per_s.idxmax(), 'variant']} at "
      f"{ok.decode_tokens_per_s.max() / base.decode_tokens_per_s:.2f}× fp32's decode speed")

# %% md slide
# ## 4 · Same question, every variant
#
# A '≠' marks an answer that differs from fp32's. Agreement and KL above say how often and how far
# the variants drift on many prompts; one answer is only an anecdote.

# %% fragment
qs = quality.prompts("questions")[:QUESTIONS]
quality.side_by_side(qs, {v: table.answers[v] for v in ok.variant})

# %% md slide
# ## 5 · Per-tensor vs per-channel scales — and a CPU instruction
#
# Per-tensor: one scale for a whole weight matrix, so a single large weight squeezes all the others
# into a few int8 steps. Per-channel: one scale per output column, so each column uses the full
# range. On x86 CPUs without VNNI, ONNX Runtime's int8 kernel adds pairs of uint8×int8 products into
# **16-bit** sums, which saturate when weights use the full int8 range — per-channel scales make that
# far more likely. `reduce_range` (7-bit weights) avoids it; `labkit.variants` turns it on where
# `int8_saturation_risk()` says so. Below: the real ONNX Runtime kernel on each probed layer's real
# weights and activations, error against fp32.

# %% fragment
print("this CPU is at risk of int8 saturation:", variants.int8_saturation_risk(),
      "| reduce_range used above:", {v: table.options[v].get("reduce_range") for v in ok.variant if v.startswith("ort-int8")})
lm = models.load(dtype="fp32")
probe = [f"model.layers.{i}.mlp.down_proj" for i in range(0, lm.model.config.num_hidden_layers, LAYER_STEP)]
acts, mods = {}, dict(lm.model.named_modules())
hooks = [mods[n].register_forward_pre_hook(lambda m, a, n=n: acts.__setitem__(n, a[0].detach())) for n in probe]
with torch.inference_mode():
    lm.model(**models.chat_inputs(lm.tokenizer, qs[0], device=lm.device))
for h in hooks:
    h.remove()

# %% fragment
forms = {"per-tensor": (False, False), "per-channel, 8-bit": (True, False), "per-channel, 7-bit": (True, True)}
err = pd.DataFrame([{"layer": n.split(".")[2], "form": f, "relative_error": variants.ort_matmul_error(mods[n].weight, acts[n], *pr)}
                    for n in probe for f, pr in forms.items()])
plots.bar(err, x="layer", y="relative_error", color="form", title="ONNX Runtime int8 error per MLP down_proj layer",
          y_title="‖Y_int8 − Y_fp32‖ / ‖Y_fp32‖", text_auto=False).show()
worst = err.groupby("form").relative_error.max()
print("worst layer error by form:", worst.round(3).to_dict())

# %% md slide
# ## 6 · Do the published claims hold here?
#
# Claims: **FP16: −50 % memory, < 0.5 % accuracy loss; INT8: −75 % memory, ~2 % accuracy loss.**
# Memory: weight bytes against fp32's (within 5 points of the claim counts as holding). Accuracy:
# the relative rise in perplexity on the evaluation text (we accept up to 3 % for "~2 %"), with
# top-1 disagreement shown beside it. `ort-int8` is the better-quality of the two ONNX int8 forms.

# %% fragment
by_variant = {r["variant"]: r for r in rows}
best = variants.best_of(rows, ["ort-int8-tensor", "ort-int8-channel"])
if best is not None:
    by_variant["ort-int8"] = best
claims = [("fp16", "FP16", -0.50, 0.005), ("bnb-int8", "INT8", -0.75, 0.03), ("ort-int8", "INT8", -0.75, 0.03)]
verdict = []
for variant, label, mem_claim, loss_claim in claims:
    r = by_variant.get(variant, {"status": "not run"})
    if r["status"] != "ok":
        verdict.append({"variant": variant, "claim": label, "note": f"not measured here: {r['status']}"})
        continue
    mem = r["weight_bytes"] / base.weight_bytes - 1
    loss = r["perplexity"] / base.perplexity - 1
    verdict.append({"variant": r["variant"], "claim": label, "memory_change": mem, "memory_claim": mem_claim,
                    "memory_holds": abs(mem - mem_claim) <= 0.05, "perplexity_rise": loss, "loss_claim": loss_claim,
                    "accuracy_holds": loss <= loss_claim, "top1_disagreement": 1 - r["agreement"]})
verdict = pd.DataFrame(verdict)
verdict

# %% fragment
for v in verdict.itertuples():
    if hasattr(v, "memory_change") and pd.notna(v.memory_change):
        print(f"{v.claim} ({v.variant}): memory {v.memory_change:+.0%} vs claimed {v.memory_claim:+.0%} → "
              f"{'holds' if v.memory_holds else 'does not hold'}; perplexity {v.perplexity_rise:+.1%} vs ≤{v.loss_claim:.1%} → "
              f"{'holds' if v.accuracy_holds else 'does not hold'} on this machine")

# %% md slide
# ## Takeaways

# %% fragment
res = results.Results("03_int8_int4")
res.notes.update(settings=settings.to_dict(), cpu_features=variants.cpu_features(),
                 int8_saturation_risk=variants.int8_saturation_risk(), export_s=export_s)
res.replace("variants", [{k: v for k, v in r.items()} for r in rows])
res.replace("layer_error", err.to_dict("records"))
res.replace("claims", verdict.to_dict("records"))
print("saved", res.save())
res.frame("variants")[["variant", "weight_bytes", "peak_memory_bytes", "ttft_s", "decode_tokens_per_s",
                       "perplexity", "agreement", "kl"]]

# %% subslide
# the same measurements from a GPU, where one ships (data/reference/03_int8_int4.<gpu>.json, each with its provenance)
results.show_gpu_references("03_int8_int4", "variants", ["variant", "status", "device", "weight_bytes", "peak_memory_bytes",
                                                        "ttft_s", "decode_tokens_per_s", "perplexity", "agreement", "kl"])

# %% md fragment
# - Bytes follow the prediction; whether speed follows depends on the kernels: bitsandbytes on a CPU
#   dequantises weights on every call, ONNX Runtime's int8 path computes in integers.
# - The int8 that keeps quality (LLM.int8 handles outlier activations in fp16) and the int8 that is
#   fast (dynamic int8 with one activation scale per tensor) are different int8s: read the KL column.
# - "−75 % memory, ~2 % loss" is a property of a method on a model on a machine, not of a bit width.
#
# ## Exercises
# 1. **Per-channel vs per-tensor.** Emulate ONNX Runtime's dynamic int8 in PyTorch on every linear
#    layer (`variants.fake_dynamic_int8`) with per-tensor and with per-channel weight scales. Which
#    keeps closer to fp32? Does the emulation agree with the two ONNX rows in the table?
# 2. **Which layers hurt most?** Quantise one kind of layer at a time (q, k, v, o, gate, up, down,
#    lm_head) and rank them by KL. What is special about the inputs of the worst one?

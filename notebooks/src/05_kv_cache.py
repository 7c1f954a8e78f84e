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
# # 05 · The KV cache and attention: where decode time goes
#
# Each new token attends to every token before it. A decode loop can recompute the keys and values of
# the whole sequence at every step, or compute each position's once and keep them: the KV cache.

# %% [markdown] slideshow={"slide_type": "notes"}
# Here
# you write the step that uses the cache, check it against `generate`, then measure both sides of the
# trade — the bytes the cache holds and the time it saves — and go on to static vs dynamic caches,
# attention kernels, and the operators one step spends its time in.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Write one decode step with the KV cache, run it in a greedy loop, and prove the loop gives `generate`'s tokens.
# - Compute the cache's bytes per token from a model's config, then measure the tensors.
# - Time the loop with and without the cache, and read where the difference comes from.
# - Separate prefill (TTFT) from decode (TPOT) for short and long prompts.
# - Compare a dynamic and a static cache, and attention implementations ([SDPA](../docs/glossary.md#sdpa) and
#   [FlashAttention](../docs/glossary.md#flashattention): fused attention kernels), each with its greedy agreement.
# - Tell the real switches from one that articles invent (`cache_implementation="flash"`).
# - Read a profiler table: how much of a step is matrix multiplication, attention, and the rest.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: the learner writes the decode step themselves (exercise 05.decode_step); give the room
# five minutes for it before running the cells after it. Ask for a prediction of the speedup the cache
# gives at `LOOP_TOKENS` new tokens (128 in full mode, 24 in quick mode) before the timing cell, and collect a few numbers. The agreement columns are
# the point of the variant tables: a faster variant that changes the answer is shown as such.

# %% slideshow={"slide_type": "slide"}
import pandas as pd
import torch

import labkit
from labkit.core import config, env, machine, results, timing, verdict
from labkit.model import dtypes, hardware, models, sizing
from labkit.decoding import cache_variants, decode, generation, kv, profiling, quality
from labkit.engines import fusion
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb05

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "flash-attn")})
env.capabilities_frame().query("name in ['cuda', 'flash-attn', 'torch.compile']")

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
DTYPE = "fp16" if env.device().startswith("cuda") else "fp32"  # weights and KV cache precision
PROMPT = generation.TIMED_PROMPT  # the timed request
LOOP_TOKENS = config.pick(128, 24)  # new tokens from the loop written below, with and without the cache
POINTS = [8, 16, 32, 64]  # new-token counts at which total time is read off (and LOOP_TOKENS)
KV_NEW_TOKENS = config.pick(16, 4)  # new tokens for the cache-size check
KV_BATCHES = [1, 4]  # sequences per cache-size check
KV_CONTEXTS = config.pick([128, 512, 1024, 2048], [64, 128, 256])  # prompt tokens for the growth line
SPLIT_PROMPTS = config.pick([32, 256, 1024], [32, 512])  # prompt tokens for prefill vs decode
SPLIT_TOKENS = config.pick(32, 8)  # new tokens per prefill/decode run
VARIANT_TOKENS = config.pick(64, 8)  # new tokens per cache-variant run
REPEATS = config.pick(5, 3)  # timed repeats of the profiler and the bandwidth probe
ROUNDS = config.pick(8, 6)  # rounds of every comparison, each in a shuffled order: round i of each side is a pair
ATTN_PROMPT = config.pick(1024, 384)  # prompt tokens for the attention comparison
ATTN_TOKENS = config.pick(16, 4)  # new tokens per attention run
PROFILE_PROMPT = 128  # prompt tokens for the profiled prefill
COMPILE_HERE = cache_variants.compile_here()[0]  # compile the decode step here: full mode, or any mode on a GPU

# %% slideshow={"slide_type": "fragment"}
lm = models.load(dtype=DTYPE)
inputs = models.chat_inputs(lm.tokenizer, PROMPT, device=lm.device)  # (1, T) on the model's device
n_prompt = inputs["input_ids"].shape[1]
print(f"{lm.name} in {DTYPE} on {lm.device}; the prompt is {n_prompt} tokens")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · One decode step, with the cache
#
# `generate` hides a loop: the prompt goes through the model once (*prefill*), then one token at a time
# (*decode*). The prefill leaves every prompt position's keys and values in a cache (`past_key_values`).
# What does a decode step need to feed the model, if the cache already holds everything before the new
# token? Write the step: the check runs it on a tiny random model against the same step without a cache.

# %% labkit={"exercise": "05.decode_step"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def decode_step(model, tokens, cache, position_ids):
    """One decode step with the KV cache: (B,) newest tokens at (B,) positions → (B, V) next-token logits.

    ``cache`` holds the keys and values of every earlier position. ``model(...)`` takes ``input_ids`` (B, L),
    ``position_ids`` (B, L) and ``past_key_values``; its ``.logits`` are (B, L, V).
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("05.decode_step", decode_step);

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The loop around the step
#
# Prefill once, then your step, one token at a time. The other branch keeps no cache: each step feeds the
# whole sequence so far. Both yield one token per step, so labkit can stamp each as it arrives.

# %% slideshow={"slide_type": "fragment"}
step = exercises.use("05.decode_step", decode_step, decode.decode_one_token)


@torch.inference_mode()
def greedy_steps(model, input_ids, new_tokens, use_cache=True):
    """(1, T) prompt → yields new_tokens greedy tokens, each (1,), one per step."""
    if use_cache:
        out = model(input_ids=input_ids, use_cache=True)  # prefill: T positions at once, cache filled
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1)
        position = torch.full_like(token, input_ids.shape[1])  # the new token sits right after the prompt
        for _ in range(new_tokens - 1):
            yield token
            token, position = step(model, token, cache, position).argmax(-1), position + 1
        yield token
    else:
        ids = input_ids
        for _ in range(new_tokens):  # step t runs all T + t positions again
            token = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1)
            yield token
            ids = torch.cat([ids, token[:, None]], dim=1)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · Cache on vs off: time per token
#
# Both loops run in `ROUNDS` rounds, each round in a shuffled order, so round i of each forms a pair (the chart
# draws the first round's). Predict: for `LOOP_TOKENS` new tokens, how many times faster is the loop with the cache than without it?
# And how does the time of one step change from the first tokens to the last, with the cache and without?
# The chart's `itl_s` is each token's inter-token latency ([ITL](../docs/glossary.md#itl)): the time since the token before.

# %% slideshow={"slide_type": "fragment"}
PREDICT_CACHE_SPEEDUP = None  # your prediction: time without the cache / time with it, for LOOP_TOKENS tokens

# %% slideshow={"slide_type": "fragment"}
list(greedy_steps(lm.model, inputs["input_ids"], 2))  # untimed warmup: first calls allocate
loops = timing.rounds({"cache on": lambda: kv.time_steps(greedy_steps(lm.model, inputs["input_ids"], LOOP_TOKENS),
                                                          lm.device, n_prompt),
                       "cache off": lambda: kv.time_steps(greedy_steps(lm.model, inputs["input_ids"], LOOP_TOKENS,
                                                                       use_cache=False), lm.device, n_prompt)},
                      ROUNDS)  # each round in a shuffled order; 'cache on' timed once more after the last round
(on, on_tokens), (off, off_tokens) = loops["cache on"][0], loops["cache off"][0]  # the first round: drawn below
loop_s = {k: [r.e2e_s for r, _ in runs] for k, runs in loops.items()}  # each round's total time, round i at index i
loop_first, loop_again = (r.e2e_s for r, _ in loops.ends())
print(f"{ROUNDS} rounds, each in a shuffled order; 'cache on' timed first and again after the last round: "
      f"again / first = {loop_again / loop_first:.2f}")
per_token = pd.DataFrame(kv.per_token_rows(on, "cache on") + kv.per_token_rows(off, "cache off"))
plots.line(per_token, x="token", y="itl_s", color="variant", title="Time per generated token (first = TTFT)",
           x_title="generated token", y_title="seconds", markers=False).show()
early = per_token[per_token.token.between(2, 5)].groupby("variant").itl_s.median()  # first decode steps
late = per_token[per_token.token > LOOP_TOKENS - 4].groupby("variant").itl_s.median()  # the last four
growth = late / early
print(f"last steps / first steps: cache on {growth['cache on']:.2f}×, cache off {growth['cache off']:.2f}×")

# %% slideshow={"slide_type": "subslide"}
points = sorted({*(p for p in POINTS if p < LOOP_TOKENS), LOOP_TOKENS})
totals = pd.DataFrame({k: pd.DataFrame([kv.elapsed_at(r, points) for r, _ in runs]).median()  # median over the rounds
                       for k, runs in loops.items()})
totals["speedup"] = totals["cache off"] / totals["cache on"]
totals.index.name = "new_tokens"
plots.bar(totals.reset_index().melt(id_vars="new_tokens", value_vars=["cache on", "cache off"], var_name="variant",
                                    value_name="seconds"), x="new_tokens", y="seconds", color="variant",
          title=f"Total time for n new tokens, read off the same runs (median of {ROUNDS} rounds)",
          y_title="seconds").show()
exercises.reveal(f"cache speedup at {totals.index[-1]} tokens", PREDICT_CACHE_SPEEDUP, totals.speedup.iloc[-1], "×")
cache_v = verdict.compare(loop_s["cache on"], loop_s["cache off"], higher_is_better=False, paired=True)
print(f"with the cache against without it, round by round: {verdict.said(cache_v)}")
totals

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Same tokens as `generate`?
#
# A faster loop is only useful if it computes the same thing. Greedy decoding is deterministic, so the
# loop with the cache, the loop without it and `generate` should agree token for token — do they?

# %% slideshow={"slide_type": "fragment"}
core = decode.same_as_generate(lm.model, inputs["input_ids"], inputs["attention_mask"], new_tokens=LOOP_TOKENS)
n = core["compared_tokens"][0]  # generate stops at end-of-sequence; the loops run on: compare that far
reference = torch.tensor(core["generate"], device="cpu")  # read back to the host, as the loops' tokens are
loop_agreement = {"cache on": quality.agreement(on_tokens[:, :n], reference),
                  "cache off": quality.agreement(off_tokens[:, :n], reference)}
for label, share in loop_agreement.items():
    print(f"your loop, {label}: {share:.0%} of {n} tokens equal to generate's")
print("answer:", repr(lm.tokenizer.decode(reference[0], skip_special_tokens=True)))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · The decode core: the same loop in labkit
#
# Every engine in this lab — the server's batches (notebook 06), [continuous batching](../docs/glossary.md#continuous-batching)
# (07: requests join and leave the batch at every step), the static-cache and compiled decoder (08) — runs on
# these few functions. They are your loop, batched: a mask hides [left padding](../docs/glossary.md#left-padding) (pads before
# the shorter prompts), and each row counts its own positions. `prefill` and `decode_one_token` are the answer to
# the exercise above, so they appear here once your `decode_step` passes its check.

# %% slideshow={"slide_type": "fragment"}
solved = exercises.evaluate("05.decode_step", decode_step).status == "correct"
decode.show_source(*(["prefill", "decode_one_token", "greedy"] if solved else ["greedy"]))

# %% slideshow={"slide_type": "fragment"}
print(f"labkit's decode core vs generate, {core['new_tokens']} tokens: "
      f"{'identical' if core['identical'] else 'DIFFERENT'} (greedy, with the cache)")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · How many bytes does the cache hold?
#
# Every layer keeps, for each position, one key and one value vector per *key/value head*, each `head_dim`
# numbers wide. Models with grouped-query attention have fewer key/value heads than query heads. Write the
# bytes one position of one sequence costs, reading the numbers from a config.

# %% labkit={"exercise": "05.kv_bytes_per_token"} slideshow={"slide_type": "skip"} tags=["exercise"]
def kv_bytes_per_token(config, bytes_per_value):
    """Bytes the KV cache holds for one position of one sequence.

    ``config``: a transformers model config (``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``hidden_size``, and ``head_dim`` where the model sets it).
    ``bytes_per_value``: 4 for fp32, 2 for fp16/bf16.
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("05.kv_bytes_per_token", kv_bytes_per_token);

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Predict, then measure the tensors
#
# `generate` feeds every token but the last through the model: a request of *p* prompt tokens and *n*
# new tokens leaves *p + n − 1* positions per sequence. The growth line prefills prompts of each length in
# `KV_CONTEXTS`. Predict: how many MiB does one sequence's cache hold after the longest of them?

# %% slideshow={"slide_type": "fragment"}
PREDICT_KV_MIB = None  # your prediction: MiB after the longest prompt in KV_CONTEXTS, one sequence

# %% slideshow={"slide_type": "fragment"}
per_pos = exercises.use("05.kv_bytes_per_token", kv_bytes_per_token, kv.bytes_per_position)(
    lm.model.config, dtypes.DTYPE_BYTES[DTYPE])
sizes = [kv.measure_cache(lm.model, lm.tokenizer, PROMPT, KV_NEW_TOKENS, batch=b) for b in KV_BATCHES]
static_why = cache_variants.static_cache_reason(lm.model, lm.tokenizer)  # '' where a static cache fits this model
if static_why:
    print(f"static cache not measured: {static_why}")
else:
    sizes.append(kv.measure_cache(lm.model, lm.tokenizer, PROMPT, KV_NEW_TOKENS, batch=1,
                                  **cache_variants.cache_variant_kwargs("static")))
sizes += kv.prefill_cache_sizes(lm.model, lm.tokenizer, KV_CONTEXTS)
kvdf = pd.DataFrame([s.to_dict() for s in sizes]).drop(columns=["predicted_bytes", "ratio"])
kvdf["formula_bytes"] = per_pos * kvdf.context * kvdf.batch  # bytes per position × positions × sequences
kvdf["measured / formula"] = kvdf.measured_bytes / kvdf.formula_bytes
grow = kvdf.iloc[len(KV_BATCHES) + (not static_why):]
plots.predicted_vs_measured([f"{c} tokens" for c in grow.context], list(grow.formula_bytes / 2**20),
                            list(grow.measured_bytes / 2**20), "KV cache after prefill: formula vs tensors", "MiB").show()
exercises.reveal(f"MiB after {grow.context.iloc[-1]} tokens", PREDICT_KV_MIB, grow.measured_bytes.iloc[-1] / 2**20, "MiB")
print(f"{per_pos:,} bytes per position; measured / formula over {len(kvdf)} caches: "
      f"{kvdf['measured / formula'].min():.4f} to {kvdf['measured / formula'].max():.4f}")
print(nb05.findings.layer_by_layer_sentence(lm.model.config, DTYPE, kv.bytes_per_position(
    lm.model.config, dtypes.DTYPE_BYTES[DTYPE]), int(grow.context.iloc[-1])))
kvdf

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · Prefill vs decode: TTFT and TPOT, short and long prompts
#
# Prefill runs the whole prompt through the model in one pass; a decode step runs one token and reads the
# cache. Predict: when the prompt gets longer by the factor below, how many times longer do TTFT (prefill)
# and TPOT (one decode step) get?

# %% slideshow={"slide_type": "fragment"}
print(f"prompt lengths: {SPLIT_PROMPTS} tokens, a factor of {SPLIT_PROMPTS[-1] / SPLIT_PROMPTS[0]:.0f}")
PREDICT_TTFT_GROWTH = None  # your prediction: TTFT(longest) / TTFT(shortest)
PREDICT_TPOT_GROWTH = None  # your prediction: TPOT(longest) / TPOT(shortest)

# %% slideshow={"slide_type": "fragment"}
split = pd.DataFrame(kv.prefill_decode_split(lm.model, lm.tokenizer, SPLIT_PROMPTS, SPLIT_TOKENS, repeats=ROUNDS))
melted = split.melt(id_vars="prompt_tokens", value_vars=["ttft_s", "tpot_s"], var_name="metric", value_name="seconds")
plots.bar(melted.astype({"prompt_tokens": str}), x="prompt_tokens", y="seconds", color="metric",
          title="Prefill (TTFT) vs decode (TPOT)", y_title="seconds").show()
short, long_ = split.iloc[0], split.iloc[-1]
exercises.reveal("TTFT growth", PREDICT_TTFT_GROWTH, long_.ttft_s / short.ttft_s, "×")
exercises.reveal("TPOT growth", PREDICT_TPOT_GROWTH, long_.tpot_s / short.tpot_s, "×")
weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())  # what every decode step reads
step_bytes = [sizing.decode_bytes_per_step(weight_bytes, per_pos, r.prompt_tokens + SPLIT_TOKENS / 2, 1)
              for r in (short, long_)]  # weights + the cache a mid-answer step reads
print(f"bytes one decode step reads, weights plus the cache: {step_bytes[0] / 1e6:,.0f} MB → {step_bytes[1] / 1e6:,.0f} MB, "
      f"so a memory-bound step predicts TPOT {step_bytes[1] / step_bytes[0]:.2f}× (measured "
      f"{long_.tpot_s / short.tpot_s:.2f}×, {long_.n} rounds, each in a shuffled order)")
split.drop(columns="samples")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · Dynamic vs static cache
#
# A *dynamic* cache grows by concatenation at every step. A *static* cache allocates every position once
# and writes in place: its shapes never change, which is what lets `torch.compile` (and, on a
# GPU, [CUDA graphs](../docs/glossary.md#cuda-graphs): kernel launches recorded once, replayed) compile the decode step once; the first call pays for that. Predict: without compiling, which of
# the two decodes faster on this machine?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FASTER_CACHE = None  # your prediction: "dynamic" or "static"

# %% slideshow={"slide_type": "fragment"}
variants = ["dynamic"] + ([] if static_why else ["static"]) + (
    ["static+compile"] if COMPILE_HERE and not static_why and env.capability("torch.compile").available else [])
vrows = [dict(r, where=results.HERE) for r in
         kv.compare_cache_variants(lm.model, lm.tokenizer, variants, PROMPT, VARIANT_TOKENS, repeats=ROUNDS)]
if "static+compile" not in variants and not static_why:
    why = cache_variants.compile_here()[1] or "COMPILE_HERE = False"
    ref = cache_variants.compile_reference()  # this kind of machine's: never a CPU's beside a GPU's rows
    print(f"torch.compile of the decode step not run here ({why}); " + (
        f"reference rows from {results.provenance(ref)}" if ref is not None else "no compile reference of this GPU ships"))
    if ref is not None:
        vrows += [dict(r, where=results.where_of(ref)) for r in ref.frame("cache_variants").to_dict("records")]
        print(findings.compile_sentence(cache_variants.compile_story(ref)))
vdf = pd.DataFrame(vrows)
plots.bar(vdf, x="variant", y="tpot_s", color="where", title="Decode time per token by cache", y_title="seconds",
          facet="where").show()
here = vdf[vdf["where"] == results.HERE].set_index("variant")
won, why = (nb05.findings.faster_of(here, ["dynamic", "static"], "tpot_s") if not static_why  # the takeaways' verdict
            else (None, f"no static cache here: {static_why}"))
exercises.reveal_choice("faster decode", PREDICT_FASTER_CACHE, won, ["dynamic", "static"], undecided=why)
vdf[["variant", "where", "new_tokens", "first_call_s", "ttft_s", "tpot_s", "decode_tokens_per_s", "agreement"]]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7 · Attention: the real switches, and one that articles invent
#
# Articles write `generate(..., cache_implementation="flash")` to get FlashAttention. Is that an option?
# Each call below runs on this model; a refused call is refused before any forward pass.

# %% slideshow={"slide_type": "fragment"}
claims = kv.audit_claims(lm.model, lm.tokenizer)
for c in claims:
    print(f"[{c['source']}] {c['call']}\n    here: {c['what it does here']}"
          + (f"\n    what does this job: {c['the real API']}" if c["the real API"] else ""))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Attention implementations, timed
#
# `eager` writes attention as matmul → softmax → matmul in PyTorch; `sdpa` calls PyTorch's fused
# `scaled_dot_product_attention`; `flash_attention_2` is a fused CUDA kernel for fp16/bf16 on NVIDIA GPUs.
# The comparison prefills an `ATTN_PROMPT`-token prompt. Predict: which implementation has the shorter TTFT
# here, and do they give the same tokens?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FASTER_ATTENTION = None  # your prediction: "eager" or "sdpa"

# %% slideshow={"slide_type": "fragment"}
status = pd.DataFrame(kv.attention_status(lm.device, dtype=lm.model.dtype))
for r in status[~status.available].itertuples():
    print(f"{r.attn_implementation}: not run here — {r.reason}")
impls = list(status[status.available].attn_implementation)
attn = pd.DataFrame(kv.compare_attention(lm.model, lm.tokenizer, impls, ATTN_PROMPT, ATTN_TOKENS, repeats=ROUNDS))
plots.bar(attn, x="attn_implementation", y="ttft_s", title=f"TTFT for a {ATTN_PROMPT}-token prompt",
          y_title="seconds").show()
timed = attn[attn.attn_implementation.isin(["eager", "sdpa"])].set_index("attn_implementation")
won, why = nb05.findings.faster_of(timed, ["eager", "sdpa"], "ttft_s")
exercises.reveal_choice("shorter TTFT", PREDICT_FASTER_ATTENTION, won, ["eager", "sdpa"], undecided=why)
attn.drop(columns=["answer_start", "samples"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8 · Profiler view: where does one step spend its time?
#
# `torch.profiler` records every operator of one prefill and of the decode step after it. Self time counts
# each operator once (`aten::linear` calls `aten::mm`; only `aten::mm` gets the time). Predict: what share
# of a decode step goes to matrix multiplication (reading the weights), and what share to attention?

# %% slideshow={"slide_type": "fragment"}
PREDICT_MATMUL_SHARE = None  # your prediction: share of a decode step's self time in matmul, 0 to 1

# %% slideshow={"slide_type": "fragment"}
profiles = profiling.profile_prefill_decode(lm.model, lm.tokenizer, prompt_tokens=PROFILE_PROMPT, repeats=REPEATS)
profiling.groups_figure(profiles).show()
groups = profiling.groups_frame(profiles).set_index(["step", "group"]).share
exercises.reveal("decode step in matmul", PREDICT_MATMUL_SHARE, groups[(profiles[1].step, "matmul")], "share")
top = profiling.top_ops_frame(profiles, top=6)
top.assign(ms=top.self_us / 1e3).drop(columns="self_us").round(3)

# %% [markdown] slideshow={"slide_type": "fragment"}
# The matmul share, split as notebook 01 splits a step: the weights at this machine's probed bandwidth,
# the extra because the matrix-vector products read them slower than that, and the other operators.

# %% slideshow={"slide_type": "fragment"}
bw = hardware.bandwidth(device=lm.device, repeats=REPEATS)  # notebook 01's probe: 1 GiB, far above the cache
step = profiles[1]
matmul_s = step.groups().set_index("group").self_us["matmul"] / 1e6
ids = models.chat_inputs(lm.tokenizer, PROMPT, device=lm.device)["input_ids"]
step_ops = fusion.decode_step_ops(lm.model, ids)
gap = hardware.decode_gap(step.total_us / 1e6, sizing.decode_bytes_per_step(weight_bytes, per_pos, PROFILE_PROMPT, 1),
                          bw.gbs, len(step_ops) - step_ops.count("linear"), lm.device, matmul_s=matmul_s,
                          weight_bytes=weight_bytes, profiled=True)  # the same three pieces notebooks 01 and 10 print
print("profiled decode step (operator self time; notebook 01 splits the wall-clock step):", gap["explanation"])

# %% slideshow={"slide_type": "subslide"}
# the same measurements from a GPU, where one ships (data/reference/05_kv_cache.<gpu>.json, each with its provenance)
_ = references.show("05_kv_cache", ["cache_on_off", "prefill_decode", "cache_variants", "attention"], source="gpu")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
res = results.Results("05_kv_cache")
for section, rows in {"cache_on_off": totals.reset_index().to_dict("records"), "kv_bytes": kvdf.to_dict("records"),
                      "prefill_decode": split.to_dict("records"), "cache_variants": vrows,
                      "attention": attn.to_dict("records"), "claims": claims,
                      "profile_groups": profiling.groups_frame(profiles).to_dict("records"),
                      "decode_gap": [{k: v for k, v in gap.items() if k != "explanation"}]}.items():
    res.replace(section, rows)
found = nb05.findings.takeaways(loop_agreement=min(loop_agreement.values()), core_identical=core["identical"],
                                tokens=int(totals.index[-1]), speedup=totals.speedup.iloc[-1], step_growth=growth.to_dict(),
                                loop_s=loop_s,
                                kv_sizes=kvdf, bytes_per_position=per_pos, split=split, variants=here, attention=timed,
                                decode_shares=profiles[1].share_samples,
                                weight_bytes=weight_bytes, gap=gap, static_reason=static_why)
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The two exercises sit where their mechanism is taught: `05.decode_step` in section 1 (the loop of
# section 2 runs your step once it is correct) and `05.kv_bytes_per_token` in section 4 (the formula-vs-
# tensors chart uses your formula). Change an answer, run its check cell again, then the cells after it.
# To go further: set `DTYPE = "bf16"` in the parameters cell and predict what happens to the bytes per
# position and to the cache speedup before you run it.

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
# # 00 · Setup: your machine, your model, your first measured answer
#
# Every number in this lab is measured on the machine in front of you. This notebook checks
# what that machine can run, loads the default chat model (offline, from a PyPI wheel), asks it
# one question and times the answer: time to first token and tokens per second.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Read the capabilities table: which optimisation paths this machine can take, and why not.
# - Load a real chat model with one call, in 32-bit floats ([fp32](../docs/glossary.md#fp32)), and know where its files live.
# - Measure time to first token ([TTFT](../docs/glossary.md#ttft)) and [decode](../docs/glossary.md#decode) speed in output tokens per second
#   ([tokens/s](../docs/glossary.md#tokens-per-second)) for one answer, and see why the first call is slower than the second.
# - Know where results are saved, with the environment that produced them.
#
# Each term is defined where first used and collected in the [glossary](../docs/glossary.md). On a slow machine,
# [quick mode](../docs/glossary.md#quick-mode) (`LABKIT_QUICK=1`) runs fewer repeats and tokens through the same code.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: this notebook is the room's install check. Ask everyone to run it top to bottom while
# you run it on the projector; the capabilities table is where a learner's laptop differs from yours,
# so ask two or three people to read theirs aloud. Before the first answer is timed, ask the room to
# guess its TTFT and tokens/s, and write the guesses down; compare after the second call.

# %% slideshow={"slide_type": "slide"}
import labkit
from labkit.core import config, env, machine, memory, results
from labkit.model import models, sizing
from labkit.decoding import generation
from labkit.lessons import findings, plots
from labkit.lessons import nb00

env.require_usable_gpu()  # stops here when nvidia-smi sees a GPU that torch cannot use (a CPU run by mistake)
plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if v})
env.capabilities_frame()

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
QUESTION = "What is the capital of France? Answer in one sentence."
MAX_NEW_TOKENS = config.pick(64, 24)  # tokens to generate per answer
DTYPE = "fp32"  # the baseline precision; later notebooks change it

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Predict, then load
#
# Before loading, the sizing model predicts how many bytes the weights take: parameters are
# counted on a model built on the [meta device](../docs/glossary.md#meta-device) (shapes, no data: no memory used), times bytes per
# parameter. The memory table after the load names each number's
# [source](../docs/glossary.md#memory-sources): `params` the weights' bytes, `rss` this process's resident memory now,
# [`rss_peak`](../docs/glossary.md#rss-peak) its highest since the process started; `cuda_peak` and `nvml` are GPU readings
# (empty on a CPU, with the reason).

# %% slideshow={"slide_type": "fragment"}
predicted = sizing.estimate("default", dtype=DTYPE, context=1)
print(f"{predicted.model}: {predicted.n_params:,} parameters → predicted weights {predicted.weight_bytes / 2**20:.1f} MiB in {DTYPE}")

# %% slideshow={"slide_type": "subslide"}
lm = models.load(dtype=DTYPE)
measured = memory.param_bytes(lm.model)
print(f"loaded {lm.name} on {lm.device} in {lm.load_seconds:.2f} s from {config.shown(models.resolve())}")
print(models.reference_note())  # what "fp32" means for this model (empty for your own LABKIT_MODEL)
print(f"parameter bytes: measured {measured.mib:.1f} MiB, predicted {predicted.weight_bytes / 2**20:.1f} MiB, "
      f"ratio {measured.bytes / predicted.weight_bytes:.3f}")
memory.frame(memory.snapshot(lm.model))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## A first chat, timed token by token
#
# A streamer hook stamps each token as `generate` hands it over: **TTFT** is the time to the
# first token ([prefill](../docs/glossary.md#prefill): one pass over the whole prompt), **[TPOT](../docs/glossary.md#tpot)** the mean time per
# token after it (decode), **[E2E](../docs/glossary.md#e2e)** the whole answer's time.

# %% slideshow={"slide_type": "fragment"}
first = generation.generate(lm.model, lm.tokenizer, QUESTION, max_new_tokens=MAX_NEW_TOKENS)
print("answer:", first.text)
print(f"TTFT {first.ttft_s * 1e3:.0f} ms · {first.n_out} tokens · "
      f"decode {first.decode_tokens_per_s or float('nan'):.1f} tokens/s · E2E {first.e2e_s:.2f} s")

# %% slideshow={"slide_type": "subslide"}
second = generation.generate(lm.model, lm.tokenizer, QUESTION, max_new_tokens=MAX_NEW_TOKENS)
print(f"second call: TTFT {second.ttft_s * 1e3:.0f} ms (first {first.ttft_s * 1e3:.0f} ms), "
      f"decode {second.decode_tokens_per_s or float('nan'):.1f} tokens/s")
print("same answer:", second.text == first.text)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Save what was measured
#
# Results go to `results/00_setup.json` with the hardware, library versions, date and command.
# Re-running this notebook replaces that file and nothing else.

# %% slideshow={"slide_type": "fragment"}
res = results.Results("00_setup")
res.add("load", model=lm.name, dtype=DTYPE, device=lm.device, load_s=lm.load_seconds,
        param_bytes=measured.bytes, predicted_bytes=predicted.weight_bytes)
for label, r in (("first", first), ("second", second)):
    res.add("chat", call=label, ttft_s=r.ttft_s, tpot_s=r.tpot_s, decode_tokens_per_s=r.decode_tokens_per_s,
            n_out=r.n_out, e2e_s=r.e2e_s, answer=r.text)
chat_1, chat_2 = res.section("chat")
found = nb00.findings.takeaways(model=lm.name, device=lm.device, load_s=lm.load_seconds, param_bytes=measured.bytes,
                                predicted_bytes=predicted.weight_bytes, first=chat_1, second=chat_2,
                                same_answer=first.text == second.text)
findings.record(res, found)
path = res.save()
print("saved", config.shown(path))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Working alone: hints, solutions, your progress
#
# From notebook 01 on, each exercise is a cell to fill in and a check that prints `not attempted`, `correct` or
# `wrong, because …`. Stuck on one, ask in a new cell:
#
# - `exercises.hint("06.left_pad")`: the next of its two or three hints (the idea first, nearly code last); a wrong
#   answer's line names the hint written for that mistake.
# - `exercises.solution("06.left_pad")`: that exercise's solution, and no other.
# - `exercises.reset("06.left_pad")`: start over (the record forgets it; the cell as shipped is printed).
#
# The last cell of every notebook prints your progress (done / wrong / not tried, predictions made), as does
# `python -m labkit progress` in a terminal. It stays in your lab cache; `pack --progress` shares it with an instructor.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
findings.show(found)
res.frame("chat")[["call", "ttft_s", "tpot_s", "decode_tokens_per_s", "n_out", "answer"]]

# %% [markdown] slideshow={"slide_type": "fragment"}
# - The capabilities table says which later sections run here and which show reference results.
# - The weights' size is predictable from the config before loading: parameters × bytes each.
# - The first call pays one-time costs (lazy initialisation, allocator growth); notebook 04
#   measures them. Compare the two TTFT values above.
#
# ## Exercises
# 1. Set `LABKIT_MODEL` to another model directory and re-run: how do TTFT and tokens/s change?
# 2. Ask a longer question: which of TTFT and TPOT grows, and why?

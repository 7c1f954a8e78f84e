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
# # 04 · Warmup: what the first request pays, and why
#
# A server that has just started must start Python, import torch, load the weights — and then answer its
# first request. Is that first request as fast as the hundredth?

# %% [markdown] slideshow={"slide_type": "notes"}
# Part of what it may pay is hidden inside
# the first `generate`: memory the allocator has not asked the OS for yet, weights not yet paged in,
# lazily initialised libraries — on a GPU also the CUDA context and kernel selection, and with
# [`torch.compile`](../docs/glossary.md#torch-compile) (PyTorch's compiler) the compilation itself. This notebook times each phase of a truly cold start, writes
# the warmup loop a server runs, and measures how many calls it takes until latency settles.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Split a cold start into phases — process start, imports, model load, first and second
#   request — measured in a fresh process.
# - Write the stopping rule of a warmup (exercise) and the share of the first call that is one-time cost
#   (exercise), then run a warmup loop written in the notebook on a real model.
# - See the first requests' latencies cold and after a warmup, side by side, each with its greedy
#   agreement against the cold process's answer.
# - Measure what `torch.compile` adds to the first call, and when it pays back.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: ask the room which cold-start phase is largest, and how much slower the first request is,
# before the first fresh process runs. The stopping rule (exercise 04.calls_until_settled) drives the
# warmup loop of section 4; give five minutes for it. On a busy laptop the loop may not settle: that is a
# result too (the spread says why).

# %% slideshow={"slide_type": "slide"}
import pandas as pd

import labkit
from labkit.core import config, env, machine, results, timing
from labkit.model import models, sizing
from labkit.decoding import cache_variants, generation, quality
from labkit.engines import warmup
from labkit.lessons import exercises, findings, plots
from labkit.lessons import nb04

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})
env.capabilities_frame().query("name in ['cuda', 'torch.compile']")

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
REQUESTS = config.pick(20, 8)  # timed requests per fresh process
REQUEST_TOKENS = 8  # new tokens per request (short: the start-up costs are the subject)
UNTIL_SPREAD = 0.10  # settled when (p90 - p10) / median of the last WINDOW calls is under this fraction
WINDOW = 5  # calls per settle window
MAX_CALLS = config.pick(30, 12)  # warmup gives up after this many calls, settled or not
COMPILE_TOKENS = (1, 16)  # (batch, tokens) of the input for the one-layer compile demo
COMPILE_ROUNDS = config.pick(10, 8)  # rounds of the plain and the compiled call, each in a shuffled order: pairs
COMPILE_MODEL = cache_variants.compile_here()[0]  # whole-model compile, fresh process: full mode, or on a GPU

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Predict: where does a cold start spend its time?
#
# A fresh process must start the interpreter, import torch and transformers, read the weights, then run
# the first request. Which phase is the largest? How many times longer than a steady request (the median
# of the last `WINDOW` requests) is the first one?

# %% slideshow={"slide_type": "fragment"}
PREDICT_LARGEST_PHASE = None  # your prediction: "process_start", "import", "load" or "first_request" (GPU: "cuda_init" too)
PREDICT_FIRST_OVER_STEADY = None  # your prediction: first request latency / steady latency (×)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · Measure: one truly cold process
#
# `warmup.cold_start` spawns `python -m labkit cold-start`, which times each phase in order and
# prints them as JSON. Nothing is cached in that process: its first request is truly cold.

# %% slideshow={"slide_type": "fragment"}
cold = warmup.cold_start(requests=REQUESTS, max_new_tokens=REQUEST_TOKENS)
phases = cold.phases_frame()
plots.bar(phases.dropna(subset=["seconds"]), x="phase", y="seconds", title="Cold start, phase by phase (fresh process)",
          y_title="seconds").show()
phases

# %% slideshow={"slide_type": "fragment"}
steady_s = timing.Measurement.from_values("steady", cold.requests_s[-WINDOW:]).median
start_up = cold.process_start_s + cold.import_s + cold.load_s + (cold.cuda_init_s or 0)
timed = phases.dropna(subset=["seconds"]).query("phase != 'second_request'").set_index("phase").seconds
exercises.reveal_choice("largest phase", PREDICT_LARGEST_PHASE, timed.idxmax(), list(timed.index))
exercises.reveal("first request / steady", PREDICT_FIRST_OVER_STEADY, cold.first_request_s / steady_s, "×")
print(f"before the first request: {start_up:.2f} s (imports {cold.import_s:.2f} s, load {cold.load_s:.2f} s); "
      f"first request {cold.first_request_s * 1e3:.0f} ms, steady {steady_s * 1e3:.0f} ms")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### How much of the first call is one-time cost?
#
# The steady latency is what every call pays; whatever the first call pays on top happens once. Write the
# share of the first call that is one-time cost, from a list of latencies in call order.

# %% labkit={"exercise": "04.one_time_share"} slideshow={"slide_type": "skip"} tags=["exercise"]
def one_time_share(latencies_s: list[float], window: int) -> float:
    """(first − steady) / first, where steady is the median of the last ``window`` latencies: 0 when the first
    call is as fast as the rest, near 1 when it is almost all one-time cost."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("04.one_time_share", one_time_share)

# %% slideshow={"slide_type": "fragment"}
share = exercises.use("04.one_time_share", one_time_share, warmup.one_time_share)(cold.requests_s, WINDOW)
extra_ms = (cold.first_request_s - steady_s) * 1e3
print(warmup.one_time_said(cold.requests_s, WINDOW, share))  # the share beside the verdict on the first call

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Where did the first request's extra memory come from?
#
# Resident memory (RSS) before and after the first request. On CPU, transformers maps the safetensors
# file into memory: the weights can count as "loaded" before the OS has read them. Does the first request
# grow the RSS, and by how much compared with the parameter bytes the sizing model predicts? On a GPU the
# weights live in device memory, so the growth is read there: PyTorch's CUDA allocator and NVML.

# %% slideshow={"slide_type": "fragment"}
rss = cold.rss_bytes
grew = warmup.first_request_growth(cold)  # by source: RSS on a CPU; CUDA allocator and NVML on a GPU
weights_b = sizing.weight_bytes(sizing.shape(models.resolve()), "fp32")  # the model the cold process loaded
print(f"RSS: after import {rss['after_import'] / 2**20:.0f} MiB · after load {rss['after_load'] / 2**20:.0f} MiB · "
      f"after 1st request {rss['after_request_1'] / 2**20:.0f} MiB · after 2nd {rss['after_request_2'] / 2**20:.0f} MiB")
for src, b in grew.items():
    print(f"first request grew {warmup.GROWTH_SOURCES[src]} by " + (f"{b / 2**20:.0f} MiB = {b / weights_b:.2f}× the "
          f"weights ({weights_b / 2**20:.0f} MiB)" if b is not None else "— (not measurable here)"))
print("CUDA context:", f"{cold.cuda_init_s:.2f} s" if cold.cuda_init_s is not None else cold.notes["cuda_init_s"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · The warmup loop, written out
#
# A server calls its model before it opens its port, until latency has *settled*: the last `WINDOW` calls
# spread less than `UNTIL_SPREAD` — spread as `labkit.core.timing.Measurement` defines it everywhere,
# (p90 − p10) / median, given to you as `window_spread`. Write the stopping rule on a list of latencies.

# %% labkit={"exercise": "04.calls_until_settled"} slideshow={"slide_type": "skip"} tags=["exercise"]
from labkit.engines.warmup import window_spread


def calls_until_settled(latencies_s: list[float], until_spread: float, window: int) -> int | None:
    """The number of calls before the first ``window`` calls in a row whose ``window_spread`` is under
    ``until_spread`` (those earlier calls are the warmup); None when no such window exists yet."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("04.calls_until_settled", calls_until_settled)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Predict, then run the loop on the model
#
# The loop below loads the model in this notebook's process (it has imported torch but run no model) and
# calls it until your rule says settled, or `MAX_CALLS`. Predict: how many calls before the steady window?

# %% slideshow={"slide_type": "fragment"}
PREDICT_CALLS_TO_SETTLE = None  # your prediction: warmup calls before the first steady window

# %% slideshow={"slide_type": "fragment"} tags=["mechanism"]
settled_after = exercises.use("04.calls_until_settled", calls_until_settled, warmup.settle_point)
lm = models.load()


def request():  # one short greedy request, as the cold processes make
    return generation.generate(lm.model, lm.tokenizer, warmup.DEFAULT_PROMPT, max_new_tokens=REQUEST_TOKENS,
                               fixed_length=True).text


latencies, answers = [], []
while len(latencies) < MAX_CALLS:
    t0 = timing.now(lm.device)  # synchronises a GPU before reading the clock
    answers.append(request())
    latencies.append(timing.now(lm.device) - t0)
    if settled_after(latencies, UNTIL_SPREAD, WINDOW) is not None:
        break  # the last WINDOW calls are steady: open the port
n_warm = settled_after(latencies, UNTIL_SPREAD, WINDOW)
print(f"{len(latencies)} calls: " + " ".join(f"{t * 1e3:.0f}" for t in latencies) + " ms")

# %% slideshow={"slide_type": "fragment"}
if n_warm is not None:
    exercises.reveal("warmup calls before settling", PREDICT_CALLS_TO_SETTLE, n_warm, "calls")
else:
    print(f"no steady window within MAX_CALLS={MAX_CALLS} calls (this machine is noisy): nothing to compare with "
          f"your prediction of {PREDICT_CALLS_TO_SETTLE}")
print(f"the same rule in labkit (warmup.settle_point): {warmup.settle_point(latencies, UNTIL_SPREAD, WINDOW)}; "
      f"answers identical across the calls: {len(set(answers)) == 1}")
print("this loop:", nb04.findings.settle_words(latencies, UNTIL_SPREAD, WINDOW))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · The first requests, cold vs after a warmup
#
# A second fresh process runs labkit's warmup first — `warmup.warmup(model, tokenizer,
# until_spread=UNTIL_SPREAD, max_calls=MAX_CALLS, window=WINDOW)`, the same rule as your loop — then
# the same timed requests. Every request's answer is compared with the cold process's first answer
# (greedy agreement: the share of identical tokens). Does the warmup change the latency of request 1?
# Does it change the answers?

# %% slideshow={"slide_type": "fragment"}
warmed = warmup.cold_start(requests=REQUESTS, max_new_tokens=REQUEST_TOKENS, warm=True, until_spread=UNTIL_SPREAD,
                           max_calls=MAX_CALLS, window=WINDOW)
reqs = warmup.requests_frame(cold=cold, warmed=warmed)
reference_answer = cold.texts[0]  # the cold process's first greedy answer: the baseline
reqs["agreement"] = [quality.token_agreement(lm.tokenizer, t, reference_answer) for t in cold.texts + warmed.texts]
plots.line(reqs, x="request", y="latency_s", color="series", title=f"First {REQUESTS} requests of a fresh process",
           x_title="request number", y_title="end-to-end latency (s)").show()
by = reqs.groupby("series")
summary = by.agg(first_s=("latency_s", "first"), median_s=("latency_s", "median"), agreement=("agreement", "min"))
summary

# %% slideshow={"slide_type": "fragment"}
rep = warmed.warmup
warmup.settle_figure(rep).show()
print("labkit's warmup:", nb04.findings.settle_words(rep.latencies_s, rep.until_spread, rep.window))
print(f"steady latency {rep.steady_s * 1e3:.0f} ms" if rep.settled else
      f"last spread {rep.final_spread:.1%}: the machine is noisy")
cold_point = warmup.settle_point(cold.requests_s, UNTIL_SPREAD, WINDOW)  # saved with the results
print("the cold series above, by the same rule:", nb04.findings.settle_words(cold.requests_s, UNTIL_SPREAD, WINDOW))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · torch.compile: what does its first call cost?
#
# `torch.compile` traces a module ([dynamo](../docs/glossary.md#dynamo), its front end, captures the graph) and generates and
# builds code for it ([inductor](../docs/glossary.md#inductor), its default backend) on the first call; later calls with the same
# shapes reuse it. First one decoder layer's MLP (small and quick), with the largest difference between its
# compiled and [eager](../docs/glossary.md#eager) outputs (eager: uncompiled, one operator at a time); then — in full mode — the
# whole model's decode step with a [static cache](../docs/glossary.md#static-cache) (every position allocated up front), in a
# fresh process, whose answers are compared with the cold eager process's.

# %% slideshow={"slide_type": "fragment"}
cap = env.capability("torch.compile")
res = results.Results("04_warmup")
if cap.available:
    import torch

    x = torch.randn(*COMPILE_TOKENS, lm.model.config.hidden_size, device=lm.device)  # inputs follow the model
    mlp = lm.model.model.layers[0].mlp
    mlp_cost = warmup.compile_cost(mlp, x, repeats=COMPILE_ROUNDS)  # steady calls judged paired, round by round
    with torch.inference_mode():  # the same module and shapes: dynamo reuses the code compiled above
        first = lambda y: y[0] if isinstance(y, tuple) else y  # a mixture-of-experts block also returns router logits
        mlp_cost["max_abs_diff"] = (first(torch.compile(mlp)(x)) - first(mlp(x))).abs().max().item()
    res.add("compile", target="one MLP layer", where=results.HERE, **mlp_cost)
    print(f"one MLP: eager first {mlp_cost['eager_first_s'] * 1e3:.1f} ms · compiled first {mlp_cost['compiled_first_s']:.2f} s "
          f"· then {mlp_cost['compiled_s'] * 1e3:.2f} ms compiled vs {mlp_cost['eager_s'] * 1e3:.2f} ms eager; "
          f"outputs differ by at most {mlp_cost['max_abs_diff']:.2g}")
else:
    print("torch.compile is not available here:", cap.reason)

# %% slideshow={"slide_type": "fragment"}
if cap.available and COMPILE_MODEL:
    comp = warmup.cold_start(requests=3, max_new_tokens=REQUEST_TOKENS, compile=True)
    res.add("compile", target="whole model (static cache)", where=results.HERE, compiled_first_s=comp.first_request_s,
            compiled_s=comp.requests_s[-1], eager_first_s=cold.first_request_s, eager_s=cold.requests_s[-1],
            tokens_per_call=REQUEST_TOKENS,
            agreement=min(quality.token_agreement(lm.tokenizer, t, reference_answer) for t in comp.texts))
    print(f"compiled model, fresh process: first request {comp.first_request_s:.1f} s, then {comp.requests_s[-1]:.2f} s")
else:
    why = cache_variants.compile_here()[1] or "COMPILE_MODEL = False"
    story = cache_variants.compile_story()  # this kind of machine's reference (notebooks 05 and 08 show it too)
    if story is None:
        print(f"Whole-model compile not run here ({why}), and no compile reference of this GPU ships.")
    else:
        res.add("compile", target=f"whole model (static cache, {story.new_tokens} tokens)", where=story.where,
                compiled_first_s=story.compiled_first_s, eager_first_s=story.eager_first_s,
                compiled_s=story.new_tokens / story.compiled_tokens_per_s,
                eager_s=story.new_tokens / story.eager_tokens_per_s, agreement=story.agreement,
                tokens_per_call=story.new_tokens, paired=story.paired, judged=story.judged,
                samples={"compiled_s": [story.new_tokens / x for x in story.compiled_samples],
                         "eager_s": [story.new_tokens / x for x in story.eager_samples]})
        print(f"Whole-model compile not run here ({why}). " + findings.compile_sentence(story))
comp_df = res.frame("compile")
comp_df["break_even_calls"] = [warmup.break_even_calls(r.compiled_first_s, r.compiled_s, r.eager_first_s, r.eager_s)
                               for r in comp_df.itertuples()]
if "tokens_per_call" in comp_df:  # the whole model's pay-back in tokens, the unit notebooks 05 and 08 use
    comp_df["break_even_tokens"] = pd.to_numeric(comp_df.break_even_calls) * comp_df.tokens_per_call
comp_df[[c for c in ["target", "where", "eager_first_s", "compiled_first_s", "eager_s", "compiled_s", "break_even_calls",
                     "break_even_tokens",
                     "max_abs_diff", "agreement"] if c in comp_df]]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
res.replace("phases", [{"phase": p, "seconds": s} for p, s in cold.phases().items()])
res.replace("requests", reqs.to_dict("records"))
res.replace("notebook_warmup", [{"call": i, "latency_s": t} for i, t in enumerate(latencies, start=1)])
res.add("warmup", calls=rep.calls, settled=rep.settled, warmup_calls=rep.warmup_calls,
        final_spread=rep.final_spread, steady_s=rep.steady_s, cold_settle_point=cold_point,
        notebook_loop_calls=len(latencies), notebook_loop_warmup_calls=n_warm)
res.notes.update(rss_bytes=cold.rss_bytes, gpu_bytes=cold.gpu_bytes)  # gpu_bytes: allocator and NVML on a GPU
found = nb04.findings.takeaways(cold=cold, warmed=warmed, steady_s=steady_s, one_time_share=share, memory_growth=grew,
                                weight_bytes=weights_b, loop_warmup_calls=n_warm, loop_calls=len(latencies),
                                summary=summary, compile_rows=comp_df, loop_latencies_s=latencies,
                                until_spread=UNTIL_SPREAD, window=WINDOW)
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The two exercises sit where their mechanism is taught: `04.one_time_share` in section 2 and
# `04.calls_until_settled` in section 4 (the warmup loop there stops by your rule once it is correct).
# Change an answer, run its check cell again, then the cells after it. To go further:
# 1. Raise `REQUEST_TOKENS` to 64: predict whether the first request's one-time share grows or shrinks.
# 2. Tighten `UNTIL_SPREAD` to 0.05: how many warmup calls does it take now? Does it settle at all?
# 3. A server takes prompts of many lengths. Why should its warmup use several prompt lengths
#    (hint: compiled shapes, allocator sizes)?

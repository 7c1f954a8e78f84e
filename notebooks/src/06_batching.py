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
# # 06 · Batching and serving: more users per second, and what each one pays
#
# One decode step reads every weight of the model once, whether it advances one sequence or sixteen.
# Batching shares that read among users.

# %% [markdown] slideshow={"slide_type": "notes"}
# Here you build a batch yourself — prompts of different lengths
# padded into one rectangle, a mask, one prefill, one decode step — and check it against each prompt alone.
# Then the library does the same at scale: a sweep of [static batches](../docs/glossary.md#static-batching) (each runs until its
# longest answer ends), the cost of padding, and a server that batches requests as they come
# ([dynamic batching](../docs/glossary.md#dynamic-batching)) under load.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Write left padding with its attention mask, and the next step's mask and positions; run one batched
#   decode step and check it gives each prompt's own tokens.
# - Measure a static batch-size sweep: TTFT, TPOT, total and per-user tokens/s, each with its greedy
#   agreement against the prompts decoded alone; read the trade-off as a [Pareto front](../docs/glossary.md#pareto-front)
#   (the settings that no other beats on both).
# - Count what left padding wastes when prompt lengths differ, and what bucketing saves.
# - Run an OpenAI-compatible server with dynamic batching and compare `max_batch_size` 1 and 8 under load;
#   tell TGI's real batching flags from the client options articles invent.
# - Put the real [vLLM](../docs/glossary.md#vllm) engine (an open-source serving engine: `vllm serve`, with `make vllm`) under the
#   same load as the lab's server: throughput, TTFT, TPOT, ITL and [goodput](../docs/glossary.md#goodput) (requests per second
#   that meet the [SLO](../docs/glossary.md#slo), a latency target) in one table.
# - Load-test it two ways: Locust (generic HTTP) and an LLM-aware streaming client with vLLM's
#   benchmark semantics (TTFT, TPOT, ITL, goodput under [open-loop](../docs/glossary.md#open-loop)
#   [Poisson and bursty](../docs/glossary.md#poisson-arrivals) arrivals: requests come at random times, answered or not).

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: the live batching panel (section 8) is the centrepiece; run the sections before
# it while the room does the two exercises of sections 1 and 2. Ask for a prediction of total and per-user
# tokens/s at the sweep's largest batch before the sweep (section 4). In the panel, move batch size 1 → 8 at 8 clients, then drop to
# 1 client and ask why batching stops helping.

# %% slideshow={"slide_type": "slide"}
import os

import pandas as pd
import torch
from IPython.display import display

import labkit
from labkit.core import config, env, machine, results, verdict
from labkit.model import models
from labkit.decoding import decode
from labkit.serve import launch, loadgen
from labkit.serve.experiments import batching
from labkit.serve.vllm import shared
from labkit.serve.vllm import offline as vllm
from labkit.serve.vllm import server as vllm_server
from labkit.serve import metrics as prom
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb06
from labkit.lessons.widgets import panel as batch_widget

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
STEP_PROMPTS = ["The capital of France is", "Once upon a time, in a village by the sea, there lived", "Water boils at"]
STEP_TOKENS = config.pick(16, 8)  # new tokens for the decode core's check on the padded batch
SWEEP_TOKENS = config.pick(32, 6)  # new tokens per sequence in the static sweep
BATCH_SIZES = config.pick(None, [1, 2, 4, 8])  # None: 1, 2, 4, 8, 16 on a CPU; on a GPU doubling until out of memory
SWEEP_REPEATS = config.pick(8, 6)  # rounds over the batch sizes (and the padding cases), each in a shuffled order (after one warmup each)
PAD_BATCH = config.pick(8, 4)  # sequences in the padding experiment (one long prompt, the rest short)
PAD_LONG_REPEAT = config.pick(2, 1)  # how many times the long prompt repeats the prompt set
CLIENTS = 8  # concurrent clients for the server comparison
SERVE_ROUNDS = config.pick(8, 6)  # rounds of one short pass per max_batch_size, each round in a shuffled order
SERVE_REQUESTS = 8  # requests per pass
SERVE_TOKENS = config.pick(32, 4)  # tokens per request (ignore_eos: exactly this many)
MAX_WAIT_MS = 20  # dynamic batching: how long the oldest queued request waits for company, ms
LOCUST_SECONDS = config.pick(20, 5)  # Locust run time, s
OPEN_LOOP_ROUNDS = config.pick(8, 6)  # rounds of one open-loop pass per arrival shape, each in a shuffled order
OPEN_LOOP_REQUESTS = config.pick(8, 3)  # requests per open-loop (Poisson / bursty) pass
REQUEST_RATE = 2.0  # open-loop arrival rate, requests/s
SLO = loadgen.SLO(ttft_s=2.0, tpot_s=0.5)  # goodput target: a request is good if it meets both, s
VLLM_LIVE = os.environ.get("LABKIT_VLLM_LIVE") == "1"  # True: start vllm serve here (about a minute on 2 cores); else its reference run
VLLM_ROUNDS = config.pick(8, 6)  # rounds of the same load against labkit serve and vllm serve, each in a shuffled order
VLLM_KV_CACHE_GIB = 1  # vllm serve's KV cache on a CPU, whole GiB (on a GPU: half its memory)
VLLM_START_DEADLINE_S = 300  # seconds vllm serve may take to answer /health (eager start: about 35-100 s on 2 cores)

# %% slideshow={"slide_type": "fragment"}
lm = models.load()
res = results.Results("06_batching")
print(f"{lm.name} on {lm.device}, loaded in {lm.load_seconds:.2f} s")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · A batch is a rectangle
#
# A batch is one (B, T) tensor, but prompts have different lengths: the short ones are padded. A decoder
# writes each row's next token after its last column, so on which side do the pads go, and how does the
# model learn to ignore them? Write the padding and its attention mask (1 = real token, 0 = pad), building
# both on the model's device.

# %% labkit={"exercise": "06.left_pad"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def left_pad(prompt_ids, pad_id, device):
    """Token-id lists of different lengths → (B, T) ``input_ids`` and ``attention_mask`` on ``device``.

    T is the longest prompt's length; shorter rows are filled with ``pad_id``.
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("06.left_pad", left_pad);

# %% slideshow={"slide_type": "fragment"}
pad_batch = exercises.use("06.left_pad", left_pad, decode.left_pad)
prompt_ids = [lm.tokenizer(t)["input_ids"] for t in STEP_PROMPTS]
ids, mask = pad_batch(prompt_ids, lm.tokenizer.pad_token_id, lm.device)
pd.DataFrame(mask.cpu().numpy(), index=[f"{len(p)} tokens" for p in prompt_ids])  # the mask: 0 marks a pad

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · One batched decode step, written out
#
# One prefill runs all rows at once and leaves every row's keys and values in one cache. Then a decode
# step feeds one token per row. Each row's new token sits in the same column, but at which *position*,
# when a row starts with pads? And what must the step's mask cover? Write both.

# %% labkit={"exercise": "06.step_inputs"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def step_inputs(attention_mask):
    """The next decode step's inputs, from the (B, T) mask so far.

    Returns the step's (B, T + 1) attention mask and the (B,) positions of the new tokens (positions count
    a row's real tokens only, from 0).
    """
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("06.step_inputs", step_inputs);

# %% slideshow={"slide_type": "fragment"}
next_inputs = exercises.use("06.step_inputs", step_inputs, batching.step_inputs)
with torch.inference_mode():
    positions = decode.positions(mask)  # (B, T): each row counts its real tokens from 0 (pads are masked out)
    out = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)  # one prefill
    first = out.logits[:, -1].argmax(-1)  # (B,) each row's first new token
    step_mask, step_pos = next_inputs(mask)  # (B, T + 1), (B,)
    out = lm.model(input_ids=first[:, None], attention_mask=step_mask, position_ids=step_pos[:, None],
                   past_key_values=out.past_key_values, use_cache=True)  # one step: every row, one token
    second = out.logits[:, -1].argmax(-1)
batched = torch.stack([first, second], dim=1).cpu()  # (B, 2)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same tokens as each prompt alone?
#
# Padding is only correct if it changes nothing: each row should get the tokens its prompt gets without
# company. Does it, row by row?

# %% slideshow={"slide_type": "fragment"}
alone = torch.cat([decode.greedy(lm.model, torch.tensor([p], device=lm.device), new_tokens=2).cpu()
                   for p in prompt_ids])
pd.DataFrame({"prompt": STEP_PROMPTS, "pads": [ids.shape[1] - len(p) for p in prompt_ids],
              "batched": [lm.tokenizer.decode(r) for r in batched], "alone": [lm.tokenizer.decode(r) for r in alone],
              "same": (batched == alone).all(dim=1).tolist()})

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · The decode core on a left-padded batch
#
# The server's batches (section 6), continuous batching (notebook 07) and the compiled decoder (08) run on
# these functions: your padding, your mask and positions, and the step, in a loop. `left_pad`, `positions` and
# `extend` answer this notebook's exercises, so each appears once your version passes its check.

# %% slideshow={"slide_type": "fragment"}
solved = {name: exercises.evaluate(f"06.{name}", answer).status == "correct"
          for name, answer in (("left_pad", left_pad), ("step_inputs", step_inputs))}
decode.show_source(*(["left_pad"] if solved["left_pad"] else []), *(["positions", "extend"] if solved["step_inputs"] else []),
                   "prefill", "decode_one_token", "greedy")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Proof that the core computes what `generate` computes, on the same left-padded batch:

# %% slideshow={"slide_type": "fragment"}
core = decode.same_as_generate(lm.model, ids, mask, new_tokens=STEP_TOKENS)
print(f"decode core vs generate, {len(core['ours'])} left-padded rows × {STEP_TOKENS} tokens: "
      f"{'identical' if core['identical'] else 'DIFFERENT'}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · Static batching: predict, then sweep
#
# A decode step must read all weights plus each sequence's KV cache. The sweep below runs batches of
# `BATCH_SIZES` prompts (left padded, mixed lengths). Predict: at the largest batch, how many times the
# total tokens/s of batch 1? And will each user's own speed rise, stay, or fall?

# %% slideshow={"slide_type": "fragment"}
PREDICT_THROUGHPUT_GAIN = None  # your prediction: total tokens/s at the largest batch / at batch 1

# %% slideshow={"slide_type": "fragment"}
machine.check("static sweep")
sweep = batching.static_sweep(lm.model, lm.tokenizer, BATCH_SIZES, new_tokens=SWEEP_TOKENS, repeats=SWEEP_REPEATS)
res.replace("static", sweep)
res.frame("static")[["batch_size", "status", "ttft_s", "tpot_s", "latency_s", "tokens_per_s_per_user",
                     "total_tokens_per_s", "wasted_fraction", "agreement"]].round(3)

# %% slideshow={"slide_type": "subslide"}
ok = [r for r in sweep if r["status"] == "ok"]
first_row, last_row = ok[0], ok[-1]
memory_bound = batching.memory_bound_gain(lm.model, lm.tokenizer, last_row["batch_size"], SWEEP_TOKENS)
plots.line(res.frame("static").query("status == 'ok'"), x="batch_size", y=["total_tokens_per_s", "tokens_per_s_per_user"],
           title="Static batching: total against per-user output tokens/s", x_title="batch size",
           y_title="output tokens/s", log_x=True).show()
batching.pareto_figure(sweep).show()
total_v, user_v = nb06.findings.batch_verdicts(first_row, last_row, memory_bound)
gain = total_v.gain
print(f"drift: batch 1 timed first and again after the last round (the rounds each in a shuffled order), last / first = "
      f"{first_row['drift']:.2f}" if first_row.get("drift") else "")
print(nb06.findings.throughput_sentence(last_row["batch_size"], total_v, memory_bound))
exercises.reveal(f"throughput gain at batch {last_row['batch_size']}", PREDICT_THROUGHPUT_GAIN, gain, "×")
print(f"the memory-bound model predicted {memory_bound:.1f}× (weights read once per step, KV per sequence)")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · The cost of padding
#
# One long prompt among short ones makes every row pay for its length in prefill (and in attention while
# decoding). *Bucketing* — batching prompts of similar length — is the remedy: the short prompts together,
# the long one alone. Predict: how many times faster is the bucketed prefill than the mixed one?

# %% slideshow={"slide_type": "fragment"}
PREDICT_BUCKET_SPEEDUP = None  # your prediction: prefill time of the mixed batch / of the two buckets together

# %% slideshow={"slide_type": "fragment"}
machine.check("padding")
pad = batching.padding_experiment(lm.model, lm.tokenizer, batch=PAD_BATCH, new_tokens=4, long_repeat=PAD_LONG_REPEAT,
                                  repeats=SWEEP_REPEATS)
res.replace("padding", pad)
mixed, bucketed = pad[0], pad[-1]
plots.bar(res.frame("padding"), x="case", y="ttft_s", title="Prefill time (TTFT) with and without padding",
          y_title="seconds").show()
exercises.reveal("bucketing speedup", PREDICT_BUCKET_SPEEDUP, mixed["ttft_s"] / bucketed["ttft_s"], "×")
print(f"{mixed['pad_tokens']} of the mixed batch's {mixed['padded_tokens']} prompt tokens are padding "
      f"({mixed['wasted_fraction']:.0%}); its tokens equal the bucketed ones on {mixed['agreement']:.0%}")
res.frame("padding")[["case", "batch", "real_tokens", "padded_tokens", "wasted_fraction", "ttft_s", "tpot_s",
                      "agreement"]].round(3)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · A server with dynamic batching
#
# `python -m labkit serve` (or `launch.start_server(...)` here) speaks the OpenAI API: `POST /v1/completions`
# and `/v1/chat/completions`, streaming or not, plus `/health` and `/metrics`. Requests wait in a bounded queue;
# a model thread takes the oldest, waits up to `max_wait_ms` for up to `max_batch_size` others, and decodes them
# together (the loop of section 3). A sequence that finishes leaves the batch at once.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Where batching is configured: articles vs TGI vs this lab
#
# Articles configure Hugging Face TGI's batching from its Python client:
# `Client(url, max_batch_size=…, waiting_served_ratio=…)`. Does the client take those? What does the lab's
# own server do with such a keyword?

# %% slideshow={"slide_type": "fragment"}
print(f"the article writes:    {batching.TGI_ARTICLE_CALL}\nTGI's client really is: {batching.TGI_CLIENT_CALL}")
try:  # the article's keyword, given to labkit's server: refused before anything loads
    launch.start_server(lm, port=0, max_batch_size=CLIENTS, waiting_served_ratio=1.2).stop()
except ValueError as exc:
    print("labkit's server:", exc)
pd.DataFrame(batching.tgi_batching_options()).style.hide(axis="index")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### max_batch_size 1 vs 8, same load
#
# Predict: with `CLIENTS` clients always waiting, how many times the output tokens/s does `max_batch_size=8`
# serve compared with `max_batch_size=1`? And what happens to each token's time (TPOT)? The two settings take
# turns: `SERVE_ROUNDS` rounds of one short pass each (`SERVE_REQUESTS` requests), each round in a shuffled order,
# so a slower stretch of the machine hits both alike and each round's two passes form a pair for the verdict.

# %% slideshow={"slide_type": "fragment"}
PREDICT_SERVER_GAIN = None  # your prediction: served tokens/s with max_batch_size 8 / with 1

# %% slideshow={"slide_type": "fragment"}
# the lab's own server, on this machine even with LABKIT_SERVER_URL set: its batch settings are what this section varies
server = launch.start_server(lm, port=0, max_batch_size=1, max_wait_ms=MAX_WAIT_MS)
print("serving at", server.url)
bad = loadgen.run(server.url, num_requests=1, max_tokens=10**6, warmup=0).outputs[0]
print(f"a request for a million tokens gets HTTP {bad.status}: {bad.error}")

# %% slideshow={"slide_type": "subslide"}
machine.check("server")
serve_rows, scraped = nb06.runs.batch_size_rounds(server, (1, 8), SERVE_ROUNDS, clients=CLIENTS,
                                                  num_requests=SERVE_REQUESTS, max_tokens=SERVE_TOKENS)
res.replace("serving", serve_rows)
one, eight = serve_rows
serve_v, tpot_v = nb06.findings.server_verdicts(one, eight)  # paired on the passes, round by round
print(f"{SERVE_ROUNDS} rounds of one pass per setting: max_batch_size 8 served "
      + verdict.phrase(serve_v, "the tokens/s of max_batch_size 1", "more", "fewer"))
plots.bar(res.frame("serving").astype({"max_batch_size": str}), x="max_batch_size", y="output_tokens_per_s",
          title=f"{CLIENTS} clients: served output tokens/s", y_title="tokens/s").show()
exercises.reveal("server gain", PREDICT_SERVER_GAIN, serve_v.gain, "×")
res.frame("serving")[["max_batch_size", "rounds", "mean_batch_size", "completed", "failed", "output_tokens_per_s",
                      "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s"]].round(3)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The server's own view, from `/metrics` (Prometheus text format): how big the batches of the last `max_batch_size=8`
# pass above really were, its counters after that pass minus before it.

# %% slideshow={"slide_type": "fragment"}
for name, labels, value in prom.samples_delta(*scraped[8]):  # name, labels (a bucket), value
    if name.startswith(("labkit_batch_size", "labkit_queue")):
        print(name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""), f"{value:g}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same load against vLLM
#
# `vllm serve` (installed by `make vllm` in `.venv-vllm`) with `--max-num-seqs 8`, the same precision and model: the
# same requests from the same `CLIENTS` clients through the same load generator, in interleaved rounds with the lab's
# server at `max_batch_size=8`; goodput at this notebook's `SLO`. A start costs about a minute on 2 cores, so it runs
# with `VLLM_LIVE = True`; otherwise the table is the reference's (notebook 09 starts vLLM under its own load).
# With `LABKIT_SERVER_URL` set, the load goes to the room's one `vllm serve` instead (nothing starts here, whatever
# `VLLM_LIVE` says), on the instructor's machine and shared with every learner sending load at the same moment: its
# numbers are neither this laptop's nor yours alone.
# Predict: how many times the lab's output tokens/s does vLLM serve?

# %% slideshow={"slide_type": "fragment"}
PREDICT_VLLM_GAIN = None  # your prediction: vLLM's output tokens/s / the lab's server's, same load

# %% slideshow={"slide_type": "fragment"}
server.configure(max_batch_size=8)
vllm_settings = vllm_server.Settings(model=models.resolve(), dtype=vllm.VLLM_DTYPES[lm.dtype],
                                     device=vllm_server.default_device(), max_num_seqs=8, kv_cache_gib=VLLM_KV_CACHE_GIB)
SHARED = shared.shared_server()  # LABKIT_SERVER_URL: the room's vllm serve takes vLLM's load; None: vLLM starts here
machine.check("vllm serve")
if SHARED is None and not vllm_server.vllm_python().exists():
    same = {"status": vllm_server.MISSING}
elif SHARED is None and not VLLM_LIVE:
    same = {"status": "vllm serve not started here (VLLM_LIVE = False; set it True to measure this table here)"}
else:
    same = nb06.runs.beside_vllm(vllm_settings, {"labkit serve (max_batch_size 8)": server.url}, VLLM_ROUNDS,
                              VLLM_START_DEADLINE_S, shared=SHARED, num_requests=SERVE_REQUESTS,
                              max_concurrency=CLIENTS, max_tokens=SERVE_TOKENS, slo=SLO)
if "rows" in same:
    res.replace("vllm_same_load", same["rows"])
    res.notes["vllm_same_load"] = {"VLLM_LIVE": VLLM_LIVE, "platform": same["platform"],
                                    "settings": vars(vllm_settings), "shared_server": SHARED and SHARED.provenance()}
    lab_row, vllm_row = same["rows"]
    exercises.reveal("vLLM / labkit serve output tokens/s" + (" (vLLM on the shared server)" if SHARED else ""),
                     PREDICT_VLLM_GAIN, vllm_row["output_tokens_per_s"] / lab_row["output_tokens_per_s"], "×")
    vllm_v = verdict.compare(verdict.samples(vllm_row, "output_tokens_per_s"),
                             verdict.samples(lab_row, "output_tokens_per_s"), paired=True)  # round by round
    print(f"vLLM {same['platform']['version']} ({same['platform']['platform']}); status: {same['status']}; "
          f"{VLLM_ROUNDS} rounds, each in a shuffled order: vLLM served "
          + verdict.phrase(vllm_v, "the lab's output tokens/s", "more", "fewer")
          + (f"; vLLM ran on the {SHARED.provenance()['where']}" if SHARED else ""))
    display(res.frame("vllm_same_load")[["server", *nb06.runs.SAME_LOAD_FIGURES]].round(3))
else:
    print(same["status"] if same["status"].startswith(("vLLM not installed", "vllm serve not started"))
          else f"vLLM did not run here: {same['status']}")
    references.show("06_batching", "vllm_same_load", ["server", *nb06.runs.SAME_LOAD_FIGURES])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7 · Load testing two ways
#
# **Locust** is a general HTTP load tester: each simulated user sends a request, waits for the whole
# answer, sends the next (a *closed loop*). It sees response times, not tokens.

# %% slideshow={"slide_type": "fragment"}
server.configure(max_batch_size=8)  # the lab's server here: Locust's view of the batcher measured above
locust = loadgen.run_locust(server.url, users=CLIENTS, run_time_s=LOCUST_SECONDS, max_tokens=SERVE_TOKENS)
res.add("locust", users=CLIENTS, max_tokens=SERVE_TOKENS, **locust["aggregated"])
agg = locust["aggregated"]
print(f"Locust, {CLIENTS} users for {LOCUST_SECONDS} s: {agg['requests']} requests, {agg['failures']} failed, "
      f"{agg['requests_per_s']:.2f} requests/s ≈ {agg['output_tokens_per_s']:.1f} tokens/s, "
      f"median response {agg['response_p50_s']:.2f} s")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **labkit.serve.loadgen** measures like `vllm bench serve`: an *open loop* where requests arrive at a rate whether
# or not earlier ones finished (Poisson gaps, or gamma gaps with burstiness < 1 for bursts), streamed so TTFT
# and inter-token latency are stamped as tokens arrive, and **goodput**: requests per second that meet the
# SLO. The same call works against `vllm serve` (notebook 07). A burst fills the queue at once (longer waits)
# but also hands the batcher company (bigger batches). The two shapes take turns in `OPEN_LOOP_ROUNDS` rounds of
# one short pass each (round i of both draws its gaps from the same seed), and the verdict pairs each round's two
# TTFT p90s. Predict: which arrivals see the worse TTFT p90?

# %% slideshow={"slide_type": "fragment"}
PREDICT_WORSE_TTFT = None  # your prediction: "Poisson" or "bursty"

# %% slideshow={"slide_type": "fragment"}
open_rows = nb06.runs.arrival_rounds(server.url, {"Poisson": 1.0, "bursty": 0.25}, OPEN_LOOP_ROUNDS,
                                     num_requests=OPEN_LOOP_REQUESTS, request_rate=REQUEST_RATE, max_tokens=SERVE_TOKENS,
                                     slo=SLO)  # each figure the median over the passes, every pass's value in samples
res.replace("open_loop", open_rows)
poisson, bursty = open_rows
worse, burst_v = nb06.findings.worse_ttft(open_rows)  # the takeaway's verdict, paired on the passes' TTFT p90s
exercises.reveal_choice("worse TTFT p90", PREDICT_WORSE_TTFT, worse, ["Poisson", "bursty"],
                        undecided=f"{burst_v.label} ({burst_v.reason})")
server.stop()  # queued requests would get an explicit 503; running ones finish first
res.frame("open_loop")[["arrivals", "rounds", "completed", "failed", "request_throughput", "goodput", "ttft_p50_s",
                        "ttft_p90_s", "itl_p50_s", "e2e_p90_s"]].round(3)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8 · Live: batch size, max wait and clients
#
# Move a slider: the panel reconfigures its own server, sends one streaming request per client, and adds the
# point to the curves (total tokens/s, and median latency on the right axis). Try batch size 1 against 8 at
# 8 clients, then a max wait of 200 ms with a single client.

# %% slideshow={"slide_type": "fragment"}
widget_server = launch.start_server(lm, port=0, max_wait_ms=MAX_WAIT_MS)
batch_widget(widget_server, batch_size=8, clients=CLIENTS)

# %% slideshow={"slide_type": "subslide"}
# the same measurements from a GPU, where one ships (data/reference/06_batching.<gpu>.json, each with its provenance)
_ = references.show("06_batching", ["static", "serving"], source="gpu")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways, from this run's numbers

# %% slideshow={"slide_type": "fragment"}
found = nb06.findings.takeaways(sweep=sweep, memory_bound_gain=memory_bound, padding=pad, serving=serve_rows,
                                open_loop=open_rows, clients=CLIENTS, request_rate=REQUEST_RATE)
findings.record(res, found)
print("saved", config.shown(res.save()))
findings.show(found)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Exercises
#
# The two exercises sit where their mechanism is taught: `06.left_pad` in section 1 and `06.step_inputs` in
# section 2; the batched step of section 2 runs your versions once they are correct. To go further: re-run
# the server comparison with `CLIENTS = 1` after predicting which configuration wins, and in the panel move
# max wait from 0 to 200 ms at batch size 8 with 8 clients, watching the mean batch size and latency.

# %% slideshow={"slide_type": "fragment"}
widget_server.stop()  # the panel above stops measuring; run its cell again to restart it

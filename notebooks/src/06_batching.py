# %% md slide
# # 06 · Batching and serving: more users per second, and what each one pays
#
# One decode step reads every weight of the model once, whether it advances one sequence or sixteen.
# Batching shares that read among users: the machine's total tokens/s climbs while each user's own
# speed falls a little. A server turns this into *dynamic batching*: requests that arrive close
# together are decoded together. We measure it statically, then behind a real HTTP server under load.

# %% md subslide
# ## Learning objectives
#
# - Measure a static batch-size sweep: per-request latency, TTFT, TPOT, total output tokens/s,
#   and read the trade-off as a Pareto front (tokens/s per user against total tokens/s).
# - Count what left padding wastes when prompt lengths differ, and what bucketing saves.
# - Run an OpenAI-compatible server with dynamic batching (`python -m labkit serve`) and compare
#   `max_batch_size` 1 and 8 under the same load.
# - Load-test it two ways: Locust (generic HTTP) and an LLM-aware streaming client with vLLM's
#   benchmark semantics (TTFT, TPOT, ITL, goodput under Poisson and bursty arrivals).

# %% slide
import urllib.request

import pandas as pd

import labkit
from labkit import batching, config, env, loadgen, models, plots, results, serving, sizing
from labkit.batch_widget import panel as batch_widget

plots.setup_offline()
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers")})

# %% subslide parameters
SWEEP_TOKENS = config.pick(32, 12)  # new tokens per sequence in the static sweep
BATCH_SIZES = None  # None: 1, 2, 4, 8, 16 on a CPU; on a GPU doubling until out of memory
SWEEP_REPEATS = config.pick(2, 1)  # timed runs per batch size (after one warmup)
PAD_BATCH = 8  # sequences in the padding experiment (one long prompt, the rest short)
CLIENTS = 8  # concurrent clients for the server comparison
SERVE_REQUESTS = config.pick(32, 16)  # requests per server configuration
SERVE_TOKENS = config.pick(32, 12)  # tokens per request (ignore_eos: exactly this many)
MAX_WAIT_MS = 20  # dynamic batching: how long the oldest queued request waits for company, ms
LOCUST_SECONDS = config.pick(20, 6)  # Locust run time, s
OPEN_LOOP_REQUESTS = config.pick(40, 12)  # requests per open-loop (Poisson / bursty) run
REQUEST_RATE = 2.0  # open-loop arrival rate, requests/s
SLO = loadgen.SLO(ttft_s=2.0, tpot_s=0.5)  # goodput target: a request is good if it meets both, s

# %% fragment
lm = models.load()
res = results.Results("06_batching")
print(f"{lm.name} on {lm.device}, loaded in {lm.load_seconds:.2f} s")

# %% md slide
# ## 1 · Static batching: predict
#
# A decode step must read all weights plus each sequence's KV cache. If reading memory were the
# only cost, B sequences would take barely longer than one, and total tokens/s would grow almost B×.

# %% fragment
est = sizing.estimate("default", dtype=lm.dtype, context=1)
prompt_tokens = batching.prompt_lengths(lm.tokenizer, batching.load_prompts("prompts"))
context = round(sum(prompt_tokens) / len(prompt_tokens)) + SWEEP_TOKENS // 2  # prompt + half the answer, on average
read = {b: sizing.decode_bytes_per_step(est.weight_bytes, est.kv_bytes_per_token, context, b) for b in (1, 16)}
predicted_16 = 16 * read[1] / read[16]
print(f"bytes read per step: batch 1 {read[1] / 2**20:.1f} MiB, batch 16 {read[16] / 2**20:.1f} MiB "
      f"→ memory-bound prediction: batch 16 gives {predicted_16:.1f}× the total tokens/s of batch 1")

# %% md subslide
# ## Measure: one left-padded batch per size, every sequence generates the same number of tokens

# %% fragment
sweep = batching.static_sweep(lm.model, lm.tokenizer, BATCH_SIZES, new_tokens=SWEEP_TOKENS, repeats=SWEEP_REPEATS)
res.replace("static", sweep)
res.frame("static")[["batch_size", "status", "ttft_s", "tpot_s", "latency_s", "tokens_per_s_per_user",
                     "total_tokens_per_s", "wasted_fraction"]].round(3)

# %% subslide
ok = [r for r in sweep if r["status"] == "ok"]
plots.line(res.frame("static").query("status == 'ok'"), x="batch_size", y=["total_tokens_per_s", "tokens_per_s_per_user"],
           title="Static batching: total against per-user output tokens/s", x_title="batch size",
           y_title="output tokens/s", log_x=True).show()
batching.pareto_figure(sweep).show()
first, last = ok[0], ok[-1]
print(f"batch {last['batch_size']}: {last['total_tokens_per_s'] / first['total_tokens_per_s']:.1f}× the total tokens/s "
      f"of batch 1 (memory-bound prediction {predicted_16:.1f}× at 16); each user gets "
      f"{last['tokens_per_s_per_user'] / first['tokens_per_s_per_user']:.2f}× the speed, TTFT "
      f"{last['ttft_s'] / first['ttft_s']:.1f}× longer")

# %% md slide
# ## 2 · The cost of padding
#
# A batch is a rectangle: shorter prompts are padded on the left up to the longest. One long
# prompt among short ones makes every row pay for its length in prefill (and in attention while
# decoding). Predict the waste from token counts alone, then time it; *bucketing* (batching
# prompts of similar length) is the remedy.

# %% fragment
pad = batching.padding_experiment(lm.model, lm.tokenizer, batch=PAD_BATCH, new_tokens=4, long_repeat=2)
res.replace("padding", pad)
mixed = pad[0]
print(f"predicted: {mixed['pad_tokens']} of {mixed['padded_tokens']} prompt tokens are padding "
      f"({mixed['wasted_fraction']:.0%} of the prefill work is wasted)")
res.frame("padding")[["case", "batch", "real_tokens", "padded_tokens", "wasted_fraction", "ttft_s", "tpot_s"]].round(3)

# %% subslide
plots.bar(res.frame("padding"), x="case", y="ttft_s", title="Prefill time (TTFT) with and without padding",
          y_title="seconds").show()
bucketed = pad[-1]
print(f"bucketing: prefill {bucketed['ttft_s']:.2f} s instead of {mixed['ttft_s']:.2f} s "
      f"({mixed['ttft_s'] / bucketed['ttft_s']:.1f}× faster) for the same {mixed['real_tokens']} real tokens")

# %% md slide
# ## 3 · A server with dynamic batching
#
# `python -m labkit serve` (or `serving.run_server(...)` here) speaks the OpenAI API:
# `POST /v1/completions` and `/v1/chat/completions`, streaming or not, plus `/health` and
# `/metrics`. Requests wait in a bounded queue; a model thread takes the oldest, waits up to
# `max_wait_ms` for up to `max_batch_size` others, and decodes them together. A sequence that
# finishes leaves the batch at once, so short answers are not held hostage by long ones.
#
# Predict: with 8 clients always waiting, `max_batch_size=8` should approach the static batch-8
# throughput above; `max_batch_size=1` serves them one at a time, like batch 1.

# %% fragment
server = serving.start_server(lm, port=0, max_batch_size=1, max_wait_ms=MAX_WAIT_MS)
print("serving at", server.url)
bad = loadgen.run(server.url, num_requests=1, max_tokens=10**6, warmup=0).outputs[0]
print(f"a request for a million tokens gets HTTP {bad.status}: {bad.error}")

# %% subslide
serve_rows = []
for max_batch in (1, 8):
    server.configure(max_batch_size=max_batch)
    loadgen.run(server.url, num_requests=CLIENTS, max_concurrency=CLIENTS, max_tokens=4)  # warm this shape
    server.reset_stats()
    run = loadgen.run(server.url, num_requests=SERVE_REQUESTS, max_concurrency=CLIENTS, max_tokens=SERVE_TOKENS)
    serve_rows.append({"max_batch_size": max_batch, "mean_batch_size": server.stats()["mean_batch_size"],
                       **{k: v for k, v in run.summary().items() if k != "errors"}})
res.replace("serving", serve_rows)
res.frame("serving")[["max_batch_size", "mean_batch_size", "completed", "failed", "output_tokens_per_s",
                      "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s"]].round(3)

# %% subslide
plots.bar(res.frame("serving").astype({"max_batch_size": str}), x="max_batch_size", y="output_tokens_per_s",
          title=f"{CLIENTS} clients: served output tokens/s", y_title="tokens/s").show()
one, eight = serve_rows
print(f"max_batch_size 8 serves {eight['output_tokens_per_s'] / one['output_tokens_per_s']:.1f}× the tokens/s of "
      f"max_batch_size 1 ({eight['failed'] + one['failed']} failed); median latency per request "
      f"{one['e2e_p50_s']:.2f} s → {eight['e2e_p50_s']:.2f} s, but each token comes "
      f"{eight['tpot_p50_s'] / one['tpot_p50_s']:.1f}× slower (TPOT)")

# %% md subslide
# The server's own view, from `/metrics` (Prometheus text format): how big the batches really were.

# %% fragment
metrics_text = urllib.request.urlopen(server.url + "/metrics").read().decode()
print("\n".join(line for line in metrics_text.splitlines() if line.startswith(("labkit_batch_size", "labkit_queue"))))

# %% md slide
# ## 4 · Load testing two ways
#
# **Locust** is a general HTTP load tester: each simulated user sends a request, waits for the
# whole answer, sends the next (a *closed loop*). It sees response times, not tokens.

# %% fragment
server.configure(max_batch_size=8)
locust = loadgen.run_locust(server.url, users=CLIENTS, run_time_s=LOCUST_SECONDS, max_tokens=SERVE_TOKENS)
res.add("locust", users=CLIENTS, max_tokens=SERVE_TOKENS, **locust["aggregated"])
agg = locust["aggregated"]
print(f"Locust, {CLIENTS} users for {LOCUST_SECONDS} s: {agg['requests']} requests, {agg['failures']} failed, "
      f"{agg['requests_per_s']:.2f} requests/s ≈ {agg['output_tokens_per_s']:.1f} tokens/s, "
      f"median response {agg['response_p50_s']:.2f} s")

# %% md subslide
# **labkit.loadgen** measures like `vllm bench serve`: an *open loop* where requests arrive at a
# rate whether or not earlier ones finished (Poisson gaps, or gamma gaps with burstiness < 1 for
# bursts), streamed so TTFT and inter-token latency are stamped as tokens arrive, and **goodput**:
# requests per second that meet the SLO. The same call works against `vllm serve` (notebook 07).
# A burst fills the queue at once (longer waits) but also hands the batcher company (bigger
# batches): which effect wins depends on the rate and the server, so measure it.

# %% fragment
open_rows = []
for label, burstiness in (("Poisson", 1.0), ("bursty (gamma 0.25)", 0.25)):
    run = loadgen.run(server.url, num_requests=OPEN_LOOP_REQUESTS, request_rate=REQUEST_RATE, burstiness=burstiness,
                      max_tokens=SERVE_TOKENS, slo=SLO, seed=1)
    open_rows.append({"arrivals": label, **{k: v for k, v in run.summary().items() if k not in ("errors", "slo")}})
res.replace("open_loop", open_rows)
res.frame("open_loop")[["arrivals", "completed", "failed", "request_throughput", "goodput", "ttft_p50_s",
                        "ttft_p90_s", "itl_p50_s", "e2e_p90_s"]].round(3)

# %% subslide
poisson, bursty = open_rows
print(f"at {REQUEST_RATE:g} requests/s, TTFT p90: Poisson {poisson['ttft_p90_s']:.2f} s, bursty {bursty['ttft_p90_s']:.2f} s; "
      f"goodput (TTFT ≤ {SLO.ttft_s:g} s and TPOT ≤ {SLO.tpot_s:g} s): Poisson {poisson['goodput']:.2f}, "
      f"bursty {bursty['goodput']:.2f} requests/s")
server.stop()  # queued requests would get an explicit 503; running ones finish first
print("server stopped; requests answered:", server.stats()["requests"])

# %% md slide
# ## 5 · Live: batch size, max wait and clients
#
# Move a slider: the panel reconfigures its own server, sends one streaming request per client,
# and adds the point to the curves (total tokens/s, and median latency on the right axis).
# Try batch size 1 against 8 at 8 clients, then a max wait of 200 ms with a single client.

# %% fragment
widget_server = serving.start_server(lm, port=0, max_wait_ms=MAX_WAIT_MS)
batch_widget(widget_server, batch_size=8, clients=CLIENTS)

# %% subslide
# the same measurements from a GPU, where one ships (data/reference/06_batching.<gpu>.json, each with its provenance)
results.show_gpu_references("06_batching", ["static", "serving"])

# %% md slide
# ## Takeaways

# %% fragment
res.save()
takeaways = [
    {"measurement": "static batch 1 → largest", "throughput gain": last["total_tokens_per_s"] / first["total_tokens_per_s"],
     "per-user speed": last["tokens_per_s_per_user"] / first["tokens_per_s_per_user"],
     "latency factor": last["latency_s"] / first["latency_s"]},
    {"measurement": f"server max_batch_size 1 → 8 ({CLIENTS} clients)",
     "throughput gain": eight["output_tokens_per_s"] / one["output_tokens_per_s"],
     "per-user speed": one["tpot_p50_s"] / eight["tpot_p50_s"], "latency factor": eight["e2e_p50_s"] / one["e2e_p50_s"]},
    {"measurement": "padding: mixed batch → bucketed", "throughput gain": mixed["ttft_s"] / bucketed["ttft_s"],
     "per-user speed": None, "latency factor": bucketed["ttft_s"] / mixed["ttft_s"]},
]
pd.DataFrame(takeaways).round(2)

# %% md fragment
# - **Batching helps when there are users to batch**: with several requests in flight, a batch
#   shares each weight read, and the server's tokens/s multiplies (table above, and the sweep).
# - **It costs the single user**: each step is slower with a bigger batch (TPOT up, per-user
#   tokens/s down), a new request waits up to `max_wait_ms` for company, and waits for the batch
#   ahead of it to finish. With one client, batching only adds that wait.
# - **Padding is paid by everyone in the batch**: bucket by length, or use a server that packs
#   sequences without padding (vLLM, notebook 07).
# - Measure like the users feel it: streaming TTFT and TPOT percentiles under realistic arrivals,
#   and goodput against an SLO, not just requests/s.
#
# ## Exercises
# 1. Re-run the server comparison with `CLIENTS = 1`. Which configuration wins, and why?
# 2. In the panel, set 8 clients and move max wait from 0 to 200 ms at batch size 8. What happens
#    to the mean batch size and to latency?
# 3. Run `python -m labkit serve` in a terminal and `python -m labkit.loadgen --max-concurrency 4`
#    against it; then point the same command at `vllm serve` on a GPU.

# %% fragment
widget_server.stop()  # the panel above stops measuring; run its cell again to restart it

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
# # 11 · Beyond one machine: replicas behind a real router, capacity, and what a token costs
#
# The lab so far ends at one server. A team, a product or a class is served by **replicas behind a
# router**: several copies of the server, and in front of them a process that picks one for each
# request.

# %% [markdown] slideshow={"slide_type": "notes"}
# Where it sends a request decides whether that replica already holds the request's prefix
# in its cache. Then three questions every deployment answers with numbers: how many requests per
# second one server takes before it breaks its latency target (the **[knee](../docs/glossary.md#knee)**), how many replicas a load
# needs, and what a token costs in dollars and joules. Here with `smg` (the Shepherd Model Gateway, a
# router from PyPI) in front of replicas of the lab's own server.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Start replicas of `labkit serve` and a real router in front of them; see what the router detects,
#   how it health-checks, and which replica it picks for each request.
# - Compare [routing policies](../docs/glossary.md#routing-policies) (round-robin, cache-aware, session affinity) on a shared-prefix, multi-turn
#   workload: each replica's prefix-cache hit rate, TTFT, its share of the requests, and answers
#   identical to one server's.
# - Write the cache-aware decision yourself and replay it against the router's real choices.
# - Find one server's knee under an SLO from an open-loop sweep and turn it into a replica count.
# - Size tensor parallelism from a model's config, and cost and energy per token from this run.
# - Watch the fleet survive a replica killed mid-run, a router that fails to start and a port in use.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: start the notebook first; the replicas and the policy rounds take about a minute. Ask the room
# before section 1: with 4 groups sharing long system prompts on 2 replicas, what share of requests can reuse
# a cached prefix under round-robin, and under cache-aware routing? Before section 3: from one request's own
# latency, at what arrival rate will this one server stop meeting the SLO? On a laptop every replica shares the
# same cores: say it out loud, the lesson here is cache locality and latency, not throughput.

# %% slideshow={"slide_type": "slide"}
import contextlib
import os
import threading
import time

import pandas as pd
from IPython.display import display

import labkit
from labkit.core import config, cpu, energy, env, machine, results
from labkit.model import hardware, models, parallel, prompts
from labkit.serve import loadgen
from labkit.serve.fleet import capacity
from labkit.serve.fleet import router
from labkit.serve.fleet import routing
from labkit.serve.vllm import server as vllm_server
from labkit.lessons import cost, exercises, findings, plots, references
from labkit.lessons import nb11

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in {**env.versions(), **env.versions(("smg",))}.items() if k in ("python", "torch", "transformers", "smg")})

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
REPLICAS = 2  # labkit serve replicas behind the router, one torch thread each
POLICIES = config.pick(("round_robin", "cache_aware", "consistent_hashing"), ("round_robin", "cache_aware"))  # smg's policies (consistent hashing: a routing key per conversation)
GROUPS = config.pick(4, 2)  # groups of conversations, each with its own long system prompt
PER_GROUP = 2  # conversations per group
TURNS = config.pick(4, 3)  # turns per conversation; each resends the conversation so far
SYSTEM_TOKENS = config.pick(512, 256)  # tokens of each group's system prompt
DOCUMENT_TOKENS = config.pick(256, 128)  # tokens of the document each conversation's first message pastes
MAX_TOKENS = config.pick(16, 4)  # tokens per answer
ROUNDS = config.pick(8, 6)  # rounds of the policy comparison (fresh system prompts each round, policies interleaved
#                             in a shuffled order): the pairs of the paired verdict, which needs at least 6
STAGGER_S = 0.3  # seconds between two conversations' starts (users do not all arrive at once)
PREFIX_CACHE_TOKENS = 16384  # each replica's prefix cache bound, KV positions (holds the whole workload)
ROUTE_THRESHOLD = 4  # your routing rule's load threshold, requests in flight
VLLM_REPLICAS = config.pick(2, 0)  # vllm serve replicas for the same comparison, where `make vllm` built vLLM (0: none)
TARGET_SLO = loadgen.SLO(ttft_s=1.0, tpot_s=0.25)  # the latency target a request must meet (seconds)
SLO_FACTOR = 3  # where one request alone misses the target: the SLO is this many times its own TTFT and TPOT
RATE_MULTIPLES = config.pick((0.5, 1, 1.5, 2, 3, 4), (1, 1.5, 2, 3))  # offered rates, × one request's own rate
SWEEP_SECONDS = config.pick(20, 6)  # seconds of arrivals at each rate: long enough for a queue to build past the SLO
SWEEP_MAX_TOKENS = config.pick(24, 8)  # tokens per answer in the sweep
FOLLOW = 0.9  # goodput follows the offered rate while it is at least this fraction of it
USERS, REQUESTS_PER_MIN_PER_USER, HEADROOM = 200, 2, 0.8  # the load to plan for; load replicas to 80 % of what
# one holds within the SLO
TP_MODEL, TP_GPU, TP_DTYPE, TP_CONTEXT = "Llama-3.1-8B", "L4", "bf16", 8192  # a public config (data/configs), a GPU from data/gpus.json
PRICE_NAME = None  # a row of data/prices.json (None: the first of this machine's architecture); or set HOURLY_USD
HOURLY_USD = None  # US dollars per hour (None: the row above)
MACHINE_WATTS = 30  # your machine's power draw under load, W: used only where no energy counter can be read

# %% slideshow={"slide_type": "fragment"}
res = results.Results("11_scale_out")
tok = models.load_tokenizer()
fleet = contextlib.ExitStack()  # everything started below is stopped by fleet.close() (the last cell), or at exit
reps = fleet.enter_context(router.replicas(REPLICAS, prefix_cache_tokens=PREFIX_CACHE_TOKENS, threads=1))
routers = {p: fleet.enter_context(router.routed([r.url for r in reps], p)) for p in POLICIES}
print(f"{REPLICAS} replicas of labkit serve, 1 torch thread each: {[r.url for r in reps]}; smg routers: "
      + ", ".join(f"{p} {r.url}" for p, r in routers.items()))
print(f"This machine has {os.cpu_count()} cores and every replica shares them: here the lesson is cache locality and "
      "TTFT, not throughput (more replicas on the same cores add no compute).")

# %% slideshow={"slide_type": "fragment"}
# what the router detected, as it reports it (GET /workers): each replica, its health, the engine it found
pd.DataFrame(routers["cache_aware"].workers())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Routing policies on a shared-prefix, multi-turn workload
#
# `GROUPS` groups of `PER_GROUP` conversations; every group has its own system prompt of `SYSTEM_TOKENS`
# tokens, each conversation opens by pasting a document of its own, every turn resends the conversation so far. Each replica keeps the KV of the prompts it served
# (its prefix cache, notebook 10). **Round-robin** alternates replicas; **cache-aware** keeps a tree of the
# text each replica was sent and picks the longest match, unless that replica is much busier; **consistent
# hashing** pins each conversation (its routing key) to a replica.
#
# Predict: what share of the requests reuse a cached prefix under round-robin, and under cache-aware?

# %% slideshow={"slide_type": "fragment"}
PREDICT_HIT_RATE_RR = None  # your prediction: share of requests that reuse a cached prefix, round-robin (0-1)
PREDICT_HIT_RATE_CA = None  # the same under cache-aware routing

# %% slideshow={"slide_type": "fragment"}
workloads = [routing.workload(tok, GROUPS, PER_GROUP, TURNS, SYSTEM_TOKENS, tag=f"-{r}", document_tokens=DOCUMENT_TOKENS)
             for r in range(ROUNDS)]
n_req = GROUPS * PER_GROUP * TURNS
print(f"{n_req} requests a round; system prompts of {SYSTEM_TOKENS} tokens, documents of {DOCUMENT_TOKENS}; {ROUNDS} "
      f"rounds of {', '.join(POLICIES)}, "
      "interleaved, each round in a shuffled order, after one warm-up run per router that is not a round; every "
      "replica's prefix cache flushed before each run")
warm = routing.workload(tok, 1, 2, 1, SYSTEM_TOKENS, tag="-warm-up")  # two one-turn conversations: not a round
cmp = nb11.runs.compare_policies(routers, reps, workloads, MAX_TOKENS, stagger_s=STAGGER_S, warmup=warm)
res.replace("policy_runs", cmp["runs"])
res.replace("policy_replicas", cmp["replicas"])
res.replace("policies", nb11.runs.policy_table(cmp["runs"]))
policy_df = res.frame("policies")
policy_df[["policy", "rounds", "requests", "failed", "hit_rate", "token_hit_rate", "ttft_p50_s", "ttft_p90_s",
           "max_share"]].round(3)

# %% slideshow={"slide_type": "fragment"}
# each replica's share of the requests and its own hit rate, from its /metrics (after − before), last round
rep_df = res.frame("policy_replicas")
rep_df[rep_df["round"] == ROUNDS - 1][["policy", "replica", "requests", "share", "hit_rate", "token_hit_rate"]].round(3)

# %% slideshow={"slide_type": "fragment"}
first = workloads[0][:GROUPS]  # round 0's first conversation of every group, all its turns, on one server, no router
single = routing.run_policy(reps[0].url, "one server", reps[:1], first, MAX_TOKENS, stagger_s=STAGGER_S)
same = {p: routing.same_answers(single["records"], recs[0]) for p, recs in cmp["records"].items()}
res.replace("identical", [{"policy": p, **s} for p, s in same.items()])
print("greedy answers identical to one server's (round 0, the first conversation of each group, every turn): "
      + ", ".join(f"{p} {s['identical']}/{s['compared']}" for p, s in same.items()))

# %% slideshow={"slide_type": "fragment"}
by = policy_df.set_index("policy")
exercises.reveal("hit rate, round-robin", PREDICT_HIT_RATE_RR, by.loc["round_robin", "hit_rate"])
exercises.reveal("hit rate, cache-aware", PREDICT_HIT_RATE_CA, by.loc["cache_aware", "hit_rate"])
plots.bar(policy_df, x="policy", y=["hit_rate", "token_hit_rate"], title="Prefix-cache hits by routing policy",
          y_title="share").update_layout(barmode="group").show()
plots.bar(policy_df, x="policy", y=["ttft_p50_s", "ttft_p90_s"], title="TTFT by routing policy (median over rounds)",
          y_title="seconds").update_layout(barmode="group").show()
head = nb11.runs.headline(res.section("policies"), cmp["runs"], None, None, {"all_identical": all(
    s["all_identical"] for s in same.values())})
print(f"cache-aware: {head['cache_aware_hit_rate']:.0%} of requests hit a replica's cache, {head['cache_aware_token_hit_rate']:.0%} "
      f"of prompt positions reused; round-robin: {head['round_robin_hit_rate']:.0%} and {head['round_robin_token_hit_rate']:.0%}. "
      f"TTFT p50 cache-aware / round-robin = {head['ttft_p50_ratio_ca_over_rr']:.2f} ({head['ttft_verdict_label']}, "
      f"round r of one against round r of the other: {head['ttft_verdict_reason']}).")
print("Against the work:", nb11.findings.work_words(head))

# %% slideshow={"slide_type": "fragment"}
# what the router itself counted (its Prometheus port): cache-aware's branches, tree match or load fallback
branches = {}
for name, labels, value in routers["cache_aware"].scrape():
    if name == "smg_cache_aware_policy_branch_total" and value:
        branches[labels.get("branch")] = branches.get(labels.get("branch"), 0) + value
print("smg cache_aware decisions by branch:", branches)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The same with vLLM replicas
#
# `vllm serve` answers the same OpenAI API and counts its prefix-cache hits in `/metrics` (in tokens), so the
# router and the workload do not change. Where `make vllm` built vLLM's environment, `VLLM_REPLICAS` of them
# run one round of round-robin and cache-aware routing (each policy on its own system prompts); otherwise the
# reference's rows show what they did, under its provenance.

# %% slideshow={"slide_type": "fragment"}
VLLM_POLICY_COLUMNS = ["policy", "answered", "failed", "token_hit_rate", "ttft_p50_s", "ttft_p90_s"]
if VLLM_REPLICAS and vllm_server.vllm_python().exists():
    settings = vllm_server.Settings(model=models.resolve(), device=vllm_server.default_device(), max_num_seqs=8)
    with contextlib.ExitStack() as vstack:
        vreps = router.start_vllm_replicas(VLLM_REPLICAS, settings)
        vstack.callback(router.stop_all, vreps)
        vrows = []
        for i, p in enumerate(("round_robin", "cache_aware")):
            vwork = routing.workload(tok, GROUPS, PER_GROUP, TURNS, SYSTEM_TOKENS, tag=f"-vllm{i}",
                                     document_tokens=DOCUMENT_TOKENS)
            with router.routed([r.url for r in vreps], p) as vr:
                vrows.append(routing.run_policy(vr.url, p, vreps, vwork, MAX_TOKENS, stagger_s=STAGGER_S)["summary"])
    res.replace("vllm_policies", vrows)
    display(res.frame("vllm_policies")[VLLM_POLICY_COLUMNS].round(3))
else:
    print("vLLM replicas not started: " + ("VLLM_REPLICAS is 0 (quick mode; set it to 2 to run them)"
                                           if not VLLM_REPLICAS else vllm_server.MISSING))
    references.show("11_scale_out", "vllm_policies", VLLM_POLICY_COLUMNS)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · The decision, written out
#
# Cache-aware routing in one rule: send the request to the replica holding the longest prefix of it (among
# the prompts it was sent), unless that replica has more than `threshold` requests in flight beyond the
# least-loaded replica; then to the least-loaded one. Ties go to the less loaded replica, then the lower
# index. Your rule is then replayed on the last cache-aware round, request by request in the order the
# router received them, with what each replica held and its load at that moment.

# %% labkit={"exercise": "11.route"} slideshow={"slide_type": "skip"} tags=["exercise"]
def route(prompt, cached, loads, threshold):
    """prompt: the request (token ids or text); cached[r]: the prompts replica r was sent before;
    loads[r]: replica r's requests in flight; threshold: how many more than the least-loaded replica's
    a replica may have and still get the request. Return the chosen replica's index."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("11.route", route)

# %% tags=["mechanism"]
route_fn = exercises.use("11.route", route, routing.longest_prefix_route)
replayed = routing.replay(cmp["records"]["cache_aware"][-1], [r.url for r in reps], route_fn, ROUTE_THRESHOLD)
res.replace("replay", replayed)
agree = sum(r["agree"] for r in replayed)
ties = sum(r["tie"] for r in replayed)
print(f"the rule chose smg's replica for {agree} of {len(replayed)} requests; {ties} more "
      f"{'was a tie' if ties == 1 else 'were ties'} (the same match, the same load: the rule breaks a tie by index, "
      "smg its own way); smg's fallback for a miss weighs its own estimate of each replica's wait, not only the "
      "requests in flight")

# %% slideshow={"slide_type": "fragment"}
pd.DataFrame(replayed)[lambda d: ~d.agree][["conversation", "turn", "router", "rule", "loads", "tie"]].head(8)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Capacity against an SLO
#
# One server, requests arriving as a Poisson process (open loop: arrivals do not wait for answers) at rising
# rates, each for `SWEEP_SECONDS` of arrivals: a short burst meets any SLO a batch can clear, only a load that
# lasts builds a queue. A request is *good* when its TTFT and TPOT meet the SLO; *goodput* (good requests ÷ the
# arrival window) follows the offered rate while the server keeps up, and falls away past its **knee**. Rates are
# multiples of one request's own rate (1 ÷ its latency alone), so the sweep fits the machine.
#
# Predict: at how many requests per second does this one server stop keeping up?

# %% slideshow={"slide_type": "fragment"}
PREDICT_KNEE_RPS = None  # your prediction: the knee, requests per second

# %% slideshow={"slide_type": "fragment"}
server = reps[0]  # one replica, addressed directly (its neighbour sits idle)
sweep_prompts = [f"{q} Answer in a few words." for q in routing.QUESTIONS]
loadgen.run(server.url, sweep_prompts, num_requests=2, max_concurrency=1, max_tokens=4, endpoint="chat")  # warm up
alone = loadgen.run(server.url, sweep_prompts, num_requests=3, max_concurrency=1, max_tokens=SWEEP_MAX_TOKENS,
                    endpoint="chat", ignore_eos=True, warmup=0).summary()
SLO, slo_why = loadgen.slo_from_baseline(TARGET_SLO, alone, SLO_FACTOR)
one_rate = 1 / alone["e2e_p50_s"]
rates = [round(m * one_rate, 2) for m in RATE_MULTIPLES]
print(f"{slo_why}. One request alone takes {alone['e2e_p50_s']:.2f} s: {one_rate:.2f} req/s one after the other; "
      f"offered rates {rates} req/s")

# %% slideshow={"slide_type": "fragment"}
machine.check("capacity sweep")
with energy.EnergyMeter() as meter:  # every rate for SWEEP_SECONDS of arrivals, the prefix cache flushed before each
    swept = nb11.runs.capacity_sweep(server, sweep_prompts, rates, SWEEP_SECONDS, SWEEP_MAX_TOKENS, SLO, FOLLOW)
res.replace("capacity", swept["points"])
cap_df = res.frame("capacity")
cap_df[["offered_rps", "requests", "good_requests", "completed_rps", "pace", "goodput_rps", "goodput_over_run_rps",
        "ttft_p90_s", "tpot_p50_s", "output_tokens_per_s"]].round(3)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The knee, from the measurements
#
# Sorted by offered rate, the knee is the last rate whose goodput still follows it (goodput ≥ `FOLLOW` ×
# offered): the first level that does not follow is where the server stopped keeping up. `completed_rps` is the
# pace answers came out at, and `pace` that over the pace requests arrived at: below 1 a queue grows, and a queue
# that grows breaks any SLO once the load lasts; goodput is good requests ÷ the arrival window, at most that pace.
# Past the knee, `completed_rps` is the most the server completes, SLO or not (its ceiling). `goodput_over_run_rps`
# is good requests ÷ the whole run, as `vllm bench serve` reports it, the drain after the last arrival included.

# %% labkit={"exercise": "11.knee"} slideshow={"slide_type": "skip"} tags=["exercise"]
def knee(offered, goodput, follow):
    """offered: the offered rates (req/s) of a sweep, in any order; goodput: the goodput at each (req/s);
    follow: a fraction. Return the knee's offered rate, or None when no rate's goodput follows it."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("11.knee", knee)

# %% tags=["mechanism"]
knee_fn = exercises.use("11.knee", knee, lambda o, g, f: capacity.find_knee(o, g, f)["knee_rps"])
found, held = swept["knee"], swept["held"]  # the knee (capacity.find_knee) and what one replica holds
knee_rps = knee_fn(list(cap_df.offered_rps), list(cap_df.goodput_rps), FOLLOW)
res.replace("knee", [{k: v for k, v in found.items() if k != "points"}])
print(found["reason"])
if knee_rps is not None:
    exercises.reveal("the knee", PREDICT_KNEE_RPS, knee_rps, "req/s")
fig = plots.line(cap_df, x="offered_rps", y=["offered_rps", "goodput_rps"], title="Goodput against the offered rate",
                 x_title="offered req/s", y_title="req/s")
fig.show()

# %% slideshow={"slide_type": "fragment"}
print(capacity.held_said(held))  # within the SLO at the knee, and the ceiling past it
if held["rps"] is None:
    print(f"no knee: the slowest rate already missed the SLO ({found['reason']}); add smaller RATE_MULTIPLES")
else:
    need = capacity.replicas_needed(USERS, REQUESTS_PER_MIN_PER_USER, held["rps"], HEADROOM)
    res.replace("replicas_needed", [need])
    print(need["arithmetic"] + ("" if found["reached"] else " (an upper bound: the knee is a lower bound, so fewer "
                                "may do; add larger RATE_MULTIPLES to find the knee)"))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · When one GPU is not enough: tensor parallelism
#
# Tensor parallelism (TP) splits every layer across `d` GPUs: each holds about 1/d of the weights and of the
# KV cache, and every decode step all-reduces the hidden state twice per layer: 2 × layers × hidden ×
# activation bytes for every generated token. Replicas send nothing between GPUs. So: replicas while the
# model fits one GPU, TP when it does not.

# %% slideshow={"slide_type": "fragment"}
tp_rows = [*parallel.tp_plan(models.resolve(), TP_DTYPE, context_tokens=TP_CONTEXT, gpu=TP_GPU),
           *parallel.tp_plan(str(config.DATA_DIR / "configs" / TP_MODEL), TP_DTYPE, context_tokens=TP_CONTEXT, gpu=TP_GPU)]
res.replace("tp", tp_rows)
tp_df = res.frame("tp")
for col in ("weights_bytes_per_gpu", "kv_bytes_per_gpu", "total_bytes_per_gpu"):
    tp_df[col.replace("bytes", "gib")] = tp_df[col] / 2**30
tp_df[["model", "degree", "legal", "weights_gib_per_gpu", "kv_gib_per_gpu", "total_gib_per_gpu",
       "all_reduce_bytes_per_token", "fits", "note"]].round(2)

# %% slideshow={"slide_type": "fragment"}
for name in (models.resolve(), str(config.DATA_DIR / "configs" / TP_MODEL)):
    print("-", parallel.replicas_or_tp(name, TP_DTYPE, gpu=TP_GPU, context_tokens=TP_CONTEXT)["why"])
gpus = env.hardware().get("gpu_count") or 0
print(f"`vllm serve --tensor-parallel-size 2` needs two GPUs and vLLM's environment; this machine has {gpus} GPU(s)"
      + (" and vLLM: `make gpu-check CHECKS=tp` runs it" if gpus >= 2 and vllm_server.vllm_python().exists() else
         ". The preflight's `tp` check runs it where both are present."))
_ = references.show("11_scale_out", ["tp_run"], source="gpu")  # a GPU reference of the tp check, where one ships

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · What a token costs: dollars and joules
#
# An instance that produces `T` tokens per second for an hour at `P` dollars costs `P / (T × 3600) × 10⁶`
# dollars per million tokens. `T` is this run's: what one replica sustained at the knee, within the SLO (or, where
# the sweep found none, its best throughput, labelled as missing the SLO). Prices are public list prices
# in `data/prices.json`, each with its page and date. Energy comes from a counter where one can be read
# ([RAPL](../docs/glossary.md#rapl), the CPU's energy counters, on a CPU; NVML on a GPU); elsewhere from the wattage you set, labelled an estimate.

# %% slideshow={"slide_type": "fragment"}
if held["rps"] is not None:
    at_knee = cap_df[cap_df.offered_rps == held["at_rps"]].iloc[-1]
    priced_at = f"at the knee, {at_knee.offered_rps:.2f} req/s offered, {held['rps']:.2f} req/s within the SLO"
else:  # no rate met the SLO: price the sweep's best throughput, and say it missed the SLO
    at_knee = cap_df.loc[cap_df.output_tokens_per_s.idxmax()]
    priced_at = f"at {at_knee.offered_rps:.2f} req/s, the sweep's best throughput, which missed the SLO (no knee)"
tps = at_knee.output_tokens_per_s
prices = cost.load_prices()
kind = "gpu" if env.device().startswith("cuda") else "cpu"
PRICE_NAME = PRICE_NAME or cost.price_for(kind, hardware.cpu_arch(), prices)  # this machine's kind and architecture
if PRICE_NAME not in {p["name"] for p in prices}:
    raise ValueError(f"PRICE_NAME={PRICE_NAME!r}: choose one of {[p['name'] for p in prices]}")
if kind == "cpu":  # the whole machine: one single-thread replica per core, as section 2 runs them
    priced, as_if = cost.cpu_as_if(tps, machine.cores(), where=priced_at)
else:
    priced, as_if = {kind: tps}, "Priced as one replica per GPU of each instance, each as fast as this run's."
costs = cost.cost_table(priced, prices, hourly_usd=HOURLY_USD, label="your price")
res.replace("cost", costs.to_dict("records"))
print(as_if)
rows_by_name = {p["name"]: p for p in prices}  # each instance's architecture and vCPUs beside its price
costs["arch"] = costs.name.map(lambda n: rows_by_name.get(n, {}).get("arch", "this machine" if n == "your price" else ""))
costs["vcpus"] = costs.name.map(lambda n: rows_by_name.get(n, {}).get("vcpus"))
costs[costs.kind == kind][["name", "arch", "vcpus", "hourly_usd", "tokens_per_s", "usd_per_million_tokens", "date",
                           "source"]].round(4)

# %% slideshow={"slide_type": "fragment"}
chosen = costs.set_index("name").loc["your price" if HOURLY_USD else PRICE_NAME]
print(f"{at_knee.output_tokens_per_s:.1f} output tokens/s from one replica {priced_at} (measured "
      f"here; this machine is {cpu.machine_line(env.hardware())}); {chosen.tokens_per_s:.1f} tokens/s priced at ${chosen.hourly_usd:g}/h ({'your price' if HOURLY_USD else PRICE_NAME}, "
      f"{chosen.date}): ${chosen.usd_per_million_tokens:.2f} per million output tokens. The "
      f"{'CPU' if kind == 'gpu' else 'GPU'} rows of data/prices.json get no figure: this run measured no throughput there.")
reading = meter.reading
tokens = int(cap_df.output_tokens.sum())
if reading.joules is None:
    estimate = energy.estimate_joules(MACHINE_WATTS, reading.seconds)
    print(f"energy: not measured here ({reading.reason}). {estimate.method}: "
          f"{energy.joules_per_token(estimate, tokens):.3f} J per output token over {tokens} tokens (an estimate)")
    res.replace("energy", [{**estimate.to_dict(), "tokens": tokens, "unreadable_reason": reading.reason}])
else:
    print(f"energy: {reading.joules:.1f} J over {reading.seconds:.1f} s ({reading.method}): "
          f"{energy.joules_per_token(reading, tokens):.3f} J per output token over {tokens} tokens")
    res.replace("energy", [{**reading.to_dict(), "tokens": tokens}])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · Faults: what the fleet does when a piece breaks
#
# A replica killed mid-run (SIGKILL, as a crash): the router's health check drops it, the requests it held
# fail and are counted, the rest are answered by the survivor, and nothing hangs. A router that fails to
# start: its log's error line, within the start's deadline. A port already in use: refused before anything
# starts. Each is one line; the notebook goes on.

# %% slideshow={"slide_type": "fragment"}
fault_work = routing.workload(tok, 2, PER_GROUP, TURNS, 64, tag="-fault")  # short prompts: many turns in flight
with router.routed([r.url for r in reps], "round_robin") as rr:
    killer = threading.Timer(1.0, reps[-1].kill)  # the last replica dies a second into the run
    killer.start()
    t0 = time.monotonic()
    fault = routing.run(rr.url, fault_work, MAX_TOKENS, timeout_s=60)
    killer.join()
    dropped_s = router.wait_for(lambda: reps[-1].url not in rr.healthy_urls(), 20)
    ran_s = time.monotonic() - t0
answered = sum(r["ok"] for r in fault)
res.replace("fault_kill", [{"planned": len(fault), "answered": answered, "failed": len(fault) - answered,
                            "run_s": ran_s, "dropped_after_s": dropped_s}])
print(f"killed {reps[-1].name} mid-run: {answered} of {len(fault)} requests answered, {len(fault) - answered} counted "
      f"failed ({sorted({r['error'][:60] for r in fault if not r['ok']})}); the router dropped it "
      + (f"{dropped_s:.1f} s after the run" if dropped_s is not None else "not within 20 s") + f"; the run took {ran_s:.1f} s")

# %% slideshow={"slide_type": "fragment"}
for what, start in {
    "a router whose configuration it refuses": lambda: router.start_router(
        [reps[0].url], "cache_aware", extra_args=("--cache-threshold", "1.5"), deadline_s=30),
    "a router on a port in use": lambda: router.start_router([reps[0].url], port=int(reps[0].url.rsplit(":", 1)[1])),
    "a replica on a port in use": lambda: router.start_replicas(1, ports=[int(reps[0].url.rsplit(":", 1)[1])]),
}.items():
    try:
        router.stop_all([start()])
        print(f"{what}: started (unexpected)")
    except router.StartError as exc:
        print(f"{what}: {type(exc).__name__}: {exc}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
head = nb11.runs.headline(res.section("policies"), cmp["runs"], found, chosen.to_dict() | {"name": chosen.name},
                          {"all_identical": all(s["all_identical"] for s in same.values())})
found_11 = nb11.findings.takeaways(head=head, capacity_reason=found["reason"],
                                   arithmetic=need["arithmetic"] if held["rps"] is not None else None,
                                   chosen=chosen.to_dict() | {"name": chosen.name}, tokens_per_s=at_knee.output_tokens_per_s,
                                   answered=answered, requests=len(fault), rates=rates, priced_at=priced_at,
                                   held=capacity.held_said(held))
findings.record(res, found_11)
res.notes["versions"] = env.versions(("smg",))
res.save()
fleet.close()  # every replica and router stops here
findings.show(found_11)

# %% [markdown] slideshow={"slide_type": "fragment"}
# - Where the router sends a request decides whether its prefix is already in a replica's cache: the hit
#   rates and TTFT above are the same replicas under the same load, routed differently.
# - One server's knee under an SLO, not its peak requests per second, is the number to plan replicas with.
# - Replicas while the model fits one GPU; tensor parallelism when it does not, paid for on every token.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Exercises (open-ended)
# 1. Set `PER_GROUP = 4` and `GROUPS = 2`. Does cache-aware routing's advantage grow or shrink, and why?
# 2. Raise `ROUTE_THRESHOLD` to 100 and lower it to 0: how often does the replay still agree with smg?
# 3. Tighten `TARGET_SLO` to a TTFT of 0.3 s. Where does the knee move, and how many replicas does the
#    same class need?

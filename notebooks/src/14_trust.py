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
# # 14 · Can you trust this benchmark?
#
# Three clients nobody here wrote (`vllm bench serve`, NVIDIA AIPerf, GuideLLM) and labkit's own drive one
# `vllm serve`, held to one definition. Then: is a difference there at all ([A/A](../docs/glossary.md#a-a-test)),
# does the arrival pattern move TTFT, what does MLPerf's LoadGen say, and does a greedy answer depend on its batch?

# %% [markdown] slideshow={"slide_type": "notes"}
# The clients are real programs: AIPerf and GuideLLM run from `.venv-clients` (`make clients`; `make test` builds
# it), `vllm bench serve` from `.venv-vllm`, labkit's loadgen as `python -m labkit loadgen`. Each is a child process
# held to chosen cores, so its CPU time is its own. vLLM starts once (about 30 s on a laptop) and serves sections
# 1 to 5; a client that is missing or fails becomes a row marked failed, never an error.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Read four clients' TTFT, TPOT or ITL and throughput on the same requests, name each one's definition, and
#   recompute all of them under one (an exercise); hold them against the server's own histograms.
# - Measure what a client costs on a small machine: its CPU, and how far its figures move when it shares the cores.
# - See how often "B is faster" appears when nothing changed, and how often a real slowdown is caught, by one run
#   each, the old overlap rule, a [bootstrap interval](../docs/glossary.md#bootstrap-interval) you write and a
#   [paired test](../docs/glossary.md#paired-test) on interleaved passes with a
#   [magnitude floor](../docs/glossary.md#magnitude-floor), sized by the [power](../docs/glossary.md#power) formula
#   (an exercise).
# - Compare a concurrency cap with Poisson arrivals at the same rate; run MLPerf's LoadGen over the server through an
#   adapter you complete; find where a greedy answer changes with its batch.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: before section 1 ask how far apart four honest clients can be on one server (10 %? 30 %?); before
# section 2, how often one run each says "faster" when nothing changed; before section 3, whether Poisson arrivals
# at the same mean rate give a lower or higher TTFT than a concurrency cap; before section 5, whether temperature 0
# means one answer.

# %% slideshow={"slide_type": "slide"}
import contextlib
import statistics
import tempfile
from pathlib import Path

import pandas as pd
from IPython.display import display

import labkit
from labkit.core import config, cpu, env, machine, results, verdict
from labkit.model import models
from labkit.serve import loadgen, metrics, processes
from labkit.serve.experiments import paged
from labkit.serve.clients import mlperf, outside
from labkit.serve.vllm import server as vllm_server
from labkit.lessons import exercises, findings, references
from labkit.lessons import nb14

machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick(), "|", cpu.cpu_name(),
      f"({' '.join(cpu.cpu_isa())})")

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
PROMPTS = config.pick(16, 8)  # the request set every client sends (the lab's chat prompts)
OUTPUT_LEN = config.pick(32, 16)  # tokens per answer, exactly (ignore_eos)
CONCURRENCY = 4  # requests in flight at most, every client
CLIENT_PASSES = config.pick(7, 1)  # rounds: each other client once, each between two passes of labkit's (its pair)
AA_TRIALS, AB_TRIALS = config.pick(10, 2), config.pick(10, 1)  # real A/A trials, then real A/B trials
PAIRS = config.pick(10, 6)  # pairs of interleaved passes (A, B in a shuffled order) in each A/A trial
MAX_AB_PAIRS = config.pick(20, 6)  # the most pairs an A/B trial can afford (the formula asks for its own number)
AB_REQUESTS, AB_TOKENS = config.pick(8, 4), config.pick(16, 8)  # each pass: requests, tokens each
SLOWDOWN = 0.10  # the injected slowdown: this share of a token's time, added per token
RESAMPLED = 200  # A/A and slowdown trials drawn from the recorded passes
RESAMPLES = config.pick(1000, 200)  # bootstrap resamples in each drawn trial
IDLE_S = config.pick(20, 3)  # the idle gap before one request
LG_QUERIES = config.pick(96, 48)  # LoadGen's minimum queries per run (early stopping at p90 needs about 45)
LG_TOKENS = 8  # tokens per LoadGen query
DIVERGE_TARGETS = config.pick((0, 1, 2, 3), (0, 1))  # prompts decoded alone and in batches
DIVERGE_BATCHES = config.pick((2, 4, 8), (2, 8))
DIVERGE_TOKENS = config.pick(32, 16)
SERVER_CORES, CLIENT_CORES = {0}, {1}  # pinned: vLLM on one core, the client on the other
HAS_VLLM = vllm_server.vllm_python().exists()
res = results.Results("14_trust")
lm = models.load(dtype="fp32")
tok = lm.tokenizer
model_path = str(models.resolve())
requests = paged.load_requests()
texts = [tok.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True, tokenize=False)
         for r in requests[:PROMPTS]]
work = loadgen.Workload(texts, num_requests=len(texts), max_tokens=OUTPUT_LEN, max_concurrency=CONCURRENCY,
                        model=model_path, tokenizer=model_path)
folder = Path(tempfile.mkdtemp(prefix="clients-", dir=config.cache_dir()))
print(f"{PROMPTS} prompts × {OUTPUT_LEN} tokens, {CONCURRENCY} in flight; clients installed: "
      f"{'yes' if outside.available() else outside.MISSING}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · One workload, four clients
#
# One `vllm serve` held to core 0 (its engine, its front end, every thread); each client held to core 1. Every
# client reads the same prompts, asks for exactly `OUTPUT_LEN` tokens, greedy, at most `CONCURRENCY` in flight, and
# saves every request's record. The server's pace moves from pass to pass, so each other client's pass runs between
# two passes of labkit's client (the anchor), and is held against their geometric mean: a pace that drifts steadily
# through the three cancels (A-B-A, as in the field's interleaved trials). First, each client's own report,
# with what it calls its per-token latency and how it computes it. Predict: how far apart (largest ÷ smallest − 1) will the four reports of p50 TPOT/ITL be?

# %% slideshow={"slide_type": "fragment"}
PREDICT_RAW_SPREAD = None  # your prediction: largest ÷ smallest p50 TPOT/ITL among the clients' own reports, minus 1

# %% slideshow={"slide_type": "fragment"}
vllm_stack = contextlib.ExitStack()
srv = None
if HAS_VLLM:
    srv = vllm_stack.enter_context(vllm_server.serve(vllm_server.Settings(
        model=model_path, device=vllm_server.default_device(), max_num_seqs=8, cpu_cores="0")))
    pinned_threads = processes.pin_group(srv.proc.pid, SERVER_CORES)
    print(f"vllm serve started in {srv.start_s:.0f} s, {pinned_threads} threads held to core 0: {srv.platform()}")
    loadgen.run(srv.url, texts[:1], num_requests=1, max_tokens=4, warmup=0, model=model_path)  # set-up paid here
    before = metrics.scrape(srv.url)
    runs = nb14.runs.clients_on_one_server(
        srv.url, work, folder / "pinned", rounds=CLIENT_PASSES, cores=CLIENT_CORES, anchor="labkit",
        scrape=lambda: metrics.scrape(srv.url),
        on_run=lambda r: print(f"  {r.client}: {r.status}, {r.wall_s or 0:.1f} s"))
    server_seen = vllm_server.server_view(before, metrics.scrape(srv.url))
else:
    runs, server_seen = {}, {}
    print(f"{vllm_server.MISSING}: no server to drive")

# %% slideshow={"slide_type": "fragment"}
if runs:
    raw_only = nb14.runs.client_tables(runs)
    res.replace("clients_raw", raw_only["raw"])
    with pd.option_context("display.max_colwidth", 90):
        display(res.frame("clients_raw")[["client", "status", "ttft_p50_s", "tpot_p50_s", "tpot_p90_s",
                                         "output_tokens_per_s", "requests", "latency_named", "definition"]].round(4))
    reported = [r["tpot_p50_s"] for r in raw_only["raw"] if r.get("tpot_p50_s")]
    raw_spread = max(reported) / min(reported) - 1 if len(reported) > 1 else 0.0
    _ = exercises.reveal("largest ÷ smallest p50 TPOT/ITL among the clients' reports, minus 1", PREDICT_RAW_SPREAD,
                         raw_spread)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## One definition for everyone
#
# Each client saved, per request, when it sent it, when the first token arrived, when the last did, and the server's
# count of output tokens. Write the alignment: the same three figures for every client, from those stamps alone.

# %% labkit={"exercise": "14.align"} slideshow={"slide_type": "skip"} tags=["exercise"]
def align(records):
    """records: one dict per request with "start_s", "first_token_s", "end_s" (one clock, seconds) and "tokens" (the
    server's count of output tokens). Return {"ttft_p50_s", "tpot_p50_s", "output_tokens_per_s"} under one
    definition: TTFT = first token - start; TPOT = (end - first token) / (tokens - 1); tokens over the run's span."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("14.align", align)

# %% tags=["mechanism"]
align_fn = exercises.use("14.align", align, outside.align.aligned)
if runs:
    tables = nb14.runs.client_tables(runs, align_fn)
    tables["anchored"] = nb14.runs.anchored(runs, align_fn)
    aligned_rows = [{"client": name, **{k: v for k, v in a.items() if k in ("ttft_p50_s", "tpot_p50_s",
                                                                            "output_tokens_per_s")},
                     **nb14.runs.anchored_row(tables["anchored"], name)}
                    for name, a in tables["aligned"].items()]
    res.replace("clients_aligned", aligned_rows)
    display(res.frame("clients_aligned").round(4))
    print(nb14.findings.anchored_sentence(tables["anchored"]))
    print(nb14.findings.waves_sentence(nb14.runs.waves(runs["labkit"], CONCURRENCY), "labkit", CONCURRENCY))
    print(nb14.findings.first_waves_sentence(nb14.runs.first_waves(runs, CONCURRENCY), "labkit"))

# %% slideshow={"slide_type": "subslide"}
if runs and CLIENT_PASSES < 3:
    print(f"{CLIENT_PASSES} pair{'s' * (CLIENT_PASSES != 1)} per client here: too few for a pass-to-pass range (one "
          "client's start-up alone takes seconds). The full-mode reference:")
    references.show("14_trust", "clients_aligned")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## What was left after alignment, and the server's own view
#
# Alignment took out the definitions (GuideLLM's E2E ÷ n among them: its aligned figure is its ITL). What it cannot
# take out shows below: AIPerf's own token count (it re-tokenises the streamed text) and its clock stopping at the
# last chunk with text, which makes its TPOT shorter, not longer; and the server's pace, which moves from pass to
# pass even between two passes of one client (labkit's pass-to-pass range above). A deviation inside that range is
# not a difference between clients. The four also differ in TTFT, which no definition here touches. vLLM's
# `/metrics` histograms cover every request of the runs above (all clients): the mean is exact (sum ÷ count), a
# percentile only as fine as its bucket. They were also read before and after every pass: the server's own mean
# TPOT over each pass (timed inside vLLM, only where it counted exactly that pass's requests), held against
# labkit's passes either side as the clients' figures were, says how much of a client's residual the server itself
# ran, and how much arose outside its timing: its front end's streaming, the transport, the client's own clock.

# %% slideshow={"slide_type": "fragment"}
if runs:
    for r in runs.get("AIPerf", []):
        if r.ok:
            rep = r.reported
            early = sum(len(o.itl_s) + 1 < o.output_tokens for o in r.outputs if o.success)
            print(f"AIPerf counted {rep['client_counted_tokens']} output tokens where the server sent "
                  f"{rep['server_counted_tokens']}: its ITL divides by its own count. In {early} of {len(r.outputs)} "
                  "requests it saw fewer chunks with text than tokens: its clock stopped at the last chunk with text "
                  "(tokens past the end of the answer can have none), which shortens the aligned TPOT too")
            break
    guide = next((r for r in runs.get("GuideLLM", []) if r.ok), None)
    if guide is not None:
        print(f"GuideLLM's p50 TPOT {guide.reported['tpot_p50_s'] * 1e3:.1f} ms is E2E ÷ n, to the stream's end; its "
              f"own p50 ITL, {guide.reported['itl_p50_s'] * 1e3:.1f} ms, is the aligned definition")
    server_rows = [{"quantity": k, **{kk: vv for kk, vv in v.items() if kk != "p50_bucket_s"},
                    "p50_bucket_s": str(v.get("p50_bucket_s"))} for k, v in server_seen.items()]
    res.replace("server_view", server_rows)
    display(res.frame("server_view").round(4))
    client_mean = statistics.mean(o.tpot_s for rs in runs.values() for r in rs if r.ok for o in r.outputs
                                  if o.success and o.tpot_s is not None)
    print(f"mean TPOT over every client's requests {client_mean * 1e3:.1f} ms; the server's "
          f"{server_seen['tpot']['mean_s'] * 1e3:.1f} ms (its clock starts when the request reaches the engine)")
    print(nb14.findings.server_sentence(tables["anchored"]))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The client's own cost
#
# Every client above had core 1 to itself. A laptop benchmark usually shares its cores with the server: run AIPerf
# (and labkit's client, in full mode) again on the server's own core, so the server keeps what it had less what the
# client takes. A client's share of a core counts the CPU between its first request and its last response; its
# start-up (imports, its services, a warm-up request: `startup_cpu_s`) is paid once per run and shown apart.

# %% slideshow={"slide_type": "fragment"}
shared_rows, shared = [], None
if runs:
    cost = nb14.runs.cpu_share(runs)
    shared_rows, shared = nb14.runs.shared_cores(srv.url, work, folder / "shared", tables, runs,
                                                 server_cores=SERVER_CORES, align_fn=align_fn,
                                                 clients=config.pick(("labkit", "AIPerf"), ("AIPerf",)))
    res.replace("shared_cores", shared_rows)
    display(res.frame("shared_cores").round(4))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · A/A, then A/B
#
# Two identical configurations: the same server behind two copies of a proxy that adds nothing. A pass is
# `AB_REQUESTS` requests through one proxy; a round is a pass through A and one through B, in a shuffled order, side
# by side: a pair. Four readers judge a trial of pairs:
#
# - **naive**: the first pass each, mean TPOT, a difference wherever they are 2 % apart;
# - **overlap**: labkit's old rule, the passes' median TPOTs, a difference where their p10–p90 ranges part;
# - **bootstrap**: an interval for the difference of medians over every request of every pass, a difference where it
#   leaves out 0;
# - **paired**: a paired test on each round's log-ratio ln(B/A) of the passes'
#   medians (`verdict.compare(..., paired=True)`): drift moves both passes of a round alike and cancels.
#
# Then B's proxy adds `SLOWDOWN` of a token's time to every token. First write the bootstrap.

# %% labkit={"exercise": "14.bootstrap_diff"} slideshow={"slide_type": "skip"} tags=["exercise"]
def bootstrap_diff(new, base, resamples=2000, seed=0):
    """new, base: samples of one quantity (seconds). Return (low, high): a 95 % percentile-bootstrap interval for
    median(new) - median(base), each side resampled with replacement `resamples` times."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("14.bootstrap_diff", bootstrap_diff)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## How many pairs?
#
# The A/A rounds measure σ_d, the spread of the per-pair log-ratio when nothing changed. A paired t test at two-sided
# α = 0.05 with 90 % power needs the least n with
# n ≥ (t₀.₉₇₅,ₙ₋₁ + t₀.₉₀,ₙ₋₁)² · (σ_d / δ)², δ = ln(1 + change): iterate on n, since t depends on it (the normal
# approximation, 10.5 · (σ_d/δ)², undercounts at small n). Write it; the run then makes that many pairs of A/B
# (up to `MAX_AB_PAIRS`). Beside the real trials, `RESAMPLED` more of each kind are drawn from the recorded A/A
# rounds: distinct rounds, each round's two passes labelled A and B at random (in an A/A round the labels are
# arbitrary), and for a slowdown trial the delay added to B's tokens.

# %% labkit={"exercise": "14.pairs_needed"} slideshow={"slide_type": "skip"} tags=["exercise"]
def pairs_needed(sigma_d, change):
    """sigma_d: standard deviation of the per-pair log-ratios ln(B_i / A_i) when nothing changed; change: the change
    to catch (0.10 for 10 %). Return the least number of pairs n (never fewer than 6, the fewest a sign-flip test can
    decide on) with n >= (t(0.975, n - 1) + t(0.90, n - 1)) ** 2 * (sigma_d / delta) ** 2, delta = ln(1 + change).
    verdict.t_quantile(q, df) is Student's t quantile (from labkit.core import verdict)."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("14.pairs_needed", pairs_needed)

# %% slideshow={"slide_type": "fragment"}
PREDICT_AA_NAIVE = None  # your prediction: share of A/A trials where one run each calls a difference (0 to 1)

# %% tags=["mechanism"]
boot = exercises.use("14.bootstrap_diff", bootstrap_diff, verdict.bootstrap_diff)
pairs_fn = exercises.use("14.pairs_needed", pairs_needed, verdict.pairs_needed)
ab = None
if srv is not None:
    ab = nb14.runs.aa_ab(srv.url, texts, model=model_path, aa_trials=AA_TRIALS, pairs=PAIRS, slowdown=SLOWDOWN,
                         requests=AB_REQUESTS, max_tokens=AB_TOKENS, concurrency=CONCURRENCY, ab_trials=AB_TRIALS,
                         ab_pairs=pairs_fn, max_ab_pairs=MAX_AB_PAIRS, resampled=RESAMPLED, bootstrap=boot,
                         resamples=RESAMPLES,
                         on_sized=lambda z: print(nb14.findings.sizing_sentence(z, AA_TRIALS * PAIRS)))
    res.replace("aa_ab", [{k: (str(v) if k == "ci_s" else v) for k, v in r.items()} for r in ab["rows"]])
    display(res.frame("aa_ab").round(4))
    res.replace("aa_ab_readers", ab["table"])
    display(res.frame("aa_ab_readers").round(3))
    print(nb14.findings.readers_sentence(ab))
    _ = exercises.reveal("share of A/A trials where one run each called a difference (resampled)", PREDICT_AA_NAIVE,
                         ab["resampled_rates"]["naive"]["aa_false_positive_rate"])
    if not nb14.findings.afforded(ab):
        print("The full-mode run (full mode here, or `python -m bench.trust`) sizes its A/B trials by the formula; "
              "its reference:")
        references.show("14_trust", "aa_ab_readers")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Open loop, closed loop, and the idle gap
#
# A concurrency cap (closed loop) sends the next request only when one finishes: arrivals follow the server's pace.
# Poisson arrivals (open loop) come when they come. Same prompts, same mean rate (the closed loop's measured one).
# Predict: p50 TTFT under Poisson ÷ p50 TTFT under the cap.

# %% slideshow={"slide_type": "fragment"}
PREDICT_OPEN_OVER_CLOSED = None  # your prediction: p50 TTFT, open loop ÷ closed loop

# %% slideshow={"slide_type": "fragment"}
loops = None
if srv is not None:
    loops = nb14.runs.loops(srv.url, texts, model=model_path, requests=config.pick(32, 8), concurrency=CONCURRENCY,
                            max_tokens=8, long_tokens=32, idle_s=IDLE_S)
    loop_rows = [{"load": name, "ttft_p50_s": loops[name]["ttft_p50_s"], "ttft_p90_s": loops[name]["ttft_p90_s"],
                  "requests": len(loops[name]["ttft_s"]), "failed": loops[name]["failed"]}
                 for name in ("closed", "open", "closed_long")]
    res.replace("loops", loop_rows)
    display(res.frame("loops").round(4))
    judged = verdict.compare(loops["open"]["ttft_s"], loops["closed"]["ttft_s"], higher_is_better=False)
    judged_long = verdict.compare(loops["closed_long"]["ttft_s"], loops["closed"]["ttft_s"], higher_is_better=False)
    loops_said = nb14.findings.loops_sentence(loops, judged, judged_long)
    print(loops_said)
    print(f"after {IDLE_S} s idle, one request's TTFT {loops['after_idle_ttft_s'][0]:.3f} s; warm, back to back: "
          f"{statistics.median(loops['warm_ttft_s']):.3f} s (median of {len(loops['warm_ttft_s'])})")
    _ = exercises.reveal("p50 TTFT, open loop ÷ closed loop", PREDICT_OPEN_OVER_CLOSED,
                         loops["open"]["ttft_p50_s"] / loops["closed"]["ttft_p50_s"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · The official MLPerf LoadGen
#
# `mlcommons-loadgen` decides when each query goes (Server: Poisson at a target rate; Offline: all at once) and
# judges the run; the system under test only sends each query and tells LoadGen when its first token and its last
# arrived. Write those two calls.

# %% labkit={"exercise": "14.report"} slideshow={"slide_type": "skip"} tags=["exercise"]
def report(lg, query_id, event, tokens):
    """lg: the mlperf_loadgen module; query_id: the query LoadGen issued; event: "first" (its first token arrived) or
    "done" (its answer is complete, `tokens` output tokens). Tell LoadGen."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("14.report", report)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The limits are llama3.1-8b's Server limits read from the `mlperf.conf` inside LoadGen, rescaled: TPOT
# `mlperf.TPOT_HEADROOM` × this machine's TPOT at `CONCURRENCY` in flight, TTFT at the official ratio. Offline first:
# the rate the server sustains. Then Server at 0.4 of it and at twice it (`nb14.runs.LG_FACTORS`).

# %% tags=["mechanism"]
reporter = exercises.use("14.report", report, mlperf.report)
lg_rows, limits = [], None
if srv is not None:
    lg_rows, limits = nb14.runs.loadgen_rates(srv.url, model_path, texts, folder, tpot_s=ab["tpot_a_s"],
                                              queries=LG_QUERIES, tokens=LG_TOKENS,
                                              min_duration_s=config.pick(20, 3), report=reporter)
    res.replace("loadgen", lg_rows)
    display(res.frame("loadgen"))
    print(f"limits: TTFT ≤ {limits['ttft_s']:.2f} s, TPOT ≤ {limits['tpot_s'] * 1e3:.0f} ms (official "
          f"{limits['official_ttft_s']:g} s, {limits['official_tpot_s'] * 1e3:.0f} ms); {mlperf.NOT_COMPLIANT}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · Same prompt, same seed, different answer
#
# Greedy decoding is deterministic for one prompt alone; [batch invariance](../docs/glossary.md#batch-invariance) is
# whether it stays so inside a batch. Inside a batch the prompt is padded and every matrix
# multiply sees more rows: kernels split and sum in another order. Below, each target prompt decoded alone and
# inside batches, on `vllm serve` (fp32, the server above; bf16 too in full mode) and on the lab's engine in fp32
# and bf16. Predict: of the
# bf16 (prompt, batch) pairs on the lab's engine, how many answers change?

# %% slideshow={"slide_type": "fragment"}
PREDICT_BF16_CHANGED = None  # your prediction: bf16 answers (of the pairs below) that change inside a batch

# %% slideshow={"slide_type": "fragment"}
divergence = {}
ids = [list(models.chat_ids(tok, r.prompt)) for r in requests[:max(DIVERGE_BATCHES) + max(DIVERGE_TARGETS)]]
if srv is not None:
    divergence["vLLM fp32"] = nb14.runs.vllm_batch_divergence(srv.url, ids, batches=DIVERGE_BATCHES,
                                                              targets=DIVERGE_TARGETS, max_tokens=DIVERGE_TOKENS)
    res.notes["vllm"] = {"platform": {"version": srv.version()}}
vllm_stack.close()  # vLLM stops here
if srv is not None and config.quick():
    print("quick mode: vLLM in bf16 needs a second start, which full mode makes (and bench/trust.py records)")
more, missing = nb14.runs.divergence_beside_vllm(model_path, lm.model, tok.pad_token_id, ids, batches=DIVERGE_BATCHES,
                                                 targets=DIVERGE_TARGETS, max_tokens=DIVERGE_TOKENS,
                                                 vllm_bf16=srv is not None and not config.quick())
divergence.update(more)
if missing:
    print(missing)
div_rows = [{"engine": label, **{k: v for k, v in r.items() if k not in ("alone", "in_batch")}}
            for label, rows in divergence.items() for r in rows]
res.replace("batch_divergence", div_rows)
display(res.frame("batch_divergence").round(4))
changed = next(((label, r) for label, rows in divergence.items() for r in rows if r["first_difference"] is not None),
               None)
if changed is not None:
    label, r = changed
    at = r["first_difference"]
    around = slice(max(0, at - 6), at + 6)
    print(f"{label}, prompt {r['target']} in a batch of {r['batch']}: alone …{tok.decode(r['alone'][around])!r} | "
          f"batched …{tok.decode(r['in_batch'][around])!r}")
div_said = nb14.findings.divergence_sentence(divergence)
print(div_said)
_ = exercises.reveal("bf16 answers that change inside a batch (lab engine)", PREDICT_BF16_CHANGED,
                     sum(r["first_difference"] is not None for r in divergence["lab engine bf16"]))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Published: batch-invariant kernels, and MLPerf's own results
#
# vLLM's `VLLM_BATCH_INVARIANT=1` makes a request's answer independent of its batch by swapping in matmul and
# attention kernels whose reduction order does not depend on the batch; in vLLM 0.32's code those overrides are for
# CUDA and ROCm devices only, so a CPU cannot show it. Thinking Machines' write-up of the method,
# [Defeating Nondeterminism in LLM Inference](https://thinkingmachines.ai/blog/defeating-nondeterminism-in-llm-inference/)
# (September 2025), measured the batch-invariant kernels slower than the default ones: the price of one answer.
# MLPerf Inference's submitted results, with the hardware and the limits they met, are published by MLCommons at
# [mlcommons.org/benchmarks/inference-datacenter](https://mlcommons.org/benchmarks/inference-datacenter/): read, not
# measured here.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
sentences = []
if runs:
    sentences.append(nb14.findings.clients_sentence(tables, cost, shared))
if ab is not None:
    sentences.append(nb14.findings.aa_sentence(ab))
if loops is not None:
    sentences.append(loops_said)
if lg_rows:
    sentences.append(nb14.findings.loadgen_sentence(lg_rows, limits))
sentences.append(div_said)
if runs and ab is not None:
    found_14 = nb14.findings.takeaways(tables=tables, ab=ab, loops=loops, lg_rows=lg_rows, divergence=divergence,
                                       sentences=sentences)
    findings.record(res, found_14)
    findings.show(found_14)
else:
    print("\n".join("- " + s for s in sentences))
res.save()

# %% [markdown] slideshow={"slide_type": "fragment"}
# - Before comparing two benchmark reports, ask each for its definitions: TPOT with or without the first token,
#   tokens counted by whom, the clock stopped at which chunk, throughput over what time. From per-request stamps, one
#   definition brings them together; the cells above name what is left.
# - Before believing "B is faster", ask two rates of the reader that says so: how often it says it when nothing
#   changed (A/A), and how often it catches a change of known size. Section 2's table measured both here, for four
#   readers; its sentence names the ones that met the goal.
# - A concurrency cap sets the arrivals' pace: its TTFT is not an open-loop service's TTFT.
# - "Temperature 0" is one answer only for one batch and one precision: the table in section 5 shows where it held here.
#
# ## Exercises (open-ended)
# 1. Run AIPerf again with `--use-server-token-count` (edit `outside.aiperf_command`): does its ITL meet the others'?
# 2. Halve `SLOWDOWN`: how many pairs does your `pairs_needed` ask for, and does the paired reader then catch it in 9
#    resampled trials of 10?
# 3. Raise `LG_QUERIES` until LoadGen's early stopping holds at the p99 MLPerf uses (`percentile=0.99`).

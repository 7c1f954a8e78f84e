"""vLLM's engine beside the lab's on this machine, and one definition of each metric, checked against vLLM's client.

Three ``vllm serve`` starts from vLLM's environment (``make vllm``), one after another:

1. notebook 07's server (``--max-num-seqs`` BATCH, a KV pool of BATCH × the longest request's blocks + 1): the
   mixed workload all at once, in rounds interleaved with the lab's continuous batching in this process: vLLM's
   throughput over the lab's (verdict), greedy tokens identical to the lab's and to transformers' (bool and count);
   then answers one block longer than a request's share of the pool: preemptions from /metrics beside the replay's.
2. a server with a 1 GiB KV cache: ``vllm bench serve`` (vLLM's own client, through ``labkit.serve.vllm.bench``)
   and ``labkit.serve.loadgen`` alternately on the same chat-formatted prompts (data/requests.json) and answer
   length; both medians of TTFT, TPOT, ITL and E2E and labkit ÷ vLLM, plus labkit's definitions applied to vLLM
   bench's own records; then a shared document before different questions: the prefix-cache hit rate (/metrics).
3. an n-gram (prompt lookup) speculative-decoding server: the copying task, draft acceptance from /metrics, and
   its tokens against server 2's answers to the same prompts, and its tokens/s over server 2's (not interleaved:
   two servers; a ratio to read).

One JSON line per phase; the last line is one JSON document. LABKIT_QUICK=1 shrinks every workload.

    flock /tmp/labkit-heavy.lock .venv/bin/python -m bench.vllm
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from labkit.core import config, machine, verdict
from labkit.core.results import jsonable
from labkit.lessons.nb10.runs import QUESTIONS, copy_prompt
from labkit.decoding import quality
from labkit.model import models
from labkit.serve import decoder, loadgen
from labkit.serve.experiments import paged, prefill, scheduler
from labkit.serve.vllm import offline as vllm
from labkit.serve.vllm import bench as vllm_bench
from labkit.serve.vllm import lab as vllm_lab
from labkit.serve.vllm import server as vllm_server
from labkit.serve.metrics import metrics_delta

BATCH = 4  # vLLM's --max-num-seqs = the lab's max_batch_size
ROUNDS = 3  # interleaved rounds of each side
N_REQUESTS, SHORT_TOKENS, LONG_TOKENS = config.pick(16, 6), config.pick(16, 8), config.pick(128, 24)
BLOCK_SIZE = 32  # tokens per block on vLLM's CPU backend (its kernels take multiples of 32)
BENCH_PROMPTS, BENCH_TOKENS, BENCH_CONCURRENCY = config.pick(32, 12), config.pick(32, 16), 4
DOCUMENT_TOKENS = config.pick(640, 320)  # the shared prefix: several of vLLM's 128-token blocks
PREFIX_QUESTIONS, PREFIX_TOKENS = config.pick(8, 4), 16
COPY_PROMPTS, COPY_PASSAGE_TOKENS, COPY_TOKENS = config.pick(4, 2), config.pick(160, 96), config.pick(96, 48)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
DEADLINE_S = 300


def emit(phase: str, doc: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(jsonable({"phase": phase, **doc}), allow_nan=False), flush=True)
    return doc


def lab_phase(lm: Any, model_dir: str) -> dict[str, Any]:
    """Server 1: vLLM against the lab's continuous batching, tokens, and the squeezed pool."""
    eos = decoder.eos_ids(lm.model, lm.tokenizer)
    pad = lm.tokenizer.pad_token_id
    work = scheduler.mixed_workload(lm.tokenizer, N_REQUESTS, 4, SHORT_TOKENS, LONG_TOKENS)
    lab_first = scheduler.run_continuous(lm.model, work, eos, pad, max_batch_size=BATCH)  # warmup, and the reference
    refs = {"transformers": vllm.hf_greedy(lm, work),
            "continuous": {k: quality.until_eos(v, eos) for k, v in lab_first.outputs().items()}}
    longest = max(len(r.prompt_ids) + r.max_new_tokens for r in work)
    blocks = BATCH * paged.blocks_for(longest, BLOCK_SIZE) + 1  # and the block vLLM keeps back
    squeeze = paged.blocks_for(longest, BLOCK_SIZE) * BLOCK_SIZE - min(len(r.prompt_ids) for r in work) + 2
    settings = vllm_server.Settings(model=model_dir, max_num_seqs=BATCH, block_size=BLOCK_SIZE, num_blocks=blocks,
                                    max_model_len=(blocks - 1) * BLOCK_SIZE)
    machine.check("vllm against the lab", quiet=True)
    got = vllm_lab.engine_runs(settings, work, rounds=ROUNDS, squeeze_tokens=squeeze, modes=(vllm_lab.ALL,),
                               others={"lab": lambda: scheduler.run_continuous(lm.model, work, eos, pad,
                                                                               max_batch_size=BATCH)},
                               deadline_s=DEADLINE_S)
    if got["status"] != "ok":
        return emit("lab", {"status": got["status"]})
    runs = got["runs"][vllm_lab.ALL]
    ours, theirs = [r.tokens_per_s for r in runs], [r.tokens_per_s for r in got["others"]["lab"]]
    v = verdict.compare(ours, theirs)
    rows = [row for r in runs for row in r.rows(eos, refs)]
    same = {name: sum(row[f"same_as_{name}"] for row in rows) for name in refs}
    sq = got["squeeze"]
    pred = vllm_lab.replay(work, sq.generated(), BLOCK_SIZE, blocks, BATCH, settings.max_model_len)
    mixed = vllm_lab.replay(work, runs[0].generated(), BLOCK_SIZE, blocks, BATCH, settings.max_model_len)
    return emit("lab", {
        "status": "ok", "vllm": got["platform"], "start_s": got["start_s"],
        "throughput": {"vllm_tokens_per_s": statistics.median(ours), "lab_tokens_per_s": statistics.median(theirs),
                       "ratio": v.ratio, "verdict": v.to_dict(), "vllm_samples": ours, "lab_samples": theirs,
                       "requests": len(work), "max_num_seqs": BATCH, "interleaved_rounds": ROUNDS},
        "tokens_identical": {name: {"identical": same[name] == len(rows), "requests_identical": same[name],
                                    "requests": len(rows)} for name in refs},
        "preemptions": {"block_size": BLOCK_SIZE, "num_blocks": blocks, "natural_blocks": got["natural_blocks"],
                        "workload": {"vllm": sum(r.metrics.get("vllm:num_preemptions_total", 0.0) for r in runs),
                                     "replay_per_run": mixed["preemptions"], "runs": len(runs)},
                        "squeezed": {"answer_tokens": squeeze, "vllm": sq.metrics.get("vllm:num_preemptions_total", 0.0),
                                     "replay": pred["preemptions"], "fit_at_once_replay": pred["fit_at_once"]}}})


def chat_texts(tokenizer: Any, prompts: list[str]) -> list[str]:
    """The chat-formatted prompt text both clients send as it is."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts]


def metrics_phase(lm: Any, model_dir: str, folder: Path) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """Server 2: vllm bench serve against loadgen, the prefix-cache hit rate, the copying task's answers."""
    requests = paged.load_requests()
    texts = chat_texts(lm.tokenizer, [requests[i % len(requests)].prompt for i in range(BENCH_PROMPTS)])
    dataset = vllm_bench.write_dataset(folder / "requests.jsonl", texts)
    copies = [list(models.chat_ids(lm.tokenizer, copy_prompt(lm.tokenizer, COPY_PASSAGE_TOKENS + 8 * i)))
              for i in range(COPY_PROMPTS)]
    settings = vllm_server.Settings(model=model_dir, max_num_seqs=8)
    out: dict[str, Any] = {}
    answers: dict[str, list[int]] = {}
    try:
        with vllm_server.serve(settings, deadline_s=DEADLINE_S) as server:
            out.update(status="ok", start_s=server.start_s, blocks=server.kv_blocks())
            loadgen.run(server.url, texts[:1], num_requests=1, max_tokens=4, warmup=0)  # the first request pays set-up
            argv = vllm_bench.command(server.url, model_dir, model_dir, dataset, folder / "bench.json",
                                      num_prompts=BENCH_PROMPTS, output_len=BENCH_TOKENS,
                                      max_concurrency=BENCH_CONCURRENCY)
            theirs, ours = [], []
            machine.check("vllm bench serve against loadgen", quiet=True)
            for _ in range(ROUNDS):  # alternately, on the same server, prompts and answer length
                theirs.append(vllm_bench.run(argv))
                ours.append(loadgen.run(server.url, texts, num_requests=BENCH_PROMPTS, max_concurrency=BENCH_CONCURRENCY,
                                        max_tokens=BENCH_TOKENS, ignore_eos=True, warmup=0, model=model_dir))
            out["metrics"] = {**vllm_bench.compare(theirs, ours), "prompts": BENCH_PROMPTS, "answer_tokens": BENCH_TOKENS,
                              "concurrency": BENCH_CONCURRENCY, "rounds": ROUNDS,
                              "failed": {"vllm_bench": sum(b["failed"] for b in theirs),
                                         "labkit": sum(r.failed for r in ours)}}
            out["prefix_cache"] = prefix_cache(server, lm.tokenizer)
            res = loadgen.run(server.url, copies, num_requests=len(copies), max_tokens=COPY_TOKENS, ignore_eos=False,
                              warmup=0, return_token_ids=True)
            answers = {str(i): o.token_ids for i, o in enumerate(res.outputs)}
            out["copy_tokens_per_s"] = res.summary()["output_tokens_per_s"]
    except (vllm_server.VLLMUnavailable, vllm_server.VLLMStartError, vllm_bench.BenchFailed) as exc:
        out["status"] = str(exc)
    return emit("metrics", out), answers


def prefix_cache(server: vllm_server.VLLMServer, tokenizer: Any) -> dict[str, Any]:
    """One question first (its document's blocks enter the cache), then the others at once: /metrics' hit rate."""
    document = prefill.document_text(tokenizer, DOCUMENT_TOKENS)
    prompts = [list(models.chat_ids(tokenizer, p)) for p in prefill.shared_prefix_prompts(document,
                                                                                        QUESTIONS[:PREFIX_QUESTIONS])]
    before = vllm_lab.scrape(server)
    first = loadgen.run(server.url, prompts[:1], num_requests=1, max_tokens=PREFIX_TOKENS, warmup=0)
    rest = loadgen.run(server.url, prompts[1:], num_requests=len(prompts) - 1, max_tokens=PREFIX_TOKENS, warmup=0)
    d = metrics_delta(before, vllm_lab.scrape(server))
    hits, queries = d.get("vllm:prefix_cache_hits_total", 0.0), d.get("vllm:prefix_cache_queries_total", 0.0)
    return {"requests": len(prompts), "prompt_tokens": sum(map(len, prompts)), "shared_document_tokens": DOCUMENT_TOKENS,
            "hits_tokens": hits, "queries_tokens": queries, "hit_rate": hits / queries if queries else None,
            "ttft_first_s": first.summary()["ttft_p50_s"], "ttft_rest_p50_s": rest.summary()["ttft_p50_s"]}


def ngram_phase(lm: Any, model_dir: str, without: dict[str, list[int]]) -> dict[str, Any]:
    """Server 3: prompt-lookup speculative decoding on the copying task."""
    copies = [list(models.chat_ids(lm.tokenizer, copy_prompt(lm.tokenizer, COPY_PASSAGE_TOKENS + 8 * i)))
              for i in range(COPY_PROMPTS)]
    settings = vllm_server.Settings(model=model_dir, max_num_seqs=8, speculative=NGRAM)
    try:
        with vllm_server.serve(settings, deadline_s=DEADLINE_S) as server:
            loadgen.run(server.url, copies[:1], num_requests=1, max_tokens=4, warmup=0)
            run = vllm_lab.served_run(server, "ngram", [scheduler.Request(id=str(i), prompt_ids=tuple(p),
                                                                         max_new_tokens=COPY_TOKENS)
                                                       for i, p in enumerate(copies)])
            start_s = server.start_s
    except (vllm_server.VLLMUnavailable, vllm_server.VLLMStartError, vllm_lab.ServerDied) as exc:
        return emit("ngram", {"status": str(exc)})
    m = run.metrics
    drafted, accepted = m.get("vllm:spec_decode_num_draft_tokens_total", 0.0), m.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    got = {r.id: o.token_ids for r, o in zip(run.work, run.result.outputs)}
    check = quality.answers_check(got, without, set()) if without else None
    same = check["compared"] - len(check["first_differences"]) if check else None
    return emit("ngram", {"status": "ok", "start_s": start_s, "speculative": NGRAM, "requests": len(copies),
                          "drafted_tokens": drafted, "accepted_tokens": accepted,
                          "acceptance_rate": accepted / drafted if drafted else None,
                          "drafts": m.get("vllm:spec_decode_num_drafts_total"),
                          "tokens_per_s": run.tokens_per_s,
                          "same_tokens_as_without": {"identical": same == len(without) if without else None,
                                                     "requests_identical": same, "requests": len(without)}})


def main() -> int:
    if not vllm_server.vllm_python().exists():
        print(json.dumps({"status": vllm_server.MISSING}))  # make bench goes on: nothing here to measure
        return 0
    start = machine.check("start", quiet=True)
    lm = models.load(dtype="fp32")
    model_dir = vllm.models_path(lm)
    with tempfile.TemporaryDirectory(prefix="labkit-vllm-bench-") as tmp:
        lab = lab_phase(lm, model_dir)
        metrics, answers = metrics_phase(lm, model_dir, Path(tmp))
    ngram = ngram_phase(lm, model_dir, answers)
    m = metrics.get("metrics", {})
    doc = {"quick": config.quick(), "load_average": os.getloadavg(), "machine": start.line(),
           "vllm": lab.get("vllm"),
           "vllm_vs_lab_throughput": lab.get("throughput", {}).get("ratio"),
           "throughput": lab.get("throughput"), "tokens_identical": lab.get("tokens_identical"),
           "prefix_cache_hit_rate": metrics.get("prefix_cache", {}).get("hit_rate"),
           "spec_decode_acceptance": ngram.get("acceptance_rate"),
           "preemptions_squeezed": (lab.get("preemptions") or {}).get("squeezed"),
           "labkit_vs_vllm_bench": {k: v["ratio"] for k, v in m.get("metrics", {}).items()},
           "labkit_vs_vllm_bench_same_records": {k: v["same_records_ratio"] for k, v in m.get("metrics", {}).items()},
           "metrics_agree_within_10pct": m.get("agree"), "definitions_identical": m.get("definitions_identical"),
           "client_differences_beyond_noise": m.get("beyond_noise"),
           "spec_decode_tokens_per_s_ratio": (ngram["tokens_per_s"] / metrics["copy_tokens_per_s"]
                                              if ngram.get("tokens_per_s") and metrics.get("copy_tokens_per_s") else None),
           "status": {"lab": lab.get("status"), "metrics": metrics.get("status"), "ngram": ngram.get("status")}}
    print(json.dumps(jsonable(doc), allow_nan=False))
    return 0 if all(s == "ok" for s in doc["status"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

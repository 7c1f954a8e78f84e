"""Notebook 10's headline ratios, measured in one run: each beside its quality or equality check.

    prompt lookup    decode speedup on the copying task (and tokens per forward pass), tokens identical
    prefix cache     TTFT without / with, under the same load; hit rate; answers identical
    chunked prefill  the running streams' ITL p99 (from 100 gaps on) and worst gap without / with; the long prompt's
                     TTFT cost; answers identical
    quantised KV     fp32 cache bytes / quantised cache bytes at long context; agreement, KL, speed ratio
    CPU engines      the lab's best CPU decode tokens/s over llama.cpp's on the same prompt, both agreements

Prints one JSON line per section, the last line one JSON document with every headline figure.
LABKIT_QUICK=1 shrinks token and request counts (the same code paths).

    python -m bench.beyond
"""
from __future__ import annotations

import argparse
import json
import sys

from labkit.core import config, env
from labkit.core.results import jsonable
from labkit.decoding import quality, speculative
from labkit.engines import cpu, llamacpp
from labkit.lessons.nb10 import runs as nb10_runs
from labkit.model import models, onnx, prompts
from labkit.precision import kvquant, variants
from labkit.serve.experiments import prefill

DROP = ("tokens", "lookup_tokens", "texts", "stamps", "ttft_s", "answer")


def _emit(section: str, rows: list[dict]) -> None:
    for r in rows:
        print(json.dumps(jsonable({"section": section, **{k: v for k, v in r.items() if k not in DROP}})), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=config.pick(3, 1), help="timed runs per measurement")
    ap.add_argument("--rounds", type=int, default=config.pick(8, 6),
                    help="interleaved rounds of each two-way comparison (its pairs: a paired verdict needs 6)")
    args = ap.parse_args(argv)
    if args.repeats <= 0 or args.rounds <= 0:
        ap.error("--repeats and --rounds must be positive")
    pick = config.pick
    lm = models.load(dtype="fp32" if env.device() == "cpu" else "fp16")
    tok, device = lm.tokenizer, lm.model.device

    tasks = {"copy": nb10_runs.copy_prompt(tok, pick(240, 96)), "chat": nb10_runs.FREE_CHAT}
    lookup = [speculative.compare_lookup(lm.model, models.chat_inputs(tok, p, device=str(device))["input_ids"],
                                         pick(64, 24), 5, repeats=args.rounds, label=t) for t, p in tasks.items()]
    _emit("lookup", lookup)

    doc = prefill.document_text(tok, pick(768, 128))
    shared = prefill.shared_prefix_prompts(doc, nb10_runs.QUESTIONS[:pick(8, 3)])
    prefix = prefill.prefix_cache_rounds(lm, shared, pick(16, 2), 2, 4096, args.rounds)
    _emit("prefix_cache", prefix)

    long_prompt = prefill.document_text(tok, pick(1536, 256))
    chunked = prefill.chunked_prefill_rounds(lm, list(nb10_runs.STREAM_PROMPTS[:pick(3, 2)]), pick(48, 10), long_prompt,
                                             128, args.rounds)
    _emit("chunked_prefill", chunked)

    caches = {"int8 per channel (lab)": lambda: kvquant.lab_cache(lm.model.config)}
    kv_name = "int8 per channel (lab)"
    if not kvquant.backend_reason("quanto"):
        caches["quanto int4"] = lambda: kvquant.library_cache(lm.model.config, "quanto", 4)
        kv_name = "quanto int4"
    kv = kvquant.compare(lm.model, kvquant.context_ids(tok, pick(2048, 384), device), pick(32, 6), caches)
    _emit("kv_cache", kv)

    prompt = prompts.load_prompts("prompts")[0]
    ref = quality.reference(lm.model, tok, prompts.load_prompts("prompts")[:pick(4, 2)], new_tokens=pick(24, 12))
    n, reps = pick(32, 8), args.repeats
    engines = [cpu.measure_hf("PyTorch", "fp32", lm.model, tok, prompt, n, reps, ref,
                                      weight_bytes=sum(p.numel() * p.element_size() for p in lm.model.parameters()))]
    fp32_answer = engines[0]["answer"]
    if env.device() == "cpu":
        half = models.load(dtype="fp16")
        engines.append(cpu.measure_hf("PyTorch", "fp16", half.model, tok, prompt, n, reps, ref, fp32_answer,
                                              sum(p.numel() * p.element_size() for p in half.model.parameters())))
        del half
    v = variants.load_variant("ort-int8-channel")
    engines.append(cpu.measure_ort("int8 per channel", v.model, v.options["provider"], tok, prompt, n, reps, ref,
                                   fp32_answer, v.weight_bytes) if v.ok
                   else cpu.failed_row("ONNX Runtime", "int8 per channel", v.status))
    v.release()
    reason = onnx.nbits_reason()
    for bits in (4, 8):
        fmt = f"MatMulNBits {bits}-bit b32"
        if reason:
            engines.append(cpu.failed_row("ONNX Runtime", fmt, reason))
            continue
        folder, made_s = onnx.quantize_nbits(bits=bits, block_size=32, symmetric=True, accuracy_level=4)
        engines.append(cpu.ort_row(fmt, folder, tok, env.device(), prompt, n, reps, ref, fp32_answer, made_s))
    cap = llamacpp.capability()
    engines.append(cpu.measure_llamacpp("llama.cpp", "Q4_1", models.default_gguf(), tok, prompt, n, reps, ref,
                                                fp32_answer) if cap.available
                   else cpu.failed_row("llama.cpp", "Q4_1", cap.reason))
    _emit("cpu_engines", engines)

    head = nb10_runs.headline(lookup, prefix, chunked, kv, engines, kv_name=kv_name)
    summary = {"bench": "beyond", "model": lm.name, "device": lm.device, "quick": config.quick(), **head,
               "hardware": env.hardware(),
               "versions": env.versions(("torch", "transformers", "onnxruntime", "optimum-quanto", "onnx-ir",
                                         "llama-cpp-python"))}
    print(json.dumps(jsonable(summary), allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engines: continuous vs static batching on the mixed workload, and torch.compile vs eager decode.

1. The mixed workload of notebook 07 (short and long answers from data/requests.json) run one at a time,
   in static batches and with continuous batching at the same batch size: throughput, mean latency of
   the short requests, and whether every request got exactly the greedy tokens it gets alone.
2. The decode step with a static KV cache, eager and compiled by torch.compile (inductor, empty cache
   so the compile is cold): steady-state decode tokens/s and the compile time.

One JSON line per measurement, then one JSON document comparing them (last line).

    flock /tmp/labkit-heavy.lock .venv/bin/python -m bench.engines [--requests 16] [--batch 4]
"""
from __future__ import annotations

import argparse
import json
import sys

from labkit.core import config, env
from labkit.core.results import jsonable
from labkit.decoding import quality
from labkit.engines import compiled
from labkit.model import hardware, models
from labkit.serve import decoder
from labkit.serve.experiments import scheduler


def emit(row: dict) -> dict:
    print(json.dumps(jsonable(row)), flush=True)
    return row


def batching_rows(lm: models.Loaded, n_requests: int, batch: int, short_tokens: int, long_tokens: int) -> list[dict]:
    work = scheduler.mixed_workload(lm.tokenizer, n_requests, 4, short_tokens, long_tokens)
    eos, pad = decoder.eos_ids(lm.model, lm.tokenizer), lm.tokenizer.pad_token_id
    scheduler.run_static(lm.model, work[:2], eos, pad, 2)  # warmup
    runs = [scheduler.run_static(lm.model, work, eos, pad, 1), scheduler.run_static(lm.model, work, eos, pad, batch),
            scheduler.run_continuous(lm.model, work, eos, pad, batch)]
    same = scheduler.compare_outputs(runs, runs[0])
    keys = ("mode", "max_batch_size", "requests", "output_tokens", "wall_s", "tokens_per_s", "mean_latency_short_s",
            "mean_latency_long_s", "mean_latency_s", "decode_steps", "mean_batch", "wasted_row_fraction")
    return [emit({"bench": "batching", **{k: r.summary()[k] for k in keys}, "outputs_match_alone": same[r.mode]})
            for r in runs]


def compile_rows(lm: models.Loaded, new_tokens: int, repeats: int, max_cache_len: int) -> list[dict]:
    ids = models.chat_inputs(lm.tokenizer, compiled.DEFAULT_PROMPT, device=lm.device)["input_ids"]
    rows = []
    for label, use_compile in (("eager, static cache", False), ("torch.compile, static cache", True)):
        dec = compiled.StaticDecoder(lm.model, max_cache_len, compile=use_compile)
        m = compiled.measure_decoder(dec, ids, new_tokens, repeats)
        rows.append(emit({"bench": "compile", "engine": label, "compile_s": m["build_s"], "ttft_s": m["ttft_s"],
                          "decode_tokens_per_s": m["decode_tokens_per_s"], "tpot_spread": m["tpot_spread"],
                          "new_tokens": new_tokens, "repeats": repeats, "tokens": m["tokens"],
                          **{k: m[k] for k in ("ir_nodes_before_fusion", "generated_kernels") if k in m}}))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=config.pick(16, 8), help="requests in the mixed workload")
    ap.add_argument("--batch", type=int, default=4, help="static batch size = continuous max_batch_size")
    ap.add_argument("--short-tokens", type=int, default=16, help="answer limit of short requests")
    ap.add_argument("--long-tokens", type=int, default=config.pick(128, 48), help="answer limit of long requests")
    ap.add_argument("--new-tokens", type=int, default=config.pick(64, 16), help="decode tokens per timed run")
    ap.add_argument("--repeats", type=int, default=config.pick(3, 1), help="timed decode runs per engine")
    ap.add_argument("--max-cache-len", type=int, default=compiled.DEFAULT_MAX_CACHE_LEN)
    ap.add_argument("--skip-compile", action="store_true", help="only the batching comparison")
    args = ap.parse_args()
    lm = models.load()
    batch = batching_rows(lm, args.requests, args.batch, args.short_tokens, args.long_tokens)
    static, cont = batch[1], batch[2]
    summary = {"bench": "engines", "model": lm.name, "device": lm.device, "hardware": hardware.device_name(lm.device),
               "continuous_vs_static": {
                   "throughput_ratio": cont["tokens_per_s"] / static["tokens_per_s"],
                   "short_latency_ratio": static["mean_latency_short_s"] / cont["mean_latency_short_s"],
                   "outputs_match_alone": cont["outputs_match_alone"]},
               "batching": batch}
    if not args.skip_compile and env.capability("torch.compile").available:
        eager, comp = compile_rows(lm, args.new_tokens, args.repeats, args.max_cache_len)
        summary["compile_vs_eager"] = {"speedup": comp["decode_tokens_per_s"] / eager["decode_tokens_per_s"],
                                       "compile_s": comp["compile_s"], "same_tokens": quality.identical(comp["tokens"], eager["tokens"])}
        summary["compile"] = [eager, comp]
    print(json.dumps(jsonable(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

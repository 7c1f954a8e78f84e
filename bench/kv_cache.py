"""KV cache on vs off for N new tokens, and the cache's measured bytes against the sizing formula.

Prints JSON lines: one per cache setting (use_cache, new_tokens, seconds, ...), one with
kv_bytes_measured and kv_bytes_predicted for the same context and batch, and last one summary.
Target on a 2-core CPU with the default model, 256 new tokens: cache on at least 3× faster than
off, measured KV bytes within 5 % of the prediction.

    python -m bench.kv_cache [--new-tokens 256] [--kv-batch 4]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from labkit.core import env
from labkit.decoding import kv
from labkit.model import models

TARGET_SPEEDUP = 3.0
TARGET_KV_REL = 0.05


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens generated per timed run")
    ap.add_argument("--kv-batch", type=int, default=4, help="sequences for the cache-size check")
    ap.add_argument("--kv-new-tokens", type=int, default=16, help="new tokens for the cache-size check")
    ap.add_argument("--prompt", default=kv.DEFAULT_PROMPT)
    args = ap.parse_args(argv)
    if args.new_tokens < 2 or args.kv_batch <= 0 or args.kv_new_tokens <= 0:
        ap.error("--new-tokens must be at least 2; --kv-batch and --kv-new-tokens positive")

    lm = models.load()
    kv.timed_generate(lm.model, lm.tokenizer, args.prompt, 8)  # untimed warmup: lazy set-up, page-in
    threads = torch.get_num_threads()
    runs = {}
    for use_cache in (True, False):
        cpu0 = time.process_time()
        r = kv.timed_generate(lm.model, lm.tokenizer, args.prompt, args.new_tokens, use_cache=use_cache)
        cpu_s = time.process_time() - cpu0
        runs[use_cache] = r
        # cpu_share near 1: this process had its threads' cores; far below: another program took them
        print(json.dumps({"use_cache": use_cache, "new_tokens": r.n_out, "seconds": r.e2e_s, "ttft_s": r.ttft_s,
                          "tpot_s": r.tpot_s, "last_itl_s": r.itl_s[-1], "n_prompt": r.n_prompt,
                          "cpu_s": cpu_s, "cpu_share": cpu_s / (r.e2e_s * threads)}), flush=True)

    size = kv.measure_cache(lm.model, lm.tokenizer, args.prompt, args.kv_new_tokens, batch=args.kv_batch)
    print(json.dumps({"kv_bytes_measured": size.measured_bytes, "kv_bytes_predicted": size.predicted_bytes,
                      "context": size.context, "batch": size.batch, "kv_dtype": size.kv_dtype,
                      "cache_class": size.cache_class}), flush=True)

    speedup = runs[False].e2e_s / runs[True].e2e_s
    kv_rel = abs(size.ratio - 1)
    summary = {"bench": "kv_cache", "model": lm.name, "device": lm.device, "new_tokens": args.new_tokens,
               "seconds_cache_on": runs[True].e2e_s, "seconds_cache_off": runs[False].e2e_s,
               "speedup": speedup, "target_speedup": TARGET_SPEEDUP, "kv_ratio": size.ratio,
               "target_kv_rel": TARGET_KV_REL, "meets_target": speedup >= TARGET_SPEEDUP and kv_rel <= TARGET_KV_REL,
               "hardware": env.hardware(), "versions": {k: v for k, v in env.versions().items()
                                                        if k in ("python", "torch", "transformers")}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

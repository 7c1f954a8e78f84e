"""Roofline check for the default model: predicted decode ceiling vs measured decode rate.

Prints the ceiling first (bandwidth ÷ bytes read per token), then the measurement, the
fraction of the ceiling reached and why the rest is missing (operators, i.e. kernel launches on
a GPU, per token: a small model on a GPU is launch-bound). The last line is one JSON document.

    python -m bench.decode_roofline [--dtype fp32] [--new-tokens 128] [--batch 1]
"""
from __future__ import annotations

import argparse
import json

from labkit.core import config, env, memory
from labkit.decoding import generation
from labkit.engines import compiled
from labkit.model import dtypes, hardware, models, sizing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp32", choices=dtypes.TORCH_DTYPES)
    ap.add_argument("--new-tokens", type=int, default=config.pick(128, 32))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=config.pick(3, 2))
    args = ap.parse_args()

    bw = hardware.bandwidth()
    print(f"# bandwidth probe: {bw.gbs:.1f} GB/s best, {bw.median_gbs:.1f} GB/s median over "
          f"{bw.read.n} reads of {bw.working_set_bytes / 2**30:.1f} GiB ({bw.device})")
    lm = models.load(dtype=args.dtype)
    weight_b = memory.param_bytes(lm.model).bytes
    s = sizing.shape("default")
    kv_tok = sizing.kv_bytes_per_token(s, dtypes.kv_dtype_for(args.dtype))
    context = 32 + args.new_tokens // 2  # prompt + half the answer: the mean context while decoding
    ceiling = sizing.decode_ceiling(weight_b, kv_tok, context, args.batch, bw.gbs * 1e9)
    print(f"# ceiling: {bw.gbs:.1f} GB/s ÷ {weight_b / 2**20:.0f} MiB per step → {ceiling:.1f} tokens/s")
    dec = generation.measure_decode(lm.model, lm.tokenizer, batch=args.batch, new_tokens=args.new_tokens,
                                    repeats=args.repeats)
    ratio = dec["aggregate_tokens_per_s"] / ceiling
    achieved_gbs = dec["aggregate_tokens_per_s"] / args.batch * sizing.decode_bytes_per_step(weight_b, kv_tok, context, args.batch) / 1e9
    print(f"# measured: {dec['aggregate_tokens_per_s']:.1f} tokens/s = {ratio:.2f}× of the ceiling "
          f"(achieved {achieved_gbs:.1f} GB/s)")
    ids = models.chat_inputs(lm.tokenizer, "Write a short story about a lighthouse keeper.", device=lm.device)["input_ids"]
    shape = lm.model.config
    gemv = hardware.linear_layout_probe(out_features=shape.vocab_size, in_features=shape.hidden_size, device=lm.device)
    gap = hardware.decode_gap(dec["tpot_s"], sizing.decode_bytes_per_step(weight_b, kv_tok, context, args.batch), bw.gbs,
                              compiled.count_eager_ops(lm.model, ids), lm.device, gemv_gbs=gemv["linear_gbs"],
                              weight_bytes=weight_b)
    print(f"# why: {gap['explanation']}")
    print(json.dumps({
        "model": lm.name, "dtype": args.dtype, "batch": args.batch, "device": lm.device,
        "bandwidth_gbs": bw.gbs, "bandwidth_median_gbs": bw.median_gbs, "weight_bytes": weight_b,
        "ceiling_tokens_per_s": ceiling, "decode_tokens_per_s": dec["aggregate_tokens_per_s"],
        "ratio": ratio, "achieved_gbs": achieved_gbs, "tpot_spread": dec["spread"],
        "ops_per_token": gap["ops_per_step"], "bytes_share_of_step": gap["bytes_share"],
        "gemv_gbs": gap["matmul_gbs"], "kernel_share_of_step": gap["kernel_share"],
        "overhead_share_of_step": gap["overhead_share"], "bound": gap["bound"],
        "new_tokens": args.new_tokens, "repeats": args.repeats, "cpu": env.hardware()["cpu"], "gpu": env.hardware()["gpu"],
        "versions": {k: v for k, v in env.versions().items() if k in ("torch", "transformers")},
    }))


if __name__ == "__main__":
    main()

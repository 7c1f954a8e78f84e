"""Every precision variant in one process, one after another: speed, memory and quality.

Prints JSON lines: one per variant (fp32 first, the baseline), then `ort-int8` (the better-quality
of ort-int8-tensor and ort-int8-channel: higher agreement, then lower KL), and last one summary
document. Every variant gets the same prompts and token counts. A variant this machine cannot
run prints a line whose status says why.
Targets on a 2-core CPU with the default model: ONNX Runtime int8 decodes at least 1.4× faster
than the fp32 PyTorch baseline of the same run; NF4 weight bytes at most 30 % of fp32's.

    python -m bench.precision [--variants fp32,bnb-nf4,...] [--new-tokens 32] [--repeats 3] [--ppl-max-tokens 1024]

The formats table (FP8, NVFP4, MXFP4 as rounded weights beside int8, int4 and NF4; their rows carry no timing):

    python -m bench.precision --variants fp32,fp8-tensor,fp8-channel,nvfp4,mxfp4,int4-g64,bnb-int8,bnb-nf4

The first run exports and quantises the ONNX models into the cache (about a minute for the
default model); later runs reuse them. Each row's prepare_s says what was spent on that.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from labkit.core import config, env, timing
from labkit.model import hardware, models, sizing
from labkit.precision import measure, variants

TARGET_ORT_INT8_SPEEDUP = 1.4
TARGET_NF4_FRACTION = 0.30
COLUMNS = ("variant", "status", "backend", "device", "weight_bytes", "weight_bytes_source", "predicted_weight_bytes",
           "load_s", "prepare_s", "measure_s", "peak_memory_bytes", "peak_memory_source", "ttft_s", "tpot_s", "decode_tokens_per_s",
           "decode_spread", "perplexity", "agreement", "kl", "kl_max", "weight_error", "bits_per_weight", "answers",
           "options")


def _line(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in COLUMNS}
    out["answer"] = (row.get("answers") or [None])[0]
    del out["answers"]
    return out


def main(argv: list[str] | None = None) -> int:
    defaults = measure.Settings.default()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(variants.names()),
                    help=f"comma-separated, from {variants.names()}")
    ap.add_argument("--new-tokens", type=int, default=defaults.new_tokens, help="decode tokens per timed run")
    ap.add_argument("--repeats", type=int, default=defaults.repeats, help="timed runs per variant")
    ap.add_argument("--ppl-max-tokens", type=int, default=config.pick(1024, defaults.ppl_max_tokens or 1024),
                    help="tokens of the evaluation text scored, the same for every variant (0: all of it)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in variants.names()]
    if unknown or not names:
        ap.error(f"unknown variant(s) {unknown}; choose from {variants.names()}")
    if args.new_tokens < 2 or args.repeats <= 0 or args.ppl_max_tokens < 0:
        ap.error("--new-tokens must be at least 2, --repeats positive, --ppl-max-tokens 0 or more")

    settings = measure.Settings(**{**defaults.to_dict(), "new_tokens": args.new_tokens, "repeats": args.repeats,
                                   "ppl_max_tokens": args.ppl_max_tokens or None})
    t0 = timing.clock()
    rows = []
    shape = sizing.shape(os.environ.get("LABKIT_MODEL") or "default")
    for row in measure.run(names, settings, progress=False):
        # the quantised layers' stored bits per weight, scales included (sizing's layout of the variant's dtype)
        row["bits_per_weight"] = sizing.bits_per_weight(shape, variants.SIZING_DTYPE[row["variant"]])
        rows.append(row)
        print(json.dumps(_line(row), ensure_ascii=False, default=str), flush=True)

    best = measure.best_of(rows, ["ort-int8-tensor", "ort-int8-channel"])
    if best is not None:
        rows.append({**best, "variant": "ort-int8", "chosen": best["variant"]})
        print(json.dumps({**_line(rows[-1]), "chosen": best["variant"]}, ensure_ascii=False, default=str), flush=True)

    by = {r["variant"]: r for r in rows}

    def ok(name: str) -> dict[str, Any] | None:
        r = by.get(name)
        return r if r is not None and r.get("status") == "ok" else None

    fp32, ort8, nf4 = ok("fp32"), ok("ort-int8"), ok("bnb-nf4")
    speedup = ort8["decode_tokens_per_s"] / fp32["decode_tokens_per_s"] if fp32 and ort8 else None
    nf4_fraction = nf4["weight_bytes"] / fp32["weight_bytes"] if fp32 and nf4 else None
    summary = {
        "bench": "precision", "model": models.display_name(), "device": env.device(),
        "variants": names, "settings": settings.to_dict(), "seconds": timing.clock() - t0,
        "ort_int8_chosen": by.get("ort-int8", {}).get("chosen"),
        "ort_int8_decode_speedup_vs_fp32": speedup, "target_ort_int8_speedup": TARGET_ORT_INT8_SPEEDUP,
        "nf4_weight_fraction_of_fp32": nf4_fraction, "target_nf4_fraction": TARGET_NF4_FRACTION,
        "all_rows_have_quality": all(r.get(k) is not None for r in rows if r.get("status") == "ok"
                                     for k in ("perplexity", "agreement", "kl")),
        "not_ok": {r["variant"]: r["status"] for r in rows if r.get("status") != "ok"},
        "meets_target": (speedup is not None and speedup >= TARGET_ORT_INT8_SPEEDUP
                         and nf4_fraction is not None and nf4_fraction <= TARGET_NF4_FRACTION),
        "cpu_features": hardware.cpu_features(),
        "hardware": env.hardware(),
        "versions": {k: v for k, v in env.versions().items()
                     if k in ("python", "torch", "transformers", "onnxscript", "onnxruntime", "bitsandbytes")},
    }
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

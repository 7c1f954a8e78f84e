"""Does an engine's decode speed depend on what else is loaded? ONNX Runtime int8 timed alone and beside the
other precision variants (as notebook 03's interleaved rounds load them), in one process, interleaved.

Each layout loads its variants, times ``--rounds`` interleaved rounds of one greedy decode each
(``generation.decode_variants``) and releases them; the layouts then repeat in the same order ``--cycles``
times, so drift hits them alike. The last line is one JSON document: tokens/s per layout and cycle, and the
medians' ratios to "alone".

    python -m bench.ort_contention [--variant ort-int8-channel] [--new-tokens 8] [--rounds 3] [--cycles 2]
"""
from __future__ import annotations

import argparse
import json
import statistics

from labkit.core import config, cpu, env
from labkit.decoding import generation
from labkit.precision import variants

ALL = ["fp32", "fp16", "bnb-int8", "bnb-nf4", "ort-fp32", "ort-int8-tensor", "ort-int8-channel"]  # notebook 03's


def layouts(target: str) -> dict[str, list[str]]:
    """What is loaded while ``target`` is timed: nothing else, the other ONNX Runtime sessions, PyTorch's fp32,
    and all of notebook 03's variants."""
    ort = [n for n in ALL if n.startswith("ort-") and n != target]
    return {"alone": [target], "beside ONNX Runtime sessions": [target, *ort],
            "beside PyTorch fp32": [target, "fp32"], "beside all of notebook 03's": [target, *[n for n in ALL if n != target]]}


def time_layout(names: list[str], new_tokens: int, rounds: int) -> float:
    loaded = [variants.load_variant(n) for n in names]
    try:
        for v in loaded:
            if v.rss_sampler is not None:
                v.rss_sampler.stop()
            if not v.ok:
                raise SystemExit(f"{v.name} did not load: {v.status}")
        rows = generation.decode_variants({v.name: (v.model, v.tokenizer) for v in loaded},
                                          new_tokens=new_tokens, rounds=rounds)
        return rows[names[0]]["decode_tokens_per_s"]
    finally:
        for v in loaded:
            v.release()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="ort-int8-channel", choices=ALL)
    ap.add_argument("--new-tokens", type=int, default=config.pick(32, 8))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=2)
    args = ap.parse_args()
    plan = layouts(args.variant)
    seen: dict[str, list[float]] = {k: [] for k in plan}
    for cycle in range(args.cycles):
        for name, names in plan.items():
            tps = time_layout(names, args.new_tokens, args.rounds)
            seen[name].append(tps)
            print(f"# cycle {cycle + 1}: {args.variant} {name}: {tps:.1f} tokens/s", flush=True)
    alone = statistics.median(seen["alone"])
    print(json.dumps({"variant": args.variant, "new_tokens": args.new_tokens, "rounds": args.rounds,
                      "cycles": args.cycles, "tokens_per_s": seen,
                      "ratio_to_alone": {k: statistics.median(v) / alone for k, v in seen.items()},
                      "machine": cpu.machine_line(env.hardware()), "torch": env.versions().get("torch"),
                      "torch_threads": __import__("torch").get_num_threads()}))


if __name__ == "__main__":
    main()

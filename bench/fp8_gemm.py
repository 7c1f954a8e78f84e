"""FP8 GEMMs against fp32 and bf16 on this machine: y = x @ W.T, timed in interleaved rounds (labkit.precision.fp8_gemm).

Four ways to run one linear layer, each timed on the same shapes:

    fp32           x and W in fp32
    bf16           x and W in bf16
    fp8_upcast     W stored as float8_e4m3fn with one fp32 scale per output row, upcast to the activations'
                   dtype at every call: (W8.to(dtype) * scale) then the matmul (weight-only FP8: bytes, not FLOPs)
    fp8_scaled_mm  torch._scaled_mm: x and W both E4M3 with per-row scales (scale_a (M, 1), scale_b (1, N)), the
                   FP8 GEMM itself; x is quantised once before timing, as the H200 probe did (.gpu/fp8probe.py)

Shapes (M, K, N): the default model's largest decoder matrices (MLP up 576→1536 and down 1536→576) at decode-like
M = 1, 16 and prefill-like M = 256, and 1024³ (``--shapes model``, the default); ``--shapes probe`` times the six
shapes of the H200 probe. Activations are fp32 on a CPU (the lab's CPU dtype), bf16 on CUDA (``--act-dtype``).
Each variant gets 5 untimed warm-up calls (the first timed as ``first_us``); then the variants take turns, round
after round, each round in a shuffled order (round i of every variant a pair); a sample is
``inner`` calls, timed with CUDA events on a GPU and ``labkit.core.timing.now`` elsewhere, in µs per call. Ratios
are fp32's median / the variant's, judged by ``labkit.core.verdict.compare(..., paired=True)``, round i of a variant
against round i of fp32. One JSON line per shape, the last line one JSON document: ratios, verdicts, the ISA.

    python -m bench.fp8_gemm [--quick] [--shapes model|probe] [--rounds 8] [--save-to data/measured_gpu]

``--save-to DIR`` writes the rows as a labkit results file, DIR/fp8_gemm.<gpu>.json on a GPU (the shape of
data/measured_gpu/fp8_gemm.nvidia-h200.json): on a lent GPU, ``--shapes probe --save-to data/measured_gpu``
refreshes it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from labkit.core import config, cpu, env, machine, results, verdict
from labkit.core.results import jsonable
from labkit.precision.fp8_gemm import VARIANTS, WARMUP, model_shapes, pair_twins, time_shape

PROBE_SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (256, 4096, 4096), (4096, 4096, 4096), (16, 8192, 28672),
                (8192, 8192, 8192))
DROP = ("samples", "first_us", "verdict_vs_fp32", "verdict_vs_bf16")  # kept in the saved file, not in the lines


def isa() -> dict[str, Any]:
    """What the kernels ran on: the CPU's instruction sets and the level torch dispatches to; the GPU's compute
    capability where one ran."""
    out: dict[str, Any] = {"cpu": cpu.cpu_name(), "cpu_isa": cpu.cpu_isa(),
                           "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["compute_capability"] = list(torch.cuda.get_device_capability(0))
    return out


def results_doc(rows: list[dict[str, Any]], environment: dict[str, Any], notes: dict[str, Any]) -> results.Results:
    """The rows as a labkit results file (section "gemm"), with the environment that measured them."""
    res = results.Results("fp8_gemm", env=environment, notes=notes)
    for r in rows:
        res.add("gemm", **r)
    return res


def save(res: results.Results, folder: Path) -> Path:
    """Write ``res`` to ``folder``/fp8_gemm[.<gpu>].json, atomically."""
    return results.write_json_atomic(folder / f"{results.reference_name(res.name, res.env)}.json", res.to_dict())


def method(device: str, act: torch.dtype, shapes: str) -> str:
    clock = "CUDA events" if device.startswith("cuda") else "labkit.core.timing.now (the host clock)"
    return (f"{clock}, {WARMUP} warm-up calls then interleaved rounds, each sample `inner` calls of a variant, median; "
            f"{str(act).replace('torch.', '')} activations; per-row E4M3 scales (absmax / 448) for W and, in "
            f"_scaled_mm, for x (quantised before timing); shapes: {shapes}")


def summary_line(row: dict[str, Any]) -> dict[str, Any]:
    """The shape, each variant's µs, its ratio over fp32 and the verdict's word."""
    vs = row.get("verdict_vs_fp32", {})
    return {"shape": f"{row['M']}x{row['K']}x{row['N']}", "what": row.get("what"),
            **{f"{v}_us": round(row[f"{v}_us"], 2) for v in row["variants"]},
            "speedup_vs_fp32": {v: round(r, 3) for v, r in row.get("speedup_vs_fp32", {}).items()},
            "verdict_vs_fp32": {v: vs[v]["kind"] for v in vs}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run: fewer rounds, shorter samples (as LABKIT_QUICK=1)")
    ap.add_argument("--shapes", default="model", choices=("model", "probe"), help="the default model's, or the H200 probe's")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, each in a shuffled order (default 8, quick 6; "
                    f"{verdict.MIN_PAIRS}+ pairs for a verdict)")
    ap.add_argument("--act-dtype", default=None, choices=("fp32", "bf16"), help="activations (default: fp32 CPU, bf16 CUDA)")
    ap.add_argument("--save-to", type=Path, default=None, help="also write DIR/fp8_gemm[.<gpu>].json (a results file)")
    args = ap.parse_args(argv)
    if args.quick:
        os.environ["LABKIT_QUICK"] = "1"
    rounds = args.rounds if args.rounds is not None else config.pick(8, 6)
    if rounds <= 0:
        ap.error("--rounds must be positive")
    device = "cuda" if env.device().startswith("cuda") else "cpu"
    act_name = args.act_dtype or ("bf16" if device == "cuda" else "fp32")
    act = {"fp32": torch.float32, "bf16": torch.bfloat16}[act_name]
    sample_s = config.pick(0.05, 0.01) if device == "cpu" else config.pick(0.005, 0.002)
    shapes = model_shapes() if args.shapes == "model" else [(m, k, n, "probe") for m, k, n in PROBE_SHAPES]

    machine.check("fp8_gemm")
    print(f"# weight bytes per value: fp32 4, bf16 2, fp8 1: a memory-bound M=1 GEMV gains at most 2× (bf16) and 4× "
          f"(fp8, int8) over fp32; int8_upcast and fp8_upcast read 1 byte but convert every weight at every call", flush=True)
    rows = []
    for m, k, n, what in shapes:
        row = {"what": what, **time_shape(m, k, n, device, act, rounds, sample_s)}
        rows.append(row)
        print(json.dumps(jsonable({k2: v for k2, v in row.items() if k2 not in DROP})), flush=True)
    rows = pair_twins(rows)  # an MLP's up and down matrices: each baseline held against its twin's

    environment = env.environment()
    environment["hardware"] = {**environment["hardware"], **{k: v for k, v in isa().items() if k == "compute_capability"}}
    notes = {"method": method(device, act, args.shapes), "act_dtype": act_name, "variants": list(VARIANTS),
             "baseline": "fp32", "note": f"one run of {rounds} rounds, each in a shuffled order, judged paired"}
    saved = save(results_doc(rows, environment, notes), args.save_to) if args.save_to else None
    summary = {"bench": "fp8_gemm", "device": device, "quick": config.quick(), "act_dtype": act_name, "rounds": rounds,
               "baseline": "fp32", "rows": [summary_line(r) for r in rows],
               "fp8_scaled_mm": rows[0]["fp8_error"] or "ran", "isa": isa(), "machine_busy": machine.busy_during(),
               "saved": str(saved) if saved else None,
               "hardware": cpu.machine_line(environment["hardware"]), "versions": env.versions(("torch",))}
    print(json.dumps(jsonable(summary), allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

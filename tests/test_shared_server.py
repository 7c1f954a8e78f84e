"""labkit.serve.vllm.shared: LABKIT_SERVER_URL checked as text and asked over HTTP, and the vLLM load of notebooks 06 and 09
sent to the room's server instead of a local ``vllm serve``, labelled as another machine's. The room's server is a
fake OpenAI server in a thread; the vLLM launcher fails the test if anything calls it."""
from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from labkit.lessons.nb06 import runs as nb06_runs
from labkit.lessons.nb09 import runs as nb09_runs
from labkit.serve import loadgen, processes
from labkit.serve.vllm import shared
from labkit.serve.vllm import server as vs

MODEL = "room/SmolLM2-135M-Instruct"


# ------------------------------------------------------------------------------------------- the URL as text


@pytest.mark.parametrize("value, match", [
    ("gpu-box:8000", "as http://HOST:PORT"),  # no scheme
    ("ftp://10.0.0.5:8000", "as http://HOST:PORT"),
    ("http://:8000", "as http://HOST:PORT"),  # no host
    ("http://10.0.0.5", "add the port"),
    ("http://10.0.0.5:99999", "from 1 to 65535"),
    ("http://10.0.0.5:port", "from 1 to 65535"),
    ("http://10.0.0.5:8000/v1", "without '/v1'"),  # the OpenAI client's base_url, not the server's root
    ("http://10.0.0.5:8000/?x=1", "without '/?x=1'"),
])
def test_a_bad_url_names_the_fix(value, match):
    with pytest.raises(shared.SharedServerError, match=re.escape(match)) as err:
        shared.server_url({shared.ENV: value})
    assert shared.ENV in str(err.value) and value in str(err.value), "the message says which variable and value"


@pytest.mark.parametrize("value, url", [("http://10.0.0.5:8000", "http://10.0.0.5:8000"),
                                        (" http://gpu-box.local:8000/ ", "http://gpu-box.local:8000"),
                                        ("https://[::1]:443", "https://[::1]:443")])
def test_a_good_url_is_kept_as_the_servers_root(value, url):
    assert shared.server_url({shared.ENV: value}) == url


def test_unset_means_no_shared_server_and_nothing_to_say():
    assert shared.server_url({}) is None and shared.server_url({shared.ENV: "  "}) is None
    assert shared.shared_server({}) is None
    assert shared.local_only("Section 6", "why", {}) is None
    line = shared.local_only("Section 6", "it needs two flags", {shared.ENV: "http://10.0.0.5:8000"})
    assert line == "Section 6 stays on this machine, not on the shared server at http://10.0.0.5:8000: it needs two flags."


def test_a_url_where_nothing_listens_says_so_and_how_to_go_on():
    url = f"http://127.0.0.1:{processes.free_port()}"
    with pytest.raises(shared.SharedServerError, match="did not answer") as err:
        shared.shared_server({shared.ENV: url}, timeout_s=2)
    assert "--host 0.0.0.0" in str(err.value) and f"unset {shared.ENV}" in str(err.value)


# ------------------------------------------------------------------------------------------- a fake room server


class Room:
    """What the fake server saw: requests per path, and the model each POST named."""

    def __init__(self, health: int = 200, models: list | None = None) -> None:
        self.health = health
        self.models = [{"id": MODEL, "object": "model"}] if models is None else models
        self.paths: Counter = Counter()
        self.models_asked: Counter = Counter()
        self.lock = threading.Lock()


def _handler(room: Room):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, status: int, body: dict | str) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            with room.lock:
                room.paths[self.path] += 1
            if self.path == "/health":
                self.reply(room.health, "")
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": room.models})
            elif self.path == "/version":
                self.reply(200, {"version": "0.0-room"})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with room.lock:
                room.paths[self.path] += 1
                room.models_asked[req.get("model")] += 1
            if req.get("model") != MODEL:  # as vLLM: a request for another model is refused
                self.reply(404, {"error": {"message": f"The model `{req.get('model')}` does not exist."}})
                return
            chat = self.path == "/v1/chat/completions"
            n = int(req.get("max_completion_tokens" if chat else "max_tokens") or 1)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
            for i in range(n):
                time.sleep(0.002)
                choice = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
            usage = {"choices": [], "usage": {"completion_tokens": n}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    return H


@contextlib.contextmanager
def _fake_server() -> Iterator[tuple[str, Room]]:
    room = Room()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(room))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", room
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def room_server() -> Iterator[tuple[str, Room]]:
    with _fake_server() as served:
        yield served


@pytest.fixture
def no_launch(monkeypatch):
    """Any start of a local vllm serve fails the test."""
    def launched(*args, **kwargs):
        raise AssertionError("a local vllm serve was started although LABKIT_SERVER_URL names the room's server")
    monkeypatch.setattr(vs, "serve", launched)
    monkeypatch.setattr(vs, "start", launched)
    monkeypatch.setattr(processes, "spawn", launched)


def test_the_shared_server_reports_its_model_and_version(room_server):
    url, room = room_server
    srv = shared.shared_server({shared.ENV: url + "/"})
    assert (srv.url, srv.model, srv.version) == (url, MODEL, "0.0-room")
    assert room.paths["/health"] == 1 and room.paths["/v1/models"] == 1


def test_a_server_whose_engine_is_not_ready_is_refused(room_server):
    url, room = room_server
    room.health = 503
    with pytest.raises(shared.SharedServerError, match="HTTP 503"):
        shared.shared_server({shared.ENV: url})


def test_a_server_without_models_is_not_taken_for_vllm(room_server):
    url, room = room_server
    room.models = []
    with pytest.raises(shared.SharedServerError, match="not an OpenAI-compatible server"):
        shared.shared_server({shared.ENV: url})


def test_provenance_names_the_shared_server_and_not_this_machine(room_server):
    url, _ = room_server
    srv = shared.shared_server({shared.ENV: url})
    for text in (srv.label, srv.provenance()["where"], srv.platform()["platform"]):
        assert url in text, text
    assert "its hardware is not this machine's" in srv.label and shared.ELSEWHERE in srv.provenance()["where"]
    assert srv.provenance()["served_model"] == MODEL and srv.platform()["server_url"] == url


# ------------------------------------------------------------------------------------------- the load path


SETTINGS = vs.Settings(model="/models/SmolLM2-135M-Instruct", max_num_seqs=8)  # what a local start would have used


def test_the_same_load_of_06_goes_to_the_shared_server_and_starts_nothing(room_server, no_launch):
    url, room = room_server
    srv = shared.shared_server({shared.ENV: url})
    with _fake_server() as (lab_url, lab):  # the lab's server on this laptop, in the notebook
        same = nb06_runs.beside_vllm(SETTINGS, {"labkit serve (max_batch_size 8)": lab_url}, 1, shared=srv,
                                  warmup_requests=2, num_requests=3, max_concurrency=2, max_tokens=4)
    assert same["status"] == "ok", same
    names = [r["server"] for r in same["rows"]]
    assert names == ["labkit serve (max_batch_size 8)", srv.label]
    shared_row = same["rows"][1]
    assert shared_row["requests"] == 3 and shared_row["failed"] == 0 and shared_row["output_tokens_per_s"] > 0
    assert same["platform"]["where"].startswith(f"shared server at {url}")
    # the warm-up and the shared row's requests reached the room's server (loadgen may add one probe per run)
    assert 2 + 3 <= room.paths["/v1/completions"] <= 2 + 3 + 2, room.paths
    assert lab.paths["/v1/completions"] >= 3, lab.paths
    assert set(room.models_asked) == {MODEL}, "every request named the model the server reports"


def test_the_capstone_load_of_09_goes_to_the_shared_server_and_starts_nothing(room_server, no_launch):
    url, room = room_server
    srv = shared.shared_server({shared.ENV: url})
    served = nb09_runs.vllm_load(SETTINGS, ["Hello?", "Why is the sky blue?"], concurrency=2, num_requests=4,
                              max_tokens=3, slo=loadgen.SLO(ttft_s=30.0), levels=(1, 2), requests_per_client=1,
                              warmup_requests=2,
                              shared=srv)
    assert served["status"] == "ok" and served["start_s"] is None, served
    row = served["row"]
    assert row["completed"] == 4 and row["server_url"] == url and row["served_model"] == MODEL
    assert url in row["where"] and shared.ELSEWHERE in row["where"]
    assert row["peak_rss_bytes"] is None and row["peak_rss_source"] == shared.MEMORY_NOTE, \
        "this laptop's memory is not the server's: None with the reason"
    assert [r["concurrency"] for r in served["sweep"]] == [1, 2], "the sweep ran against it too"
    assert 2 + 4 + 1 + 2 <= room.paths["/v1/chat/completions"] <= 2 + 4 + 1 + 2 + 4, room.paths  # + a probe per run
    assert served["platform"]["server_url"] == url and served["platform"]["version"] == "0.0-room"


def test_without_a_shared_server_the_launcher_is_what_runs(no_launch):
    """The other side of the switch: with no shared server, vllm_load asks the launcher (here: a failing one)."""
    with pytest.raises(AssertionError, match="local vllm serve was started"):
        nb09_runs.vllm_load(SETTINGS, ["Hello?"], 1, 1, 2, None)

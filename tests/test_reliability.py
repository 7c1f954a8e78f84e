"""Failure paths of the servers: nothing waits forever, a failure answers exactly the requests it hit, and
the server goes on. Each test injects the failure; each is bounded in time, so a hang fails it."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from labkit.decoding import decode
from labkit.serve import continuous, launch, protocol, server
from labkit.serve.experiments import scheduler
from test_server import request



def in_thread(fn, timeout_s: float):
    """Run ``fn`` in a thread; its result, or an AssertionError if it did not return in time."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the test below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"{getattr(fn, '__name__', 'call')} did not return within {timeout_s} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def concurrent(url: str, bodies: list[dict], gap_s: float = 0.05, timeout_s: float = 60) -> list[tuple[int, dict]]:
    """POST each body from its own thread (in order, ``gap_s`` apart); (status, json) per body."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        status, _, body = request(url + "/v1/completions", bodies[i], timeout_s=timeout_s)
        out[i] = (status, json.loads(body))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(gap_s)
    for t in threads:
        t.join(timeout_s + 5)
    assert all(r is not None for r in out), f"unanswered: {[i for i, r in enumerate(out) if r is None]}"
    return out


def test_continuous_admission_failure_answers_every_request_taken(monkeypatch):
    """A request whose admission raises gets a 500; the ones taken from the queue with it, and the one
    running, are still served."""
    admit = continuous.ContinuousEngine.admit
    boom_ids: list[list[int]] = []

    def failing_admit(self, seq):
        if seq.prompt_ids in boom_ids:
            raise RuntimeError("injected admission failure")
        return admit(self, seq)

    monkeypatch.setattr(continuous.ContinuousEngine, "admit", failing_admit)
    with launch.start_server(protocol.TINY_RANDOM, batching="continuous", port=0, max_batch_size=8) as srv:
        boom_ids.append(srv.server.lm.tokenizer("boom")["input_ids"])
        bodies = [{"prompt": "a long one", "max_tokens": 300, "ignore_eos": True},
                  {"prompt": "boom", "max_tokens": 3}, {"prompt": "after", "max_tokens": 3, "ignore_eos": True},
                  {"prompt": "and after", "max_tokens": 3, "ignore_eos": True}]
        results = concurrent(srv.url, bodies)
        assert [s for s, _ in results] == [200, 500, 200, 200], results
        assert "injected admission failure" in results[1][1]["error"]["message"]


@pytest.mark.parametrize("kind", protocol.BATCHING)
def test_model_failure_mid_batch_fails_that_batch_and_serves_the_next(kind, monkeypatch):
    step = decode.decode_one_token
    armed = threading.Event()

    def failing_step(*args, **kwargs):
        if armed.is_set():
            armed.clear()
            raise RuntimeError("injected model failure")
        return step(*args, **kwargs)

    monkeypatch.setattr(decode, "decode_one_token", failing_step)
    with launch.run_server(protocol.TINY_RANDOM, port=0, batching=kind, max_batch_size=4,
                            max_wait_ms=200, max_tokens_limit=400) as srv:
        def arm_when_three_run() -> None:
            while srv.server.batcher.running < 3:
                time.sleep(0.005)
            armed.set()  # the next decode step of the batch of three raises

        threading.Thread(target=arm_when_three_run, daemon=True).start()
        results = concurrent(srv.url, [{"prompt": f"request {i}", "max_tokens": 400, "ignore_eos": True}
                                       for i in range(3)], gap_s=0.01)
        assert [s for s, _ in results] == [500, 500, 500], results
        assert all("injected model failure" in body["error"]["message"] for _, body in results)
        status, _, body = request(srv.url + "/v1/completions", {"prompt": "next", "max_tokens": 4, "ignore_eos": True})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4


def test_any_start_up_failure_reaches_the_caller(monkeypatch):
    async def broken_start(self):
        raise RuntimeError("injected start-up failure")

    monkeypatch.setattr(server.Server, "start", broken_start)
    with pytest.raises(RuntimeError, match="injected start-up failure"):
        in_thread(lambda: launch.start_server(protocol.TINY_RANDOM, port=0), timeout_s=30)


def test_a_start_that_never_finishes_times_out(monkeypatch):
    async def stuck_start(self):
        import asyncio

        await asyncio.sleep(3600)

    monkeypatch.setattr(server.Server, "start", stuck_start)
    with pytest.raises(RuntimeError, match="did not start within 1 s"):
        in_thread(lambda: launch.start_server(protocol.TINY_RANDOM, port=0, startup_timeout_s=1), timeout_s=30)


def test_transformers_continuous_batching_check_has_a_deadline(monkeypatch):
    class Silent:  # a manager that runs and never answers
        def start(self):
            pass

        def add_request(self, *a, **k):
            pass

        def is_running(self):
            return True

        def get_result(self, timeout=None):
            time.sleep(min(timeout or 0.1, 0.1))

        def stop(self, block=True, timeout=None):
            pass

    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "init_continuous_batching", lambda self, **kw: Silent(), raising=False)
    out = in_thread(lambda: scheduler.hf_continuous_batching(timeout_s=1.0), timeout_s=30)
    assert out["available"] is False and "no result within 1 s" in out["reason"]


@pytest.mark.parametrize("kind", protocol.BATCHING)
def test_client_that_disconnects_mid_stream_frees_its_slot(kind):
    with launch.run_server(protocol.TINY_RANDOM, port=0, batching=kind, max_batch_size=1,
                            max_tokens_limit=4000) as srv:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"prompt": "go on", "max_tokens": 4000, "ignore_eos": True, "stream": True}).encode()
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        received, t0 = b"", time.monotonic()
        while b"data: " not in received and time.monotonic() - t0 < 30:  # headers may arrive before the first event
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        assert b"data: " in received, received  # streaming has begun: the request holds the only slot
        sock.close()  # the client goes away
        t0 = time.monotonic()
        while srv.server.batcher.running and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        freed_s = time.monotonic() - t0
        status, _, text = request(srv.url + "/v1/completions", {"prompt": "next", "max_tokens": 3, "ignore_eos": True})
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 3
        assert freed_s < 5, f"the slot was freed only after {freed_s:.1f} s"
        assert srv.stats()["output_tokens"] < 4000, "the abandoned request ran to its end"

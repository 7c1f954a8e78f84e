"""labkit.serve.server over HTTP: validation (4xx with JSON bodies), the OpenAI formats, streaming, metrics, a
bounded queue (503), no lost request under load or at shutdown, and the default model answering. ``request``
and ``sse_events`` are the HTTP helpers other server tests import."""
from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from labkit.serve import launch, loadgen, protocol

BAD_BODIES = {
    "not json": b"{not json",
    "not utf-8": b'{"prompt": "caf\xe9", "max_tokens": 2}',
    "unpaired surrogate": b'{"prompt": "\\ud800", "max_tokens": 2}',
    "json array": b'[1, 2]',
    "missing prompt": b'{"max_tokens": 2}',
    "prompt not a string": b'{"prompt": 42}',
    "negative max_tokens": b'{"prompt": "hi", "max_tokens": -5}',
    "zero max_tokens": b'{"prompt": "hi", "max_tokens": 0}',
    "huge max_tokens": b'{"prompt": "hi", "max_tokens": 1000000000000}',
    "max_tokens a string": b'{"prompt": "hi", "max_tokens": "10"}',
    "max_tokens a bool": b'{"prompt": "hi", "max_tokens": true}',
    "stream not a bool": b'{"prompt": "hi", "stream": "yes"}',
    "n of 2": b'{"prompt": "hi", "n": 2}',
    "temperature out of range": b'{"prompt": "hi", "temperature": 9}',
    "over-long prompt": json.dumps({"prompt": "word " * 3000, "max_tokens": 2}).encode(),
}


BAD_CHAT = {
    "missing messages": b'{"max_tokens": 2}',
    "empty messages": b'{"messages": []}',
    "bad role": b'{"messages": [{"role": "robot", "content": "hi"}]}',
    "content not text": b'{"messages": [{"role": "user", "content": 7}]}',
}


def request(url: str, body: bytes | dict | None = None, method: str = "POST", timeout_s: float = 60):
    """(status, headers, body text); never raises for an HTTP error status."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def sse_events(text: str) -> list:
    events = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def assert_still_serving(url: str) -> None:
    status, _, body = request(url + "/v1/completions", {"prompt": "still there?", "max_tokens": 2})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_completion_request_gets_4xx_json(server, case):
    status, headers, body = request(server.url + "/v1/completions", BAD_BODIES[case])
    assert 400 <= status < 500, (case, status, body)
    err = json.loads(body)["error"]
    assert err["code"] == status and err["message"] and err["type"] == "invalid_request_error"
    assert headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("case", sorted(BAD_CHAT))
def test_bad_chat_request_gets_400(server, case):
    status, _, body = request(server.url + "/v1/chat/completions", BAD_CHAT[case])
    assert status == 400 and json.loads(body)["error"]["param"].startswith("messages")


def test_messages_name_the_fix(server):
    _, _, body = request(server.url + "/v1/completions", BAD_BODIES["huge max_tokens"])
    assert "between 1 and 1024" in json.loads(body)["error"]["message"]
    _, _, body = request(server.url + "/v1/completions", BAD_BODIES["over-long prompt"])
    assert "at most 512" in json.loads(body)["error"]["message"]


def test_oversized_body_unknown_path_and_wrong_method(server):
    status, _, body = request(server.url + "/v1/completions", b'{"prompt": "' + b"x" * 300_000 + b'"}')
    assert status == 413 and json.loads(body)["error"]["code"] == 413
    status, _, body = request(server.url + "/v1/nothing", b"{}")
    assert status == 404 and "error" in json.loads(body)
    status, _, body = request(server.url + "/v1/completions", method="GET")
    assert status == 405 and "error" in json.loads(body)


def test_server_keeps_serving_after_bad_requests(server):
    for body in list(BAD_BODIES.values()) + [b"", b"\x00\x01"]:
        request(server.url + "/v1/completions", body)
    assert_still_serving(server.url)
    status, _, body = request(server.url + "/health", method="GET")
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_completion_non_streaming(server):
    status, _, body = request(server.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 5, "ignore_eos": True})
    data = json.loads(body)
    assert status == 200 and data["object"] == "text_completion" and data["model"] == protocol.TINY_RANDOM
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and isinstance(choice["text"], str)
    assert data["usage"]["completion_tokens"] == 5
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 5


def test_completion_streaming_matches_non_streaming(server):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True}
    _, _, plain = request(server.url + "/v1/completions", body)
    status, headers, text = request(server.url + "/v1/completions",
                                    {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(text)
    chunks, usage = events[:-1], events[-1]
    assert len(chunks) == 6 and [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert "".join(c["choices"][0]["text"] for c in chunks) == json.loads(plain)["choices"][0]["text"]


def test_chat_streaming_and_not(server):
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 4, "ignore_eos": True}
    status, _, plain = request(server.url + "/v1/chat/completions", body)
    data = json.loads(plain)
    assert status == 200 and data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["role"] == "assistant"
    _, _, text = request(server.url + "/v1/chat/completions", {**body, "stream": True})
    chunks = sse_events(text)
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == data["choices"][0]["message"]["content"]


def test_models_and_metrics(server):
    _, _, body = request(server.url + "/v1/models", method="GET")
    assert json.loads(body)["data"][0]["id"] == protocol.TINY_RANDOM
    request(server.url + "/v1/completions", b"{broken")
    status, headers, text = request(server.url + "/metrics", method="GET")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in ("labkit_queue_depth", "labkit_batch_size_bucket", "labkit_time_to_first_token_seconds_count",
                 "labkit_e2e_request_latency_seconds_sum", 'labkit_requests_total{endpoint="completions",status="400"}'):
        assert name in text, name
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert families["labkit_batch_size"].type == "histogram"
    assert families["labkit_queue_depth"].type == "gauge"


def test_200_requests_at_16_clients_none_failed_none_lost():
    with launch.run_server(protocol.TINY_RANDOM, port=0, max_batch_size=16, max_wait_ms=10) as srv:
        res = loadgen.run(srv.url, num_requests=200, max_concurrency=16, max_tokens=3, warmup=0)
        stats = srv.stats()
    s = res.summary()
    assert s["completed"] == 200 and s["failed"] == 0, s["errors"]
    assert all(o.output_tokens == 3 for o in res.outputs)
    assert stats["requests"] == {"completions 200": 200}  # every request the client sent was answered
    assert stats["output_tokens"] == 600
    assert stats["mean_batch_size"] > 1.5  # concurrent requests were batched


def test_full_queue_gets_503_and_serving_goes_on():
    with launch.run_server(protocol.TINY_RANDOM, port=0, max_batch_size=1, max_queue=1) as srv:
        res = loadgen.run(srv.url, num_requests=8, max_concurrency=8, max_tokens=40, warmup=0)
        statuses = sorted(o.status for o in res.outputs)
        assert set(statuses) <= {200, 503}, statuses
        assert statuses.count(503) >= 4  # at most one running plus one queued at a time (the rest refused)
        assert all("queue is full" in o.error for o in res.outputs if o.status == 503)
        assert_still_serving(srv.url)


def test_shutdown_answers_every_request():
    srv = launch.start_server(protocol.TINY_RANDOM, port=0, max_batch_size=1, drain_s=0.2)
    results: list[tuple[int, str]] = []

    def client() -> None:
        results.append(request(srv.url + "/v1/completions", {"prompt": "go", "max_tokens": 1000,
                                                             "ignore_eos": True})[::2])

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    while srv.server.batcher.depth < 3:  # one running, three waiting
        threading.Event().wait(0.01)
    srv.stop()
    for t in threads:
        t.join(30)
    assert len(results) == 4
    for status, body in results:  # queued: refused explicitly; running: finished or stopped with an error
        assert status in (200, 503), (status, body)
        if status == 503:
            assert "shutting down" in json.loads(body)["error"]["message"]
    assert sum(status == 503 for status, _ in results) >= 3
    assert not srv.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(srv.url.rsplit(":", 1)[1])), timeout=2).close()


def test_default_model_answers_over_http(default_lm):
    with launch.run_server(default_lm, port=0, max_batch_size=4) as srv:
        body = {"messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                "max_tokens": 12}
        status, _, plain = request(srv.url + "/v1/chat/completions", body)
        answer = json.loads(plain)["choices"][0]["message"]["content"]
        assert status == 200 and "Paris" in answer, answer
        _, _, text = request(srv.url + "/v1/chat/completions", {**body, "stream": True})
        assert "".join(c["choices"][0]["delta"]["content"] for c in sse_events(text)) == answer

"""The batching panel's background measuring, without a browser: a slider move returns at once, a newer
setting supersedes a running one, the newest request is never lost, and failures are shown."""
from __future__ import annotations

import threading
import time

import pytest

from labkit.serve import launch, client, loadgen, protocol
from labkit.lessons import widgets

WAIT_S = 30


def _point(values: dict, tps: float | None = None) -> dict:
    b = values["max_batch_size"]
    return {**values, "requests": 3 * values["clients"], "failed": 0, "rounds": 3, "duration_s": 1.0,
            "output_tokens_per_s": tps if tps is not None else 10.0 * b, "output_tokens_per_s_p10": 9.0 * b,
            "output_tokens_per_s_p90": 11.0 * b, "spread": 0.2, "noisy": True, "e2e_p10_s": 0.9, "e2e_p50_s": 1.0,
            "e2e_p90_s": 1.2, "ttft_p10_s": 0.1, "ttft_p50_s": 0.1, "ttft_p90_s": 0.2, "tokens_per_s_per_user": 5.0}


class Rounds:
    """A measure function in rounds that the test releases one at a time (``step``)."""

    def __init__(self, rounds: int = 3) -> None:
        self.rounds = rounds
        self.started: list[dict] = []
        self.gate = threading.Semaphore(0)
        self.in_round = threading.Event()

    def __call__(self, values: dict, superseded) -> dict:
        self.started.append(values)
        for _ in range(self.rounds):
            if superseded():
                raise widgets.Superseded(str(values))
            self.in_round.set()
            assert self.gate.acquire(timeout=WAIT_S), "the test never released the round"
        return _point(values)

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()


def _values(b: int) -> dict:
    return {"max_batch_size": b, "max_wait_ms": 20, "clients": 4}


def _recorder():
    events: list[tuple[str, int, object]] = []
    return events, lambda kind, values, detail: events.append((kind, values["max_batch_size"], detail))


def test_a_newer_request_supersedes_the_running_point() -> None:
    measure, (events, on_event) = Rounds(), _recorder()
    m = widgets.Measurer(measure, on_event)
    try:
        m.request(_values(2))
        assert measure.in_round.wait(WAIT_S)  # point 2 is in its first round
        m.request(_values(3))
        assert m.busy
        measure.step(1 + 3)  # round 1 of point 2 ends → dropped; point 3 runs its three rounds
        assert m.wait(WAIT_S)
    finally:
        m.close(WAIT_S)
    assert [(k, b) for k, b, _ in events] == [("start", 2), ("superseded", 2), ("start", 3), ("done", 3)]
    assert [v["max_batch_size"] for v in measure.started] == [2, 3]


def test_the_newest_of_many_quick_requests_is_measured_and_none_after_it_is_lost() -> None:
    measure, (events, on_event) = Rounds(rounds=1), _recorder()
    m = widgets.Measurer(measure, on_event)
    try:
        m.request(_values(1))
        assert measure.in_round.wait(WAIT_S)
        for b in (2, 3, 4, 5):  # four moves while point 1 measures: only the last one is worth measuring
            m.request(_values(b))
        measure.step(2)
        assert m.wait(WAIT_S)
        m.request(_values(6))  # a request right after the worker went idle is picked up too
        measure.step(1)
        assert m.wait(WAIT_S)
    finally:
        m.close(WAIT_S)
    done = [b for k, b, _ in events if k == "done"]
    assert done[-2:] == [5, 6] and 2 not in done and 3 not in done and 4 not in done
    assert [v["max_batch_size"] for v in measure.started] == [1, 5, 6]


def test_a_failure_is_reported_and_the_worker_goes_on() -> None:
    events, on_event = _recorder()
    calls = []

    def measure(values: dict, superseded) -> dict:
        calls.append(values["max_batch_size"])
        if values["max_batch_size"] == 13:
            raise RuntimeError("the panel's server has stopped: run the panel cell again")
        return _point(values)

    m = widgets.Measurer(measure, on_event)
    try:
        m.request(_values(13))
        assert m.wait(WAIT_S)
        m.request(_values(4))
        assert m.wait(WAIT_S)
    finally:
        m.close(WAIT_S)
    errors = [d for k, _, d in events if k == "error"]
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError) and "stopped" in str(errors[0])
    assert ("done", 4) in [(k, b) for k, b, _ in events]


def test_a_failing_display_is_printed_not_swallowed(capsys: pytest.CaptureFixture) -> None:
    def on_event(kind: str, values: dict, detail) -> None:
        if kind == "done":
            raise ValueError("cannot draw")

    m = widgets.Measurer(lambda values, superseded: _point(values), on_event)
    try:
        m.request(_values(2))
        assert m.wait(WAIT_S)
        m.request(_values(3))
        assert m.wait(WAIT_S)
    finally:
        m.close(WAIT_S)
    assert len(m.handler_errors) == 2 and "ValueError: cannot draw" in m.handler_errors[0]
    assert "showing 'done' failed" in capsys.readouterr().err


def test_closed_measurer_refuses_requests() -> None:
    m = widgets.Measurer(lambda values, superseded: _point(values), lambda *a: None)
    m.close(WAIT_S)
    with pytest.raises(RuntimeError, match="run its cell again"):
        m.request(_values(1))


# ----------------------------------------------------------------------------------- measure_point's rounds


class FakeServer:
    url = "http://127.0.0.1:9"
    running = True

    def __init__(self) -> None:
        self.configured: list[tuple] = []

    def configure(self, max_batch_size=None, max_wait_ms=None) -> None:
        self.configured.append((max_batch_size, max_wait_ms))


def _fake_loadgen(monkeypatch: pytest.MonkeyPatch, durations: list[float], fail: bool = False) -> list[int]:
    """loadgen.run answering ``num_requests`` 4-token requests per round; round i lasts durations[i]."""
    calls: list[int] = []

    def run(url, num_requests, max_concurrency, max_tokens, ignore_eos, warmup, progress=None):
        d = durations[min(len(calls), len(durations) - 1)]
        calls.append(num_requests)
        outs = [client.RequestOutput(success=not fail, output_tokens=0 if fail else 4, ttft_s=0.1 * d, e2e_s=d,
                                      status=503 if fail else 200, error="queue full" if fail else "")
                for _ in range(num_requests)]
        if progress:
            progress(num_requests, num_requests)
        return loadgen.BenchmarkResult(outputs=outs, duration_s=d)

    monkeypatch.setattr(loadgen, "run", run)
    return calls


def test_a_steady_point_stops_after_its_minimum_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_loadgen(monkeypatch, [1.0, 1.02, 0.99, 1.0])
    srv = FakeServer()
    p = widgets.measure_point(srv, 4, 20, clients=3, rounds=3, max_rounds=8)
    assert calls == [3, 3, 3] and p["rounds"] == 3 and p["requests"] == 9 and srv.configured == [(4, 20)]
    assert p["output_tokens_per_s"] == pytest.approx(12.0) and not p["noisy"]
    assert p["output_tokens_per_s_p10"] <= p["output_tokens_per_s"] <= p["output_tokens_per_s_p90"]
    assert p["e2e_p50_s"] == pytest.approx(1.0)


def test_a_noisy_point_takes_more_rounds_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_loadgen(monkeypatch, [1.0, 2.0, 0.5, 1.5, 0.7])
    p = widgets.measure_point(FakeServer(), 4, 20, clients=2, rounds=3, max_rounds=5)
    assert len(calls) == 5 and p["rounds"] == 5 and p["noisy"] and p["spread"] > 0.1
    assert "noisy" in widgets.describe(p)


def test_superseded_between_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_loadgen(monkeypatch, [1.0, 2.0, 0.5])
    asked = iter([False, True])
    with pytest.raises(widgets.Superseded):
        widgets.measure_point(FakeServer(), 4, 20, clients=2, rounds=3, superseded=lambda: next(asked))
    assert len(calls) == 1, "the point stops at the first round boundary after a newer request"


def test_every_request_failing_is_an_error_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_loadgen(monkeypatch, [1.0], fail=True)
    with pytest.raises(RuntimeError, match="every request failed.*503: queue full"):
        widgets.measure_point(FakeServer(), 4, 20, clients=2, rounds=1)


# ------------------------------------------------------------------------------------------------ the panel


def test_the_panel_returns_at_once_and_follows_two_quick_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = [], threading.Event()

    def slow_point(server, max_tokens, superseded, progress=None, rounds=1, max_rounds=None, **values):
        started.append(values["max_batch_size"])
        for _ in range(500):  # a 10 s point, in rounds of 20 ms, unless the test lets it finish
            if superseded():
                raise widgets.Superseded("newer")
            if release.is_set():
                break
            time.sleep(0.02)
        return _point(values)

    monkeypatch.setattr(widgets, "measure_point", slow_point)
    widgets.make_figure()  # imports ipywidgets and plotly outside the timed part
    t0 = time.perf_counter()
    box = widgets.panel(server=FakeServer(), batch_size=8, clients=4)
    assert time.perf_counter() - t0 < 3, "the panel cell must not wait for its 10 s measurement"
    try:
        slider = box.controls["batch"]
        t0 = time.perf_counter()
        slider.value = 9
        slider.value = 10
        assert time.perf_counter() - t0 < 3, "a slider move must not wait for the 10 s measurement"
        release.set()
        assert box.measurer.wait(WAIT_S)
    finally:
        box.measurer.close(WAIT_S)
    assert not box.errors
    assert list(box.figure.data[2].x) == [10], "the last point drawn is the second move's"
    assert 10 in list(box.figure.data[1].x) and started[-1] == 10
    assert "batch 10" in box.figure.layout.title.text


def test_the_panel_shows_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(server, **kwargs):
        raise RuntimeError("the panel's server has stopped: run the panel cell again")

    monkeypatch.setattr(widgets, "measure_point", broken)
    box = widgets.panel(server=FakeServer())
    try:
        assert box.measurer.wait(WAIT_S)
    finally:
        box.measurer.close(WAIT_S)
    status = box.children[1].children[1]
    assert "measurement failed" in status.value and "server has stopped" in status.value
    assert box.errors and box.children[1].children[0].bar_style == "danger"


def test_the_panel_against_a_live_server() -> None:
    with launch.run_server(protocol.TINY_RANDOM, port=0, max_batch_size=4) as srv:
        box = widgets.panel(srv, batch_size=2, clients=3, max_tokens=3, min_rounds=2, max_rounds=3)
        try:
            assert box.measurer.wait(120)
            box.controls["batch"].value = 3
            box.controls["batch"].value = 4
            assert box.measurer.wait(120)
        finally:
            box.measurer.close(WAIT_S)
        assert not box.errors, box.errors
        points = {p["max_batch_size"]: p for p in box.state.points}
        assert 2 in points and 4 in points and srv.config.max_batch_size == 4
        p = points[4]
        assert p["requests"] >= 6 and p["rounds"] >= 2 and p["failed"] == 0 and p["output_tokens_per_s"] > 0
        assert p["output_tokens_per_s_p10"] <= p["output_tokens_per_s"] <= p["output_tokens_per_s_p90"]
        err = box.figure.data[0].error_y
        assert err.visible and len(err.array) == len(box.figure.data[0].x)

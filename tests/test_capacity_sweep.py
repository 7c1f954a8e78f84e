"""The capacity sweep against a server whose rate is known: a fake OpenAI server that answers one request at a time,
each taking SERVICE_S, so it completes at most 1 / SERVICE_S requests per second. Each rate offered for a few seconds
of arrivals must find that ceiling, put the knee below it and the first rate above it past the knee; a burst of
eight requests per rate (what notebook 11 once offered) finds no knee at all."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from labkit.lessons.nb11 import runs as nb11_runs
from labkit.serve import client, loadgen
from labkit.serve.fleet import capacity
from labkit.serve.launch import BackgroundApp

SERVICE_S = 0.05  # one request at a time: the server's ceiling is 20 requests per second
CAP_RPS = 1 / SERVICE_S
SLO = loadgen.SLO(ttft_s=0.3)


def _app() -> web.Application:
    busy = asyncio.Lock()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "capped"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.json()
        async with busy:  # one request at a time, SERVICE_S each: a known ceiling
            await asyncio.sleep(SERVICE_S)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Paris", "."):
            await resp.write(f"data: {json.dumps({'choices': [{'delta': {'content': word}}]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


class _Server:
    def __init__(self, url: str) -> None:
        self.url = url

    def flush_cache(self) -> None:  # the lab's replicas empty their prefix cache here; the fake keeps none
        pass


@pytest.fixture(scope="module")
def capped():
    app = BackgroundApp(_app)
    yield _Server(app.url)
    app.stop()


def test_a_sweep_of_steady_loads_finds_the_servers_known_rate(capped) -> None:
    swept = nb11_runs.capacity_sweep(capped, ["Capital of France?"], [8.0, 14.0, 28.0, 40.0], seconds=3.0,
                                     max_tokens=2, slo=SLO)
    knee, held = swept["knee"], swept["held"]
    assert knee["reached"] and knee["knee_rps"] < CAP_RPS < 28.0, knee["reason"]  # the first rate past it fails
    assert held["ceiling_rps"] == pytest.approx(CAP_RPS, rel=0.15), held  # the rate it really completes
    assert held["saturated"] and held["rps"] <= CAP_RPS * 1.1
    need = capacity.replicas_needed(200, 12, held["rps"], 0.8)  # 40 req/s of demand
    assert need["replicas"] >= 40 / (0.8 * CAP_RPS), need["arithmetic"]
    assert "within the SLO" in capacity.held_said(held)


def test_a_burst_per_rate_meets_the_slo_everywhere_and_finds_no_knee(capped) -> None:
    """The old sweep: eight requests per rate, goodput as the offered rate times the share that met the SLO."""
    shares = []
    for rate in (10.0, 16.0, 28.0, 40.0):
        out = loadgen.run(capped.url, ["Capital of France?"], num_requests=8, request_rate=rate, max_tokens=2,
                          endpoint="chat", slo=SLO, warmup=0)
        shares.append(out.summary()["good_requests"] / 8 * rate)
    burst = capacity.find_knee([10.0, 16.0, 28.0, 40.0], shares)
    assert not burst["reached"] and burst["knee_rps"] == 40.0  # every burst "followed": no knee, twice the real rate


def test_steady_requests_last_the_window_and_a_point_counts_over_it() -> None:
    assert capacity.steady_requests(5.0, 6.0) == 30 and capacity.steady_requests(0.5, 6.0) == 8
    outs = [client.RequestOutput(success=True, start_s=i * 0.5, e2e_s=0.2, ttft_s=0.1, output_tokens=2)
            for i in range(5)]
    point = capacity.sweep_point(outs, 2.0, SLO)  # answers as fast as they arrive: full pace
    assert point["window_s"] == pytest.approx(2.5) and point["goodput_rps"] == pytest.approx(2.0)
    assert point["arrival_span_s"] == pytest.approx(2.0) and point["completed_rps"] == pytest.approx(2.0)
    behind = [client.RequestOutput(success=True, start_s=i * 0.5, e2e_s=0.2 + i * 0.5, ttft_s=0.1, output_tokens=2)
              for i in range(5)]  # each answer waits longer: they come out once a second, arrivals twice
    lag = capacity.sweep_point(behind, 2.0, SLO)
    assert lag["pace"] == pytest.approx(0.5) and lag["goodput_rps"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="none were sent"):
        capacity.sweep_point([], 2.0, SLO)


def test_what_a_replica_holds_never_exceeds_what_it_completed_even_without_a_knee() -> None:
    """Poisson arrivals can run slower than offered: goodput read against the offered rate may then exceed the
    rate answers came out at. Held within the SLO is never more than completed, knee reached or not."""
    points = [{"offered_rps": 4.0, "goodput_rps": 3.9, "completed_rps": 4.1, "output_tokens_per_s": 30.0},
              {"offered_rps": 8.0, "goodput_rps": 7.6, "completed_rps": 6.9, "output_tokens_per_s": 50.0}]
    knee = capacity.find_knee([p["offered_rps"] for p in points], [p["goodput_rps"] for p in points])
    assert knee["reached"] is False and knee["knee_rps"] == 8.0
    held = capacity.sustained(points, knee)
    assert held["rps"] == pytest.approx(6.9) and held["ceiling_rps"] == pytest.approx(6.9) and not held["saturated"]
    assert "held 6.90 req/s" in capacity.held_said(held)

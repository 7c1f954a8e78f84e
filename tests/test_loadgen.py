"""labkit.serve.loadgen: arrivals, SLO/goodput and percentile arithmetic, the streaming client, Locust."""
from __future__ import annotations

import math
import statistics

import pytest

from labkit.serve import launch, client, loadgen, protocol


def test_arrival_gaps_follow_the_rate_and_burstiness():
    assert loadgen.arrival_gaps(5, math.inf) == [0.0] * 5
    poisson = loadgen.arrival_gaps(4000, request_rate=10.0, burstiness=1.0, seed=1)
    assert statistics.fmean(poisson) == pytest.approx(0.1, rel=0.05)  # mean gap = 1 / rate
    cv = statistics.pstdev(poisson) / statistics.fmean(poisson)
    assert cv == pytest.approx(1.0, abs=0.08)  # exponential gaps: coefficient of variation 1
    bursty = loadgen.arrival_gaps(4000, request_rate=10.0, burstiness=0.25, seed=1)
    assert statistics.fmean(bursty) == pytest.approx(0.1, rel=0.1)
    assert statistics.pstdev(bursty) / statistics.fmean(bursty) > 1.6  # gamma(k): cv = 1/sqrt(k) = 2
    assert loadgen.arrival_gaps(3, 5.0, seed=7) == loadgen.arrival_gaps(3, 5.0, seed=7)


def _out(ttft, e2e, n, ok=True, status=200):
    return client.RequestOutput(success=ok, output_tokens=n, ttft_s=ttft, e2e_s=e2e, status=status,
                                 itl_s=[(e2e - ttft) / (n - 1)] * (n - 1) if ok and n > 1 else [],
                                 error="" if ok else "HTTP 503")


def test_summary_figures_and_goodput():
    outs = [_out(0.1, 1.0, 10), _out(0.3, 2.1, 10), _out(0.2, 0.2, 1), _out(0, 0, 0, ok=False, status=503)]
    res = loadgen.BenchmarkResult(outputs=outs, duration_s=2.0, slo=loadgen.SLO(ttft_s=0.25, tpot_s=0.15))
    s = res.summary()
    assert s["completed"] == 3 and s["failed"] == 1 and s["requests"] == 4
    assert s["output_tokens"] == 21 and s["output_tokens_per_s"] == pytest.approx(10.5)
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["tpot_p50_s"] == pytest.approx(0.15)  # (1.0-0.1)/9 = 0.1 and (2.1-0.3)/9 = 0.2
    assert s["ttft_p50_s"] == pytest.approx(0.2)
    # good: the first (ttft 0.1, tpot 0.1) and the one-token request (no tpot); not the slow or the failed one
    assert s["good_requests"] == 2 and s["goodput"] == pytest.approx(1.0)
    assert s["errors"] == {"503: HTTP 503": 1}


def test_slo_parse_uses_vllm_milliseconds():
    slo = loadgen.SLO.parse(["ttft:500", "tpot:50", "e2el:2000"])
    assert (slo.ttft_s, slo.tpot_s, slo.e2e_s) == (0.5, 0.05, 2.0)
    with pytest.raises(ValueError, match="NAME:MILLISECONDS"):
        loadgen.SLO.parse(["latency:5"])
    with pytest.raises(ValueError, match="positive"):
        loadgen.SLO(ttft_s=-1)


@pytest.mark.parametrize("kwargs, match", [({"num_requests": 0}, "num_requests"),
                                           ({"max_concurrency": 0}, "max_concurrency"),
                                           ({"request_rate": 0}, "request_rate"),
                                           ({"burstiness": 0}, "burstiness"),
                                           ({"endpoint": "embeddings"}, "choose one of")])
def test_bad_settings_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        loadgen.run("http://127.0.0.1:9", **kwargs)


def test_a_workload_is_one_frozen_record_and_run_async_takes_it_with_a_few_run_time_settings():
    import dataclasses
    import inspect

    w = loadgen.Workload(["a", [1, 2]], num_requests=3, max_tokens=[4, 8])
    assert w.prompts == ("a", [1, 2]) and w.limits == (4, 8)  # lists taken as tuples
    assert w.settings("m")["max_tokens"] == "4-8" and loadgen.Workload().settings(None)["max_tokens"] == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.num_requests = 4
    with pytest.raises(ValueError, match="no prompts"):
        loadgen.Workload(())
    with pytest.raises(ValueError, match="max_tokens"):
        loadgen.Workload(max_tokens=[])
    assert len(inspect.signature(loadgen.run_async).parameters) <= 8
    # run's keywords are the workload's fields and run_async's: one with neither is refused
    with pytest.raises(TypeError, match="num_prompts"):
        loadgen.run("http://127.0.0.1:9", num_prompts=4)


def test_unreachable_server_fails_fast():
    with pytest.raises(RuntimeError, match="did not answer"):
        loadgen.run("http://127.0.0.1:9", num_requests=1, timeout_s=5)


def test_read_locust_csv(tmp_path):
    path = tmp_path / "run_stats.csv"
    path.write_text(
        "Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,Min Response Time,"
        "Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,"
        "99.99%,100%\n"
        "POST,/v1/completions,20,1,300,350.5,100,900,400,4.0,0.2,300,320,340,360,500,700,800,900,900,900,900\n"
        ",Aggregated,20,1,300,350.5,100,900,400,4.0,0.2,300,320,340,360,500,700,800,900,900,900,900\n")
    stats = loadgen.read_locust_csv(path)
    agg = stats["aggregated"]
    assert agg["requests"] == 20 and agg["failures"] == 1 and agg["requests_per_s"] == 4.0
    assert agg["response_p50_s"] == 0.3 and agg["response_p90_s"] == 0.5 and agg["response_mean_s"] == 0.3505
    assert agg["response_p99_s"] is None  # 20 requests: too few for a 1 % tail (timing.P99_MIN_SAMPLES)
    assert list(stats["endpoints"]) == ["/v1/completions"]
    with pytest.raises(FileNotFoundError, match="Locust wrote no statistics"):
        loadgen.read_locust_csv(tmp_path / "missing.csv")


@pytest.fixture(scope="module")
def server():
    with launch.run_server(protocol.TINY_RANDOM, port=0, max_batch_size=8) as srv:
        yield srv


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streaming_client_measures_each_token(server, endpoint):
    seen = []
    res = loadgen.run(server.url, num_requests=6, max_concurrency=3, max_tokens=5, endpoint=endpoint,
                      request_rate=50.0, progress=lambda done, total: seen.append((done, total)))
    s = res.summary()
    assert s["completed"] == 6 and s["failed"] == 0 and s["model"] == protocol.TINY_RANDOM
    assert seen[-1] == (6, 6)
    for o in res.outputs:
        assert o.output_tokens == 5 and len(o.itl_s) == 4  # one SSE chunk per token
        assert 0 < o.ttft_s <= o.e2e_s
        assert o.e2e_s == pytest.approx(o.ttft_s + sum(o.itl_s))
    assert s["ttft_p50_s"] <= s["e2e_p50_s"]
    assert list(res.frame().columns)[:3] == ["success", "output_tokens", "ttft_s"]


def test_client_counts_server_refusals_as_failures(server):
    res = loadgen.run(server.url, num_requests=2, max_tokens=5000, warmup=0)  # over the server's limit
    s = res.summary()
    assert s["failed"] == 2 and all(o.status == 400 for o in res.outputs)


def test_locust_headless_against_the_server(server):
    stats = loadgen.run_locust(server.url, users=2, run_time_s=2, max_tokens=3)
    agg = stats["aggregated"]
    assert agg["requests"] > 0 and agg["failures"] == 0, stats
    assert stats["endpoints"]["/v1/completions"]["requests"] == agg["requests"]
    assert agg["output_tokens_per_s"] == pytest.approx(agg["requests_per_s"] * 3)


def test_token_id_prompts_go_to_the_completions_endpoint_as_they_are():
    body = client.payload("completions", (1, 2, 3), "m", 4, True)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 4 and "messages" not in body
    assert client.payload("completions", "Hi", "m", 4, True)["prompt"] == "Hi"
    with pytest.raises(ValueError, match="completions"):
        client.payload("chat", [1, 2, 3], "m", 4, True)


def test_mean_batch_between_two_snapshots_leaves_the_warm_up_out():
    """A fake metrics source: a warm-up request ran alone (one batch of 1), then the measured run in three batches
    of 8. The server's lifetime mean is (1 + 24) / 4 = 6.25; the difference of snapshots taken around the run is 8."""
    from labkit.serve import metrics

    after_warmup = {"batches": 1, "sequences_batched": 1}
    after_run = {"batches": 4, "sequences_batched": 25}
    assert after_run["sequences_batched"] / after_run["batches"] == 6.25  # what a lifetime mean would report
    assert metrics.mean_batch_between(after_warmup, after_run) == 8.0
    assert metrics.mean_batch_between(after_run, after_run) is None  # nothing ran in between
    with pytest.raises(ValueError, match="reset"):
        metrics.mean_batch_between(after_run, after_warmup)


def test_on_start_runs_after_the_warm_up_so_a_difference_counts_the_measured_requests(server):
    from labkit.lessons.nb09 import runs as nb09_runs

    calls = []

    def stats():  # the real server's snapshot, noting when it was read
        snap = server.stats()
        calls.append(snap)
        return snap

    server.reset_stats()
    row = nb09_runs.load_point(server.url, ["Hi"], concurrency=2, num_requests=4, max_tokens=3, stats=stats,
                            endpoint="completions", warmup=2)
    before, after = calls
    assert before["sequences_batched"] == 2  # the two warm-up requests, answered before the measured run began
    assert after["sequences_batched"] - before["sequences_batched"] == 4  # the measured requests alone
    assert row["mean_batch_size"] == pytest.approx(4 / (after["batches"] - before["batches"]))
    assert 1 <= row["mean_batch_size"] <= 2  # two clients at most: the warm-ups' batches of 1 are left out

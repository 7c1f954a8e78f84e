"""Notebook 14's pieces: the alignment to one definition, the outside clients' readers and runner (failures become
rows), the slow proxy's injected delay, the MLPerf SUT adapter over a fake server, vLLM's histograms read back,
pinning a process group, and the batch-divergence runner."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from labkit.serve import client, loadgen, metrics, processes
from labkit.serve.clients import align, outside
from labkit.serve.vllm import server as vllm_server

DATA = Path(__file__).parent / "data" / "clients"


def served_model(url):
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def rec(start, first, end, tokens):
    return {"start_s": start, "first_token_s": first, "end_s": end, "tokens": tokens}


# ------------------------------------------------------------------------------------------- alignment


def test_aligned_follows_the_one_definition():
    records = [rec(0.0, 0.2, 1.2, 11), rec(0.5, 0.6, 2.6, 21), rec(1.0, 1.4, 3.0, 2)]
    a = align.aligned(records)
    ttft = sorted([0.2, 0.1, 0.4])
    tpot = sorted([1.0 / 10, 2.0 / 20, 1.6 / 1])
    assert a["requests"] == 3
    assert a["ttft_p50_s"] == pytest.approx(ttft[1])
    assert a["tpot_p50_s"] == pytest.approx(tpot[1])
    assert a["output_tokens_per_s"] == pytest.approx(34 / 3.0)  # tokens over the span: first start to last end


def test_aligned_leaves_one_token_answers_out_of_tpot():
    a = align.aligned([rec(0, 0.1, 0.1, 1), rec(0, 0.1, 0.5, 5)])
    assert a["tpot_p50_s"] == pytest.approx(0.1)


@pytest.mark.parametrize("records, words", [([], "no records"), ([{"start_s": 0}], "lacks"),
                                            ([rec(1.0, 0.5, 2.0, 3)], "one clock")])
def test_aligned_names_bad_records(records, words):
    with pytest.raises(ValueError, match=words):
        align.aligned(records)


def test_stamps_from_request_outputs_keep_successes_only():
    outs = [client.RequestOutput(success=True, output_tokens=4, ttft_s=0.1, e2e_s=0.4, start_s=1.0),
            client.RequestOutput(success=False, start_s=2.0)]
    assert align.stamps(outs) == [rec(1.0, 1.1, 1.4, 4)]


def test_deviation_is_against_the_clients_median():
    d = align.deviation({"a": {"tpot_p50_s": 1.0, "output_tokens_per_s": 10.0},
                         "b": {"tpot_p50_s": 1.1, "output_tokens_per_s": 10.0},
                         "c": {"tpot_p50_s": 1.3, "output_tokens_per_s": None}})
    assert d["per_client"]["a"]["tpot_p50_s"] == pytest.approx(1.0 / 1.1 - 1)
    assert d["max"]["client"] == "c" and d["max"]["value"] == pytest.approx(1.3 / 1.1 - 1)
    assert "output_tokens_per_s" not in d["per_client"]["c"]


# ------------------------------------------------------------------------------------------- readers


def test_aiperf_records_use_the_servers_token_count_and_keep_aiperfs_own(tmp_path):
    shutil.copytree(DATA / "aiperf", tmp_path / "aiperf")
    outputs, reported = outside.read_aiperf(tmp_path)
    lines = [json.loads(x) for x in (DATA / "aiperf" / "profile_export.jsonl").read_text().splitlines()]
    assert [o.output_tokens for o in outputs] == [r["metrics"]["usage_completion_tokens"]["value"] for r in lines]
    assert reported["client_counted_tokens"] == sum(r["metrics"]["output_sequence_length"]["value"] for r in lines)
    assert reported["client_counted_tokens"] < reported["server_counted_tokens"]  # re-tokenised text loses tokens
    first = lines[0]["metrics"]
    assert outputs[0].ttft_s == pytest.approx(first["time_to_first_token"]["value"] / 1e3)
    assert min(o.start_s for o in outputs) == 0.0
    # AIPerf's own ITL is (E2E − TTFT) ÷ (its count − 1): recomputed from the record it matches
    own = (first["request_latency"]["value"] - first["time_to_first_token"]["value"]) / (
        first["output_sequence_length"]["value"] - 1)
    assert own == pytest.approx(first["inter_token_latency"]["value"])
    # its span, first request to last response, on the wall clock its ns stamps use
    start, end, how = outside.span_aiperf(tmp_path)
    assert how == "epoch" and start == min(r["metadata"]["request_start_ns"] for r in lines) / 1e9
    assert end == max(r["metadata"]["request_end_ns"] for r in lines) / 1e9 and end > start


def test_guidellm_tpot_counts_the_first_token_and_alignment_takes_it_out(tmp_path):
    shutil.copytree(DATA / "guidellm", tmp_path / "guidellm")
    outputs, reported = outside.read_guidellm(tmp_path)
    raw = json.loads((DATA / "guidellm" / "benchmarks.json").read_text())["benchmarks"][0]["requests"]["successful"]
    for o, r in zip(outputs, raw):
        t = r["info"]["timings"]
        assert o.e2e_s == pytest.approx(t["last_token_iteration"] - t["request_start"])  # its last token, not the end
        assert r["time_per_output_token_ms"] / 1e3 == pytest.approx(r["request_latency"] / o.output_tokens, rel=1e-3)
        assert r["inter_token_latency_ms"] / 1e3 == pytest.approx(o.tpot_s, rel=1e-3)
    assert reported["tpot_p50_s"] > reported["itl_p50_s"]
    start, end, how = outside.span_guidellm(tmp_path)
    assert how == "epoch" and start == min(r["request_start_time"] for r in raw)
    assert end == max(r["request_end_time"] for r in raw)


# ------------------------------------------------------------------------------------------- running


W = loadgen.Workload(("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",) * 4, num_requests=4, max_tokens=4,
                     max_concurrency=2, model="m", tokenizer="/nowhere")


def test_a_missing_client_is_a_row_naming_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CLIENTS_PYTHON", str(tmp_path / "none" / "python"))
    run = outside.run("AIPerf", "http://127.0.0.1:9", W, tmp_path)
    assert not run.ok and "make clients" in run.status
    assert run.row()["latency_named"] == "ITL"


def test_a_failing_and_a_hanging_client_become_failed_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(outside, "command", lambda *a: [sys.executable, "-c", "import sys; print('ERROR: bad flag'); "
                                                                             "sys.exit(3)"])
    failed = outside.run("labkit", "http://127.0.0.1:9", W, tmp_path)
    assert failed.status.startswith("failed: exit 3") and "bad flag" in failed.status
    monkeypatch.setattr(outside, "command", lambda *a: [sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.perf_counter()
    hung = outside.run("labkit", "http://127.0.0.1:9", W, tmp_path, timeout_s=1.0)
    assert "no result within 1 s" in hung.status and time.perf_counter() - t0 < 20
    with pytest.raises(ValueError, match="choose one of"):
        outside.run("wrk", "http://127.0.0.1:9", W, tmp_path)


def test_labkits_client_as_a_child_writes_records_that_align(server, tmp_path):
    from labkit.lessons.nb14 import runs as nb14

    seen = []
    runs = nb14.clients_on_one_server(server.url, dataclasses.replace(W, model=served_model(server.url)), tmp_path,
                                      clients=("labkit",), rounds=2, cores={0}, on_run=seen.append)
    assert list(runs) == ["labkit"] and seen == runs["labkit"] and len(seen) == 2
    assert (tmp_path / "round1" / outside.PROMPTS_FILE).is_file()  # each run writes its client's inputs
    run = runs["labkit"][-1]
    assert run.ok, run.status
    assert len(run.outputs) == 4 and run.reported["requests"] == 4
    assert run.aligned()["tpot_p50_s"] == pytest.approx(run.reported["tpot_p50_s"])
    assert run.cpu_s is not None and run.cpu_s > 0
    # its cost while it measured, its start-up (imports, the warm-up request) apart, both inside its whole CPU time
    assert run.startup_cpu_s > 0 and run.run_cpu_s > 0 and 0 < run.run_wall_s < run.wall_s
    assert run.startup_cpu_s + run.run_cpu_s <= run.cpu_s + 0.05
    assert run.row()["run_cpu_s"] == run.run_cpu_s


@pytest.mark.parametrize("change, words", [({"max_tokens": 1}, "at least 2"), ({"num_requests": 3}, "sent once"),
                                           ({"max_concurrency": None}, "cap"), ({"request_rate": 2.0}, "closed loop"),
                                           ({"endpoint": "chat"}, "completions"), ({"tokenizer": None}, "tokenizer"),
                                           ({"prompts": ([1, 2],) * 4}, "texts")])
def test_a_workload_the_clients_cannot_send_as_meant_is_refused(tmp_path, change, words):
    with pytest.raises(ValueError, match=words):
        outside.run("labkit", "http://127.0.0.1:9", dataclasses.replace(W, **change), tmp_path)


def test_inputs_one_file_per_client(tmp_path):
    paths = outside.write_inputs(tmp_path, W)
    assert list(paths) == list(outside.CLIENTS)
    g = [json.loads(x) for x in paths["GuideLLM"].read_text().splitlines()]
    assert len(g) == 4 and g[0]["output_tokens_count"] == 4
    assert paths["labkit"] == paths["vllm bench"]  # one prompts file, two readers
    assert loadgen.read_prompts_file(paths["labkit"]) == list(W.prompts)
    assert json.loads(paths["AIPerf"].read_text().splitlines()[0]) == {"text": W.prompts[0]}


def test_every_client_is_one_record_and_outside_names_none(tmp_path):
    """A fifth client is one record in CLIENTS and its reader: outside.py asks for no client by its name."""
    import ast
    import inspect

    for name, c in outside.CLIENTS.items():
        assert c.name == name and c.latency_named and c.definition
        argv = c.command("http://h:1", W, tmp_path)
        assert argv and all(isinstance(a, str) for a in argv)
        assert outside.ClientRun(name, "ok").row()["latency_named"] == c.latency_named
    names = set(outside.CLIENTS)
    for node in ast.walk(ast.parse(inspect.getsource(outside))):
        if isinstance(node, ast.Compare):
            said = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
            assert not said & names, f"a branch on a client's name: {ast.unparse(node)}"


def test_each_clients_environment_is_its_records(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/lab")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert outside.child_env("labkit")["PYTHONPATH"] == "/lab"
    assert "PYTHONPATH" not in outside.child_env("vllm bench")  # the lab's packages stay off vLLM's path
    assert outside.child_env("vllm bench")["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE" not in outside.child_env(
        "AIPerf")
    monkeypatch.setenv("LABKIT_CLIENTS_PYTHON", "/none/python")
    assert outside.missing("labkit") is None and outside.missing("GuideLLM") == outside.MISSING


# ------------------------------------------------------------------------------------------- the slow proxy


@pytest.mark.parametrize("chunk, token", [
    ({"choices": [{"index": 0, "text": " the"}]}, True),
    ({"choices": [{"index": 0, "text": ""}]}, True),  # a token that decodes to no text still took its step
    ({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}, True),
    ({"choices": [], "usage": {"completion_tokens": 16}}, False),
    ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, False),  # chat's opening chunk
    ({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, True),
])
def test_the_slow_proxy_delays_every_tokens_chunk_with_text_or_without(chunk, token):
    from labkit.serve.clients.delay import carries_tokens

    assert carries_tokens(b"data: " + json.dumps(chunk).encode()) is token
    assert not carries_tokens(b"data: [DONE]") and not carries_tokens(b": keep-alive")


def test_the_slow_proxy_adds_its_delay_to_every_token(server):
    from labkit.serve.clients.delay import SlowProxy

    prompts = ["Tell me a story about a lighthouse."]
    with SlowProxy(server.url, 0.0) as p:
        base = loadgen.run(p.url, prompts, num_requests=2, max_concurrency=1, max_tokens=6, warmup=1)
        p.per_token_s = 0.05
        slow = loadgen.run(p.url, prompts, num_requests=2, max_concurrency=1, max_tokens=6, warmup=0)
        with pytest.raises(ValueError, match="per_token_s"):
            p.per_token_s = -1
    assert base.failed == 0 and slow.failed == 0
    gained = statistics.median(o.tpot_s for o in slow.outputs) - statistics.median(o.tpot_s for o in base.outputs)
    assert 0.04 < gained < 0.2  # each gap grows by the delay (the machine's own noise on top)
    assert statistics.median(o.ttft_s for o in slow.outputs) > 0.04


# ------------------------------------------------------------------------------------------- MLPerf LoadGen


class FakeLG:
    def __init__(self):
        self.calls = []

    def QuerySampleResponse(self, *args):
        return args

    def FirstTokenComplete(self, responses):
        self.calls.append(("first", responses))

    def QuerySamplesComplete(self, responses):
        self.calls.append(("done", responses))


def test_report_tells_loadgen_the_first_token_then_the_answer_with_its_tokens():
    from labkit.serve.clients import mlperf

    lg = FakeLG()
    mlperf.report(lg, 7, "first", 0)
    mlperf.report(lg, 7, "done", 12)
    assert lg.calls == [("first", [(7, 0, 0)]), ("done", [(7, 0, 0, 12)])]
    with pytest.raises(ValueError, match="first"):
        mlperf.report(lg, 7, "end", 1)


def test_official_limits_come_from_loadgens_own_conf_and_keep_their_ratio():
    mlperf = pytest.importorskip("labkit.serve.clients.mlperf")
    pytest.importorskip("mlperf_loadgen")
    official = mlperf.official_limits()
    assert official["ttft_s"] > official["tpot_s"] > 0
    lim = mlperf.limits(0.02, official)
    assert lim["tpot_s"] == pytest.approx(mlperf.TPOT_HEADROOM * 0.02)
    assert lim["ttft_s"] / lim["tpot_s"] == pytest.approx(official["ttft_s"] / official["tpot_s"])
    with pytest.raises(LookupError):
        mlperf.official_limits("no-such-model")


def test_the_sut_adapter_runs_loadgen_over_a_fake_server(server, tmp_path):
    pytest.importorskip("mlperf_loadgen")
    from labkit.serve.clients import mlperf

    seen = []

    def counting(lg, qid, event, tokens):
        seen.append((event, tokens))
        mlperf.report(lg, qid, event, tokens)

    res = mlperf.run(server.url, served_model(server.url), ["Say something."] * 4, tmp_path / "lg", scenario="Offline",
                     qps=20.0, max_tokens=4, ttft_s=5.0, tpot_s=1.0, min_duration_s=0.5, min_queries=8,
                     report=counting)
    assert res.valid is not None and res.lines.get("Scenario") == "Offline"
    assert res.sent >= 8 and res.failed == 0
    assert seen.count(("first", 0)) == res.sent
    assert [t for e, t in seen if e == "done"] == [4] * res.sent  # the server's count of tokens, each answer
    assert "not an MLPerf result" in res.note
    with pytest.raises(ValueError, match="scenario"):
        mlperf.run(server.url, "m", ["p"], tmp_path, scenario="SingleStream", qps=1, max_tokens=2, ttft_s=1,
                   tpot_s=1, min_duration_s=1, min_queries=1)


def test_read_summary_takes_the_first_of_each_key():
    text = "Result is : INVALID\n  Early stopping satisfied: NO\nResult is : VALID\nno colon here\n"
    from labkit.serve.clients import mlperf

    assert mlperf.read_summary(text) == {"Result is": "INVALID", "Early stopping satisfied": "NO"}


# ------------------------------------------------------------------------------------------- histograms


PROM = """vllm:x_seconds_bucket{le="0.1",engine="0"} 2
vllm:x_seconds_bucket{le="0.2",engine="0"} 6
vllm:x_seconds_bucket{le="+Inf",engine="0"} 8
vllm:x_seconds_bucket{le="0.1",engine="1"} 0
vllm:x_seconds_bucket{le="0.2",engine="1"} 2
vllm:x_seconds_bucket{le="+Inf",engine="1"} 2
vllm:x_seconds_count{engine="0"} 8
vllm:x_seconds_count{engine="1"} 2
vllm:x_seconds_sum{engine="0"} 1.6
vllm:x_seconds_sum{engine="1"} 0.3
"""


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does():
    h = metrics.histogram(metrics.parse_prometheus(PROM), "vllm:x_seconds")
    assert h["count"] == 10 and h["sum"] == pytest.approx(1.9)
    assert h["buckets"] == [(0.1, 2.0), (0.2, 8.0), (float("inf"), 10.0)]
    assert metrics.histogram_quantile(h, 0.5) == pytest.approx(0.1 + 0.1 * (5 - 2) / (8 - 2))
    assert metrics.histogram_quantile(h, 0.1) == pytest.approx(0.1 * 1 / 2)
    assert metrics.histogram_quantile(h, 0.95) == pytest.approx(0.2)  # in +Inf: the last finite edge
    assert metrics.bucket_of(h, 0.15) == (0.1, 0.2)
    with pytest.raises(ValueError, match="no histogram"):
        metrics.histogram([], "vllm:x_seconds")


# ------------------------------------------------------------------------------------------- pinning


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is a Linux call")
def test_pin_group_holds_every_thread_of_the_group(tmp_path):
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(0.5)
        core = min(os.sched_getaffinity(0))
        assert processes.pin_group(proc.pid, {core}) >= 2  # the main thread and the sleeper
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            assert os.sched_getaffinity(int(task.name)) == {core}
        with pytest.raises(ValueError, match="at least one"):
            processes.pin_group(proc.pid, set())
    finally:
        proc.kill()
        proc.wait()


def test_cpu_trace_reads_a_groups_cpu_by_either_clock_and_keeps_a_member_that_exits():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    code = (f"import subprocess, sys, time; time.sleep(0.4); subprocess.run([sys.executable, '-c', {burn!r}]); "
            "time.sleep(0.4)")
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    trace = processes.CpuTrace(proc.pid, every_s=0.02, refresh=1).start()
    try:
        proc.wait(30)
    finally:
        proc.kill()
        trace.stop()
    assert trace.at(t0 + 0.3) < 0.3, "before the burn: the interpreter's start only"
    assert trace.at(time.time()) >= 0.45, "the child that burned 0.5 s and exited still counts"
    last_epoch, last_mono, last_cpu = trace.rows[-1]
    assert trace.at(last_mono, "monotonic") == last_cpu == trace.at(last_epoch + 5)
    assert trace.at(0.0) == trace.rows[0][2]
    with pytest.raises(ValueError, match="epoch"):
        trace.at(t0, "wall")


# ------------------------------------------------------------------------------------------- batch divergence


def test_batch_divergence_compares_the_target_alone_and_in_batches(tiny_llama):
    from labkit.decoding import invariance

    model, tok = tiny_llama
    prompts = [tok("one two three")["input_ids"], tok("a much longer prompt about many things")["input_ids"],
               tok("short")["input_ids"], tok("four five six seven")["input_ids"]]
    rows = invariance.batch_divergence(model, prompts, tok.pad_token_id, batches=(2, 4), targets=(0, 2), new_tokens=5)
    assert [(r["target"], r["batch"]) for r in rows] == [(0, 2), (0, 4), (2, 2), (2, 4)]
    alone, _ = invariance.answer(model, [prompts[0]], tok.pad_token_id, 5)
    for r in rows:
        assert len(r["alone"]) == len(r["in_batch"]) == 5 and r["max_logit_diff"] is not None
        assert (r["first_difference"] is None) == (r["alone"] == r["in_batch"])
    assert rows[0]["alone"] == alone
    with pytest.raises(ValueError, match="batch size"):
        invariance.batch_divergence(model, prompts, tok.pad_token_id, batches=(1,))


# ------------------------------------------------------------------------------------------- notebook 14's tables


def _run(name, tpot, tokens=5, n=4, status="ok", reported=None):
    outs = [client.RequestOutput(success=True, output_tokens=tokens, ttft_s=0.1, e2e_s=0.1 + tpot * (tokens - 1),
                                 start_s=0.05 * i) for i in range(n)]
    return outside.ClientRun(name, status, outs if status == "ok" else [], reported or {"tpot_p50_s": tpot},
                             cpu_s=3.0, wall_s=4.0, startup_cpu_s=2.0, run_cpu_s=1.0, run_wall_s=2.0)


def test_client_tables_align_every_client_and_keep_a_failed_one_as_a_row():
    from labkit.lessons.nb14 import runs as nb14

    runs = {"labkit": [_run("labkit", 0.05), _run("labkit", 0.07)], "AIPerf": [_run("AIPerf", 0.066)],
            "GuideLLM": [outside.ClientRun("GuideLLM", "failed: exit 2: no such flag")]}
    t = nb14.client_tables(runs)
    assert t["aligned"]["labkit"]["tpot_p50_s"] == pytest.approx(0.06)  # the median over its two rounds
    assert "GuideLLM" not in t["aligned"]
    failed = next(r for r in t["raw"] if r["client"] == "GuideLLM")
    assert failed["rounds"] == 0 and failed["status"].startswith("failed")
    worst = t["aligned_deviation"]["max"]
    assert abs(worst["value"]) == pytest.approx(0.066 / 0.063 - 1) and worst["metric"] == "tpot_p50_s"
    # CPU per second between the first request and the last response: the start-up stays out of it
    assert nb14.cpu_share(runs)["labkit"] == pytest.approx(0.5) and nb14.cpu_share(runs)["GuideLLM"] is None
    assert nb14.startup_cpu(runs) == {"labkit": 2.0, "AIPerf": 2.0, "GuideLLM": None}
    # the learner's alignment is the one the table uses
    t2 = nb14.client_tables(runs, lambda records: {"ttft_p50_s": 1.0, "tpot_p50_s": 2.0, "output_tokens_per_s": 3.0})
    assert t2["aligned"]["AIPerf"]["tpot_p50_s"] == 2.0


def test_each_client_runs_between_two_anchor_runs_and_its_deviation_is_the_median_of_its_pairs(monkeypatch, tmp_path):
    from labkit.lessons.nb14 import runs as nb14

    paces = (1.04 ** k for k in range(20))  # the server slows 4 % with every pass, steadily
    tpot = {"labkit": 0.050, "AIPerf": 0.055, "GuideLLM": 0.050}  # AIPerf reads 10 % slower, GuideLLM the same

    def fake(name, url, w, folder, *, cores=None, timeout_s=0):
        p = next(paces)
        if name == "GuideLLM" and "round1" in str(folder):
            return outside.ClientRun(name, "failed: exit 1: no")
        return _run(name, tpot[name] * p)

    monkeypatch.setattr(outside, "run", fake)
    runs = nb14.clients_on_one_server("http://x", None, tmp_path, clients=("labkit", "AIPerf", "GuideLLM"), rounds=3,
                                      anchor="labkit")
    assert runs.anchor == "labkit" and len(runs["AIPerf"]) == 3 and len(runs["GuideLLM"]) == 2  # failed: not again
    assert runs.order[::2] == ["labkit"] * 6 and len(runs.order) == 11  # before each other run, and once at the end
    first = runs.order.index("AIPerf")
    assert runs.anchor_of["AIPerf"][0] == runs.order[:first].count("labkit") - 1
    assert runs.anchor_after["AIPerf"][0] == runs.anchor_of["AIPerf"][0] + 1
    assert runs.anchor_after[runs.order[-2]][-1] == 5  # the last client's closing anchor run
    a = nb14.anchored(runs)
    aiperf = a["per_client"]["AIPerf"]
    assert aiperf["pairs"] == 3 and aiperf["tpot_p50_s"]["deviation"] == pytest.approx(0.1)
    assert aiperf["tpot_p50_s"]["range"] == pytest.approx(0.0, abs=1e-9)  # the steady drift cancels between the sides
    guide = a["per_client"]["GuideLLM"]
    assert guide["tpot_p50_s"]["deviation"] == pytest.approx(0.0, abs=1e-9) and guide["pairs"] == 1
    assert guide["tpot_p50_s"]["range"] is None  # one pair: no range
    assert a["per_client"]["labkit"]["pairs"] == 5 and a["max"]["client"] == "AIPerf"
    before_only = nb14.anchored(nb14.ClientPasses(dict(runs), "labkit", runs.anchor_of))  # the anchor before alone
    assert before_only["per_client"]["AIPerf"]["tpot_p50_s"]["deviation"] == pytest.approx(1.1 * 1.04 - 1)
    with pytest.raises(ValueError, match="anchor"):
        nb14.anchored(nb14.ClientPasses({"labkit": []}))


def test_the_servers_own_clock_tells_a_slower_server_from_a_clients_clock(monkeypatch, tmp_path):
    from labkit.lessons.nb14 import findings, runs as nb14

    paces = (1.03 ** k for k in range(40))  # the server drifts steadily
    clock = {"labkit": 1.0, "AIPerf": 1.1, "GuideLLM": 1.0}  # what the client's own clock adds to each token
    server = {"labkit": 1.0, "AIPerf": 1.0, "GuideLLM": 1.1}  # how much slower the server runs while it drives it
    seen = {}

    def fake(name, url, w, folder, *, cores=None, timeout_s=0):
        seen["tpot"] = 0.05 * next(paces) * server[name]
        return _run(name, seen["tpot"] * clock[name])

    monkeypatch.setattr(outside, "run", fake)
    counted = {"n": 4}  # the server's TPOT histogram counted the pass's 4 answered requests
    monkeypatch.setattr(vllm_server, "server_view",
                        lambda before, after: {"tpot": {"mean_s": seen["tpot"], "count": counted["n"]}})
    scraped = []
    runs = nb14.clients_on_one_server("http://x", None, tmp_path, clients=("labkit", "AIPerf", "GuideLLM"), rounds=6,
                                      anchor="labkit", scrape=lambda: scraped.append(1) or scraped)
    assert len(scraped) == 2 * len(runs.order)  # before and after every run
    assert all(len(runs.server_tpot[c]) == len(runs[c]) for c in runs) and None not in runs.server_tpot["AIPerf"]
    a = nb14.anchored(runs)
    aiperf, guide = a["per_client"]["AIPerf"], a["per_client"]["GuideLLM"]
    assert aiperf["tpot_p50_s"]["deviation"] == pytest.approx(0.1) == guide["tpot_p50_s"]["deviation"]
    assert aiperf[nb14.SERVER_TPOT]["deviation"] == pytest.approx(0.0, abs=1e-9)
    assert aiperf["beyond_server"]["deviation"] == pytest.approx(0.1)  # AIPerf's clock, not the server
    assert guide[nb14.SERVER_TPOT]["deviation"] == pytest.approx(0.1)
    assert guide["beyond_server"]["deviation"] == pytest.approx(0.0, abs=1e-9)  # the server itself ran slower
    assert nb14.anchored_row(a, "AIPerf")["tpot_beyond_server"] == pytest.approx(0.1)
    a["max"] = {"value": 0.1, "client": "GuideLLM", "metric": "tpot_p50_s"}
    assert "the server itself ran slower while GuideLLM drove it" in findings.server_sentence(a)
    a["max"]["client"] = "AIPerf"
    said = findings.server_sentence(a)
    assert "outside the server's timing (front end, transport, AIPerf's clock): +10.0%, a real difference" in said
    assert "ran slower" not in said and "over 6 of AIPerf's pairs" in said
    unscraped = nb14.anchored(nb14.ClientPasses(dict(runs), "labkit", runs.anchor_of, anchor_after=runs.anchor_after))
    assert unscraped["per_client"]["AIPerf"]["beyond_server"] is None
    assert "was not read for" in findings.server_sentence(unscraped)
    counted["n"] = 5  # a client's extra test request in the window: that pass's server figure is not comparable
    assert nb14._server_tpot([], [], _run("AIPerf", 0.05)) is None

    def down():
        raise urllib.error.URLError("connection refused")

    quiet = nb14.clients_on_one_server("http://x", None, tmp_path, clients=("labkit", "AIPerf"), rounds=1,
                                       anchor="labkit", scrape=down)  # /metrics down: the runs go on
    assert len(quiet.order) == 3 and quiet.server_tpot == {"labkit": [None, None], "AIPerf": [None]}


def test_a_failed_anchor_run_leaves_its_neighbours_one_side_and_a_failed_last_client_gets_no_closing_run(
        monkeypatch, tmp_path):
    from labkit.lessons.nb14 import runs as nb14

    calls = []

    def fake(name, url, w, folder, *, cores=None, timeout_s=0):
        calls.append(name)
        if name == "labkit" and len(calls) == 3:  # the anchor run between the two clients of round 0 fails
            return outside.ClientRun(name, "failed: exit 1: no")
        if name == "AIPerf" and "round1" in str(folder):
            return outside.ClientRun(name, "failed: exit 1: no")
        return _run(name, 0.05)

    monkeypatch.setattr(outside, "run", fake)
    monkeypatch.setattr(nb14.random, "Random", lambda seed: type("R", (), {"shuffle": lambda self, x: x.sort(
        key=lambda c: c != "GuideLLM")})())  # GuideLLM first in every round
    runs = nb14.clients_on_one_server("http://x", None, tmp_path, clients=("labkit", "GuideLLM", "AIPerf"), rounds=2,
                                      anchor="labkit")
    assert runs.order == ["labkit", "GuideLLM", "labkit", "AIPerf", "labkit", "GuideLLM", "labkit", "AIPerf"]
    assert runs.anchor_of == {"GuideLLM": [0, 2], "AIPerf": [None, 3]}
    assert runs.anchor_after == {"GuideLLM": [None, 3], "AIPerf": [2]}  # AIPerf failed last: no closing run
    assert runs.brackets("GuideLLM") == [(0, [0]), (1, [2, 3])] and runs.brackets("AIPerf") == [(0, [2]), (1, [3])]


def test_first_waves_hold_a_client_against_the_geometric_mean_of_its_two_sides():
    from labkit.lessons.nb14 import runs as nb14

    def wave_run(name, pace):
        outs = [client.RequestOutput(success=True, ttft_s=0.1, e2e_s=0.1 + 9 * pace, output_tokens=10,
                                     start_s=k * 2.0 + i * 0.01) for k in range(2) for i in range(4)]
        return outside.ClientRun(name, "ok", outs, {})

    passes = nb14.ClientPasses({"labkit": [wave_run("labkit", 0.04), wave_run("labkit", 0.09)],
                                "X": [wave_run("X", 0.06)]}, "labkit", {"X": [0]}, anchor_after={"X": [1]})
    assert nb14.first_waves(passes, 4)["X"] == {"pairs": 1, "first": pytest.approx(1.0), "later": pytest.approx(1.0)}


def test_a_pair_keeps_the_anchor_side_that_ran():
    from labkit.lessons.nb14 import runs as nb14

    passes = nb14.ClientPasses({"labkit": [], "X": []}, "labkit", {"X": [0, None, 2, None]},
                               anchor_after={"X": [1, 2, None, None]})
    assert passes.brackets("X") == [(0, [0, 1]), (1, [2]), (2, [2])]  # run 3 has neither side: no pair


def test_waves_group_a_closed_loops_requests_and_read_the_pace_between_them():
    from labkit.lessons.nb14 import findings, runs as nb14

    def wave_run(paces):  # 4 in flight: wave k's requests start together and decode at paces[k] a token
        outs = [client.RequestOutput(success=True, ttft_s=0.1, e2e_s=0.1 + 9 * p, output_tokens=10,
                                     start_s=k * 2.0 + i * 0.01) for k, p in enumerate(paces) for i in range(4)]
        return outside.ClientRun("labkit", "ok", outs, {})

    w = nb14.waves([wave_run([0.05, 0.055, 0.05, 0.06]), wave_run([0.05, 0.05, 0.05, 0.05]),
                    outside.ClientRun("labkit", "failed: exit 1")], concurrency=4)
    assert w == {"passes": 2, "waves": 4, "range": pytest.approx((0.2 + 0.0) / 2)}  # 0.06 / 0.05 − 1, and 0
    assert "4 waves of 4 requests" in findings.waves_sentence(w, "labkit", 4) and "10.0%" in findings.waves_sentence(
        w, "labkit", 4)
    assert nb14.waves([wave_run([0.05])], 4)["range"] is None  # one wave: nothing moves within the pass
    with pytest.raises(ValueError, match="concurrency"):
        nb14.waves([], 0)


def test_the_loops_sentence_says_each_load_ran_once():
    from labkit.core import verdict
    from labkit.lessons.nb14 import findings

    load = {"ttft_p50_s": 0.2}
    loops = {"closed": load, "open": {"ttft_p50_s": 0.1}, "closed_long": load, "tokens": (8, 32), "concurrency": 4,
             "rate_per_s": 2.0}
    judged = verdict.compare([0.1, 0.11, 0.09], [0.2, 0.19, 0.21], higher_is_better=False)
    said = findings.loops_sentence(loops, judged, judged)
    assert "0.50×" in said and "ran once, not repeated" in said


def test_first_waves_split_a_clients_residual_into_the_passes_first_wave_and_the_rest():
    from labkit.lessons.nb14 import findings, runs as nb14

    def wave_run(name, paces):  # 4 in flight: wave k's requests start together and decode at paces[k] a token
        outs = [client.RequestOutput(success=True, ttft_s=0.1, e2e_s=0.1 + 9 * p, output_tokens=10,
                                     start_s=k * 2.0 + i * 0.01) for k, p in enumerate(paces) for i in range(4)]
        return outside.ClientRun(name, "ok", outs, {})

    anchor = [wave_run("labkit", [0.05, 0.05, 0.05]), wave_run("labkit", [0.05, 0.05, 0.05])]
    slow_start = [wave_run("X", [0.06, 0.05, 0.05]), wave_run("X", [0.065, 0.05, 0.05])]
    steady = [wave_run("Y", [0.055, 0.055, 0.055])]
    passes = nb14.ClientPasses({"labkit": anchor, "X": slow_start, "Y": steady}, "labkit",
                               {"X": [0, 1], "Y": [None]})
    fw = nb14.first_waves(passes, 4)
    assert fw["X"] == {"pairs": 2, "first": pytest.approx(1.25), "later": pytest.approx(1.0)}
    assert fw["Y"] == {"pairs": 0, "first": None, "later": None}  # its only pass has no anchor run either side
    said = findings.first_waves_sentence(fw, "labkit")
    assert "X 1.25× and 1.00×" in said and "Y" not in said
    assert "not shown" in findings.first_waves_sentence({"Y": fw["Y"]}, "labkit")
    with pytest.raises(ValueError, match="concurrency"):
        nb14.first_waves(passes, 0)

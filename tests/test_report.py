"""labkit.lessons.report: SLO checks, the before/after table, HTML + JSON writing, and merging class results."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from labkit.core import memory, results
from labkit.lessons import report
from labkit.lessons.nb06 import runs as nb06_runs
from labkit.lessons.nb09 import runs as nb09_runs
from labkit.serve import client, loadgen
from labkit.serve import processes


def _row(concurrency, completed, good, failed=0, **kw):
    return {"concurrency": concurrency, "completed": completed, "good_requests": good, "failed": failed, **kw}


def test_meets_and_max_concurrency():
    rows = [_row(1, 10, 10), _row(2, 10, 9), _row(4, 10, 5), _row(8, 10, 10, failed=1)]
    assert [report.meets(r) for r in rows] == [True, True, False, False]
    assert report.max_concurrency(rows) == 2
    assert report.max_concurrency(rows, min_good_fraction=1.0) == 1
    assert report.max_concurrency([_row(1, 4, 0)]) is None
    with pytest.raises(ValueError, match="min_good_fraction"):
        report.meets(rows[0], 0)


def test_before_after_ratios_and_direction():
    before = {"request_throughput": 2.0, "e2e_mean_s": 4.0, "peak_rss_bytes": None}
    after = {"request_throughput": 5.0, "e2e_mean_s": 1.0, "peak_rss_bytes": 10}
    df = report.before_after(before, after).set_index("key")
    assert df.loc["request_throughput", "after / before"] == pytest.approx(2.5)
    assert df.loc["request_throughput", "better"] and df.loc["e2e_mean_s", "better"]  # lower latency is better
    assert df["after / before"].isna()["peak_rss_bytes"] and df["better"].isna()["peak_rss_bytes"]


def _results(name: str, throughput: float, gpu: str | None = None) -> results.Results:
    res = results.Results(name)
    res.add("configs", config="baseline", request_throughput=throughput, e2e_mean_s=2.0)
    res.add("configs", config="best", request_throughput=3 * throughput, e2e_mean_s=0.5)
    res.env = {"date": "2026-01-02T03:04:05+00:00", "device": "cuda" if gpu else "cpu", "quick": True,
               "hardware": {"cpu": "Test CPU", "cpu_cores_logical": 2, "gpu": gpu},
               "versions": {"torch": "2.x"}, "command": "test"}
    return res


def test_write_html_and_json(tmp_path):
    import plotly.graph_objects as go

    res = _results("09_capstone", 1.5)
    res.notes["slo"] = "TTFT ≤ 2 s <and> TPOT ≤ 0.2 s"
    paths = report.write(res, figures=[go.Figure(go.Bar(x=["a"], y=[1]))], out_dir=tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["name"] == "09_capstone" and len(data["rows"]) == 2 and data["env"]["device"] == "cpu"
    page = paths["html"].read_text()
    assert page.startswith("<!doctype html>") and "baseline" in page and "Test CPU" in page
    assert "&lt;and&gt;" in page  # notes are escaped
    assert "plotly" in page.lower()  # plotly.js embedded: opens offline
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_merge_class_results(tmp_path):
    a = _results("09_capstone", 1.0).save(tmp_path / "alice" / "09_capstone.json")
    b = _results("09_capstone", 10.0, gpu="NVIDIA L4").save(tmp_path / "bob" / "09_capstone.json")
    df = report.merge([a, b])
    assert len(df) == 4 and set(df["learner"]) == {"alice/09_capstone", "bob/09_capstone"}
    assert df.loc[df.learner == "bob/09_capstone", "hardware"].iloc[0].startswith("NVIDIA L4")
    assert list(df.loc[df.learner == "alice/09_capstone", "request_throughput"]) == [1.0, 3.0]
    fig = report.merge_figure(df)
    assert len(fig.data) == 2  # one series per learner
    with pytest.raises(ValueError, match="no column"):
        report.merge_figure(df, metric="nope")
    with pytest.raises(ValueError, match="no such results file"):
        report.merge([tmp_path / "missing.json"])
    with pytest.raises(ValueError, match="no rows in section"):
        report.merge([a], section="slo_sweep")
    with pytest.raises(ValueError, match="at least one"):
        report.merge([])


def test_class_chart_never_puts_quick_and_full_runs_on_one_axis(tmp_path):
    a = _results("09_capstone", 1.0).save(tmp_path / "alice" / "09_capstone.json")
    full = _results("09_capstone", 2.0)
    full.env["quick"] = False
    full.notes["tokens"] = "answers up to 64 tokens"
    b = full.save(tmp_path / "bob" / "09_capstone.json")
    df = report.merge([a, b])
    assert set(df["mode"]) == {"quick", "full, answers up to 64 tokens"}
    fig = report.merge_figure(df)
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith("yaxis")]
    assert len(axes) == 2 and all(fig.layout[k].matches is None for k in axes)
    same = report.merge_figure(report.merge([a]))
    assert len([k for k in same.layout.to_plotly_json() if k.startswith("yaxis")]) == 1


def test_reference_file_merges():
    path = results.reference_dir() / "09_capstone.json"
    assert path.is_file(), "data/reference/09_capstone.json is missing: `make reference NOTEBOOKS=09` writes it"
    df = report.merge([path])
    assert {"config", "request_throughput", "hardware"} <= set(df.columns) and len(df) >= 2


def test_pick_precision_takes_the_fastest_that_keeps_the_answers() -> None:
    rows = [{"precision": "fp32", "tokens_per_s": 10.0, "agreement": 1.0},
            {"precision": "bf16", "tokens_per_s": 14.0, "agreement": 0.95},
            {"precision": "int8", "tokens_per_s": 30.0, "agreement": 0.5}]
    assert report.pick_precision(rows, 0.9) == "bf16"
    assert report.pick_precision(rows, 0.4) == "int8"
    assert report.pick_precision(rows, 0.99) == "fp32"
    with pytest.raises(ValueError, match="lower min_agreement"):
        report.pick_precision(rows[1:], 0.99)


def test_choose_precision_measures_speed_and_answers(tiny_llama) -> None:
    import copy

    import torch

    model, tok = tiny_llama
    broken = copy.deepcopy(model)
    with torch.no_grad():
        for p in broken.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rows, choice = nb09_runs.choose_precision({"fp32": model, "noisy": broken}, tok, ["Hi there", "What is 2+2?"],
                                           batch=3, new_tokens=4, ref_prompts=2, ref_tokens=6)
    by = {r["precision"]: r for r in rows}
    assert by["fp32"]["agreement"] == 1.0 and by["fp32"]["kl"] < 1e-6
    assert by["noisy"]["agreement"] < 0.9 and by["noisy"]["kl"] > 0.01
    assert all(r["tokens_per_s"] > 0 and r["batch"] == 3 for r in rows)
    assert choice == "fp32"  # the only one that keeps the answers
    with pytest.raises(ValueError, match="reference precision"):
        nb09_runs.choose_precision({"noisy": broken}, tok, ["Hi"], batch=1, new_tokens=1)


def test_slo_comes_from_one_request_alone_when_the_target_is_out_of_reach():
    from labkit.serve.loadgen import SLO

    target = SLO(ttft_s=2.0, tpot_s=0.25)
    quick = {"ttft_p50_s": 0.4, "tpot_p50_s": 0.05, "completed": 3}
    slo, why = loadgen.slo_from_baseline(target, quick, factor=3)
    assert slo is target and "reachable here" in why and "TTFT 0.40 s" in why
    slow = {"ttft_p50_s": 1.5, "tpot_p50_s": 0.4, "completed": 3}  # TPOT alone misses 0.25 s
    slo, why = loadgen.slo_from_baseline(target, slow, factor=3)
    assert slo.ttft_s == pytest.approx(4.5) and slo.tpot_s == pytest.approx(1.2)
    assert "unreachable here" in why and "3× that" in why
    with pytest.raises(ValueError, match="did its requests complete"):
        loadgen.slo_from_baseline(target, {"ttft_p50_s": None, "tpot_p50_s": None})


def test_same_load_interleaves_the_servers_and_takes_medians(monkeypatch) -> None:
    calls = []

    def fake_run(url, **options):
        calls.append(url)
        n = calls.count(url)
        out = [client.RequestOutput(success=True, output_tokens=4, ttft_s=0.1 * n, e2e_s=0.1 * n + 0.3)]
        return loadgen.BenchmarkResult(outputs=out, duration_s=1.0 if url == "a" else 0.5, slo=options.get("slo"))

    monkeypatch.setattr(nb06_runs.loadgen, "run", fake_run)
    rows = nb06_runs.same_load({"lab": "a", "vllm": "b"}, 3, num_requests=1, slo=loadgen.SLO(ttft_s=0.25))
    assert all(sorted(calls[i:i + 2]) == ["a", "b"] for i in (0, 2, 4)), "one run of each per round, in a shuffled order"
    lab, vllm = rows
    assert lab["server"] == "lab" and lab["rounds"] == 3 and lab["requests"] == 3 and lab["failed"] == 0
    assert lab["samples"]["ttft_p50_s"] == pytest.approx([0.1, 0.2, 0.3]) and lab["ttft_p50_s"] == pytest.approx(0.2)
    assert lab["tpot_p50_s"] == pytest.approx(0.1) and vllm["request_throughput"] == pytest.approx(2.0)
    assert lab["samples"]["goodput"] == [1.0, 1.0, 0.0], "goodput at the SLO each round: the third misses TTFT"


def test_beside_vllm_without_vllm_says_run_make_vllm(tmp_path, monkeypatch) -> None:
    from labkit.serve.vllm import server as vllm_server

    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(tmp_path / "none" / "python"))
    out = nb06_runs.beside_vllm(vllm_server.Settings(model="/m"), {"lab": "http://127.0.0.1:9"}, 3)
    assert "rows" not in out and "run `make vllm`" in out["status"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PSS is a Linux figure")
def test_a_servers_memory_counts_pages_its_processes_share_once():
    """vllm serve's front end, engine core and workers share pages (forked, or the same libraries): summing their RSS
    counts those pages in each process; PSS counts them once. A parent and its forked child sharing 100 MiB."""
    import psutil

    code = ("import os, time\nblock = b'x' * (100 * 2**20)\nos.fork()\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while len(processes.group_pids(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        members = processes.group_pids(proc.pid)
        assert len(members) == 2, members
        rss = sum(psutil.Process(p).memory_info().rss for p in members)
        held, source = memory.processes_memory(processes.group_pids(proc.pid))
        assert source.startswith("PSS"), source
        assert 100 * 2**20 < held < 0.75 * rss, (held, rss)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10  # the forked child belongs to init now: gone once init has reaped it
    while processes.group_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert memory.processes_memory(processes.group_pids(proc.pid)) == (None, "no process of vllm serve's group could be read")

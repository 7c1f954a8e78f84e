"""labkit.serve.fleet.router: the command lines it builds, ports in use refused before anything starts, the start
deadline, a child that exits, the stop of the whole process group (on failure too), and the real router (smg)
in front of two tiny-random replicas: registration, round-robin shares, the routed-worker header, a flushed
prefix cache, a replica killed mid-run, and a router that fails to start."""
from __future__ import annotations

import signal
import socket
import sys
import threading
import time

import pytest
from processes import gone

from labkit.serve import processes
from labkit.serve import protocol
from labkit.serve.fleet import router
from labkit.serve.fleet import routing
from labkit.serve.vllm import server as vs


def test_replica_command_runs_the_lab_server_with_its_prefix_cache_on_one_thread():
    argv = router.replica_command(8101, model="tiny-random", threads=1, max_batch_size=4, prefix_cache_tokens=2048,
                                  python="/py")
    assert argv[:4] == ["/py", "-m", "labkit", "serve"]
    pairs = dict(zip(argv[4::1], argv[5::1]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8101" and pairs["--batching"] == "continuous"
    assert pairs["--prefix-cache-tokens"] == "2048" and pairs["--threads"] == "1" and pairs["--max-batch-size"] == "4"
    assert pairs["--model"] == "tiny-random"
    assert "--model" not in router.replica_command(1, python="/py"), "no model: labkit serve's default"
    env = router.replica_environment(1, base={"PATH": "/bin", "PYTHONPATH": "/lab"})
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONPATH"] == "/lab", "the replica runs this lab's package"
    with pytest.raises(ValueError, match="threads=0"):
        router.replica_command(1, threads=0)


def test_router_command_binds_loopback_metrics_included_and_names_bad_choices():
    argv = router.router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], 9000, 9001, policy="round_robin",
                                 health_interval_s=2, health_failure_threshold=3, python="/py")
    assert argv[:4] == ["/py", "-m", "smg", "launch"]
    pairs = dict(zip(argv[4::1], argv[5::1]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "9000" and pairs["--policy"] == "round_robin"
    assert pairs["--prometheus-host"] == "127.0.0.1", "smg's metrics listener binds every interface by default"
    assert pairs["--prometheus-port"] == "9001" and pairs["--health-check-interval-secs"] == "2"
    assert pairs["--health-failure-threshold"] == "3"
    assert argv[argv.index("--worker-urls") + 1:argv.index("--worker-urls") + 3] == ["http://127.0.0.1:1",
                                                                                      "http://127.0.0.1:2"]
    with pytest.raises(ValueError, match="choose one of .*cache_aware"):
        router.router_command(["http://127.0.0.1:1"], 1, 2, policy="fastest")
    with pytest.raises(ValueError, match="at least one replica"):
        router.router_command([], 1, 2)
    with pytest.raises(ValueError, match="health_interval_s"):
        router.router_command(["http://127.0.0.1:1"], 1, 2, health_interval_s=0)


def test_ports_in_use_are_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(router.PortInUse, match=f"port {port} on 127.0.0.1 is in use.*pick another port"):
            router.start_replicas(1, model=protocol.TINY_RANDOM, ports=[port], log_dir=tmp_path)
        with pytest.raises(router.PortInUse, match=f"port {port}"):
            router.start_router(["http://127.0.0.1:1"], port=port, log_dir=tmp_path)
    assert not list(tmp_path.iterdir()), "nothing was started, so no log was written"
    with pytest.raises(ValueError, match="distinct ports"):
        router.start_replicas(2, ports=[5, 5])
    assert len(set(router.free_ports(8))) == 8


HANGS = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck: only SIGKILL ends it
print("loading", flush=True)
print("ERROR: worker pool stalled", flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # a helper in its group
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


def test_a_child_that_never_gets_ready_fails_at_its_deadline_and_its_group_isgone(tmp_path, alarm):
    pids = tmp_path / "pids"
    child = router.spawn("stuck", [sys.executable, "-c", HANGS, str(pids)], "http://127.0.0.1:1", log_dir=tmp_path)
    while not pids.exists():
        time.sleep(0.05)
    t0 = time.monotonic()
    with pytest.raises(router.StartError, match=r"stuck did not get ready within 2 s: ERROR: worker pool stalled"):
        router.wait_ready(child, lambda: False, 2, "get ready")
    assert time.monotonic() - t0 < 2 + 2 + 5, "the deadline, then a 2 s grace before SIGKILL"
    leader, helper = map(int, pids.read_text().split())
    assert gone(leader) and gone(helper), "the whole process group is stopped, its helper included"
    assert child not in processes._LIVE


def test_a_child_that_exits_reports_its_logs_error_line_at_once(tmp_path, alarm):
    code = "import sys; print('Traceback (most recent call last):'); print('ValueError: bad flag', flush=True); sys.exit(3)"
    child = router.spawn("quits", [sys.executable, "-c", code], "http://127.0.0.1:1", log_dir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(router.StartError, match=r"quits exited with 3 before get ready: ValueError: bad flag"):
        router.wait_ready(child, lambda: False, 60, "get ready")
    assert time.monotonic() - t0 < 15, "an exit is seen at once, not at the deadline"
    assert (tmp_path / "quits.log").read_text().startswith("$ "), "the log starts with the command line"


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_failing_ready_check_or_an_interrupt_stops_the_child(tmp_path, failure, alarm):
    child = router.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(300)"], "http://127.0.0.1:1",
                         log_dir=tmp_path)

    def ready():
        raise failure("the cell failed")

    with pytest.raises(failure):
        router.wait_ready(child, ready, 30, "get ready")
    assert gone(child.proc.pid) and child not in processes._LIVE


def test_stop_sends_sigkill_after_the_grace_to_a_child_that_ignores_sigterm(tmp_path, alarm):
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('deaf' + ' now', flush=True); "
            "time.sleep(300)")
    child = router.spawn("deaf", [sys.executable, "-c", code], "http://127.0.0.1:1", log_dir=tmp_path)
    while "deaf now" not in child.log():  # (the log's first line, the command, holds the words apart)
        time.sleep(0.05)
    t0 = time.monotonic()
    assert child.stop(grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - t0 < 10 and gone(child.proc.pid)


# ---------------------------------------------------------------------------------------- the real router

needs_router = pytest.mark.skipif(not router.installed(), reason=router.MISSING)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with router.replicas(2, model=protocol.TINY_RANDOM, log_dir=tmp_path_factory.mktemp("fleet"),
                         prefix_cache_tokens=4096) as reps:
        yield reps


@needs_router
def test_round_robin_splits_a_workload_evenly_and_names_each_worker(fleet, tmp_path):
    from labkit.model import models

    convs = routing.workload(models.load_tokenizer(), 2, 2, 2, 48)
    with router.routed([r.url for r in fleet], "round_robin", log_dir=tmp_path) as rt:
        assert {w["runtime"] for w in rt.workers()} == {"generic"}, "labkit serve registers as an OpenAI-compatible worker"
        res = routing.run_policy(rt.url, "round_robin", fleet, convs, 3)
        assert rt.metrics().get("smg_worker_selection_total") == 8
    s = res["summary"]
    assert s["answered"] == 8 and s["failed"] == 0 and s["unrouted"] == 0
    assert [p["requests"] for p in res["replicas"]] == [4, 4], "round robin alternates"
    assert sum(p["cache_queries"] for p in res["replicas"]) == 8, "every request was looked up in a replica's cache"
    assert not rt.alive() and not rt.proc.returncode, "stopped cleanly at the end of the block"


@needs_router
def test_flush_cache_empties_a_replica_and_keeps_its_counters(fleet):
    from labkit.model import models

    convs = routing.workload(models.load_tokenizer(), 1, 1, 2, 48)
    routing.run(fleet[0].url, convs, 2)
    before = fleet[0].metrics()
    assert before["labkit_prefix_cache_tokens"] > 0
    assert fleet[0].flush_cache() >= 1
    after = fleet[0].metrics()
    assert after["labkit_prefix_cache_tokens"] == 0
    assert after["labkit_prefix_cache_queries_total"] == before["labkit_prefix_cache_queries_total"]


@needs_router
def test_a_replica_killed_mid_run_is_dropped_and_every_request_is_answered_or_counted(tmp_path, alarm):
    from labkit.model import models

    convs = routing.workload(models.load_tokenizer(), 2, 3, 4, 48)
    with router.replicas(2, model=protocol.TINY_RANDOM, log_dir=tmp_path) as reps:
        with router.routed([r.url for r in reps], "round_robin", log_dir=tmp_path) as rt:
            killer = threading.Timer(0.3, reps[1].kill)
            killer.start()
            records = routing.run(rt.url, convs, 8, timeout_s=60)
            killer.join()
            deadline = time.monotonic() + 20
            while reps[1].url in rt.healthy_urls() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert rt.healthy_urls() == [reps[0].url], "the health check dropped the dead replica"
            after = routing.run(rt.url, convs[:1], 2, timeout_s=60)
    assert len(records) == 24, "every planned turn is a row: answered, failed, or not sent after a failure"
    assert all(r["ok"] or r["error"] for r in records), "a failure says why"
    assert all(r["ok"] and r["worker"] == reps[0].url for r in after), "the survivor answers everything"


@needs_router
def test_a_router_that_fails_to_start_says_why_within_its_deadline(fleet, tmp_path, alarm):
    t0 = time.monotonic()
    with pytest.raises(router.StartError, match=r"exited with \d+ before registering.*cache_threshold"):
        router.start_router([r.url for r in fleet], "cache_aware", extra_args=("--cache-threshold", "1.5"),
                            deadline_s=30, log_dir=tmp_path)
    assert time.monotonic() - t0 < 30


def test_a_missing_router_names_the_fix(monkeypatch):
    monkeypatch.setattr(router, "installed", lambda: False)
    with pytest.raises(router.RouterUnavailable, match="make setup"):
        router.start_router(["http://127.0.0.1:1"])


def test_vllm_replicas_say_why_they_cannot_start_without_vllm(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(vs.VLLMUnavailable, match="make vllm"):
        router.start_vllm_replicas(2, vs.Settings(model="/m"), log_dir=tmp_path)

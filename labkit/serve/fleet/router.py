"""Replicas behind a real router: N ``labkit serve`` processes (or ``vllm serve``, from vLLM's environment) on
127.0.0.1 and smg, the Shepherd Model Gateway from PyPI, in front of them. Every one is a child process in a
process group of its own, with its log under ``build/scale_out/``, started within a deadline and always
stopped (SIGTERM to the group, SIGKILL after a grace), also when a cell fails, at interpreter exit, and when a
start fails. A start that fails raises ``StartError`` with the log's error line; a port already taken raises
``PortInUse`` before anything starts.

Why smg (1.13): three routers are on PyPI as prebuilt wheels, and each was run here in front of two
``labkit serve`` replicas.
- smg 1.13 has wheels for Linux x86-64 and Arm, macOS (Apple silicon and Intel) and Windows: the most
  laptops. It registers ``labkit serve`` as a "generic" OpenAI-compatible worker (it probes ``/health``, then
  ``/v1/models`` for the engine, ``/version`` (vLLM) and ``/server_info`` (SGLang), and reads
  ``/get_model_info``), health-checks it on ``/health`` every ``--health-check-interval-secs``, forwards each
  request body untouched, names the worker it chose in the ``x-smg-routed-worker-id`` response header, lists
  its workers at ``GET /workers`` and serves Prometheus metrics on a port of their own
  (``smg_worker_selection_total``, ``smg_cache_aware_policy_branch_total``, ...). Policies: round_robin,
  cache_aware (a radix tree of the text each worker was sent; the longest match wins while its share of
  the request reaches ``--cache-threshold``, unless the worker's load is too far above the others'),
  consistent_hashing (session affinity on the ``x-smg-routing-key`` header), prefix_hash, power_of_two,
  manual, random.
- sglang-router 0.3.2 has no Linux Arm wheel (pip falls back to a 0.0.1 placeholder) and vllm-router 0.1.17
  is Linux-only. Both add SGLang's sampling fields (``no_stop_trim``, ``continue_final_message``, ...) to every
  request body, which ``labkit serve`` refuses by name (HTTP 400): neither works with the lab's server as is.

The router runs in this environment (``python -m smg launch``; ``make setup`` installs it, the ``[router]``
extra); the replicas run ``python -m labkit serve --batching continuous --prefix-cache-tokens N --threads 1``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import config, env
from .. import metrics as prom
from .. import processes
from ..vllm import server as vllm_server
from ..processes import Child, StartError, free_ports, stop_all, wait_for, wait_ready  # noqa: F401 (used as router.*)

ROUTER_PACKAGE = "smg"  # pyproject's [router] extra pins the version
POLICIES = ("round_robin", "cache_aware", "consistent_hashing", "prefix_hash", "power_of_two", "manual", "random")
ROUTED_HEADER = "x-smg-routed-worker-id"  # the response header naming the worker smg chose
ROUTING_KEY_HEADER = "x-smg-routing-key"  # the request header consistent_hashing and manual route on
LOG_DIR = config.REPO_DIR / "build" / "scale_out"
MISSING = "the router (smg) is not installed here: run `make setup`, or pip install 'labkit[router]'"


class RouterUnavailable(env.Unavailable):
    """The router cannot run here; the message names the fix."""


class PortInUse(StartError):
    """A port asked for is taken; nothing was started."""


def check_port(port: int) -> None:
    """``PortInUse`` (one line) when 127.0.0.1:``port`` cannot be bound."""
    processes.check_port(port, PortInUse)


def _ports(n: int, ports: Sequence[int] | None) -> list[int]:
    if ports is None:
        return free_ports(n)
    ports = list(ports)
    if len(ports) != n or len(set(ports)) != n:
        raise ValueError(f"ports={ports}: give {n} distinct ports (one per process), or None for free ones")
    for port in ports:
        check_port(port)
    return ports


def spawn(name: str, argv: list[str], url: str, *, child_env: Mapping[str, str] | None = None,
          log_dir: Path | None = None, kind: type[Child] = Child) -> Child:
    """``processes.spawn`` with the log under ``build/scale_out/`` unless ``log_dir`` says otherwise."""
    return processes.spawn(name, argv, url, log_dir=Path(log_dir or LOG_DIR), child_env=child_env, kind=kind)


# ---------------------------------------------------------------------------------------- replicas


class Replica(Child):
    """One ``labkit serve`` (or, via ``start_vllm_replicas``, the same methods on ``vllm serve``)."""

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as one number per metric name (labels summed)."""
        return prom.totals(self.url)

    def healthy(self) -> bool:
        try:
            self.get("/health", timeout_s=2.0)
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def flush_cache(self) -> int:
        """Drop the replica's prefix cache (``POST /flush_cache``); returns the entries dropped."""
        return int(self.post("/flush_cache").get("flushed", 0))


def replica_command(port: int, *, model: str | None = None, dtype: str = "fp32", threads: int = 1,
                    max_batch_size: int = 8, prefix_cache_tokens: int = 8192, python: str | None = None) -> list[str]:
    """``labkit serve`` for one replica: continuous batching, the prefix cache on, ``threads`` torch threads."""
    for name, value in (("threads", threads), ("max_batch_size", max_batch_size),
                        ("prefix_cache_tokens", prefix_cache_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: a positive integer")
    argv = [python or sys.executable, "-m", "labkit", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--batching", "continuous", "--prefix-cache-tokens", str(prefix_cache_tokens),
            "--max-batch-size", str(max_batch_size), "--threads", str(threads), "--dtype", dtype]
    return argv + (["--model", model] if model else [])


def replica_environment(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The replica's environment: ``threads`` OpenMP threads (no oversubscribed cores), unbuffered output."""
    child = dict(os.environ if base is None else base)
    child.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return child


def start_replicas(n: int, *, model: str | None = None, ports: Sequence[int] | None = None, deadline_s: float = 180.0,
                   log_dir: Path | None = None, threads: int = 1, **options: Any) -> list[Replica]:
    """Start ``n`` replicas of ``labkit serve`` at once and wait until each answers ``/health``. ``options``:
    ``dtype``, ``max_batch_size``, ``prefix_cache_tokens`` (``replica_command``). On any failure every replica
    started is stopped, and ``StartError`` names the one that failed with its log's error line."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: at least one replica")
    chosen = _ports(n, ports)
    replicas: list[Replica] = []
    try:
        for i, port in enumerate(chosen):
            argv = replica_command(port, model=model, threads=threads, **options)
            replicas.append(spawn(f"replica-{i}-{port}", argv, f"http://127.0.0.1:{port}",
                                  child_env=replica_environment(threads), log_dir=log_dir, kind=Replica))
        for rep in replicas:
            wait_ready(rep, rep.healthy, deadline_s, "answering /health")
    except BaseException:
        stop_all(replicas)
        raise
    return replicas


def start_vllm_replicas(n: int, settings: vllm_server.Settings, *, deadline_s: float = 300.0,
                        log_dir: Path | None = None) -> list[vllm_server.VLLMServer]:
    """``n`` ``vllm serve`` replicas from vLLM's environment, one after the other (each checks its memory); on a
    CPU each is bound to its own share of the cores. ``vllm_server.VLLMUnavailable`` says why they cannot run."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    servers: list[vllm_server.VLLMServer] = []
    try:
        for i in range(n):
            s = settings
            if s.device == "cpu" and s.cpu_cores is None and len(cores) >= n:
                share = cores[i * len(cores) // n:(i + 1) * len(cores) // n]
                s = dataclasses.replace(settings, cpu_cores=",".join(map(str, share)))
            servers.append(vllm_server.start(s, deadline_s=deadline_s, log_dir=log_dir or LOG_DIR,
                                             name=f"vllm-replica-{i}"))
    except BaseException:
        stop_all(servers)
        raise
    return servers


# ---------------------------------------------------------------------------------------- the router


class Router(Child):
    """smg in front of the replicas: its URL, the policy it runs, its workers and its metrics."""

    policy: str = ""
    metrics_url: str = ""

    def workers(self) -> list[dict[str, Any]]:
        """Each registered worker: its URL, whether smg counts it healthy, and its status."""
        data = json.loads(self.get("/workers"))
        return [{"url": w.get("url"), "healthy": bool(w.get("is_healthy")), "status": w.get("status"),
                 "runtime": w.get("runtime_type")} for w in data.get("workers", [])]

    def healthy_urls(self) -> list[str]:
        return sorted(w["url"] for w in self.workers() if w["healthy"])

    def metrics(self) -> dict[str, float]:
        return prom.metric_totals(self.scrape())

    def scrape(self) -> list[tuple[str, dict[str, str], float]]:
        """Every metric sample with its labels (per worker, per policy branch)."""
        return prom.scrape(self.metrics_url)


def installed() -> bool:
    return importlib.util.find_spec(ROUTER_PACKAGE) is not None


def router_command(worker_urls: Sequence[str], port: int, metrics_port: int, *, policy: str = "cache_aware",
                   health_interval_s: int = 1, health_failure_threshold: int = 2, extra_args: Sequence[str] = (),
                   python: str | None = None) -> list[str]:
    """``smg launch`` on 127.0.0.1:``port`` (metrics on 127.0.0.1:``metrics_port``) in front of ``worker_urls``."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: choose one of {list(POLICIES)}")
    if not worker_urls:
        raise ValueError("worker_urls=[]: the router needs at least one replica's URL")
    for name, value in (("health_interval_s", health_interval_s), ("health_failure_threshold", health_failure_threshold)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: a positive integer (smg takes whole seconds and counts)")
    return [python or sys.executable, "-m", ROUTER_PACKAGE, "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),  # smg's default is every interface
            "--health-check-interval-secs", str(health_interval_s),
            "--health-failure-threshold", str(health_failure_threshold),
            "--shutdown-grace-period-secs", "1",  # no load balancer to drain on loopback: stop in 1 s, not 5
            *extra_args]


def start_router(worker_urls: Sequence[str], policy: str = "cache_aware", *, port: int | None = None,
                 metrics_port: int | None = None, deadline_s: float = 60.0, health_interval_s: int = 1,
                 health_failure_threshold: int = 2, extra_args: Sequence[str] = (), log_dir: Path | None = None,
                 name: str | None = None) -> Router:
    """Start smg and wait until every worker is registered and healthy (``GET /workers``)."""
    if not installed():
        raise RouterUnavailable(MISSING)
    spare = iter(free_ports(2))
    port, metrics_port = _ports(2, [port if port is not None else next(spare),
                                    metrics_port if metrics_port is not None else next(spare)])
    argv = router_command(worker_urls, port, metrics_port, policy=policy, health_interval_s=health_interval_s,
                          health_failure_threshold=health_failure_threshold, extra_args=extra_args)
    router = spawn(name or f"router-{policy}-{port}", argv, f"http://127.0.0.1:{port}",
                   child_env={**os.environ, "NO_COLOR": "1"}, log_dir=log_dir, kind=Router)
    assert isinstance(router, Router)
    router.policy, router.metrics_url = policy, f"http://127.0.0.1:{metrics_port}"
    want = sorted(worker_urls)
    wait_ready(router, lambda: router.healthy_urls() == want, deadline_s,
               f"registering its {len(want)} worker{'s' * (len(want) != 1)} as healthy")
    return router


@contextlib.contextmanager
def replicas(n: int, **kwargs: Any) -> Iterator[list[Replica]]:
    """``with router.replicas(2) as reps:`` — ``start_replicas``, stopped at the end of the block."""
    reps = start_replicas(n, **kwargs)
    try:
        yield reps
    finally:
        stop_all(reps)


@contextlib.contextmanager
def routed(worker_urls: Sequence[str], policy: str = "cache_aware", **kwargs: Any) -> Iterator[Router]:
    """``with router.routed(urls, "cache_aware") as r:`` — ``start_router``, stopped at the end of the block."""
    r = start_router(worker_urls, policy, **kwargs)
    try:
        yield r
    finally:
        r.stop()

"""Starting and stopping the lab's server: in a thread of this process (``start_server``, a ``ServerHandle``)
or in its own process (``start_process``, a ``ProcessHandle``), and ``run_server``, a context manager for
either that always stops what it started and lets the model go; ``run_in_child``, one call in a fresh
process's main thread; ``Background`` and ``BackgroundApp``, an async app on a thread and loop of its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import queue as _queue
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import fields
from typing import Any

from ..core import config
from . import processes
from .protocol import ServerConfig, server_config
from .server import Server, load_model

LISTENING = "labkit serve: listening on "  # the line a subprocess prints once its port is bound
LOG_DIR = config.REPO_DIR / "build" / "serve"  # start_process's logs


# ------------------------------------------------------------------------- an async app on a thread of its own


class Background:
    """``start()`` then ``serve()``, two coroutines, on an event loop of their own in a daemon thread: the one way
    the lab runs an async app (the lab's server, a proxy) beside a notebook's own loop. ``wait_started`` returns
    once ``start`` returned or raised (``failure``); the loop closes when ``serve`` ends."""

    def __init__(self, start: Callable[[], Awaitable[Any]], serve: Callable[[], Awaitable[Any]], name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.failure: BaseException | None = None
        self._started = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                try:
                    self.loop.run_until_complete(start())
                except BaseException as exc:  # noqa: BLE001  every start-up failure goes back to the caller
                    self.failure = exc
                    return
                finally:
                    self._started.set()
                self.loop.run_until_complete(serve())
            finally:
                self.loop.close()

        self.thread = threading.Thread(target=main, name=name, daemon=True)
        self.thread.start()

    def wait_started(self, timeout_s: float) -> bool:
        """True once ``start`` returned or raised (see ``failure``); False when ``timeout_s`` passed first."""
        return self._started.wait(timeout_s)


class BackgroundApp:
    """An aiohttp app on 127.0.0.1, on a free port, served by a ``Background`` thread; ``url`` once started,
    ``stop()`` closes it."""

    def __init__(self, make_app: Callable[[], Any], startup_timeout_s: float = 10.0, name: str = "labkit-app") -> None:
        from aiohttp import web

        self.url, self._runner = "", None
        self._stopped: asyncio.Event | None = None

        async def start() -> None:
            self._stopped = asyncio.Event()
            self._runner = web.AppRunner(make_app(), handle_signals=False, access_log=None, shutdown_timeout=2.0)
            await self._runner.setup()
            try:
                await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            except BaseException:
                await self._runner.cleanup()
                raise
            self.url = "http://127.0.0.1:%d" % self._runner.addresses[0][1]

        async def serve() -> None:
            try:
                await self._stopped.wait()
            finally:
                await self._runner.cleanup()

        self._bg = Background(start, serve, name)
        if not self._bg.wait_started(startup_timeout_s) or self._bg.failure is not None:
            self.stop()
            raise RuntimeError(f"the app did not start: {self._bg.failure or 'no port within the timeout'}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._bg.thread.is_alive() and self._stopped is not None:
            self._bg.loop.call_soon_threadsafe(self._stopped.set)
        self._bg.thread.join(timeout_s)
        if self._bg.thread.is_alive():
            raise RuntimeError(f"the app at {self.url} did not stop within {timeout_s:g} s")


# ------------------------------------------------------------------------- running it: thread/process


class ServerHandle:
    """A server running in a background thread of this process (``run_server``/``start_server``)."""

    def __init__(self, server: Server, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.server = server
        self._loop = loop
        self._thread = thread
        assert server.url is not None
        self.url: str = server.url

    def __str__(self) -> str:
        return self.url

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self.server.closing

    @property
    def config(self) -> ServerConfig:
        return self.server.cfg

    def configure(self, max_batch_size: int | None = None, max_wait_ms: float | None = None) -> None:
        """Change dynamic batching while the server runs (the next batch uses it)."""
        self.server.batcher.configure(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)

    def stats(self) -> dict[str, Any]:
        return self.server.metrics.snapshot()

    def flush_cache(self) -> int:
        """Drop the prefix cache's entries, its disk tier's files too (``POST /flush_cache``); returns how many."""
        req = urllib.request.Request(self.url + "/flush_cache", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(json.loads(resp.read().decode("utf-8") or "{}").get("flushed", 0))

    def set_spill(self, policy: Callable[[int], bool] | None) -> None:
        """The prefix cache's disk-tier policy while the server runs: ``policy(positions)`` says whether an evicted
        entry of that many positions is written to disk (None: every one). Needs ``prefix_cache_disk_dir``."""
        if not self.server.cfg.prefix_cache_disk_dir:
            raise ValueError("this server has no disk tier: start it with prefix_cache_disk_dir (and a prefix cache)")
        if policy is not None and not callable(policy):
            raise ValueError(f"policy={policy!r}: a function of an entry's positions returning True to spill it")
        self.server.batcher.spill = policy

    def reset_stats(self) -> None:
        """Fresh counters and histograms (between experiments on one server)."""
        self.server.metrics.reset()

    def stop(self, timeout_s: float | None = None) -> None:
        """Answer queued requests, let running ones finish (drain_s), close the port, end the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.server.request_stop)
            self._thread.join(timeout_s if timeout_s is not None else self.server.cfg.drain_s + 90)
        if self._thread.is_alive():
            raise RuntimeError(f"server at {self.url} did not stop in time")

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_server(model: Any = None, *, server_class: type[Server] | None = None, startup_timeout_s: float = 60.0,
                 **options: Any) -> ServerHandle:
    """Load (or reuse) a model and serve it from a background thread; returns once the port is bound.

    ``model``: a ``models.Loaded`` (shared, not copied), a name/directory, 'tiny-random' or None (default).
    ``options``: any ``ServerConfig`` field, e.g. ``port=0`` (an ephemeral port; see ``handle.url``).
    ``server_class``: a ``Server`` subclass; default ``Server``, whose batching loop ``batching`` names.
    Any start-up failure is raised here; a start that takes longer than ``startup_timeout_s`` is an error.
    """
    cfg = server_config(**{"port": 0, **options})
    lm = load_model(model if model is not None else cfg.model, cfg.dtype)
    server = (server_class or Server)(lm, cfg)
    bg = Background(server.start, server.serve_until_stopped, "labkit-server")
    if not bg.wait_started(startup_timeout_s):
        bg.loop.call_soon_threadsafe(server.request_stop)
        raise RuntimeError(f"the server did not start within {startup_timeout_s:g} s; raise startup_timeout_s "
                           "on a slow machine, or look for a stuck model load")
    if bg.failure is not None:
        exc = bg.failure
        if isinstance(exc, OSError):  # the port is taken or the host cannot be bound
            raise ValueError(f"cannot listen on {cfg.host}:{cfg.port} ({exc}); choose another port, or port=0") from exc
        raise RuntimeError(f"the server failed to start: {type(exc).__name__}: {exc}") from exc
    return ServerHandle(server, bg.loop, bg.thread)


class ProcessHandle(processes.Child):
    """A server in a child process (``python -m labkit serve``): its own interpreter, GIL and threads, in a process
    group of its own under the one supervisor (``labkit.serve.processes``), its output in ``build/serve/``."""

    stop_grace_s = 60.0  # SIGTERM is graceful: queued requests are answered first, then SIGKILL

    def __str__(self) -> str:
        return self.url

    @property
    def running(self) -> bool:
        return self.alive()

    @property
    def output(self) -> list[str]:
        """What the server printed so far (the log without its command line)."""
        return self.log().splitlines()[1:]

    def __enter__(self) -> "ProcessHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_process(model: str | None = None, startup_timeout_s: float = 120.0, **options: Any) -> ProcessHandle:
    """Start ``python -m labkit serve`` with these options on a free port; return once it listens."""
    cfg = server_config(**{"port": 0, **options, **({"model": model} if model is not None else {})})
    argv = [sys.executable, "-m", "labkit", "serve", "--host", cfg.host, "--port", str(cfg.port)]
    for f in fields(ServerConfig):
        value = getattr(cfg, f.name)
        if f.name in ("host", "port") or value is None or value == f.default:
            continue
        if f.name == "drop_finished":
            argv.append("--no-drop-finished")
        else:
            argv += [f"--{f.name.replace('_', '-')}", str(value)]
    handle = processes.spawn("labkit serve", argv, "", log_dir=LOG_DIR, log_name=f"serve-{uuid.uuid4().hex[:8]}",
                             child_env={**os.environ, "PYTHONUNBUFFERED": "1"}, kind=ProcessHandle)

    def listening() -> bool:  # the line the server prints once its port is bound names its URL
        line = next((ln for ln in handle.output if ln.startswith(LISTENING)), None)
        if line is not None:
            handle.url = line[len(LISTENING):].strip()
        return line is not None

    try:
        processes.wait_ready(handle, listening, startup_timeout_s, "start listening", poll_s=0.1)
    except processes.StartError as exc:
        raise RuntimeError(f"`{' '.join(argv)}` did not start listening: {exc}\n" + "\n".join(handle.output[-20:])) from None
    return handle


@contextlib.contextmanager
def run_server(model: Any = None, *, subprocess: bool = False, **options: Any) -> Iterator[Any]:
    """``with run_server(port=0, max_batch_size=8) as srv: ... srv.url ...`` — started, then stopped.

    ``subprocess=True`` runs ``python -m labkit serve`` in a child process (``model`` must then be a name).
    """
    if subprocess:
        if model is not None and not isinstance(model, str):
            raise ValueError("subprocess=True loads the model in the child: pass a name, 'tiny-random' or None")
        handle: Any = start_process(model, **options)
    else:
        handle = start_server(model, **options)
    try:
        yield handle
    finally:
        handle.stop()


# ------------------------------------------------------------------------- one call in a process of its own


def _child_main(results_queue: Any, visible: str | None, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
    """What ``run_in_child``'s process runs, in its main thread: ``fn(*args, **kwargs)``, its result or error
    put on ``results_queue``."""
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible  # before anything in this process starts CUDA
    try:
        results_queue.put(("ok", fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, which raises it as the check's failure)
        text = str(exc).strip().splitlines()
        results_queue.put(("error", f"{type(exc).__name__}: {text[0][:300] if text else ''}"))


def _visible_devices(device: str) -> str | None:
    """CUDA_VISIBLE_DEVICES for a child process that must see only the GPU ``device`` names ("cuda:1"), as its
    cuda:0; None for plain "cuda" (the child sees what this process sees)."""
    import torch

    index = torch.device(device).index if device.startswith("cuda") else None
    if index is None:
        return None
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return str(index)
    if index >= len(visible):
        raise ValueError(f"{device} does not exist: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} "
                         f"makes {len(visible)} device(s) visible")
    return visible[index]


def run_in_child(fn: Callable[..., Any], *args: Any, device: str = "cuda", timeout_s: float = 570.0,
                 **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a fresh process (spawned: no CUDA state inherited), in that process's main
    thread, where vLLM may install its signal handlers (the preflight runs its checks in worker threads). The
    child sees only ``device``'s GPU. Returns what ``fn`` returned; raises ``RuntimeError`` with the child's
    error, when it dies without answering, or when it is still running after ``timeout_s`` (then it is killed)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s}: must be positive")
    mp = multiprocessing.get_context("spawn")
    results_queue = mp.Queue()
    name = getattr(fn, "__name__", "call")
    child = mp.Process(target=_child_main, args=(results_queue, _visible_devices(device), fn, args, kwargs),
                       name=f"labkit {name}")
    child.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                status, value = results_queue.get(timeout=0.5)
                break
            except _queue.Empty:
                if not child.is_alive() and results_queue.empty():
                    raise RuntimeError(f"{name}'s process ended (exit code {child.exitcode}) without an answer") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} still running in its process after {timeout_s:.0f} s") from None
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    if status != "ok":
        raise RuntimeError(f"in a process of its own: {value}")
    return value

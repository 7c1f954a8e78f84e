"""The server's job queue. ``Batcher`` collects waiting ``Job``s into a batch (up to ``max_batch_size``, waiting
at most ``max_wait_ms``) and runs it on ``decoder.decode_batch`` in its own thread; ``ContinuousBatcher``
admits new jobs into the running batch at every token boundary instead. Both stream tokens to the waiting
request and record the server's metrics. A job with a compiled grammar (``decoding.grammar.Grammar``) decodes under
its own ``decoding.grammar.Constraint``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.checks import model_device
from ..core.timing import bind_thread, clock
from ..decoding import grammar as structured
from . import decoder
from .continuous import ContinuousEngine
from .prefix_cache import PrefixCache
from .metrics import Metrics
from .protocol import ApiError, Params, ServerConfig

log = logging.getLogger("labkit.serve")


# ------------------------------------------------------------------------------------ jobs and batcher


class Job:
    """One admitted request: its prompt, and a channel the model thread pushes events into.

    Events: ('token', token_id, finish_reason or None) and ('error', http_status, message).
    """

    def __init__(self, prompt_ids: list[int], params: Params, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        # params.response_format compiled for the served tokenizer (the server sets it after stamping the arrival,
        # so the compile counts in TTFT); None: free text
        self.grammar: structured.Grammar | None = None
        self.loop = loop
        self.events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.arrival = clock()
        self.started: float | None = None
        self.cancelled = False  # set when the client went away: the model thread drops it
        self.answered = False  # a final event (last token or error) has been pushed
        self.seq: decoder.Sequence | None = None  # the decode sequence, once the batcher made it

    def push(self, event: tuple[Any, ...]) -> None:
        """Called from the model thread."""
        if event[0] == "error" or event[2] is not None:
            self.answered = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def fail(self, status: int, message: str) -> None:
        if not self.answered:
            self.push(("error", status, message))

    def sequence(self, eos: set[int] | None = None) -> decoder.Sequence:
        """The decode sequence for this request: its tokens are pushed to it as they come. With a grammar it
        gets a fresh ``decoding.grammar.Constraint`` whose stop tokens are ``eos``."""
        constraint = structured.Constraint(self.grammar, eos) if self.grammar is not None else None
        self.seq = decoder.Sequence(prompt_ids=self.prompt_ids, max_new_tokens=self.params.max_tokens,
                                    ignore_eos=self.params.ignore_eos, on_token=lambda t, r: self.push(("token", t, r)),
                                    cancelled=lambda: self.cancelled, sampling=self.params.sampling, owner=self,
                                    constraint=constraint)
        return self.seq


class Batcher:
    """The bounded queue and the batching loop (a model thread)."""

    def __init__(self, lm: Any, cfg: ServerConfig, metrics: Metrics) -> None:
        self.lm = lm
        self.cfg = cfg
        self.metrics = metrics
        self.eos = decoder.eos_ids(lm.model, lm.tokenizer)
        self.pad_id = lm.tokenizer.pad_token_id
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abort = threading.Event()
        self.running = 0
        self._thread = threading.Thread(target=self._serve, name="labkit-batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        """The model thread: on the model's GPU (its unnamed synchronise and allocations go there), then the loop."""
        bind_thread(model_device(self.lm.model))
        self._loop()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def settings(self) -> tuple[int, float]:
        """(max_batch_size, max_wait_ms) as they are now; ``configure`` changes them under the same lock."""
        with self._cond:
            return self.cfg.max_batch_size, self.cfg.max_wait_ms

    @property
    def aborting(self) -> bool:
        return self._abort.is_set()

    def counters(self) -> dict[str, tuple[str, float]]:
        """Extra Prometheus counters of this batching loop (name -> (help, value))."""
        return {}

    def gauges(self) -> dict[str, tuple[str, float]]:
        """Extra Prometheus gauges of this batching loop (name -> (help, value))."""
        return {}

    def take(self, room: int, wait: bool) -> list[Job] | None:
        """Up to ``room`` queued requests, oldest first (those whose client left are dropped); with
        ``wait``, blocks until there is at least one. None once the server is closing."""
        with self._cond:
            while wait and not self._queue and not self._closing:
                self._cond.wait()
            if self._closing:
                return None
            jobs: list[Job] = []
            while self._queue and len(jobs) < room:
                job = self._queue.popleft()
                if not job.cancelled:  # its client left while it waited: nobody to answer
                    jobs.append(job)
            return jobs

    def begin(self, job: Job) -> decoder.Sequence:
        """Stamp the request's start (queue-wait metric) and make its decode sequence."""
        job.started = clock()
        self.metrics.observe(self.metrics.queue_wait, job.started - job.arrival)
        return job.sequence(self.eos)

    def configure(self, max_batch_size: int | None = None, max_wait_ms: float | None = None) -> None:
        """Change batching while serving; the next batch uses the new values."""
        with self._cond:
            new = replace(self.cfg, max_batch_size=self.cfg.max_batch_size if max_batch_size is None else max_batch_size,
                          max_wait_ms=self.cfg.max_wait_ms if max_wait_ms is None else max_wait_ms).check()
            self.cfg.max_batch_size, self.cfg.max_wait_ms = new.max_batch_size, new.max_wait_ms
            self._cond.notify_all()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closing:
                raise ApiError(503, "server is shutting down; retry against another instance")
            if len(self._queue) >= self.cfg.max_queue:
                raise ApiError(503, f"queue is full ({self.cfg.max_queue} requests waiting); retry later")
            self._queue.append(job)
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse new requests and answer every queued one with 503."""
        with self._cond:
            self._closing = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in pending:
            job.fail(503, "server is shutting down; the request was not started")

    def abort(self) -> None:
        """Stop the running batch after its current step (its requests get an error)."""
        self._abort.set()

    def join(self, timeout_s: float | None) -> bool:
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _next_batch(self) -> list[Job] | None:
        with self._cond:
            while True:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return None
                # wait for company, counted from the oldest request's arrival, never past max_wait_ms
                deadline = self._queue[0].arrival + self.cfg.max_wait_ms / 1e3
                while len(self._queue) < self.cfg.max_batch_size and not self._closing:
                    remaining = deadline - clock()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._closing:
                    return None
                batch = self.take(self.cfg.max_batch_size, wait=False)  # the condition's lock is re-entrant
                if batch:
                    return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self.running = len(batch)
            try:
                self._run(batch)
            except Exception as exc:  # keep serving: this batch's requests get a 500, the next batch runs
                log.exception("batch of %d failed", len(batch))
                for job in batch:
                    job.fail(500, f"generation failed: {type(exc).__name__}: {exc}")
            finally:
                self.running = 0

    def _run(self, batch: list[Job]) -> None:
        seqs = [self.begin(job) for job in batch]
        self.metrics.observe(self.metrics.batch_size, len(batch))
        decoder.decode_batch(self.lm.model, seqs, self.eos, self.pad_id, drop_finished=self.cfg.drop_finished,
                              should_abort=lambda: self.aborting)
        for job, seq in zip(batch, seqs):
            if seq.finish_reason == "aborted":
                job.fail(503, "server is shutting down; generation was stopped")


# ------------------------------------------------------------------------------- continuous batching server


class ContinuousBatcher(Batcher):
    """``labkit.serve``'s batcher with continuous batching: queued requests join the running batch at the
    next token boundary (up to ``max_batch_size`` running), and each leaves when done. ``max_wait_ms`` is
    not used: nobody waits for company, a new request starts at the next step. The batch-size metric is
    observed once per decode step. ``prefix_cache_tokens`` and ``prefill_chunk_tokens`` (ServerConfig)
    turn on the prefix cache and chunked prefill of ``ContinuousEngine``."""

    prefix_cache: PrefixCache | None = None
    spill: Callable[[int], bool] | None = None  # the disk tier's policy, read at every eviction (None: spill every entry)

    def _spill(self, positions: int) -> bool:
        return self.spill is None or bool(self.spill(positions))

    def _prefix_cache_metrics(self) -> tuple[dict[str, tuple[str, float]], dict[str, tuple[str, float]]]:
        """The prefix cache's (counters, gauges) for /metrics; both empty when the cache is off."""
        pc = self.prefix_cache
        if pc is None:
            return {}, {}
        counters = {"labkit_prefix_cache_queries_total": ("Prompts looked up in the prefix cache", pc.queries),
                    "labkit_prefix_cache_hits_total": ("Prompts that reused a cached prefix", pc.hits),
                    "labkit_prefix_cache_hit_tokens_total": ("Prompt positions reused instead of prefilled",
                                                             pc.hit_tokens),
                    "labkit_prefix_cache_query_tokens_total": ("Prompt positions looked up", pc.query_tokens),
                    "labkit_prefix_cache_disk_hits_total": ("Entries read back from the disk tier", pc.disk_hits),
                    "labkit_prefix_cache_disk_writes_total": ("Evicted entries written to the disk tier",
                                                              pc.disk_writes),
                    "labkit_prefix_cache_disk_failures_total": ("Disk-tier files missing or unreadable: recomputed",
                                                                pc.disk_failures)}
        gauges = {"labkit_prefix_cache_tokens": ("KV positions held by the prefix cache", pc.tokens),
                  "labkit_prefix_cache_capacity_tokens": ("Prefix cache bound, positions", pc.capacity_tokens),
                  "labkit_prefix_cache_hit_rate": ("Share of prompts that reused a cached prefix",
                                                   pc.hits / pc.queries if pc.queries else 0.0)}
        return counters, gauges

    def counters(self) -> dict[str, tuple[str, float]]:
        return self._prefix_cache_metrics()[0]

    def gauges(self) -> dict[str, tuple[str, float]]:
        return self._prefix_cache_metrics()[1]

    def _loop(self) -> None:
        prefix = (PrefixCache(self.cfg.prefix_cache_tokens, disk_dir=self.cfg.prefix_cache_disk_dir, spill=self._spill)
                  if self.cfg.prefix_cache_tokens else None)
        engine = ContinuousEngine(self.lm.model, self.eos, self.pad_id,
                                  prefill_chunk_tokens=self.cfg.prefill_chunk_tokens, prefix_cache=prefix)
        self.prefix_cache = prefix
        closing = False
        while True:
            room = self.settings()[0] - engine.load
            jobs = [] if closing else self.take(max(room, 0), wait=not engine.busy)
            if jobs is None:  # closing: queued requests got 503 in close(); running ones finish (drain)
                closing, jobs = True, []
            if closing and not engine.busy:
                return
            for job in jobs:  # each admission on its own: one bad request fails alone
                try:
                    engine.admit(self.begin(job))
                except Exception as exc:
                    log.exception("admitting a request failed")
                    job.fail(500, f"generation failed: {type(exc).__name__}: {exc}")
            if engine.busy:
                self.running = engine.load
                if engine.active:
                    self.metrics.observe(self.metrics.batch_size, len(engine.active))
                try:
                    engine.step()
                except Exception as exc:  # keep serving: the running requests get a 500, the queue goes on
                    log.exception("continuous batch of %d failed", len(engine.active))
                    for seq in engine.abort():
                        seq.owner.fail(500, f"generation failed: {type(exc).__name__}: {exc}")
            if self.aborting:
                for seq in engine.abort():
                    seq.owner.fail(503, "server is shutting down; generation was stopped")
            self.running = engine.load

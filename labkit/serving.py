"""An OpenAI-compatible server with dynamic batching: ``python -m labkit serve`` or ``run_server(...)``.

Requests wait in a bounded queue. A batching loop in a model thread takes the oldest request and waits up
to ``max_wait_ms`` (counted from that request's arrival) for up to ``max_batch_size`` requests, then decodes
them together greedily (left padding, ``labkit.batching.decode_batch``). A sequence that finishes leaves the
batch at once (its KV-cache rows are dropped), so a short answer is not held until the longest one is done
and no compute goes to finished rows; new requests join at the next batch (continuous batching, which
admits them between decode steps, is notebook 07's subject).

Endpoints: POST /v1/completions and /v1/chat/completions (``"stream": true`` gives server-sent events,
``data: {...}`` chunks ending with ``data: [DONE]``), GET /v1/models, /health and /metrics (Prometheus text).
A request that sets none of ``temperature``, ``top_p`` and ``seed`` is decoded greedily (this server's
default, reproducible; OpenAI's default temperature is 1); otherwise tokens are sampled (``labkit.sampling``:
temperature, nucleus top-p, a per-request generator seeded by ``seed``). ``stop`` strings end the answer
before them, as in the OpenAI API. A parameter the server does not implement is refused with a 400 naming
it, never ignored. ``ignore_eos`` (as in vLLM) generates exactly ``max_tokens`` tokens, for benchmarks.

Every bad request gets a 4xx with an OpenAI-style JSON error body; a full queue gets 503; on shutdown the
queued requests get an explicit 503 and running ones finish (or, after ``drain_s``, get an error).
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import math
import os
import queue as _queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from . import batching
from .sampling import Sampling
from .timing import clock

log = logging.getLogger("labkit.serving")

TINY_RANDOM = "tiny-random"  # a 2-layer random Llama with the default tokenizer: fast tests, nonsense text
DEFAULT_HOST = "127.0.0.1"
LISTENING = "labkit serve: listening on "  # the line a subprocess prints once its port is bound
BATCHING = ("dynamic", "continuous")


# ---------------------------------------------------------------------------------------------- config


@dataclass
class ServerConfig:
    """Everything the server can be told. Validated by ``check()``."""

    model: str | None = None  # None/'default', a directory, a hub id, or 'tiny-random'
    dtype: str = "fp32"
    host: str = DEFAULT_HOST
    port: int = 8000  # 0: an ephemeral port, reported back
    max_batch_size: int = 8
    max_wait_ms: float = 20.0  # how long the oldest queued request may wait for others to join
    max_queue: int = 256  # requests waiting beyond this get 503
    max_tokens_limit: int = 1024  # a request asking for more tokens gets 400
    default_max_tokens: int = 64  # when a request does not say
    max_prompt_tokens: int = 2048  # a longer prompt gets 400
    drop_finished: bool = True  # False: finished sequences ride along until the longest one ends
    drain_s: float = 10.0  # on shutdown, how long running requests may finish before they get an error
    max_body_bytes: int = 1 << 20  # a larger request body gets 413
    batching: str = "dynamic"  # dynamic: wait up to max_wait_ms, decode a batch to its end; continuous: join at every step
    prefix_cache_tokens: int = 0  # continuous only: KV positions of prompt prefixes kept for reuse (0: off)
    prefill_chunk_tokens: int = 0  # continuous only: prompt tokens prefilled per step (0: a whole prompt at once)

    def check(self) -> "ServerConfig":
        for name in ("max_batch_size", "max_queue", "max_tokens_limit", "default_max_tokens", "max_prompt_tokens",
                     "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port!r}: must be 0 (any free port) to 65535")
        if not isinstance(self.max_wait_ms, (int, float)) or self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms={self.max_wait_ms!r}: must be 0 or more milliseconds")
        if not isinstance(self.drain_s, (int, float)) or self.drain_s < 0:
            raise ValueError(f"drain_s={self.drain_s!r}: must be 0 or more seconds")
        if self.batching not in BATCHING:
            raise ValueError(f"batching={self.batching!r}: choose one of {list(BATCHING)}")
        for name in ("prefix_cache_tokens", "prefill_chunk_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}: must be 0 (off) or a positive integer")
            if value and self.batching != "continuous":
                raise ValueError(f"{name} needs batching='continuous' (the dynamic batcher prefills whole batches)")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"default_max_tokens={self.default_max_tokens} exceeds max_tokens_limit="
                             f"{self.max_tokens_limit}; lower it or raise the limit")
        return self


def _config(**kwargs: Any) -> ServerConfig:
    names = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ValueError(f"unknown server option(s) {unknown}; choose from {sorted(names)}")
    return ServerConfig(**kwargs).check()


# ---------------------------------------------------------------------------------------- validation


class ApiError(Exception):
    """A request the server refuses: HTTP status plus an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def kind(self) -> str:
        if self.status == 503:
            return "service_unavailable"
        if self.status == 413:
            return "request_too_large"
        if self.status == 404:
            return "not_found"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class Params:
    """A validated generation request."""

    chat: bool
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    max_tokens: int = 64
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    model: str | None = None
    sampling: Sampling | None = None  # None: greedy
    stop: list[str] = field(default_factory=list)


_ROLES = ("system", "user", "assistant")
MAX_STOP = 4  # as the OpenAI API
# what this server does with every request parameter it knows; anything else is refused by name
_ACCEPTED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n",
             "temperature", "top_p", "seed", "stop", "ignore_eos",
             "user", "metadata"}  # the last two only label a request: they change no output
# parameters the API defines that this server does not implement: refused unless they ask for the default
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {},
                                         "logprobs": None, "top_logprobs": None, "best_of": 1, "echo": False,
                                         "suffix": None, "tools": None, "tool_choice": None, "functions": None,
                                         "function_call": None, "response_format": None}


def _number(body: dict[str, Any], name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not (low < value if low_open else low <= value) or value > high:
        lo = f"above {low:g}" if low_open else f"from {low:g}"
        raise ApiError(400, f"'{name}' must be a number {lo} to {high:g}, got {json.dumps(value)[:40]}", name)
    return float(value)


def _sampling(body: dict[str, Any]) -> Sampling | None:
    """Greedy when the request sets none of temperature, top_p and seed (or temperature 0); otherwise
    sampled, with OpenAI's default temperature of 1 where only top_p or seed is given."""
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63):
        raise ApiError(400, "'seed' must be an integer (a 64-bit one)", "seed")
    if temperature is None and top_p is None and seed is None:
        return None
    if temperature == 0:
        return None  # greedy: top_p and seed cannot change an argmax
    return Sampling(temperature=1.0 if temperature is None else temperature,
                    top_p=1.0 if top_p is None else top_p, seed=seed)


def _stop(value: Any) -> list[str]:
    """'stop': a string or a list of up to MAX_STOP non-empty strings."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops) or len(stops) > MAX_STOP:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return [_utf8_text(x, "stop") for x in stops]


def _refuse_unsupported(body: dict[str, Any], chat: bool) -> None:
    """No parameter is silently ignored: one this server does not implement gets a 400 naming it."""
    for name, default in _UNSUPPORTED_DEFAULTS.items():
        value = body.get(name)
        if name == "logprobs" and value is False:
            continue
        if value is not None and value != default:
            raise ApiError(400, f"'{name}' is not supported by this server; leave it out", name)
    unknown = sorted(set(body) - _ACCEPTED - set(_UNSUPPORTED_DEFAULTS))
    if unknown:
        raise ApiError(400, f"unknown parameter '{unknown[0]}' for /v1/{'chat/' if chat else ''}completions; "
                            f"this server accepts {sorted(_ACCEPTED)}", unknown[0])


def _utf8_text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} is not valid UTF-8 text (it holds an unpaired surrogate escape)",
                       param) from None
    return value


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or a list of {'type': 'text', 'text': ...} parts."""
    if isinstance(value, str):
        return _utf8_text(value, where)
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return _utf8_text("".join(p["text"] for p in value), where)
    raise ApiError(400, f"{where} must be a string (or a list of text parts)", where)


def parse_body(raw: bytes, chat: bool, cfg: ServerConfig) -> Params:
    """Validate a request body; raise ``ApiError`` (4xx) naming the field and the fix."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    p = Params(chat=chat, max_tokens=cfg.default_max_tokens)
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "'messages' is required: a non-empty list of {'role': ..., 'content': ...}",
                           "messages")
        p.messages = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in _ROLES:
                raise ApiError(400, f"messages[{i}] needs a 'role' out of {list(_ROLES)}", f"messages[{i}].role")
            p.messages.append({"role": m["role"], "content": _content(m.get("content"), f"messages[{i}].content")})
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' is required: one string (this server takes one prompt per request)",
                           "prompt")
        p.prompt = _utf8_text(prompt, "prompt")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise ApiError(400, f"'{key}' must be an integer, got {json.dumps(max_tokens)[:40]}", key)
        if not 1 <= max_tokens <= cfg.max_tokens_limit:
            raise ApiError(400, f"'{key}'={max_tokens}: must be between 1 and {cfg.max_tokens_limit}", key)
        p.max_tokens = max_tokens
    for name in ("stream", "ignore_eos"):
        value = body.get(name, False)
        if value is not None and not isinstance(value, bool):
            raise ApiError(400, f"'{name}' must be true or false", name)
        setattr(p, name, bool(value))
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
            raise ApiError(400, "'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
        p.include_usage = bool(opts.get("include_usage", False))
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError(400, "'n' must be 1: this server returns one choice per request", "n")
    p.sampling = _sampling(body)
    p.stop = _stop(body.get("stop"))
    _refuse_unsupported(body, chat)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", "model")
    p.model = model
    return p


# -------------------------------------------------------------------------------------------- metrics

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1  # per bucket; render() makes them cumulative
                break

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for edge, count in zip(self.buckets, self.counts):
            running += count
            lines.append(f'{self.name}_bucket{{le="{edge:g}"}} {running}')
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.n}', f"{self.name}_sum {self.total:.6f}",
                  f"{self.name}_count {self.n}"]
        return lines


class Metrics:
    """Counters, gauges and histograms, updated from the event loop and the model thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.batches = 0
        self.batch_size = Histogram("labkit_batch_size", "Sequences per batch the model ran", BATCH_BUCKETS)
        self.queue_wait = Histogram("labkit_queue_wait_seconds", "Time from arrival to the start of its batch",
                                    LATENCY_BUCKETS_S)
        self.ttft = Histogram("labkit_time_to_first_token_seconds", "Arrival to first token, server side",
                              LATENCY_BUCKETS_S)
        self.e2e = Histogram("labkit_e2e_request_latency_seconds", "Arrival to last token, server side",
                             LATENCY_BUCKETS_S)

    def count(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def observe(self, hist: Histogram, value: float) -> None:
        with self.lock:
            hist.observe(value)

    def add_tokens(self, prompt: int = 0, output: int = 0) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.output_tokens += output

    def reset(self) -> None:
        """Fresh counters and histograms, in place: every thread keeps writing to this one object."""
        fresh = Metrics()
        with self.lock:
            for name, value in vars(fresh).items():
                if name != "lock":
                    setattr(self, name, value)

    def snapshot(self) -> dict[str, Any]:
        """Plain numbers for notebooks: request counts, mean batch size, tokens."""
        with self.lock:
            return {"requests": {f"{e} {s}": n for (e, s), n in sorted(self.requests.items())},
                    "batches": self.batch_size.n,
                    "mean_batch_size": self.batch_size.total / self.batch_size.n if self.batch_size.n else None,
                    "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}

    def render(self, gauges: dict[str, tuple[str, float]], counters: dict[str, tuple[str, float]] | None = None) -> str:
        with self.lock:
            lines = ["# HELP labkit_requests_total Requests answered, by endpoint and HTTP status",
                     "# TYPE labkit_requests_total counter"]
            lines += [f'labkit_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            for name, help_text, value in (("labkit_prompt_tokens_total", "Prompt tokens admitted", self.prompt_tokens),
                                           ("labkit_generation_tokens_total", "Tokens generated", self.output_tokens)):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
            for name, (help_text, value) in (counters or {}).items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value:g}"]
            for name, (help_text, value) in gauges.items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
            for hist in (self.batch_size, self.queue_wait, self.ttft, self.e2e):
                lines += hist.render()
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ jobs and batcher


class Job:
    """One admitted request: its prompt, and a channel the model thread pushes events into.

    Events: ('token', token_id, finish_reason or None) and ('error', http_status, message).
    """

    def __init__(self, prompt_ids: list[int], params: Params, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.loop = loop
        self.events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.arrival = clock()
        self.started: float | None = None
        self.cancelled = False  # set when the client went away: the model thread drops it
        self.answered = False  # a final event (last token or error) has been pushed

    def push(self, event: tuple[Any, ...]) -> None:
        """Called from the model thread."""
        if event[0] == "error" or event[2] is not None:
            self.answered = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def fail(self, status: int, message: str) -> None:
        if not self.answered:
            self.push(("error", status, message))

    def sequence(self) -> batching.Sequence:
        """The decode sequence for this request: its tokens are pushed to it as they come."""
        return batching.Sequence(prompt_ids=self.prompt_ids, max_new_tokens=self.params.max_tokens,
                                 ignore_eos=self.params.ignore_eos, on_token=lambda t, r: self.push(("token", t, r)),
                                 cancelled=lambda: self.cancelled, sampling=self.params.sampling, owner=self)


class Batcher:
    """The bounded queue and the batching loop (a model thread)."""

    def __init__(self, lm: Any, cfg: ServerConfig, metrics: Metrics) -> None:
        self.lm = lm
        self.cfg = cfg
        self.metrics = metrics
        self.eos = batching.eos_ids(lm.model, lm.tokenizer)
        self.pad_id = lm.tokenizer.pad_token_id
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abort = threading.Event()
        self.running = 0
        self._thread = threading.Thread(target=self._loop, name="labkit-batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

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

    def begin(self, job: Job) -> batching.Sequence:
        """Stamp the request's start (queue-wait metric) and make its decode sequence."""
        job.started = clock()
        self.metrics.observe(self.metrics.queue_wait, job.started - job.arrival)
        return job.sequence()

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
        batching.decode_batch(self.lm.model, seqs, self.eos, self.pad_id, drop_finished=self.cfg.drop_finished,
                              should_abort=lambda: self.aborting)
        for job, seq in zip(batch, seqs):
            if seq.finish_reason == "aborted":
                job.fail(503, "server is shutting down; generation was stopped")


# ------------------------------------------------------------------------------------------ the server


class Detokenizer:
    """Text deltas from a growing list of token ids, never splitting a multi-byte character."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # start of the window decoded for context
        self.read = 0  # tokens already turned into text

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tok.decode(self.ids[start:end], skip_special_tokens=True)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._text(self.prefix, self.read)
        after = self._text(self.prefix)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
        before = self._text(self.prefix, self.read)
        after = self._text(self.prefix)
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class StopText:
    """The text of a growing answer, cut at the first OpenAI ``stop`` string (which is not part of it).

    ``add(token)`` returns the text that can be sent now: a tail that might be the start of a stop string
    is held back until the next token shows whether it is. ``stopped`` turns True when one completed.
    """

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.detok = Detokenizer(tokenizer)
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def add(self, token: int) -> str:
        return self._release(self.detok.add(token))

    def finish(self) -> str:
        """After the last token: whatever is still held (no stop string can complete any more)."""
        text = self._release(self.detok.flush())
        if self.stopped:
            return text
        text, self.held = text + self.held, ""
        return text

    def _release(self, delta: str) -> str:
        if self.stopped:
            return ""
        text = self.held + delta
        hits = [text.find(s) for s in self.stops if s in text]
        if hits:
            self.stopped, self.held = True, ""
            return text[:min(hits)]
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


def tiny_random_model():
    """A 2-layer random Llama with the default tokenizer: the server path in milliseconds, for tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from . import models

    tok = models.load_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return models.Loaded(model=model, tokenizer=tok, name=TINY_RANDOM, dtype="fp32", device="cpu", load_seconds=0.0)


def load_model(model: Any = None, dtype: str = "fp32"):
    """A ``models.Loaded``: pass one through, build the tiny random model, or load by name."""
    from . import models

    if isinstance(model, models.Loaded):
        return model
    if model == TINY_RANDOM:
        return tiny_random_model()
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model={model!r}: pass a models.Loaded, a name/directory, '{TINY_RANDOM}' or None")
    return models.load(model, dtype=dtype)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None):
    from aiohttp import web

    return web.json_response(data, status=status, headers=headers, dumps=lambda d: json.dumps(d, ensure_ascii=False))


def _error(exc: ApiError):
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    return _json(exc.body(), status=exc.status, headers=headers)


def _forget_handler_chains() -> None:
    """aiohttp caches each request handler's middleware chain (an lru_cache keyed by the handler, a bound
    method of this server), which would keep every stopped server, and the model it served, alive. Clear
    it once a server stops; running servers rebuild their entry on their next request."""
    web_app = sys.modules.get("aiohttp.web_app")
    cache = getattr(web_app, "_cached_build_middleware", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()


class Server:
    """The aiohttp application around a ``Batcher``. Start and stop it inside one event loop."""

    def __init__(self, lm: Any, cfg: ServerConfig) -> None:
        self.lm = lm
        self.cfg = cfg
        self.metrics = Metrics()
        self.batcher = Batcher(lm, cfg, self.metrics)
        self.url: str | None = None
        self.closing = False
        self._runner: Any = None
        self._stopped: asyncio.Event | None = None
        cfg_len = getattr(lm.model.config, "max_position_embeddings", None) or 4096
        self.max_model_len = int(cfg_len)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> str:
        from aiohttp import web

        app = web.Application(client_max_size=self.cfg.max_body_bytes, middlewares=[self._errors_middleware()])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_endpoint)
        self._stopped = asyncio.Event()
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=self.cfg.drain_s + 5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        self.batcher.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        return self.url

    def request_stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    async def serve_until_stopped(self) -> None:
        assert self._stopped is not None, "start() first"
        await self._stopped.wait()
        await self.stop()

    async def stop(self) -> None:
        """Queued requests get 503, running ones may finish for drain_s, then the port closes."""
        if self.closing:
            return
        self.closing = True
        self.batcher.close()
        if not await asyncio.to_thread(self.batcher.join, self.cfg.drain_s):
            self.batcher.abort()
            await asyncio.to_thread(self.batcher.join, 60.0)
        if self._runner is not None:
            await self._runner.cleanup()
        _forget_handler_chains()


    # ----------------------------------------------------------------- handlers
    def _errors_middleware(self):
        from aiohttp import web

        @web.middleware
        async def errors(request: Any, handler: Any) -> Any:
            try:
                return await handler(request)
            except ApiError as exc:
                return _error(exc)
            except web.HTTPException as exc:
                if exc.status < 400:
                    raise
                return _error(ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}"))
            except Exception as exc:  # a bug must still answer in JSON, and the server goes on
                log.exception("unhandled error on %s", request.path)
                return _error(ApiError(500, f"internal error: {type(exc).__name__}"))
        return errors

    async def health(self, request: Any) -> Any:
        status = 503 if self.closing else 200
        max_batch_size, max_wait_ms = self.batcher.settings()
        return _json({"status": "shutting down" if self.closing else "ok", "model": self.lm.name,
                      "queue_depth": self.batcher.depth, "running": self.batcher.running,
                      "max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms}, status=status)

    async def list_models(self, request: Any) -> Any:
        return _json({"object": "list", "data": [{"id": self.lm.name, "object": "model", "owned_by": "labkit",
                                                  "max_model_len": self.max_model_len}]})

    async def metrics_endpoint(self, request: Any) -> Any:
        from aiohttp import web

        max_batch_size, max_wait_ms = self.batcher.settings()
        gauges = {"labkit_queue_depth": ("Requests waiting for a batch", self.batcher.depth),
                  "labkit_queue_capacity": ("Queue bound; beyond it requests get 503", self.cfg.max_queue),
                  "labkit_running_requests": ("Requests in the batch now running", self.batcher.running),
                  "labkit_max_batch_size": ("Configured max_batch_size", max_batch_size),
                  "labkit_max_wait_seconds": ("Configured max wait", max_wait_ms / 1e3)}
        gauges.update(self.batcher.gauges())
        return web.Response(text=self.metrics.render(gauges, self.batcher.counters()), content_type="text/plain",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def completions(self, request: Any) -> Any:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Any) -> Any:
        return await self._generate(request, chat=True)

    async def _read(self, request: Any) -> bytes:
        from aiohttp import web

        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body is larger than {self.cfg.max_body_bytes} bytes") from None

    def _prompt_ids(self, p: Params) -> list[int]:
        tok = self.lm.tokenizer
        if p.chat:
            if getattr(tok, "chat_template", None):
                ids = tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)
            else:
                ids = tok("\n".join(m["content"] for m in p.messages or []))["input_ids"]
        else:
            ids = tok(p.prompt)["input_ids"]
        ids = [int(i) for i in ids]
        param = "messages" if p.chat else "prompt"
        if not ids:
            raise ApiError(400, f"'{param}' is empty: send at least one token of text", param)
        if len(ids) > self.cfg.max_prompt_tokens:
            raise ApiError(400, f"'{param}' has {len(ids)} tokens; this server accepts at most "
                           f"{self.cfg.max_prompt_tokens} (shorten it)", param)
        if len(ids) + p.max_tokens > self.max_model_len:
            raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) exceeds the model's "
                           f"context of {self.max_model_len} tokens; lower max_tokens", "max_tokens")
        return ids

    async def _generate(self, request: Any, chat: bool) -> Any:
        endpoint = "chat" if chat else "completions"
        try:
            params = parse_body(await self._read(request), chat, self.cfg)
            prompt_ids = self._prompt_ids(params)
            job = Job(prompt_ids, params, asyncio.get_running_loop())
            self.batcher.submit(job)
        except ApiError as exc:
            self.metrics.count(endpoint, exc.status)
            return _error(exc)
        self.metrics.add_tokens(prompt=len(prompt_ids))
        try:
            first = await job.events.get()
            if first[0] == "error":  # nothing was sent yet: a plain error response
                self.metrics.count(endpoint, first[1])
                return _error(ApiError(first[1], first[2]))
            if params.stream:
                return await self._stream(request, job, first, endpoint)
            return await self._complete(job, first, endpoint)
        finally:
            job.cancelled = True  # no-op once it finished; stops the work if the client went away

    def _record_first(self, job: Job) -> None:
        self.metrics.observe(self.metrics.ttft, clock() - job.arrival)

    def _record_done(self, job: Job, n_out: int, endpoint: str, status: int) -> None:
        self.metrics.observe(self.metrics.e2e, clock() - job.arrival)
        self.metrics.add_tokens(output=n_out)
        self.metrics.count(endpoint, status)

    def _envelope(self, p: Params, rid: str, chunk: bool) -> dict[str, Any]:
        obj = ("chat.completion" if p.chat else "text_completion") + (".chunk" if chunk and p.chat else "")
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.lm.name}

    def _usage(self, job: Job, n_out: int) -> dict[str, int]:
        return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": n_out,
                "total_tokens": len(job.prompt_ids) + n_out}

    async def _complete(self, job: Job, event: tuple[Any, ...], endpoint: str) -> Any:
        self._record_first(job)
        answer = StopText(self.lm.tokenizer, job.params.stop)
        parts: list[str] = []
        n_out = 0
        while True:
            if event[0] == "error":
                self._record_done(job, n_out, endpoint, event[1])
                return _error(ApiError(event[1], event[2]))
            n_out += 1
            parts.append(answer.add(event[1]))
            if answer.stopped:  # a stop string completed: the model thread drops the sequence at its next step
                job.cancelled = True
                reason = "stop"
                break
            if event[2] is not None:
                reason = event[2]
                parts.append(answer.finish())
                break
            event = await job.events.get()
        p, text = job.params, "".join(parts)
        rid = ("chatcmpl-" if p.chat else "cmpl-") + uuid.uuid4().hex[:24]
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if p.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self._record_done(job, n_out, endpoint, 200)
        return _json({**self._envelope(p, rid, False), "choices": [choice], "usage": self._usage(job, n_out)})

    async def _stream(self, request: Any, job: Job, event: tuple[Any, ...], endpoint: str) -> Any:
        from aiohttp import web

        p = job.params
        rid = ("chatcmpl-" if p.chat else "cmpl-") + uuid.uuid4().hex[:24]
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        await resp.prepare(request)
        answer = StopText(self.lm.tokenizer, p.stop)
        n_out, status = 0, 200

        async def send(data: Any) -> None:
            payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            await resp.write(f"data: {payload}\n\n".encode("utf-8"))

        self._record_first(job)
        try:
            while True:
                if event[0] == "error":
                    status = event[1]
                    await send(ApiError(event[1], event[2]).body())
                    break
                n_out += 1
                delta = answer.add(event[1])
                reason = "stop" if answer.stopped else event[2]
                if answer.stopped:
                    job.cancelled = True  # the model thread drops the sequence at its next step
                elif reason is not None:
                    delta += answer.finish()
                if p.chat:
                    d = {"role": "assistant", "content": delta} if n_out == 1 else {"content": delta}
                    choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": reason}
                else:
                    choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
                await send({**self._envelope(p, rid, True), "choices": [choice]})
                if reason is not None:
                    break
                event = await job.events.get()
            if p.include_usage and status == 200:
                await send({**self._envelope(p, rid, True), "choices": [], "usage": self._usage(job, n_out)})
            await send("[DONE]")
            await resp.write_eof()
        except ConnectionError:  # the client went away mid-stream; the finally in _generate cancels the job
            status = 499
        self._record_done(job, n_out, endpoint, status)
        return resp


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


def server_class_for(cfg: ServerConfig) -> type[Server]:
    """``Server`` for dynamic batching, ``labkit.scheduler.ContinuousServer`` for continuous batching."""
    if cfg.batching == "continuous":
        from .scheduler import ContinuousServer

        return ContinuousServer
    return Server


def start_server(model: Any = None, *, server_class: type[Server] | None = None, startup_timeout_s: float = 60.0,
                 **options: Any) -> ServerHandle:
    """Load (or reuse) a model and serve it from a background thread; returns once the port is bound.

    ``model``: a ``models.Loaded`` (shared, not copied), a name/directory, 'tiny-random' or None (default).
    ``options``: any ``ServerConfig`` field, e.g. ``port=0`` (an ephemeral port; see ``handle.url``).
    ``server_class``: a ``Server`` subclass; default: the one ``batching`` names (``server_class_for``).
    Any start-up failure is raised here; a start that takes longer than ``startup_timeout_s`` is an error.
    """
    cfg = _config(**{"port": 0, **options})
    lm = load_model(model if model is not None else cfg.model, cfg.dtype)
    server = (server_class or server_class_for(cfg))(lm, cfg)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # every start-up failure goes back to the caller, none is swallowed
            failure.append(exc)
            started.set()
            loop.close()
            return
        started.set()
        try:
            loop.run_until_complete(server.serve_until_stopped())
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="labkit-server", daemon=True)
    thread.start()
    if not started.wait(startup_timeout_s):
        loop.call_soon_threadsafe(server.request_stop)
        raise RuntimeError(f"the server did not start within {startup_timeout_s:g} s; raise startup_timeout_s "
                           "on a slow machine, or look for a stuck model load")
    if failure:
        exc = failure[0]
        if isinstance(exc, OSError):  # the port is taken or the host cannot be bound
            raise ValueError(f"cannot listen on {cfg.host}:{cfg.port} ({exc}); choose another port, or port=0") from exc
        raise RuntimeError(f"the server failed to start: {type(exc).__name__}: {exc}") from exc
    return ServerHandle(server, loop, thread)


class ProcessHandle:
    """A server in a child process (``python -m labkit serve``): its own interpreter, GIL and threads."""

    def __init__(self, proc: subprocess.Popen, url: str, output: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.output = output

    def __str__(self) -> str:
        return self.url

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (graceful: queued requests answered), then SIGKILL after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> "ProcessHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_process(model: str | None = None, startup_timeout_s: float = 120.0, **options: Any) -> ProcessHandle:
    """Start ``python -m labkit serve`` with these options on a free port; return once it listens."""
    cfg = _config(**{"port": 0, **options, **({"model": model} if model is not None else {})})
    argv = [sys.executable, "-m", "labkit", "serve", "--host", cfg.host, "--port", str(cfg.port)]
    for f in fields(ServerConfig):
        value = getattr(cfg, f.name)
        if f.name in ("host", "port") or value is None or value == f.default:
            continue
        if f.name == "drop_finished":
            argv.append("--no-drop-finished")
        else:
            argv += [f"--{f.name.replace('_', '-')}", str(value)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: _queue.Queue[str | None] = _queue.Queue()
    output: list[str] = []

    def pump() -> None:  # keep reading so the child never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="labkit-serve-output", daemon=True).start()
    deadline = time.monotonic() + startup_timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except _queue.Empty:
            line = ""
        if line and line.startswith(LISTENING):
            return ProcessHandle(proc, line[len(LISTENING):].strip(), output)
        if line is None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            tail = "\n".join(output[-20:])
            raise RuntimeError(f"`{' '.join(argv)}` did not start listening:\n{tail}")


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


# ----------------------------------------------------------------------------------------------- CLI


def _cli_module():
    """The running CLI module: ``python -m labkit`` runs it as ``__main__``, the console script imports it."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == "labkit.__main__":
        return main
    return importlib.import_module("labkit.__main__")


async def _serve_forever(server: Server) -> None:
    url = await server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows / not main thread
            loop.add_signal_handler(sig, server.request_stop)
    print(f"{LISTENING}{url}", flush=True)
    print(f"model {server.lm.name} · {server.cfg.batching} batching · max_batch_size {server.cfg.max_batch_size} · "
          f"max_wait_ms {server.cfg.max_wait_ms:g} · queue {server.cfg.max_queue} · Ctrl-C stops", flush=True)
    await server.serve_until_stopped()
    print("labkit serve: stopped", flush=True)


def cmd_serve(args: Any) -> int:
    cli = _cli_module()
    options = {f.name: getattr(args, f.name) for f in fields(ServerConfig) if hasattr(args, f.name)}
    try:
        cfg = _config(**options)
        if cfg.host not in (DEFAULT_HOST, "localhost", "::1"):
            print(f"warning: listening on {cfg.host}: anyone who can reach this machine can use the server",
                  file=sys.stderr)
        lm = load_model(cfg.model, cfg.dtype)
    except ValueError as exc:
        raise cli.UsageError(str(exc)) from None
    asyncio.run(_serve_forever(server_class_for(cfg)(lm, cfg)))
    return 0


def _configure_serve(p: Any) -> None:
    d = ServerConfig()
    p.add_argument("--model", default=None, help=f"'default', a directory, a hub id or '{TINY_RANDOM}'")
    p.add_argument("--dtype", default=d.dtype, help="fp32, fp16 or bf16 (default fp32)")
    p.add_argument("--host", default=d.host, help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=d.port, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="sequences per batch (default 8)")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long the oldest request waits for others to join (default 20)")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="queued requests before 503 (default 256)")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens_limit, help="largest max_tokens accepted")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens, help="max_tokens when unset")
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens, help="longest prompt accepted")
    p.add_argument("--drain-s", type=float, default=d.drain_s, help="on shutdown, seconds running requests get")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413 beyond)")
    p.add_argument("--batching", default=d.batching, choices=BATCHING,
                   help="dynamic (default): batches wait up to max-wait-ms; continuous: requests join at every step")
    p.add_argument("--prefix-cache-tokens", type=int, default=d.prefix_cache_tokens,
                   help="continuous batching: KV positions of shared prompt prefixes kept for reuse (0: off)")
    p.add_argument("--prefill-chunk-tokens", type=int, default=d.prefill_chunk_tokens,
                   help="continuous batching: prompt tokens prefilled per step (0: a whole prompt at once)")
    p.add_argument("--no-drop-finished", dest="drop_finished", action="store_false",
                   help="keep finished sequences in the batch until the longest ends (static batching's cost)")


cmd_serve.configure = _configure_serve  # type: ignore[attr-defined]
_cli_module().command("serve", "OpenAI-compatible server with dynamic batching (binds 127.0.0.1)")(cmd_serve)

"""Static batching versus continuous batching of the same requests, with the same greedy decoding.

static      takes ``batch_size`` requests, decodes them together until the longest is done (finished rows
            keep computing, as ``generate`` does), returns the whole batch, then takes the next
            ``batch_size``. A request's response is ready when its batch is (``finished_s``); the moment its
            own last token came out is kept too (``last_token_s``). ``batch_size=1`` is one at a time.
continuous  keeps up to ``max_batch_size`` requests running and admits a waiting one at every token
            boundary: a new request's prompt is prefilled alone (its own KV cache), then its cache is
            left-padded and joined to the running batch's; a finished request leaves at once (its rows
            are dropped from every layer's cache) and its response is ready right then.

Both use ``labkit.decode``'s ``prefill`` and ``decode_one_token`` (left padding, positions that count
only real tokens), so a request's greedy tokens are the ones it gets when run alone. Every request
arrives at time 0 (an offline workload, like ``vllm.LLM.generate``); times are seconds from the start.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import batching, decode, serving
from .sampling import choose
from .timing import now

MODES = ("static", "continuous")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive integer")
    return value


@dataclass(frozen=True)
class Request:
    """One request of a workload: its chat-formatted prompt tokens and its answer limit."""

    id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.id}: needs at least one prompt token")
        _positive("max_new_tokens", self.max_new_tokens)


@dataclass
class Completion:
    """What one request got and when (seconds from the start of the run)."""

    id: str
    kind: str
    n_prompt: int
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    admitted_s: float | None = None  # its prefill started
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None  # its response was ready

    @property
    def latency_s(self) -> float:
        assert self.finished_s is not None, f"request {self.id} did not finish"
        return self.finished_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n_out": len(self.tokens), "latency_s": self.finished_s}


@dataclass
class Run:
    """One workload run: every request's completion plus what the engine computed."""

    mode: str
    max_batch_size: int
    wall_s: float
    completions: list[Completion]
    decode_steps: int = 0
    computed_rows: int = 0  # sum over decode steps of the rows in the batch (finished rows riding along count)
    prefills: int = 0  # prefill forward passes (static: one per batch; continuous: one per request)

    @property
    def output_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.completions)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def mean_batch(self) -> float:
        return self.computed_rows / self.decode_steps if self.decode_steps else 0.0

    def outputs(self) -> dict[str, list[int]]:
        return {c.id: list(c.tokens) for c in self.completions}

    def summary(self) -> dict[str, Any]:
        lat = [c.latency_s for c in self.completions]
        short = [c.latency_s for c in self.completions if c.kind == "short"]
        long_ = [c.latency_s for c in self.completions if c.kind == "long"]
        useful = self.output_tokens - len(self.completions)  # each request's first token comes from a prefill
        return {"mode": self.mode, "max_batch_size": self.max_batch_size, "requests": len(self.completions),
                "output_tokens": self.output_tokens, "wall_s": self.wall_s, "tokens_per_s": self.tokens_per_s,
                "requests_per_s": len(self.completions) / self.wall_s,
                "mean_latency_s": statistics.fmean(lat), "max_latency_s": max(lat),
                "mean_latency_short_s": statistics.fmean(short) if short else None,
                "mean_latency_long_s": statistics.fmean(long_) if long_ else None,
                "mean_ttft_s": statistics.fmean(c.first_token_s for c in self.completions),
                "decode_steps": self.decode_steps, "mean_batch": self.mean_batch,
                "wasted_row_fraction": 1 - useful / self.computed_rows if self.computed_rows else 0.0}

    def frame(self):
        import pandas as pd

        return pd.DataFrame([{**c.to_dict(), "mode": self.mode} for c in self.completions]).drop(columns=["tokens"])


def _check(requests: Sequence[Request], batch: int, name: str) -> None:
    if not requests:
        raise ValueError("no requests: pass at least one")
    _positive(name, batch)
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids must be unique")


def _completion(r: Request) -> Completion:
    return Completion(id=r.id, kind=r.kind, n_prompt=len(r.prompt_ids), max_new_tokens=r.max_new_tokens)


def _finish_reason(token: int, n_out: int, limit: int, eos: set[int]) -> str | None:
    if token in eos:
        return "stop"
    return "length" if n_out >= limit else None


# ---------------------------------------------------------------------------------------------- static


def _tracked(c: Completion, r: Request, t0: float, stamp_finish: bool) -> batching.Sequence:
    """A decode sequence for request ``r`` that stamps its tokens' times (since ``t0``) into ``c``;
    ``stamp_finish``: its response is ready at its last token (continuous), not when its batch returns."""
    def on_token(token: int, reason: str | None) -> None:
        t = now() - t0
        if c.first_token_s is None:
            c.first_token_s = t
        c.tokens.append(token)
        c.last_token_s = t
        c.finish_reason = reason
        if reason is not None and stamp_finish:
            c.finished_s = t

    return batching.Sequence(prompt_ids=list(r.prompt_ids), max_new_tokens=r.max_new_tokens, on_token=on_token)


def run_static(model: Any, requests: Sequence[Request], eos: set[int], pad_id: int, batch_size: int = 4) -> Run:
    """Static batches of ``batch_size`` in arrival order; a batch returns when its longest request is done."""
    _check(requests, batch_size, "batch_size")
    comps = {r.id: _completion(r) for r in requests}
    steps = rows = 0
    t0 = now()
    for start in range(0, len(requests), batch_size):
        chunk = requests[start:start + batch_size]
        admitted = now() - t0
        seqs = []
        for r in chunk:
            comps[r.id].admitted_s = admitted
            seqs.append(_tracked(comps[r.id], r, t0, stamp_finish=False))
        stats = batching.decode_batch(model, seqs, eos, pad_id, drop_finished=False)
        done = now() - t0
        for r in chunk:
            comps[r.id].finished_s = done  # generate() hands the batch back at once
        steps += stats.steps - 1  # decode_batch counts the prefill's token as a step
        rows += stats.computed_rows - len(chunk)
    wall = now() - t0
    return Run(mode="static" if batch_size > 1 else "one at a time", max_batch_size=batch_size, wall_s=wall,
               completions=[comps[r.id] for r in requests], decode_steps=steps, computed_rows=rows,
               prefills=-(-len(requests) // batch_size))


# ------------------------------------------------------------------------------------------ continuous


def _layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None or any(not hasattr(layer, "keys") or type(layer).__name__ != "DynamicLayer" for layer in layers):
        raise ValueError("continuous batching here needs a full-attention model (transformers DynamicLayer caches); "
                         "sliding-window or hybrid caches are not supported")
    return layers


def _pad_left(t: Any, n: int) -> Any:
    """(B, H, L, D) → (B, H, n + L, D) with ``n`` zero columns in front (masked out, never attended)."""
    import torch

    if n == 0:
        return t
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], n, t.shape[3]), t], dim=2)


def join_caches(cache: Any, mask: Any, new_cache: Any, new_mask: Any) -> Any:
    """Append ``new_cache``'s rows to ``cache`` (in place), left-padding the shorter one; return the joined mask."""
    import torch

    length, new_length = mask.shape[1], new_mask.shape[1]
    total = max(length, new_length)
    for layer, new in zip(_layers(cache), _layers(new_cache)):
        layer.keys = torch.cat([_pad_left(layer.keys, total - length), _pad_left(new.keys, total - new_length)])
        layer.values = torch.cat([_pad_left(layer.values, total - length), _pad_left(new.values, total - new_length)])
    pad = lambda m, n: torch.cat([m.new_zeros(m.shape[0], n), m], dim=1)  # noqa: E731
    return torch.cat([pad(mask, total - length), pad(new_mask, total - new_length)])


def trim_left(cache: Any, mask: Any) -> Any:
    """Drop leading columns that are padding in every row (left behind by a long request that left)."""
    real = mask.sum(0).nonzero()
    first = int(real[0]) if real.numel() else mask.shape[1]
    if first == 0:
        return mask
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, first:]
        layer.values = layer.values[:, :, first:]
    return mask[:, first:]


class PrefixCache:
    """Keys and values of prompt prefixes already computed, reused by later prompts that start the same way
    (a shared system prompt): automatic prefix caching, as vLLM's and SGLang's radix cache do it.

    Entries are the KV of a prompt's first ``block_tokens``-aligned positions. A lookup finds the entry that
    shares the longest aligned prefix with the new prompt; the new prompt then prefills only the rest.
    The KV of a prefix depends on that prefix alone (attention is causal), so the reuse changes no output.
    At most ``capacity_tokens`` positions are kept; the least recently used entry goes first.
    """

    def __init__(self, capacity_tokens: int, block_tokens: int = 16) -> None:
        _positive("capacity_tokens", capacity_tokens)
        _positive("block_tokens", block_tokens)
        self.capacity_tokens = capacity_tokens
        self.block_tokens = block_tokens
        self.entries: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}  # prefix ids -> per layer (K, V), LRU order
        self.queries = self.hits = self.hit_tokens = self.query_tokens = self.evictions = 0

    @property
    def tokens(self) -> int:
        return sum(len(k) for k in self.entries)

    def _aligned(self, n: int) -> int:
        return n // self.block_tokens * self.block_tokens

    def lookup(self, prompt_ids: Sequence[int]) -> tuple[int, Any]:
        """(positions reused, a DynamicCache holding them) for the longest cached prefix; (0, None) on a
        miss. At least one prompt token is always left to prefill (its logits give the first token)."""
        from transformers import DynamicCache

        prompt = tuple(prompt_ids)
        self.queries += 1
        self.query_tokens += len(prompt)
        best, best_key = 0, None
        for key in self.entries:
            n = 0
            limit = min(len(key), len(prompt) - 1)
            while n < limit and key[n] == prompt[n]:
                n += 1
            n = self._aligned(n)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        layers = self.entries.pop(best_key)
        self.entries[best_key] = layers  # most recently used
        cache = DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(k[:, :, :best], v[:, :, :best], i)
        self.hits += 1
        self.hit_tokens += best
        return best, cache

    def store(self, prompt_ids: Sequence[int], cache: Any) -> None:
        """Keep the KV of the prompt's aligned prefix (its cache must hold the whole prompt, batch of one)."""
        n = self._aligned(len(prompt_ids))
        if n == 0 or n > self.capacity_tokens:
            return
        key = tuple(prompt_ids[:n])
        if any(len(k) >= n and k[:n] == key for k in self.entries):
            return  # already covered by a longer (or equal) entry
        for k in [k for k in self.entries if len(k) < n and key[:len(k)] == k]:
            del self.entries[k]  # this entry covers the shorter ones it extends
        self.entries[key] = [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in _layers(cache)]
        while self.tokens > self.capacity_tokens:
            del self.entries[next(iter(self.entries))]
            self.evictions += 1

    def stats(self) -> dict[str, Any]:
        return {"queries": self.queries, "hits": self.hits, "hit_rate": self.hits / self.queries if self.queries else None,
                "hit_tokens": self.hit_tokens, "token_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else None,
                "entries": len(self.entries), "tokens": self.tokens, "evictions": self.evictions}


@dataclass
class _Prefill:
    """A sequence whose prompt is being prefilled, possibly over several steps (chunked prefill)."""

    seq: batching.Sequence
    cache: Any
    done: int = 0  # prompt positions already in ``cache``


class ContinuousEngine:
    """The continuous-batching core: ``admit`` a sequence at any token boundary, ``step`` all running ones.

    Sequences are ``labkit.batching.Sequence``: ``on_token(token, finish_reason)`` is called for every token
    (the reason is None until the last), and ``cancelled()`` is checked after each, as in ``decode_batch``.

    ``prefill_chunk_tokens`` > 0 turns on chunked prefill: a new prompt is prefilled at most that many tokens
    per step, between the running sequences' decode steps, so one long prompt does not stall every running
    stream for its whole prefill. ``prefix_cache`` (a ``PrefixCache``) reuses the KV of prompt prefixes
    computed before.
    """

    def __init__(self, model: Any, eos: set[int], pad_id: int, prefill_chunk_tokens: int = 0,
                 prefix_cache: PrefixCache | None = None) -> None:
        if isinstance(prefill_chunk_tokens, bool) or not isinstance(prefill_chunk_tokens, int) or prefill_chunk_tokens < 0:
            raise ValueError(f"prefill_chunk_tokens={prefill_chunk_tokens!r}: 0 (off) or a positive integer")
        self.model = model
        self.eos = eos
        self.pad_id = pad_id
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.prefix_cache = prefix_cache
        self.device = next(model.parameters()).device
        self.active: list[batching.Sequence] = []  # row i of the batch is active[i]
        self.prefilling: deque[_Prefill] = deque()  # admitted, prompt not fully prefilled yet (chunked)
        self._clear()
        self.steps = self.rows = self.prefills = self.prefill_chunks = 0

    def _clear(self) -> None:
        self.cache = self.mask = self.pos = self.next_tokens = None

    @property
    def busy(self) -> bool:
        """Sequences running or still being prefilled."""
        return bool(self.active or self.prefilling)

    @property
    def load(self) -> int:
        """Sequences this engine holds (running plus prefilling): what counts against max_batch_size."""
        return len(self.active) + len(self.prefilling)

    def admit(self, seq: batching.Sequence) -> None:
        """Take ``seq`` in: prefill it alone (now, or chunk by chunk in the next steps), then its first token
        comes out and its KV cache joins the running batch's."""
        from transformers import DynamicCache

        if not seq.prompt_ids:
            raise ValueError("every sequence needs at least one prompt token")
        _positive("max_new_tokens", seq.max_new_tokens)
        reused, cache = self.prefix_cache.lookup(seq.prompt_ids) if self.prefix_cache is not None else (0, None)
        job = _Prefill(seq, cache if cache is not None else DynamicCache(), done=reused)
        if self.prefill_chunk_tokens:
            self.prefilling.append(job)
        else:
            self._prefill(job, len(seq.prompt_ids) - job.done)

    def _prefill(self, job: _Prefill, n: int) -> bool:
        """Run the next ``n`` prompt tokens of ``job``; True once its prompt is complete (then its first token
        is out and, unless that token ended it, it runs in the batch)."""
        import torch

        seq = job.seq
        with torch.inference_mode():
            ids = torch.tensor([list(seq.prompt_ids[job.done:job.done + n])], device=self.device)
            mask = torch.ones((1, job.done + n), dtype=torch.long, device=self.device)  # cached part + this chunk
            logits, job.cache = decode.prefill(self.model, ids, mask, cache=job.cache)
            job.done += n
            self.prefill_chunks += 1
            if job.done < len(seq.prompt_ids):
                return False
            self.prefills += 1
            if self.prefix_cache is not None:
                self.prefix_cache.store(seq.prompt_ids, job.cache)
            tok = choose(logits, [seq.sampling])
            if not seq.emit(int(tok[0]), self.eos):
                return True
            new_pos = decode.positions(mask)[:, -1]
            if self.cache is None:
                self.cache, self.mask, self.pos, self.next_tokens = job.cache, mask, new_pos, tok
            else:
                self.mask = join_caches(self.cache, self.mask, job.cache, mask)
                self.pos, self.next_tokens = torch.cat([self.pos, new_pos]), torch.cat([self.next_tokens, tok])
        self.active.append(seq)
        return True

    def step(self) -> list[batching.Sequence]:
        """At most ``prefill_chunk_tokens`` prompt tokens of waiting prefills, then one decode step for every
        running sequence; returns the ones that finished (they have left)."""
        import torch

        budget = self.prefill_chunk_tokens
        while self.prefilling and budget > 0:
            job = self.prefilling[0]
            n = min(budget, len(job.seq.prompt_ids) - job.done)
            budget -= n
            if self._prefill(job, n):
                self.prefilling.popleft()
        if not self.active:
            return []
        with torch.inference_mode():
            self.mask, self.pos = decode.extend(self.mask), self.pos + 1
            logits = decode.decode_one_token(self.model, self.next_tokens, self.cache, self.pos, self.mask)
            self.next_tokens = choose(logits, [seq.sampling for seq in self.active])
            self.steps += 1
            self.rows += len(self.active)
            chosen = self.next_tokens.tolist()  # one host sync per step
            keep = [row for row, seq in enumerate(self.active) if seq.emit(int(chosen[row]), self.eos)]
            done = [seq for row, seq in enumerate(self.active) if row not in set(keep)]
            if done:  # they leave: drop their rows from the batch and from every layer's cache
                if keep:
                    index = torch.tensor(keep, device=self.device)
                    self.cache.batch_select_indices(index)
                    self.mask = trim_left(self.cache, self.mask[index])
                    self.pos, self.next_tokens = self.pos[index], self.next_tokens[index]
                else:
                    self._clear()
                self.active = [self.active[r] for r in keep]
        return done

    def abort(self) -> list[batching.Sequence]:
        """Stop every running or prefilling sequence ('aborted'); returns them."""
        stopped = self.active + [job.seq for job in self.prefilling]
        for seq in stopped:
            seq.finish_reason = "aborted"
        self.active = []
        self.prefilling.clear()
        self._clear()
        return stopped


def run_continuous(model: Any, requests: Sequence[Request], eos: set[int], pad_id: int,
                   max_batch_size: int = 4, prefill_chunk_tokens: int = 0,
                   prefix_cache: PrefixCache | None = None) -> Run:
    """Continuous batching: admit at token boundaries, leave when done (see the module docstring)."""
    _check(requests, max_batch_size, "max_batch_size")
    waiting = deque(requests)
    comps = {r.id: _completion(r) for r in requests}
    engine = ContinuousEngine(model, eos, pad_id, prefill_chunk_tokens=prefill_chunk_tokens, prefix_cache=prefix_cache)
    t0 = now()

    while waiting or engine.busy:
        while waiting and engine.load < max_batch_size:  # admit at this token boundary
            r = waiting.popleft()
            comps[r.id].admitted_s = now() - t0
            engine.admit(_tracked(comps[r.id], r, t0, stamp_finish=True))
        engine.step()
    wall = now() - t0
    return Run(mode="continuous", max_batch_size=max_batch_size, wall_s=wall,
               completions=[comps[r.id] for r in requests], decode_steps=engine.steps, computed_rows=engine.rows,
               prefills=engine.prefills)


def run(model: Any, requests: Sequence[Request], eos: set[int], pad_id: int, mode: str, batch_size: int = 4) -> Run:
    """``run_static`` or ``run_continuous`` by name (``mode`` in MODES)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
    fn = run_static if mode == "static" else run_continuous
    return fn(model, requests, eos, pad_id, batch_size)


# ------------------------------------------------------------------------------- continuous batching server


class ContinuousBatcher(serving.Batcher):
    """``labkit.serving``'s batcher with continuous batching: queued requests join the running batch at the
    next token boundary (up to ``max_batch_size`` running), and each leaves when done. ``max_wait_ms`` is
    not used: nobody waits for company, a new request starts at the next step. The batch-size metric is
    observed once per decode step. ``prefix_cache_tokens`` and ``prefill_chunk_tokens`` (ServerConfig)
    turn on the prefix cache and chunked prefill of ``ContinuousEngine``."""

    prefix_cache: PrefixCache | None = None

    def counters(self) -> dict[str, tuple[str, float]]:
        pc = self.prefix_cache
        if pc is None:
            return {}
        return {"labkit_prefix_cache_queries_total": ("Prompts looked up in the prefix cache", pc.queries),
                "labkit_prefix_cache_hits_total": ("Prompts that reused a cached prefix", pc.hits),
                "labkit_prefix_cache_hit_tokens_total": ("Prompt positions reused instead of prefilled", pc.hit_tokens),
                "labkit_prefix_cache_query_tokens_total": ("Prompt positions looked up", pc.query_tokens)}

    def gauges(self) -> dict[str, tuple[str, float]]:
        pc = self.prefix_cache
        if pc is None:
            return {}
        return {"labkit_prefix_cache_tokens": ("KV positions held by the prefix cache", pc.tokens),
                "labkit_prefix_cache_capacity_tokens": ("Prefix cache bound, positions", pc.capacity_tokens),
                "labkit_prefix_cache_hit_rate": ("Share of prompts that reused a cached prefix", pc.hits / pc.queries
                                                 if pc.queries else 0.0)}

    def _loop(self) -> None:
        prefix = PrefixCache(self.cfg.prefix_cache_tokens) if self.cfg.prefix_cache_tokens else None
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
                    serving.log.exception("admitting a request failed")
                    job.fail(500, f"generation failed: {type(exc).__name__}: {exc}")
            if engine.busy:
                self.running = engine.load
                if engine.active:
                    self.metrics.observe(self.metrics.batch_size, len(engine.active))
                try:
                    engine.step()
                except Exception as exc:  # keep serving: the running requests get a 500, the queue goes on
                    serving.log.exception("continuous batch of %d failed", len(engine.active))
                    for seq in engine.abort():
                        seq.owner.fail(500, f"generation failed: {type(exc).__name__}: {exc}")
            if self.aborting:
                for seq in engine.abort():
                    seq.owner.fail(503, "server is shutting down; generation was stopped")
            self.running = engine.load


class ContinuousServer(serving.Server):
    """``labkit.serving.Server`` whose model thread runs ``ContinuousBatcher``."""

    def __init__(self, lm: Any, cfg: serving.ServerConfig) -> None:
        super().__init__(lm, cfg)
        self.batcher = ContinuousBatcher(lm, cfg, self.metrics)


def start_server(model: Any = None, **options: Any) -> serving.ServerHandle:
    """``serving.start_server`` with continuous batching (same options, same API, same handle)."""
    return serving.start_server(model, **{"batching": "continuous", **options})


# --------------------------------------------------------------------------------------------- workload


def chat_ids(tokenizer: Any, prompt: str) -> tuple[int, ...]:
    """The chat-formatted prompt's token ids (what the model is prefilled with)."""
    from .models import chat_inputs

    return tuple(int(i) for i in chat_inputs(tokenizer, prompt)["input_ids"][0])


def mixed_workload(tokenizer: Any, n_requests: int = 8, long_every: int = 4, short_tokens: int = 16,
                   long_tokens: int = 64, path: Any = None) -> list[Request]:
    """A mixed workload from data/requests.json: one request in ``long_every`` has a long answer, the rest
    short ones. Short requests are the shortest answers in the file, long ones the longest; each request's
    answer limit is its recorded answer length capped at ``short_tokens`` / ``long_tokens``."""
    from . import paged

    _positive("n_requests", n_requests)
    _positive("long_every", long_every)
    _positive("short_tokens", short_tokens)
    _positive("long_tokens", long_tokens)
    pool = sorted(paged.load_requests(path), key=lambda r: (r.answer_tokens, r.id))
    n_long = sum(1 for i in range(n_requests) if i % long_every == 0)
    shorts, longs = pool[: n_requests - n_long], pool[::-1][:n_long]
    if len(shorts) + len(longs) > len(pool) or set(r.id for r in shorts) & set(r.id for r in longs):
        raise ValueError(f"n_requests={n_requests}: the requests file holds only {len(pool)} requests")
    out = []
    si = li = 0
    for i in range(n_requests):
        if i % long_every == 0:
            r, cap, kind = longs[li], long_tokens, "long"
            li += 1
        else:
            r, cap, kind = shorts[si], short_tokens, "short"
            si += 1
        out.append(Request(id=r.id, prompt_ids=chat_ids(tokenizer, r.prompt), max_new_tokens=min(r.answer_tokens, cap),
                           kind=kind))
    return out


def compare_outputs(runs: Sequence[Run], reference: Run) -> dict[str, bool]:
    """For each run: are all its requests' tokens identical to the reference run's?"""
    ref = reference.outputs()
    return {r.mode: r.outputs() == ref for r in runs}


def timeline_figure(runs: Sequence[Run], title: str = "When each request ran and when its response was ready"):
    """One row per (mode, request): a bar from admission to response, a dot at its last token."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = {"short": "#1f77b4", "long": "#d62728"}
    for run_ in runs:
        for c in run_.completions:
            y = f"{run_.mode} · {c.id}"
            fig.add_bar(y=[y], x=[c.finished_s - c.admitted_s], base=[c.admitted_s], orientation="h",
                        marker_color=colors.get(c.kind, "#7f7f7f"), showlegend=False,
                        hovertext=f"{c.kind}, {len(c.tokens)} tokens, latency {c.finished_s:.2f} s")
            fig.add_scatter(y=[y], x=[c.last_token_s], mode="markers", marker={"color": "black", "size": 5},
                            showlegend=False)
    fig.update_layout(title=title, xaxis_title="seconds from the start", template="plotly_white",
                      barmode="overlay", height=200 + 14 * sum(len(r.completions) for r in runs),
                      yaxis={"autorange": "reversed"})
    return fig


# ------------------------------------------------------------------- transformers' own continuous batching


def hf_continuous_batching(new_tokens: int = 4, timeout_s: float = 60.0) -> dict[str, Any]:
    """Does transformers' own continuous batching (``ContinuousBatchingManager``, behind ``generate_batch``,
    with paged attention) run on this device?

    Tries it on a tiny random Llama with a 4-token prompt. Returns ``available`` and, when not, the
    ``reason`` (the error its generation thread logged).
    """
    import importlib.metadata

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from . import env

    device = env.device()
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, eos_token_id=0, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval().to(device)
    model.config._attn_implementation = "sdpa_paged"
    if not hasattr(model, "generate_batch"):
        return {"available": False, "reason": "this transformers has no generate_batch (continuous batching)",
                "device": device}
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0,
                           num_blocks=8, block_size=16, max_batch_tokens=64)
    errors: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR and record.exc_info:
                exc = record.exc_info[1]
                errors.append(f"{type(exc).__name__}: {exc}")

    log = logging.getLogger("ContinuousBatchingLogger")
    handler, propagate = _Catch(), log.propagate
    log.addHandler(handler)
    log.propagate = False  # the notebook shows one line, not the generation thread's traceback
    got: list[int] = []
    try:
        manager = model.init_continuous_batching(generation_config=gen)
        manager.start()
        manager.add_request([1, 2, 3, 4], max_new_tokens=new_tokens)
        deadline = time.monotonic() + timeout_s
        while manager.is_running() and not got and time.monotonic() < deadline:
            result = manager.get_result(timeout=0.5)
            if result is not None:
                got.append(len(result.generated_tokens))
        if not got and manager.is_running():
            errors.append(f"no result within {timeout_s:g} s")
        manager.stop(block=True, timeout=5.0)
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
    version = importlib.metadata.version("transformers")
    if got and got[0] > 0 and not errors:
        return {"available": True, "reason": "", "device": device, "transformers": version, "tokens": got[0]}
    reason = errors[0] if errors else "its generation thread stopped without a result"
    if device == "cpu" and "NoneType" in reason:
        # its PagedAttentionCache sizes the block pool from the accelerator's free memory
        reason += " (its paged KV cache sizes itself from CUDA/MPS free memory, which a CPU does not report)"
    return {"available": False, "device": device, "transformers": version,
            "reason": f"transformers {version} continuous batching (ContinuousBatchingManager) failed on {device}: "
                      f"{reason}"}


# ------------------------------------------------------------------------------ data/requests.json


def measure_requests(path: Any = None, max_batch_size: int = 8) -> dict[str, Any]:
    """Fill in data/requests.json's lengths with the default model: ``prompt_tokens`` (chat-formatted) and
    ``answer_tokens`` (its greedy answer up to end-of-sequence or the request's ``max_tokens``), measured
    with ``run_continuous``. Run once by ``python -m labkit.scheduler``; the file keeps how it was made."""
    import datetime as dt
    import json
    from pathlib import Path

    from . import config, env, models
    from .results import write_json_atomic

    path = Path(path) if path is not None else config.DATA_DIR / "requests.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    lm = models.load(dtype="fp32")
    reqs = [Request(id=r["id"], prompt_ids=chat_ids(lm.tokenizer, r["prompt"]), max_new_tokens=r["max_tokens"],
                    kind=r["kind"]) for r in data["requests"]]
    result = run_continuous(lm.model, reqs, batching.eos_ids(lm.model, lm.tokenizer), lm.tokenizer.pad_token_id,
                            max_batch_size=max_batch_size)
    for raw, c in zip(data["requests"], result.completions):
        raw.update(prompt_tokens=c.n_prompt, answer_tokens=len(c.tokens), finish_reason=c.finish_reason)
    versions = env.versions(("torch", "transformers"))
    data["_about"] = (
        "Requests written for labkit: short questions, chat tasks, explanations, code, and questions about "
        "passages (the passages were written for this file too). max_tokens is the limit a chat client would "
        "send. prompt_tokens counts the chat-formatted prompt; answer_tokens is the length of the default "
        f"model's ({models.display_name()}, fp32) greedy answer, ending at end-of-sequence or max_tokens, "
        f"measured {dt.date.today().isoformat()} with torch {versions['torch']}, transformers "
        f"{versions['transformers']} by `python -m labkit.scheduler` (labkit.scheduler.measure_requests).")
    write_json_atomic(path, data)
    return result.summary()


if __name__ == "__main__":
    print(measure_requests())

"""Continuous batching's engine: requests join a running batch at any token boundary.

A new request is prefilled alone, then its KV cache is joined to the running batch's (``join_caches``,
left-padded to the longer one) and trimmed back when the longest leaves (``trim_left``). ``PrefixCache``
keeps the cache of prompts seen before, so a shared prefix is prefilled once. ``ContinuousEngine`` runs
the loop on the decode core.
"""
from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.checks import positive
from ..decoding import decode
from . import decoder

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
    At most ``capacity_tokens`` positions are kept; the least recently used entry goes first. ``clear()``
    (the server's ``POST /flush_cache``) drops every entry from another thread; the counters go on.

    A second tier: with ``disk_dir``, an evicted entry that ``spill(positions)`` accepts (every one by default) is
    written there (a safetensors file per entry) and read back when a later prompt shares its prefix, instead of
    being recomputed. A file that is gone or cannot be read is a miss: the prompt is recomputed, never answered
    from bad KV. ``disk_hits``, ``disk_writes``, ``disk_failures`` count what the tier did.
    """

    def __init__(self, capacity_tokens: int, block_tokens: int = 16, disk_dir: str | Path | None = None,
                 spill: Callable[[int], bool] | None = None) -> None:
        positive("capacity_tokens", capacity_tokens)
        positive("block_tokens", block_tokens)
        self.capacity_tokens = capacity_tokens
        self.block_tokens = block_tokens
        self.entries: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}  # prefix ids -> per layer (K, V), LRU order
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.spill = spill or (lambda n: True)
        self.on_disk: dict[tuple[int, ...], tuple[Path, str]] = {}  # prefix ids -> (its file, the device it came from)
        self.queries = self.hits = self.hit_tokens = self.query_tokens = self.evictions = 0
        self.disk_hits = self.disk_writes = self.disk_failures = 0
        self._lock = threading.RLock()  # the model thread looks up and stores; /metrics and a flush come from the event loop
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)

    @property
    def tokens(self) -> int:
        with self._lock:  # /metrics reads it while the model thread stores
            return sum(len(k) for k in self.entries)

    def _aligned(self, n: int) -> int:
        return n // self.block_tokens * self.block_tokens

    def lookup(self, prompt_ids: Sequence[int]) -> tuple[int, Any]:
        """``_lookup`` under the cache's lock."""
        with self._lock:
            return self._lookup(prompt_ids)

    def store(self, prompt_ids: Sequence[int], cache: Any) -> None:
        """``_store`` under the cache's lock."""
        with self._lock:
            self._store(prompt_ids, cache)

    def clear(self) -> int:
        """Drop every entry (the counters go on); returns how many there were. A running sequence keeps the KV it
        was already given."""
        with self._lock:
            n = len(self.entries) + len(self.on_disk)
            self.entries = {}
            for path, _device in self.on_disk.values():
                path.unlink(missing_ok=True)
            self.on_disk = {}
            return n

    def _lookup(self, prompt_ids: Sequence[int]) -> tuple[int, Any]:
        """(positions reused, a DynamicCache holding them) for the longest cached prefix; (0, None) on a
        miss. At least one prompt token is always left to prefill (its logits give the first token)."""
        from transformers import DynamicCache

        prompt = tuple(prompt_ids)
        self.queries += 1
        self.query_tokens += len(prompt)
        best, best_key = 0, None
        for key in [*self.entries, *self.on_disk]:
            n = 0
            limit = min(len(key), len(prompt) - 1)
            while n < limit and key[n] == prompt[n]:
                n += 1
            n = self._aligned(n)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        if best_key in self.on_disk:
            layers = self._reload(best_key)
            if layers is None:  # gone or unreadable: recompute, never answer from bad KV
                return 0, None
            self._keep(best_key, layers)
        else:
            layers = self.entries.pop(best_key)
            self.entries[best_key] = layers  # most recently used
        cache = DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(k[:, :, :best], v[:, :, :best], i)
        self.hits += 1
        self.hit_tokens += best
        return best, cache

    def _store(self, prompt_ids: Sequence[int], cache: Any) -> None:
        """Keep the KV of the prompt's aligned prefix (its cache must hold the whole prompt, batch of one)."""
        n = self._aligned(len(prompt_ids))
        if n == 0 or n > self.capacity_tokens:
            return
        key = tuple(prompt_ids[:n])
        if any(len(k) >= n and k[:n] == key for k in self.entries):
            return  # already covered by a longer (or equal) entry
        for k in [k for k in self.entries if len(k) < n and key[:len(k)] == k]:
            del self.entries[k]  # this entry covers the shorter ones it extends
        self._keep(key, [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in _layers(cache)])

    def _keep(self, key: tuple[int, ...], layers: list[tuple[Any, Any]]) -> None:
        """Hold ``layers`` in memory as the most recent entry; evict the least recent beyond capacity (to disk when
        the tier takes it)."""
        self.entries[key] = layers
        while self.tokens > self.capacity_tokens:
            old = next(iter(self.entries))
            evicted = self.entries.pop(old)
            self.evictions += 1
            if self.disk_dir is not None and self.spill(len(old)):
                self._write(old, evicted)

    def _path(self, key: tuple[int, ...]) -> Path:
        return self.disk_dir / f"prefix-{hashlib.sha1(repr(key).encode()).hexdigest()[:16]}-{len(key)}.safetensors"

    def _write(self, key: tuple[int, ...], layers: list[tuple[Any, Any]]) -> None:
        from safetensors.torch import save_file

        path = self._path(key)
        tensors = {f"{kind}{i}": t.contiguous().cpu() for i, (k, v) in enumerate(layers) for kind, t in (("k", k), ("v", v))}
        save_file(tensors, str(path), metadata={"positions": str(len(key))})
        self.on_disk[key] = (path, str(layers[0][0].device))
        self.disk_writes += 1

    def _reload(self, key: tuple[int, ...]) -> list[tuple[Any, Any]] | None:
        """The entry's KV read back from its file onto the device it was evicted from (the model's), or None when the
        file is gone, cut short or not the entry it should be (its positions checked)."""
        from safetensors.torch import load_file

        path, device = self.on_disk.pop(key)
        try:
            tensors = load_file(str(path), device=device)
            layers = [(tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(len(tensors) // 2)]
            if not layers or any(k.shape[2] != len(key) or v.shape[2] != len(key) for k, v in layers):
                raise ValueError(f"{path.name} does not hold {len(key)} positions")
        except Exception:  # noqa: BLE001  a missing, truncated or foreign file: the prompt is recomputed
            self.disk_failures += 1
            path.unlink(missing_ok=True)
            return None
        path.unlink(missing_ok=True)  # back in memory: the file would be a stale copy
        self.disk_hits += 1
        return layers

    def stats(self) -> dict[str, Any]:
        return {"queries": self.queries, "hits": self.hits, "hit_rate": self.hits / self.queries if self.queries else None,
                "hit_tokens": self.hit_tokens, "token_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else None,
                "entries": len(self.entries), "tokens": self.tokens, "evictions": self.evictions,
                "disk_entries": len(self.on_disk), "disk_hits": self.disk_hits, "disk_writes": self.disk_writes,
                "disk_failures": self.disk_failures}


@dataclass
class _Prefill:
    """A sequence whose prompt is being prefilled, possibly over several steps (chunked prefill)."""

    seq: decoder.Sequence
    cache: Any
    done: int = 0  # prompt positions already in ``cache``


class ContinuousEngine:
    """The continuous-batching core: ``admit`` a sequence at any token boundary, ``step`` all running ones.

    Sequences are ``labkit.serve.decoder.Sequence``: ``on_token(token, finish_reason)`` is called for every token
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
        self.active: list[decoder.Sequence] = []  # row i of the batch is active[i]
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

    def admit(self, seq: decoder.Sequence) -> None:
        """Take ``seq`` in: prefill it alone (now, or chunk by chunk in the next steps), then its first token
        comes out and its KV cache joins the running batch's."""
        from transformers import DynamicCache

        if not seq.prompt_ids:
            raise ValueError("every sequence needs at least one prompt token")
        positive("max_new_tokens", seq.max_new_tokens)
        reused, cache = self.prefix_cache.lookup(seq.prompt_ids) if self.prefix_cache is not None else (0, None)
        seq.cached_tokens = reused
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
            tok = decoder.pick(logits, [seq])
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

    def step(self) -> list[decoder.Sequence]:
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
            self.next_tokens = decoder.pick(logits, self.active)
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

    def abort(self) -> list[decoder.Sequence]:
        """Stop every running or prefilling sequence ('aborted'); returns them."""
        stopped = self.active + [job.seq for job in self.prefilling]
        for seq in stopped:
            seq.finish_reason = "aborted"
        self.active = []
        self.prefilling.clear()
        self._clear()
        return stopped

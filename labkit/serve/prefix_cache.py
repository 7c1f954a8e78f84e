"""Automatic prefix caching: the keys and values of prompt prefixes seen before, reused, in memory and on disk.

A later prompt that starts as an earlier one did (a shared system prompt, a document) prefills only the rest:
``PrefixCache.lookup`` finds the longest cached block-aligned prefix, ``store`` keeps a prefilled prompt's.
Least recently used entries leave first; with a disk tier they are written to safetensors files and read back
on a later hit instead of being recomputed. The continuous-batching engine (``labkit.serve.continuous``) asks it
before each prefill; the server's ``POST /flush_cache`` clears it.
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.checks import positive


def full_attention_layers(cache: Any) -> list[Any]:
    """The layers of a transformers cache, each a full-attention ``DynamicLayer`` whose keys and values can be cut
    and joined; ``ValueError`` for a sliding-window or hybrid cache."""
    layers = getattr(cache, "layers", None)
    if layers is None or any(not hasattr(layer, "keys") or type(layer).__name__ != "DynamicLayer" for layer in layers):
        raise ValueError("continuous batching here needs a full-attention model (transformers DynamicLayer caches); "
                         "sliding-window or hybrid caches are not supported")
    return layers


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
        self._keep(key, [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone())
                         for layer in full_attention_layers(cache)])

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

"""Continuous batching's engine: requests join a running batch at any token boundary.

A new request is prefilled alone, then its KV cache is joined to the running batch's (``join_caches``,
left-padded to the longer one) and trimmed back when the longest leaves (``trim_left``). A ``PrefixCache``
(``labkit.serve.prefix_cache``) keeps the cache of prompts seen before, so a shared prefix is prefilled once.
``ContinuousEngine`` runs the loop on the decode core.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from ..core.checks import positive
from ..decoding import decode
from . import decoder
from .prefix_cache import PrefixCache, full_attention_layers

# ------------------------------------------------------------------------------------------ continuous


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
    for layer, new in zip(full_attention_layers(cache), full_attention_layers(new_cache)):
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
    for layer in full_attention_layers(cache):
        layer.keys = layer.keys[:, :, first:]
        layer.values = layer.values[:, :, first:]
    return mask[:, first:]


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

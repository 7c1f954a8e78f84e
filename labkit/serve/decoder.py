"""The batched greedy decode the server runs: ``decode_batch`` prefills a batch of ``Sequence``s and steps them
together on the decode core's shared KV cache, dropping each sequence as soon as it finishes, and reports
``BatchStats``. ``eos_ids`` gathers every end-of-sequence id a model and its tokenizer know. ``pick`` chooses
each row's next token, after masking the rows of sequences held to a grammar (``decoding.grammar.Constraint``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.checks import positive
from ..decoding import decode
from ..decoding.sampling import Sampling, choose
from ..decoding.grammar import Constraint

# ------------------------------------------------------------------------ the server's batched decoder


@dataclass
class Sequence:
    """One request inside ``decode_batch``. ``on_token(token_id, finish_reason)`` runs in the model thread;
    ``finish_reason`` is None until the last token ('stop' at end-of-sequence, 'length' at the limit).
    Tokens are greedy unless ``sampling`` says otherwise (``labkit.decoding.sampling``); a ``constraint`` keeps
    them inside its grammar (``pick`` masks the row, ``emit`` advances the grammar)."""

    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    on_token: Callable[[int, str | None], None] | None = None
    cancelled: Callable[[], bool] = lambda: False
    sampling: Sampling | None = None  # None: greedy
    owner: Any = None  # whoever submitted it (the server's request), for answering after a failure
    constraint: Constraint | None = None  # None: any token may come next
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | cancelled | aborted
    cached_tokens: int = 0  # prompt positions a prefix cache served, not computed (the continuous engine sets it)

    def emit(self, token: int, eos: set[int]) -> bool:
        """Record one generated token, set ``finish_reason`` when it ends the sequence, call ``on_token``;
        True while the sequence goes on."""
        self.tokens.append(token)
        if self.constraint is not None:
            self.constraint.accept(token)
        if token in eos and (not self.ignore_eos or self.constraint is not None and self.constraint.terminated):
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.on_token is not None:
            self.on_token(token, self.finish_reason)
        if self.finish_reason is None and self.cancelled():
            self.finish_reason = "cancelled"
        return self.finish_reason is None


@dataclass
class BatchStats:
    """What one ``decode_batch`` call did: steps run and row-steps computed versus tokens kept."""

    batch_size: int
    prompt_tokens: int
    padded_prompt_tokens: int
    steps: int = 0
    computed_rows: int = 0  # sum over steps of the rows in the batch (padding rows count)
    output_tokens: int = 0

    @property
    def wasted_fraction(self) -> float:
        return 1 - self.output_tokens / self.computed_rows if self.computed_rows else 0.0


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends a sequence: the tokenizer's and the generation config's."""
    ids: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def pick(logits: Any, seqs: list[Sequence]) -> Any:
    """(B, V) logits → (B,) next tokens for ``seqs`` (row i is ``seqs[i]``): the row of each running sequence
    with a ``constraint`` is masked in place first, then ``choose`` takes the greedy or sampled token. Rows of
    unconstrained sequences are not touched."""
    for row, s in enumerate(seqs):
        if s.constraint is not None and s.finish_reason is None:
            s.constraint.mask(logits[row:row + 1])
    return choose(logits, [s.sampling for s in seqs])


def decode_batch(model: Any, seqs: list[Sequence], eos: set[int], pad_id: int, *, drop_finished: bool = True,
                 should_abort: Callable[[], bool] = lambda: False) -> BatchStats:
    """Greedy-decode a batch of sequences together, streaming each token through ``Sequence.on_token``.

    ``drop_finished=True`` removes a finished (or cancelled) sequence from the batch and the KV cache at once;
    ``False`` keeps it computing until the longest sequence is done, the cost static batching pays.
    ``should_abort()`` is checked between steps; an abort marks unfinished sequences 'aborted'.
    """
    import torch

    if not seqs:
        raise ValueError("decode_batch needs at least one sequence")
    for s in seqs:
        if not s.prompt_ids:
            raise ValueError("every sequence needs at least one prompt token")
        positive("max_new_tokens", s.max_new_tokens)
    device = next(model.parameters()).device
    input_ids, mask = decode.left_pad([s.prompt_ids for s in seqs], pad_id, device)
    stats = BatchStats(batch_size=len(seqs), prompt_tokens=sum(len(s.prompt_ids) for s in seqs),
                       padded_prompt_tokens=int(input_ids.numel()))
    active = list(range(len(seqs)))  # row r of the batch holds seqs[active[r]]
    with torch.inference_mode():
        logits, cache = decode.prefill(model, input_ids, mask)
        next_tokens = pick(logits, seqs)
        pos = decode.positions(mask)[:, -1]
        while True:
            stats.steps += 1
            stats.computed_rows += len(active)
            chosen = next_tokens.tolist()  # one host sync per step for the whole batch
            keep = []
            for row, idx in enumerate(active):
                s = seqs[idx]
                if s.finish_reason is not None:  # finished earlier, kept because drop_finished=False
                    keep.append(row)
                    continue
                stats.output_tokens += 1
                if s.emit(int(chosen[row]), eos) or not drop_finished:
                    keep.append(row)
            if all(seqs[i].finish_reason is not None for i in active):
                break
            if should_abort():
                for i in active:
                    if seqs[i].finish_reason is None:
                        seqs[i].finish_reason = "aborted"
                break
            if len(keep) < len(active):  # shrink the batch: rows, mask and every layer's KV cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, pos, next_tokens = mask[index], pos[index], next_tokens[index]
                active = [active[r] for r in keep]
            # finished rows kept by drop_finished=False are fed padding and their output is ignored
            done = torch.tensor([seqs[i].finish_reason is not None for i in active], device=device)
            feed = next_tokens.masked_fill(done, pad_id)
            mask, pos = decode.extend(mask), pos + 1
            logits = decode.decode_one_token(model, feed, cache, pos, mask)
            next_tokens = pick(logits, [seqs[i] for i in active])
    return stats

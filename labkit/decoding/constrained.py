"""Structured outputs, the mechanism: a mask over the vocabulary, recomputed at every step, that leaves only the
tokens which keep the text on its way to something the grammar accepts.

``choice_mask`` is the mask for a choice among strings and ``regex_mask`` the same rule for a regular expression
(the ``regex`` package's partial matching answers "can this still become a match?"). ``constrained_greedy`` runs
the decode core with a mask applied to each step's logits and times the mask apart from the model: a mask written
this way visits every vocabulary entry at every step, which is what grammar engines (xgrammar, llguidance)
precompute away.

The vocabulary is the text each token id decodes to (``token_texts``); a token whose text is empty is never
allowed (it would add nothing, forever).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import regex

from ..core import timing
from . import decode


def token_texts(tokenizer: Any) -> list[str]:
    """The text of every token id on its own (``len(tokenizer)`` entries): what a mask compares with the grammar."""
    return [tokenizer.decode([i]) for i in range(len(tokenizer))]


def parses(text: str) -> bool:
    """Whether ``text`` is one JSON value."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def choice_mask(text: str, choices: Sequence[str], vocab: Sequence[str], eos_id: int) -> list[bool]:
    """True for each token that keeps ``text`` a prefix of one of ``choices``; end-of-sequence only once ``text``
    is a whole choice."""
    allowed = [bool(piece) and any(c.startswith(text + piece) for c in choices) for piece in vocab]
    allowed[eos_id] = text in choices
    return allowed


def regex_mask(text: str, pattern: str, vocab: Sequence[str], eos_id: int) -> list[bool]:
    """True for each token after which ``text`` can still become a full match of ``pattern``; end-of-sequence
    only when ``text`` already is one."""
    compiled = regex.compile(pattern)
    allowed = [bool(piece) and compiled.fullmatch(text + piece, partial=True) is not None for piece in vocab]
    allowed[eos_id] = compiled.fullmatch(text) is not None
    return allowed


@dataclass
class Constrained:
    """One constrained decode: the text and tokens, whether it ended at end-of-sequence, and where the time went."""

    text: str
    tokens: list[int]
    finished: bool  # ended with end-of-sequence (the grammar accepted the text), not at the token limit
    prefill_s: float = 0.0
    mask_s: list[float] = field(default_factory=list)  # seconds computing the mask, per step
    step_s: list[float] = field(default_factory=list)  # seconds in the model, per decode step

    def summary(self) -> dict[str, Any]:
        def per_step(xs: list[float]) -> float | None:
            return 1e3 * sum(xs) / len(xs) if xs else None
        return {"text": self.text, "tokens": len(self.tokens), "finished": self.finished,
                "mask_ms_per_token": per_step(self.mask_s), "model_ms_per_token": per_step(self.step_s)}


MaskFn = Callable[[str, Sequence[str], int], Sequence[bool]]  # (text so far, vocab, eos id) -> allowed per token


def constrained_greedy(model: Any, tokenizer: Any, prompt_ids: Sequence[int], mask: MaskFn | None,
                       max_new_tokens: int = 16, vocab: Sequence[str] | None = None,
                       eos_id: int | None = None) -> Constrained:
    """Greedy decode of one prompt on the decode core, each step's logits masked by ``mask(text, vocab, eos_id)``
    (None: no mask). Stops at end-of-sequence or ``max_new_tokens``; a step whose mask allows nothing stops too
    (the grammar has no way on), as not finished."""
    import torch

    vocab = token_texts(tokenizer) if vocab is None else vocab
    eos_id = tokenizer.eos_token_id if eos_id is None else eos_id
    device = model.device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    attn = torch.ones_like(ids)
    out = Constrained(text="", tokens=[], finished=False)
    with torch.inference_mode():
        t0 = timing.now(device)
        logits, cache = decode.prefill(model, ids, attn)
        pos = decode.positions(attn)[:, -1]
        out.prefill_s = timing.now(device) - t0
        for _ in range(max_new_tokens):
            row = logits[0].float()
            if mask is not None:
                t0 = timing.clock()
                allowed = torch.as_tensor(list(mask(out.text, vocab, eos_id)), dtype=torch.bool, device=device)
                out.mask_s.append(timing.clock() - t0)
                if allowed.shape[0] < row.shape[0]:  # the model's head may be wider than the tokenizer
                    allowed = torch.cat([allowed, torch.zeros(row.shape[0] - allowed.shape[0], dtype=torch.bool,
                                                              device=device)])
                if not bool(allowed.any()):
                    break
                row = row.masked_fill(~allowed[:row.shape[0]], float("-inf"))
            token = int(row.argmax())
            if token == eos_id:
                out.finished = True
                break
            out.tokens.append(token)
            out.text += vocab[token]
            t0 = timing.now(device)
            attn, pos = decode.extend(attn), pos + 1
            logits = decode.decode_one_token(model, torch.tensor([token], device=device), cache, pos, attn)
            out.step_s.append(timing.now(device) - t0)
    return out


def form_not_answer(free_text: str, forced_text: str, choices: Sequence[str]) -> str:
    """What the mask guaranteed and what it did not, from one question answered free and forced: the forced answer
    is one of ``choices`` by construction (the form); whether it is the right one is the model's (the answer). Where
    the free answer named another choice, say which: the mask changed the answer, it did not check it."""
    named = [c for c in choices if regex.search(rf"\b{regex.escape(c)}\b", free_text, flags=regex.IGNORECASE)]
    said = "a mask guarantees the form, not the answer"
    if named and forced_text not in named:
        return (f"{said}: the free answer named {', '.join(repr(c) for c in named)}, the mask forced {forced_text!r}, "
                "one of the choices and nothing more: no mask checks which choice is right")
    return f"{said}: {forced_text!r} is one of the choices by construction; whether it is right is the model's to get"

"""Choosing the next token from a batch of logits: greedy, or sampled with temperature and top-p.

A request that gives no ``temperature`` is decoded greedily (the lab's server default, reproducible by
construction). A sampled request draws from its own ``torch.Generator``, seeded by its ``seed`` (or a
random seed when it has none): the same seed and prompt give the same tokens, whatever else shares
the batch.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sampling:
    """How one sequence chooses its tokens. ``temperature`` 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    _generator: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature={self.temperature!r}: must be a number from 0 (greedy) to 2")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be a number above 0 and at most 1")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r}: must be an integer (or None)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device: Any) -> Any:
        """This sequence's random stream, created on the logits' device at its first draw."""
        import torch

        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))
        return self._generator


def sample(logits: Any, s: Sampling) -> Any:
    """One token id (a 0-d tensor) from (V,) logits: temperature, then the smallest set of tokens whose
    probabilities add up to ``top_p`` (nucleus), then one draw."""
    import torch

    probs = torch.softmax(logits.float() / s.temperature, dim=-1)
    if s.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= s.top_p  # tokens after the nucleus is already full
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=s.generator(logits.device))[0]


def choose(logits: Any, samplings: list[Sampling | None]) -> Any:
    """(B, V) logits → (B,) token ids: greedy rows by argmax, sampled rows by ``sample``."""
    assert logits.shape[0] == len(samplings), f"{logits.shape[0]} rows of logits, {len(samplings)} samplings"
    tokens = logits.argmax(-1)
    for row, s in enumerate(samplings):
        if s is not None and not s.greedy:
            tokens[row] = sample(logits[row], s)
    return tokens

"""Same prompt, same greedy decoding, a different answer: one prompt alone and inside batches of other prompts.

In a batch, the prompt's row is padded on the left to the longest prompt and every matrix multiply sees more rows:
kernels block and sum in another order, floating-point addition is not associative, and a near-tie between two
tokens can go the other way. ``batch_divergence`` decodes each target prompt alone and in batches of ``batches``
(the target first, then the next prompts in turn) and compares the target's answer (``quality.divergence``: the
first position that differs and the largest logit difference up to it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import decode, quality


def answer(model: Any, prompts: Sequence[Sequence[int]], pad_id: int, new_tokens: int) -> tuple[list[int], list[Any]]:
    """Greedy decode of ``prompts`` as one batch: the first prompt's tokens and its logits, step by step (on the CPU)."""
    import torch

    device = next(model.parameters()).device
    ids, mask = decode.left_pad([list(p) for p in prompts], pad_id, device)
    steps: list[Any] = []
    tokens = decode.greedy(model, ids, mask, new_tokens=new_tokens, logits_out=steps)
    with torch.inference_mode():
        logits = [s[0].float().cpu() for s in steps]
    return tokens[0].cpu().tolist(), logits


def batch_divergence(model: Any, prompts: Sequence[Sequence[int]], pad_id: int, *, batches: Sequence[int] = (2, 4, 8),
                     targets: Sequence[int] = (0,), new_tokens: int = 32) -> list[dict[str, Any]]:
    """One row per (target prompt, batch size): where the target's answer in the batch first differs from its answer
    alone (None: identical for ``new_tokens``), the largest logit difference up to there, and the answers' tokens."""
    if not prompts:
        raise ValueError("no prompts")
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or b < 2:
            raise ValueError(f"batch size {b!r}: 2 or more (1 is the prompt alone)")
    rows = []
    for t in targets:
        if not 0 <= t < len(prompts):
            raise ValueError(f"target {t}: an index into the {len(prompts)} prompts")
        alone, alone_logits = answer(model, [prompts[t]], pad_id, new_tokens)
        for b in batches:
            batch = [prompts[(t + i) % len(prompts)] for i in range(b)]
            got, logits = answer(model, batch, pad_id, new_tokens)
            d = quality.divergence(alone, got, alone_logits, logits)
            rows.append({"target": t, "batch": b, "first_difference": d.position, "max_logit_diff": d.max_logit_diff,
                         "steps_compared": d.steps, "alone": alone, "in_batch": got})
    return rows

"""Checks for notebook 10 (beyond the articles): the acceptance rule of speculative decoding, the longest
block-aligned prefix a prefix cache can reuse, and a per-channel int8 KV quantiser."""
from __future__ import annotations

from ...precision.quantisers import quantize_kv
from ..exercises import Wrong, call, close, exercise, number, slipped


@exercise("10.accept", "speculative decoding's greedy acceptance rule", hints=(
    "Keep the draft's longest prefix that the model agrees with, then add the model's own next token: its "
    "logits come from the same verify pass, so every pass adds at least one token, even when no draft token "
    "is accepted or the draft is empty.",
    "Compare draft[i] with predicted[i] from i = 0 and stop at the first disagreement. A later match does not "
    "count: that draft token was conditioned on a wrong one. With n tokens accepted, the model's token is "
    "predicted[n]: it replaces the first rejected draft token, or follows a draft accepted in full.",
    "Count how many leading draft tokens equal the prediction at the same index, stopping at the first disagreement "
    "or at the draft's end; call it n. The pass adds those n draft tokens (`draft[:n]`) and then one token of the "
    "model's own: its prediction at index n.",
))
def _accept(fn) -> None:
    cases = [  # (draft, the model's greedy token after each prefix of it (one more than the draft), expected)
        ([5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8]),  # all accepted, plus the bonus token
        ([5, 6, 7], [5, 9, 7, 8], [5, 9]),  # stop at the first disagreement; the model's token replaces it
        ([5, 6, 7], [4, 6, 7, 8], [4]),  # nothing accepted: still one token, as plain decoding
        ([], [3], [3]),  # no draft: one plain decode step
        ([1, 1, 2], [1, 1, 1, 2], [1, 1, 1]),
    ]
    for draft, predicted, want in cases:
        got = call(fn, list(draft), list(predicted))
        if not isinstance(got, list) or not all(isinstance(t, int) for t in got):
            raise Wrong(f"return a list of token ids, got {type(got).__name__}")
        if got == want:
            continue
        if got == want[:-1] or (draft == predicted[:len(draft)] and got == draft):
            raise Wrong(f"draft {draft}, model {predicted}: got {got}, expected {want}; the model's own token "
                        "after the accepted prefix comes for free (its logits are already computed)", hint=1)
        if len(got) > len(want):
            raise Wrong(f"draft {draft}, model {predicted}: got {got}, expected {want}; stop at the first "
                        "disagreement: every later draft token was conditioned on a wrong token", hint=2)
        raise Wrong(f"draft {draft}, model {predicted}: got {got}, expected {want}", hint=2)


@exercise("10.reusable_prefix", "the longest block-aligned prefix a prefix cache can reuse", hints=(
    "Count the positions where the new prompt matches the cached one from the start, up to the first token "
    "that differs. The cache keeps its KV in whole blocks, so only whole blocks of that shared prefix can be "
    "taken: round the count down to a multiple of block.",
    "At least one prompt token must still be prefilled, since the last token's logits give the first new "
    "token. So the match may cover at most len(prompt) - 1 positions, and no more than len(cached). Apply that "
    "limit before aligning down: a 40-token prompt the cache holds in full reuses 32 positions with block 8.",
    "Walk both prompts from the start while their tokens agree, stopping at the cached prompt's end and one short of "
    "the new prompt's end (its last token is always prefilled, it gives the logits); then round the count down to "
    "whole blocks with `//` and a multiplication.",
))
def _reusable_prefix(fn) -> None:
    cached = list(range(100, 140))  # 40 positions cached
    cases = [  # (prompt, block, expected)
        (list(range(100, 120)) + [7, 8, 9], 8, 16),  # 20 shared, aligned down to 16
        (list(range(100, 140)) + [1], 8, 40),  # the whole cached entry, one token left to prefill
        (list(range(100, 140)), 8, 32),  # the same prompt: at least one token must be prefilled (its logits)
        ([5] + list(range(101, 140)), 8, 0),  # differs at the first token: nothing reusable
        (list(range(100, 123)), 4, 20),
    ]
    for prompt, block, want in cases:
        got = call(fn, cached, prompt, block)
        number(got, "a number of positions (int)", integer=True)
        if got == want:
            continue
        whole = len(prompt) <= len(cached) and prompt == cached[:len(prompt)]
        slipped(got, want, [  # a test of the answer a slip gives, why, and the hint written for it
            (lambda n: n % block, "the cache stores whole blocks, so align the shared length down to a multiple of "
                                  "the block size", 1),
            (lambda n: whole and n >= len(prompt), f"the prompt is entirely cached and you reuse all {len(prompt)} "
                                                   "positions: leave at least its last token to prefill, its logits "
                                                   "give the first new token", 2),
        ], f"{got} positions reused with block {block}")
        raise Wrong(f"cached {len(cached)} positions, prompt of {len(prompt)}, block {block}: got {got}, "
                    f"expected {want}", hint=1)


@exercise("10.quantize_kv", "per-channel int8 quantiser for the KV cache", hints=(
    "Give every channel its own scale: for each batch, head and channel, the absmax over the T tokens, divided "
    "by 127, the largest int8 code. Then q is x / scale rounded to the nearest integer and stored as int8, "
    "so that q * scale ≈ x.",
    "A channel is one of the D values of head_dim: reduce over the tokens, dim -2, and keep that dimension, so "
    "scale is (B, H, 1, D). Reducing over dim -1 gives one scale per token instead. Divide by 127, not 255: "
    "int8 keeps 127 steps on each side of zero. Round before the cast and clamp to [-127, 127].",
    "Per channel means reducing over the tokens: the magnitudes' `amax` over `dim=-2` with `keepdim=True`, kept away "
    "from zero with `clamp_min`, divided by 127. For q: divide by the scale, round to the nearest integer, clamp to "
    "±127, cast to int8.",
))
def _quantize_kv(fn) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 40, 16, generator=g)
    x[..., 5] *= 30  # an outlier channel, as keys have
    got = call(fn, x.clone())
    if not isinstance(got, tuple) or len(got) != 2:
        raise Wrong("return a pair (q, scale)")
    q, scale = got
    want_q, want_scale = quantize_kv(x)
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
        raise Wrong(f"q should be an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}", hint=1)
    if not isinstance(scale, torch.Tensor):
        raise Wrong(f"scale should be a tensor, got {type(scale).__name__}")
    if tuple(scale.shape) == (1, 3, 40, 1):
        raise Wrong("you made one scale per token (absmax over head_dim); take it per channel: absmax over the "
                    "tokens (dim -2), shape (B, H, 1, D), so an outlier channel gets its own scale", hint=2)
    close(scale, want_scale, "scale", rtol=1e-5, hint=2)
    ratio = x / want_scale
    tie = ((ratio - ratio.trunc()).abs() - 0.5).abs() < 1e-4  # within float noise of a .5: either code is right
    off = (q.to(torch.int16) != want_q.to(torch.int16)) & ~tie
    if off.any() and torch.equal(q[~tie], ratio.trunc().clamp(-127, 127).to(torch.int8)[~tie]):
        raise Wrong("q is x / scale truncated toward zero: round to the nearest code before the cast "
                    "(.round(), then .clamp(-127, 127))", hint=2)
    if off.any():
        i = tuple(int(v) for v in off.nonzero()[0])
        raise Wrong(f"q{list(i)} is {int(q[i])}, expected {int(want_q[i])} (x / scale = {ratio[i].item():.3f}): round "
                    "x / scale to the nearest integer and clamp it to [-127, 127]", hint=2)
    err = (q.float() * scale - x).abs().max().item()
    if err > want_scale.max().item():
        raise Wrong(f"dequantised q × scale is off by {err:.3g}: more than one step of the largest scale", hint=1)

"""Checks for notebook 10 (beyond the articles): the acceptance rule of speculative decoding, the longest
block-aligned prefix a prefix cache can reuse, and a per-channel int8 KV quantiser."""
from __future__ import annotations

from ...precision.quantisers import quantize_kv
from . import Wrong, call, close, exercise


@exercise("10.accept", "speculative decoding's greedy acceptance rule")
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
                        "after the accepted prefix comes for free (its logits are already computed)")
        if len(got) > len(want):
            raise Wrong(f"draft {draft}, model {predicted}: got {got}, expected {want}; stop at the first "
                        "disagreement: every later draft token was conditioned on a wrong token")
        raise Wrong(f"draft {draft}, model {predicted}: got {got}, expected {want}")


@exercise("10.reusable_prefix", "the longest block-aligned prefix a prefix cache can reuse")
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
        if isinstance(got, bool) or not isinstance(got, int):
            raise Wrong(f"return a number of positions (int), got {type(got).__name__}")
        if got == want:
            continue
        if got % block:
            raise Wrong(f"{got} positions reused with block {block}: the cache stores whole blocks, so align "
                        "the shared length down to a multiple of the block size")
        if len(prompt) <= len(cached) and prompt == cached[:len(prompt)] and got >= len(prompt):
            raise Wrong(f"the prompt is entirely cached and you reuse {got} of its {len(prompt)} positions: "
                        "leave at least its last token to prefill, its logits give the first new token")
        raise Wrong(f"cached {len(cached)} positions, prompt of {len(prompt)}, block {block}: got {got}, expected {want}")


@exercise("10.quantize_kv", "per-channel int8 quantiser for the KV cache")
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
        raise Wrong(f"q should be an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    if not isinstance(scale, torch.Tensor):
        raise Wrong(f"scale should be a tensor, got {type(scale).__name__}")
    if tuple(scale.shape) == (1, 3, 40, 1):
        raise Wrong("you made one scale per token (absmax over head_dim); take it per channel: absmax over the "
                    "tokens (dim -2), shape (B, H, 1, D), so an outlier channel gets its own scale")
    close(scale, want_scale, "scale", rtol=1e-5)
    close(q.to(torch.int16), want_q.to(torch.int16), "q", atol=1)  # rounding at .5 may go either way
    err = (q.float() * scale - x).abs().max().item()
    if err > want_scale.max().item():
        raise Wrong(f"dequantised q × scale is off by {err:.3g}: more than one step of the largest scale")

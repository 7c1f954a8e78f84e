"""The decode core: prefill, one decode step (batched, with its padding mask), and a greedy loop with and
without the KV cache. Every engine in labkit runs on these few functions: the server's dynamic batches
(``serve.decoder.decode_batch``), continuous batching (``serve.continuous.ContinuousEngine``), the static-cache and
compiled decoder (``engines.compiled.StaticDecoder``), the KV-cache measurements (``decoding.kv``) and the profiler
view (``decoding.profiling``).

The core knows nothing about requests, HTTP or tokenization: token ids in, logits and a cache out.

Shapes: B sequences, T prompt positions (shorter prompts padded on the left), V vocabulary entries.
"""
from __future__ import annotations

from typing import Any


def left_pad(prompt_ids: list[list[int]], pad_id: int, device: Any):
    """(B, T) input ids and attention mask on ``device``; shorter prompts are padded on the left so that every
    row's next token lands in the same column."""
    import torch

    longest = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), longest), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, longest - len(p):] = 1
    return ids.to(device), mask.to(device)  # built on the host, one copy each to the model's device


def positions(attention_mask: Any) -> Any:
    """(B, L) position of each token counting real tokens only; pads get 1, as in transformers' generate."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


def prefill(model: Any, input_ids: Any, attention_mask: Any = None, cache: Any = None) -> tuple[Any, Any]:
    """(B, T) prompt → (B, V) logits of its last position, and the KV cache now holding its T positions.

    ``attention_mask`` may be longer than T: (B, past + T) when the cache already holds ``past`` positions
    (a prompt fed in chunks). ``cache``: by default the one the model makes from its config (a
    ``DynamicCache`` with its sliding-window layers, a hybrid model's own), or a ``StaticCache``.
    """
    pos = None if attention_mask is None else positions(attention_mask)[:, -input_ids.shape[1]:]
    # no cache given: the model makes its own, as generate's is made, from its config: sliding-window layers keep
    # their window, a hybrid model gets its linear-attention states
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, past_key_values=cache,
                use_cache=True, logits_to_keep=1)  # the lm_head is a V-wide matmul: run it for the last position only
    return out.logits[:, -1], out.past_key_values if cache is None else cache


def decode_one_token(model: Any, tokens: Any, cache: Any, position_ids: Any, attention_mask: Any = None,
                     cache_position: Any = None) -> Any:
    """One decode step for the whole batch: (B,) tokens at (B,) positions → (B, V) next-token logits.

    The step reads every weight once for all B rows: that is why batching raises throughput. The cache grows
    by one position (a static cache is written in place at ``cache_position`` instead, so the shapes never
    change and a compiled step is built once). ``attention_mask`` (B, past + 1) hides each row's left padding.
    """
    out = model(input_ids=tokens[:, None], position_ids=position_ids[:, None], attention_mask=attention_mask,
                cache_position=cache_position, past_key_values=cache, use_cache=True)
    return out.logits[:, -1]


def verify(model: Any, tokens: Any, cache: Any) -> Any:
    """(B, T) tokens fed after the cache in one pass → (B, T, V) logits of every position: how a speculative
    step checks T drafted tokens at once. Positions follow the cache (no padding)."""
    out = model(input_ids=tokens, past_key_values=cache, use_cache=True)
    return out.logits


def extend(attention_mask: Any) -> Any:
    """The mask one step later: every row gains one real position."""
    import torch

    return torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)


def greedy(model: Any, input_ids: Any, attention_mask: Any = None, new_tokens: int = 16,
           use_cache: bool = True, logits_out: list | None = None) -> Any:
    """(B, T) prompt → (B, new_tokens) greedy tokens.

    With the cache: one prefill, then one token per step. Without it: every step runs the whole sequence
    again, recomputing the keys and values of every earlier position. ``logits_out``: a list that receives each
    step's (B, V) logits (on the model's device), the scores each token was chosen from.
    """
    import torch

    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
        raise ValueError(f"new_tokens={new_tokens!r}: must be a positive integer")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    chosen = []
    with torch.inference_mode():
        if use_cache:
            logits, cache = prefill(model, input_ids, mask)
            pos = positions(mask)[:, -1]
            for _ in range(new_tokens - 1):
                if logits_out is not None:
                    logits_out.append(logits)
                chosen.append(logits.argmax(-1))
                mask, pos = extend(mask), pos + 1
                logits = decode_one_token(model, chosen[-1], cache, pos, mask)
            if logits_out is not None:
                logits_out.append(logits)
            chosen.append(logits.argmax(-1))
        else:
            ids = input_ids
            for _ in range(new_tokens):
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                               use_cache=False).logits[:, -1]
                if logits_out is not None:
                    logits_out.append(logits)
                chosen.append(logits.argmax(-1))
                ids, mask = torch.cat([ids, chosen[-1][:, None]], dim=1), extend(mask)
    return torch.stack(chosen, dim=1)


def same_as_generate(model: Any, input_ids: Any, attention_mask: Any = None, new_tokens: int = 16,
                     use_cache: bool = True) -> dict[str, Any]:
    """Greedy tokens of ``greedy`` and of transformers' ``generate`` for the same prompt(s), and whether they
    are identical: the proof that the core is the same computation as the library. ``generate`` stops a row
    at its end-of-sequence token (the core never stops), so each row is compared up to that token."""
    import torch

    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    ours = greedy(model, input_ids, mask, new_tokens, use_cache=use_cache).cpu().tolist()
    with torch.inference_mode():
        ref = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=model.generation_config.pad_token_id)[:, input_ids.shape[1]:].cpu().tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    compared = [next((i + 1 for i, t in enumerate(row) if t in eos), len(row)) for row in ref]
    identical = all(o[:n] == r[:n] for o, r, n in zip(ours, ref, compared))
    return {"identical": identical, "ours": ours, "generate": [r[:n] for r, n in zip(ref, compared)],
            "compared_tokens": compared, "new_tokens": new_tokens, "use_cache": use_cache}


SOURCE_PARTS = ("left_pad", "positions", "prefill", "decode_one_token", "verify", "extend", "greedy")


def show_source(*names: str) -> Any:
    """This module's source for ``names`` (default: the whole core), rendered with syntax highlighting."""
    import inspect

    from IPython.display import Code

    names = names or SOURCE_PARTS
    unknown = [n for n in names if n not in SOURCE_PARTS]
    if unknown:
        raise ValueError(f"no decode-core function {unknown}; choose from {list(SOURCE_PARTS)}")
    return Code("\n\n".join(inspect.getsource(globals()[n]) for n in names), language="python")

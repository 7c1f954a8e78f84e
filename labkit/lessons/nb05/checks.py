"""Checks for notebook 05 (the KV cache): the bytes one position costs, and one decode step with the cache."""
from __future__ import annotations

from typing import Any

from ...decoding.decode import prefill
from ..exercises import Wrong, call, close, exercise, number, slipped, tiny_llama


@exercise("05.kv_bytes_per_token", "KV-cache bytes per token", hints=(
    "Every layer keeps, for each position, one key and one value vector per key/value head, each head_dim numbers "
    "wide, and each number takes bytes_per_value bytes. Multiply those counts together.",
    "Read two numbers from the config with care. Grouped-query attention caches only config.num_key_value_heads "
    "heads, fewer than num_attention_heads. A config may set head_dim itself, to something other than hidden_size "
    "/ num_attention_heads: use config.head_dim where it is set.",
    "`2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * bytes_per_value`, with `head_dim = "
    "getattr(config, \"head_dim\", None) or config.hidden_size // config.num_attention_heads`.",
))
def check_kv_bytes_per_token(fn: Any) -> None:
    from transformers import LlamaConfig

    cases = [  # (what the case is, config, bytes per value); numbers chosen so that each mistake gives its own value
        ("grouped-query attention in fp32",
         LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=6), 4),
        ("a config that sets head_dim itself, in bf16",
         LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
                     head_dim=96), 2),
        ("plain multi-head attention in fp32",
         LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3), 4),
    ]
    for what, cfg, b in cases:
        n_layers, heads, kv_heads, hd = (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                                         cfg.head_dim)
        want = 2 * n_layers * kv_heads * hd * b
        got = call(fn, cfg, b)
        number(got, "a number of bytes", hint=1)
        if got == want:
            continue
        guess = cfg.hidden_size // heads
        slipped(got, want, [  # the value a slip gives, why, and the hint written for it
            (2 * n_layers * heads * hd * b, f"you counted all {heads} attention heads, but only the {kv_heads} "
                                            "key/value heads are cached (grouped-query attention: "
                                            "config.num_key_value_heads)", 2),
            (n_layers * kv_heads * hd * b, "that is half: each position keeps a key and a value, so count both", 1),
            (2 * kv_heads * hd * b, f"that is one layer: each of the {n_layers} layers keeps its own keys and values "
                                    "(config.num_hidden_layers)", 1),
            (2 * n_layers * kv_heads * guess * b, f"this config sets head_dim = {hd}, not hidden_size / "
                                                  f"num_attention_heads = {guess}: read config.head_dim", 2),
            (2 * n_layers * kv_heads * hd, f"that counts values, not bytes: multiply by the {b} bytes per value", 1),
        ], f"for {what}, {got:,} bytes")
        raise Wrong(f"for {what} ({n_layers} layers, {heads} heads, {kv_heads} KV heads, head_dim {hd}, {b} bytes "
                    f"per value) you gave {got:,} bytes, expected {want:,}")


@exercise("05.decode_step", "decode step with the KV cache", hints=(
    "The cache already holds the keys and values of every earlier position, so the step feeds the model only the "
    "new tokens, one per row, and hands it the cache: the new token attends to the cached positions and appends "
    "its own key and value.",
    "Mind the shapes. The model takes input_ids and position_ids as (B, L), and L is 1 here, so give the (B,) "
    "tokens and positions a length-1 dimension. Its .logits come back (B, 1, V): return the last position's "
    "logits as (B, V), not the chosen tokens.",
    "One model call with four keyword arguments: the tokens and the positions each get a sequence dimension of length "
    "1 (indexing with `[:, None]`), the cache goes in as `past_key_values`, and the model must keep using the cache. "
    "Its logits are (B, 1, V): keep the last position, (B, V).",
))
def check_decode_step(fn: Any) -> None:
    import torch

    model = tiny_llama()
    ids = torch.tensor([[5, 9, 13, 17, 21, 25], [30, 31, 32, 33, 34, 35]])
    n_prompt = ids.shape[1]
    with torch.inference_mode():
        logits, cache = prefill(model, ids)
        tokens = logits.argmax(-1)  # (2,) the first new token of each row
        got = call(fn, model, tokens, cache, torch.full_like(tokens, n_prompt))
        full = model(input_ids=torch.cat([ids, tokens[:, None]], dim=1), use_cache=False).logits[:, -1]
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"return the next-token logits, a (B, V) tensor; got {type(got).__name__}", hint=2)
    if got.dim() == 1:
        raise Wrong(f"that is shape {tuple(got.shape)}: return the logits (B, V), not the chosen tokens (the loop "
                    "takes the argmax)", hint=2)
    if got.dim() == 3:
        raise Wrong(f"the logits have shape {tuple(got.shape)}: keep the last position only, out.logits[:, -1] → "
                    "(B, V)", hint=2)
    held = cache.get_seq_length()
    if held == n_prompt:
        raise Wrong("the cache did not grow, so the step ignored it: pass past_key_values=cache to the model, so "
                    "the new token attends to the cached prompt and appends its own key and value", hint=1)
    if held != n_prompt + 1:
        raise Wrong(f"the cache grew by {held - n_prompt} positions, expected 1: feed only the new tokens, "
                    "tokens[:, None] of shape (B, 1), not the whole sequence", hint=1)
    try:
        close(got, full, "next-token logits", rtol=1e-4, atol=1e-4)
    except Wrong as exc:
        raise Wrong(f"{exc}; the same step without a cache gives other logits: is the new token at position "
                    f"{n_prompt} (position_ids), right after the prompt?") from None

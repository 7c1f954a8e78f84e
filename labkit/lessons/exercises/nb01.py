"""Checks for notebook 01 (hardware sizing): a Llama's weight bytes from its config, the KV cache layer by layer, and
the decode ceiling."""
from __future__ import annotations

import numbers
from typing import Any

from ...core import config as lab_config
from ...model import kvlayout
from ...model.sizing import decode_ceiling, shape
from . import Wrong, call, close, exercise


def _number(got: Any, what: str) -> float:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):  # numpy scalars count
        raise Wrong(f"return {what} as a number, got {type(got).__name__}")
    return got


@exercise("01.weight_bytes", "weight bytes from a config")
def check_weight_bytes(fn: Any) -> None:
    from transformers import LlamaConfig

    cases = [  # (what the case is, config, bytes per parameter); sizes chosen so that each mistake gives its own value
        ("grouped-query attention, tied embeddings, fp32",
         LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                     num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True), 4),
        ("an untied output head, in bf16",
         LlamaConfig(vocab_size=500, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=False), 2),
        ("a config that sets head_dim itself, tied, fp16",
         LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True), 2),
    ]
    for what, cfg, b in cases:
        want = shape(cfg).n_params * b  # counted on a meta-device model: no formula of ours
        got = _number(call(fn, cfg, b), "the bytes")
        if got == want:
            continue
        h, L, V, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
        heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        guess = h // heads

        def total(head_dim: int = hd, kv_heads: int = kv, mlp: int = 3, norms: bool = True, tied: bool = True) -> int:
            attn = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim  # q and o; k and v
            per_layer = attn + mlp * h * inter + (2 * h if norms else 0)
            head = 0 if (cfg.tie_word_embeddings and tied) else V * h
            return V * h + L * per_layer + (h if norms else 0) + head

        mistakes = {
            total(kv_heads=heads) * b: f"k_proj and v_proj have {kv} key/value heads, not {heads}: grouped-query "
                                       "attention shares them (config.num_key_value_heads)",
            total(tied=False) * b: "this config ties the output head to the embedding (config.tie_word_embeddings): "
                                   "the vocab × hidden matrix is stored once",
            total(norms=False) * b: "the RMSNorm weights are missing: two per layer and one after the last layer, "
                                    "hidden_size values each",
            total(mlp=2) * b: "the MLP has three matrices (gate_proj, up_proj, down_proj), each hidden × intermediate",
            total(head_dim=guess) * b: f"this config sets head_dim = {hd}, not hidden_size / num_attention_heads = "
                                       f"{guess}: read config.head_dim",
            want // b: f"that counts parameters, not bytes: multiply by the {b} bytes per parameter",
        }
        mistakes.pop(want, None)
        if got in mistakes:
            raise Wrong(f"for {what}, {got:,} bytes: {mistakes[got]}")
        raise Wrong(f"for {what} ({L} layers, hidden {h}, intermediate {inter}, {heads} heads, {kv} KV heads, "
                    f"head_dim {hd}, vocabulary {V}, tied {cfg.tie_word_embeddings}, {b} bytes per parameter) you gave "
                    f"{got:,} bytes, expected {want:,} ({got / want:.3f}×)")


@exercise("01.decode_ceiling", "decode ceiling: bandwidth ÷ bytes per step")
def check_decode_ceiling(fn: Any) -> None:

    cases = [  # (weight bytes, KV bytes per token, context, batch, bandwidth bytes/s)
        (270_000_000, 36_864, 100, 1, 10e9),
        (1_000_000_000, 100_000, 1_000, 8, 300e9),
        (3_000_000_000, 131_072, 4_096, 4, 2e12),
    ]
    for w, kv, ctx, batch, bw in cases:
        want = decode_ceiling(w, kv, ctx, batch, bw)
        got = _number(call(fn, w, kv, ctx, batch, bw), "the tokens/s")
        setting = (f"{w:,} weight bytes, {kv:,} KV bytes per token, context {ctx}, batch {batch}, "
                   f"{bw / 1e9:g} GB/s")
        step = w + kv * ctx * batch
        mistakes = {
            bw / step: "that is per sequence: one step reads the bytes once and yields one token for each of the "
                       "batch's sequences, so multiply by the batch",
            batch * bw / w: "the KV cache is missing: each step also reads every sequence's cached keys and values "
                            "(KV bytes per token × context × batch)",
            batch * bw / (w + kv * ctx): "each sequence has its own KV cache: multiply the KV bytes by the batch too",
            bw / (w + kv * ctx): "the weights are read once per step for the whole batch, not once per sequence",
            step / (batch * bw): "that is seconds per token: the ceiling is tokens per second, bandwidth ÷ bytes",
            batch * bw / 2**30 * 1e9 / step: "bandwidth_bytes_per_s is already in bytes per second: no GiB conversion",
        }
        mistakes.pop(want, None)
        for value, reason in mistakes.items():
            if abs(got - value) <= 1e-6 * abs(value):
                raise Wrong(f"for {setting}: {got:.4g} tokens/s; {reason}")
        try:
            close(got, want, f"the ceiling for {setting}", rtol=1e-6)
        except Wrong as exc:
            raise Wrong(f"{exc} tokens/s (batch × bandwidth ÷ bytes one step reads)") from None


def _kv_cases() -> list[tuple[str, dict[str, Any], int, int]]:
    """(model, decoder config dict, context, bytes per value): published configs of each kind (data/configs)."""
    import json

    cases = []
    for name, context in (("gemma-4-26B-A4B", 32768), ("Qwen3.5-27B", 32768), ("Mistral-7B-v0.1", 32768),
                          ("Llama-3.1-8B", 4096), ("gemma-4-26B-A4B", 600)):
        raw = json.loads((lab_config.DATA_DIR / "configs" / name / "config.json").read_text(encoding="utf-8"))
        cases.append((name, kvlayout.text_config(raw), context, 2))
    return cases


@exercise("01.kv_layer_by_layer", "KV-cache bytes layer by layer")
def check_kv_layer_by_layer(fn: Any) -> None:
    import copy

    for name, cfg, context, b in _kv_cases():
        layers = kvlayout.layers(cfg)
        want = sum(layer.tokens_held(context) * layer.per_token * b for layer in layers)
        got = _number(call(fn, copy.deepcopy(cfg), context, b), "the bytes")
        if got == want:
            continue
        heads = cfg["num_attention_heads"]
        kv, hd = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or cfg["hidden_size"] // heads
        n = cfg["num_hidden_layers"]
        mistakes = {
            2 * n * kv * hd * b * context: "that is the naive formula, every layer full attention of one size: read "
                                           "config['layer_types'] and size each layer by its kind",
            sum(context * layer.per_token * b for layer in layers if layer.kind != "linear"):
                "a sliding layer keeps at most config['sliding_window'] tokens: min(context, sliding_window)",
            sum(layer.tokens_held(context) * 2 * kv * hd * b for layer in layers if layer.kind != "linear"):
                "full layers here have their own size: config['global_head_dim'] and "
                "config['num_global_key_value_heads'] where the config gives them",
            sum(context * 2 * kv * hd * b for layer in layers if layer.kind == "linear") + want:
                "a linear-attention layer keeps a fixed state, no tokens: leave it out",
            want // 2: "each token keeps K and V: two vectors of KV heads × head_dim values",
        }
        mistakes.pop(want, None)
        if got in mistakes:
            raise Wrong(f"for {name} at {context:,} tokens, {got:,} bytes: {mistakes[got]}")
        kinds = ", ".join(f"{sum(layer.kind == k for layer in layers)} {k}" for k in ("full", "sliding", "linear")
                          if any(layer.kind == k for layer in layers))
        raise Wrong(f"for {name} at {context:,} tokens ({kinds} layers, {b} bytes per value) you gave {got:,} bytes, "
                    f"expected {want:,} ({got / want:.3f}×)")

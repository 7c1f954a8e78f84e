"""Checks for notebook 01 (hardware sizing): a Llama's weight bytes from its config, the KV cache layer by layer, and
the decode ceiling."""
from __future__ import annotations

import numbers
from typing import Any

from ...core import config as lab_config
from ...model import kvlayout
from ...model.sizing import decode_ceiling, shape
from ..exercises import Wrong, call, close, exercise


def _number(got: Any, what: str) -> float:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):  # numpy scalars count
        raise Wrong(f"return {what} as a number, got {type(got).__name__}")
    return got


@exercise("01.weight_bytes", "weight bytes from a config", hints=(
    "The bytes are the parameter count times bytes_per_param. Count the parameters part by part, as the markdown "
    "lists them: the embedding; per layer four attention projections, three MLP matrices and two RMSNorm weights; "
    "a final RMSNorm; and the output head.",
    "Read the sizes from the config, not from hidden_size alone. k_proj and v_proj have num_key_value_heads heads, "
    "fewer than q_proj's num_attention_heads under grouped-query attention. Every head is config.head_dim wide, "
    "which a config may set to something other than hidden_size / num_attention_heads. A tied output head "
    "(tie_word_embeddings) reuses the embedding and adds nothing.",
    "With `h = config.hidden_size` and `hd = config.head_dim`, per layer `attn = 2 * h * config.num_attention_heads "
    "* hd + 2 * h * config.num_key_value_heads * hd` and `per_layer = attn + 3 * h * config.intermediate_size + 2 * "
    "h`. The total is the embedding `config.vocab_size * h`, the layers, the final norm `h` and `head = 0 if "
    "config.tie_word_embeddings else config.vocab_size * h`, times `bytes_per_param`.",
))
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

        mistakes = {  # the value a slip gives: (why, the hint written for it)
            total(kv_heads=heads) * b: (f"k_proj and v_proj have {kv} key/value heads, not {heads}: grouped-query "
                                        "attention shares them (config.num_key_value_heads)", 2),
            total(tied=False) * b: ("this config ties the output head to the embedding (config.tie_word_embeddings): "
                                    "the vocab × hidden matrix is stored once", 2),
            total(norms=False) * b: ("the RMSNorm weights are missing: two per layer and one after the last layer, "
                                     "hidden_size values each", 1),
            total(mlp=2) * b: ("the MLP has three matrices (gate_proj, up_proj, down_proj), each hidden × "
                               "intermediate", 1),
            total(head_dim=guess) * b: (f"this config sets head_dim = {hd}, not hidden_size / num_attention_heads = "
                                        f"{guess}: read config.head_dim", 2),
            want // b: (f"that counts parameters, not bytes: multiply by the {b} bytes per parameter", 1),
        }
        mistakes.pop(want, None)
        if got in mistakes:
            why, hint = mistakes[got]
            raise Wrong(f"for {what}, {got:,} bytes: {why}", hint=hint)
        raise Wrong(f"for {what} ({L} layers, hidden {h}, intermediate {inter}, {heads} heads, {kv} KV heads, "
                    f"head_dim {hd}, vocabulary {V}, tied {cfg.tie_word_embeddings}, {b} bytes per parameter) you gave "
                    f"{got:,} bytes, expected {want:,} ({got / want:.3f}×)")


@exercise("01.decode_ceiling", "decode ceiling: bandwidth ÷ bytes per step", hints=(
    "Decode is bound by memory bandwidth: bandwidth ÷ the bytes one step reads is the steps per second. Each step "
    "yields one token for every sequence of the batch, so the tokens per second are the batch times that.",
    "Count the bytes one step reads. Every weight is read once for the whole batch, not once per sequence. Each "
    "sequence reads its own KV cache, kv_bytes_per_token × context, so the KV bytes are multiplied by the batch.",
    "Two lines. First the bytes one step reads: `weight_bytes` once, plus the KV of every token of every sequence "
    "(kv_bytes_per_token, context and batch multiplied). Then divide the bandwidth by it, and multiply by the tokens "
    "one step yields, one per sequence. The bandwidth is already in bytes per second.",
))
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
        mistakes = {  # the value a slip gives: (why, the hint written for it)
            bw / step: ("that is per sequence: one step reads the bytes once and yields one token for each of the "
                        "batch's sequences, so multiply by the batch", 1),
            batch * bw / w: ("the KV cache is missing: each step also reads every sequence's cached keys and values "
                             "(KV bytes per token × context × batch)", 2),
            batch * bw / (w + kv * ctx): ("each sequence has its own KV cache: multiply the KV bytes by the batch "
                                          "too", 2),
            bw / (w + kv * ctx): ("the weights are read once per step for the whole batch, not once per sequence", 2),
            step / (batch * bw): ("that is seconds per token: the ceiling is tokens per second, bandwidth ÷ bytes", 1),
            batch * bw / 2**30 * 1e9 / step: ("bandwidth_bytes_per_s is already in bytes per second: no GiB "
                                              "conversion", 3),
        }
        mistakes.pop(want, None)
        for value, (reason, hint) in mistakes.items():
            if abs(got - value) <= 1e-6 * abs(value):
                raise Wrong(f"for {setting}: {got:.4g} tokens/s; {reason}", hint=hint)
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


@exercise("01.kv_layer_by_layer", "KV-cache bytes layer by layer", hints=(
    "Sum over the layers, each sized by its kind in config['layer_types']: a full layer keeps every token of the "
    "context, a sliding layer only its window, a linear-attention layer none. Each kept token costs a key and a "
    "value: 2 × KV heads × head_dim values, times bytes_per_value.",
    "A sliding layer keeps min(context, config['sliding_window']) tokens. A full layer uses "
    "config['global_head_dim'] and config['num_global_key_value_heads'] where the config gives them, else head_dim "
    "and num_key_value_heads (where missing: hidden_size // num_attention_heads, and num_attention_heads). A config "
    "without layer_types is full everywhere, or sliding everywhere when it sets sliding_window.",
    'Loop `for kind in types:` over `config.get("layer_types")` (or num_hidden_layers copies of one kind where it is '
    'missing); on `"full_attention"` add `context * 2 * full_kv_heads * full_head_dim`, on `"sliding_attention"` '
    'add `min(context, window) * 2 * kv_heads * head_dim`, and skip any other kind; multiply the total by '
    '`bytes_per_value`.',
))
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
        mistakes = {  # the value a slip gives: (why, the hint written for it)
            2 * n * kv * hd * b * context: ("that is the naive formula, every layer full attention of one size: read "
                                            "config['layer_types'] and size each layer by its kind", 1),
            sum(context * layer.per_token * b for layer in layers if layer.kind != "linear"):
                ("a sliding layer keeps at most config['sliding_window'] tokens: min(context, sliding_window)", 2),
            sum(layer.tokens_held(context) * 2 * kv * hd * b for layer in layers if layer.kind != "linear"):
                ("full layers here have their own size: config['global_head_dim'] and "
                 "config['num_global_key_value_heads'] where the config gives them", 2),
            sum(context * 2 * kv * hd * b for layer in layers if layer.kind == "linear") + want:
                ("a linear-attention layer keeps a fixed state, no tokens: leave it out", 1),
            want // 2: ("each token keeps K and V: two vectors of KV heads × head_dim values", 1),
        }
        mistakes.pop(want, None)
        if got in mistakes:
            why, hint = mistakes[got]
            raise Wrong(f"for {name} at {context:,} tokens, {got:,} bytes: {why}", hint=hint)
        kinds = ", ".join(f"{sum(layer.kind == k for layer in layers)} {k}" for k in ("full", "sliding", "linear")
                          if any(layer.kind == k for layer in layers))
        raise Wrong(f"for {name} at {context:,} tokens ({kinds} layers, {b} bytes per value) you gave {got:,} bytes, "
                    f"expected {want:,} ({got / want:.3f}×)")

"""What each layer of a model keeps per sequence, read from its config: the KV cache layer by layer.

The formula every tutorial teaches, 2 × layers × KV heads × head_dim × bytes per token, holds only when every
layer is full attention with one head size. The models of 2026 break it four ways, each a field of config.json:

- ``layer_types`` names each layer's kind. ``sliding_attention`` (and ``chunked_attention``) layers keep at most
  ``sliding_window`` (``attention_chunk_size``) tokens; ``linear_attention`` layers (Gated DeltaNet) keep a state
  of fixed size per sequence, whatever the context; ``full_attention`` layers keep every token.
- Per-layer sizes: a layer's head size and KV heads can differ from the model's (Gemma 4: ``global_head_dim`` for
  full layers, and ``num_global_key_value_heads`` where ``attention_k_eq_v`` reuses the keys' projection for the
  values, which transformers still caches as a tensor of their own; ``per_layer_config`` entries by layer).
- Multi-head latent attention (``kv_lora_rank``): a serving engine stores one latent of ``kv_lora_rank +
  qk_rope_head_dim`` values per token and layer, no × 2 for K and V. transformers' eager cache stores the
  expanded keys (heads × (qk_nope_head_dim + qk_rope_head_dim)) and values (heads × v_head_dim) instead: both are
  given, each labelled (``per_token`` is the engine's, ``per_token_expanded`` transformers').
- ``num_kv_shared_layers``: the last layers reuse earlier layers' KV and keep none of their own.

A layer kind this module does not know raises, naming the field: a model is never sized by the full-cache formula
by default.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

KINDS = ("full", "sliding", "linear", "mla", "shared")
# config.json's layer_types values → this module's kinds
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "sliding",
               "linear_attention": "linear"}
RECURRENT_STATE_BYTES = 4  # transformers keeps Gated DeltaNet's recurrent state in fp32 whatever the model's dtype


@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps per sequence: ``per_token`` values for each token it holds (at most ``window``
    tokens when it has one), plus ``state`` values and ``recurrent_state`` values of fixed size."""

    index: int
    kind: str  # one of KINDS
    per_token: int  # values per token: K and V (or MLA's latent, as a serving engine stores it)
    per_token_expanded: int  # the same as transformers' cache stores it (MLA: expanded K and V; else = per_token)
    window: int | None = None  # sliding: tokens kept
    state: int = 0  # linear attention: the convolution's state, values in the cache dtype
    recurrent_state: int = 0  # linear attention: the recurrent state, values kept in fp32

    def tokens_held(self, context: int) -> int:
        """Tokens of a ``context``-token sequence this layer holds."""
        if self.kind in ("linear", "shared"):
            return 0
        return min(context, self.window) if self.window is not None else context

    def bytes(self, context: int, value_bytes: float, expanded: bool = False) -> int:
        """Bytes this layer keeps for one sequence of ``context`` tokens, values of ``value_bytes`` each;
        ``expanded``: MLA as transformers stores it, not as a serving engine does."""
        per_token = self.per_token_expanded if expanded else self.per_token
        return int(self.tokens_held(context) * per_token * value_bytes + self.state * value_bytes
                   + self.recurrent_state * RECURRENT_STATE_BYTES)


def text_config(cfg: Any) -> dict[str, Any]:
    """The decoder's config as a dict: a multimodal config's ``text_config`` when it has one."""
    data = cfg if isinstance(cfg, dict) else cfg.to_dict()
    inner = data.get("text_config")
    return inner if isinstance(inner, dict) and inner.get("num_hidden_layers") else data


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def layer_types(cfg: dict[str, Any]) -> list[str]:
    """Each layer's ``layer_types`` entry; a config without the field is full attention throughout, or sliding
    throughout when it sets ``sliding_window`` (Mistral 7B v0.1) and does not switch it off (``use_sliding_window``)."""
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        window = _get(cfg, "sliding_window", "attention_chunk_size")
        if cfg.get("use_sliding_window") is False:
            window = None
        return ["sliding_attention" if window else "full_attention"] * n
    types = list(types)
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries for num_hidden_layers={n}: the config is inconsistent")
    return types


def _per_layer(cfg: dict[str, Any], index: int) -> dict[str, Any]:
    """The fields ``per_layer_config`` overrides for layer ``index`` (a list by layer, or a dict keyed by the
    layer's index or its layer type); {} when the config has none."""
    per = cfg.get("per_layer_config")
    if per is None:
        return {}
    if isinstance(per, list):
        if len(per) != int(cfg["num_hidden_layers"]):
            raise ValueError(f"per_layer_config has {len(per)} entries for num_hidden_layers={cfg['num_hidden_layers']}")
        return dict(per[index] or {})
    if isinstance(per, dict):  # keyed by the layer's index (transformers 5 writes "05"), or by its layer type
        by_index = {int(k): v for k, v in per.items() if str(k).isdigit()}
        return dict(by_index.get(index) or per.get(layer_types(cfg)[index]) or {})
    raise ValueError(f"per_layer_config is a {type(per).__name__}: expected a list by layer or a dict")


def naive_head_dim(cfg: Any) -> int:
    """The head size the tutorial formula plugs in, read as transformers reads it: ``head_dim`` when the config gives
    it; for latent attention, which has no single head size (keys carry qk_nope + qk_rope values, values
    v_head_dim, the cache a latent), transformers' choice of ``qk_rope_head_dim``; else hidden size / heads."""
    c = text_config(cfg)
    if _get(c, "head_dim") is not None:
        return int(_get(c, "head_dim"))
    if c.get("kv_lora_rank") and c.get("qk_rope_head_dim"):
        return int(c["qk_rope_head_dim"])
    return int(c["hidden_size"]) // int(c["num_attention_heads"])


def layers(cfg: Any) -> list[LayerCache]:
    """What every layer of the model whose config is ``cfg`` (a transformers config or its dict) keeps."""
    c = text_config(cfg)
    n = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(_get(c, "num_key_value_heads", default=heads))
    head_dim = int(_get(c, "head_dim", default=int(c["hidden_size"]) // heads))
    types = layer_types(c)
    shared_from = n - int(c.get("num_kv_shared_layers") or 0)
    out = []
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] = {t!r}: labkit does not know what such a layer keeps (known: "
                             f"{sorted(LAYER_TYPES)}); add it to labkit.model.kvlayout before sizing this model")
        kind = LAYER_TYPES[t]
        own = _per_layer(c, i)
        over = {**c, **own}
        if i >= shared_from:
            out.append(LayerCache(i, "shared", 0, 0))
        elif kind == "linear":
            out.append(_linear(i, over))
        elif c.get("kv_lora_rank"):
            out.append(_mla(i, over, heads))
        else:
            # a full layer's own sizes (global_*) where the config gives them; a per-layer entry wins over both
            names = (("global_head_dim", "head_dim"), ("num_global_key_value_heads", "num_key_value_heads"))
            if not c.get("attention_k_eq_v"):  # Gemma 4: full layers' own KV heads go with keys reused as values
                names = (names[0], ("num_key_value_heads",))
            if kind != "full":
                names = (("head_dim",), ("num_key_value_heads",))
            hd = int(_get(own, *names[0]) or _get(c, *names[0], default=head_dim))
            kvh = int(_get(own, *names[1]) or _get(c, *names[1], default=kv_heads))
            v_dim = int(_get(own, "v_head_dim") or hd)
            window = None if kind == "full" else int(_required(over, i, "sliding_window", "attention_chunk_size"))
            per = kvh * (hd + v_dim)
            out.append(LayerCache(i, kind, per, per, window=window))
    return out


def _required(cfg: dict[str, Any], index: int, *names: str) -> Any:
    value = _get(cfg, *names)
    if value is None:
        raise ValueError(f"layer {index} is {cfg.get('layer_types', ['?'] * (index + 1))[index]!r} but the config has "
                         f"no {' or '.join(names)}: cannot tell how much it keeps")
    return value


def _mla(index: int, c: dict[str, Any], heads: int) -> LayerCache:
    rank = int(c["kv_lora_rank"])
    rope = int(_required(c, index, "qk_rope_head_dim"))
    nope = int(_required(c, index, "qk_nope_head_dim"))
    v_dim = int(_required(c, index, "v_head_dim"))
    return LayerCache(index, "mla", per_token=rank + rope, per_token_expanded=heads * (nope + rope) + heads * v_dim)


def _linear(index: int, c: dict[str, Any]) -> LayerCache:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5): a causal convolution's state over q, k and v (``linear_conv_kernel_dim``
    positions, as transformers keeps it) and a recurrent state of value heads × key dim × value dim."""
    k_heads = int(_required(c, index, "linear_num_key_heads"))
    v_heads = int(_required(c, index, "linear_num_value_heads"))
    k_dim = int(_required(c, index, "linear_key_head_dim"))
    v_dim = int(_required(c, index, "linear_value_head_dim"))
    kernel = int(_required(c, index, "linear_conv_kernel_dim"))
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return LayerCache(index, "linear", 0, 0, state=conv_dim * kernel, recurrent_state=v_heads * k_dim * v_dim)


def kind_counts(layer_caches: list[LayerCache] | tuple[LayerCache, ...]) -> dict[str, int]:
    """How many layers of each kind, in the order the kinds first appear ({"sliding": 25, "full": 5})."""
    return dict(Counter(layer.kind for layer in layer_caches))


def uniform(layer_caches: list[LayerCache] | tuple[LayerCache, ...]) -> bool:
    """True when every layer is full attention of one size: the one case the naive formula is exact for."""
    return (all(layer.kind == "full" for layer in layer_caches)
            and len({layer.per_token for layer in layer_caches}) == 1)

"""Exact sizing from a model's config: parameters, weight bytes, KV cache, roofline ceiling.

Parameters are counted on a model built on the meta device (no per-architecture formula,
no memory), so biases, tied embeddings and GQA are right for any HF causal LM. A mixture-of-experts
model's count is extended to the config's expert count, and its active parameters (those one token
reads) and the weights a batch reads come from ``moe``. The KV cache is summed layer by layer
(``kvlayout``): sliding windows, linear attention's fixed state and latent attention each keep what
they really keep. Tables of several models side by side: ``size_tables``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.checks import positive
from ..core.config import DEFAULT_CONFIG_DIR, DEFAULT_MODEL_NAME
from . import gpus, kvlayout, moe
from .dtypes import DTYPE_BYTES, QUANTIZED, kv_dtype_for, layout, layout_bits_per_weight, normalize_dtype

USABLE_FRACTION = 0.90  # a GPU's memory left for weights + KV after CUDA context and activations


def load_config(model: str):
    """A transformers config from ``default``, a local directory with config.json, or a hub id."""
    from transformers import AutoConfig

    if model == "default":
        return AutoConfig.from_pretrained(DEFAULT_CONFIG_DIR)
    try:
        path = Path(model).expanduser()
    except RuntimeError:  # "~name" for a user this machine does not have
        raise ValueError(f"{model}: no such user's home directory; give a directory holding config.json, "
                         "or a hub id of the form owner/name") from None
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{model}: no config.json in that directory; point at a HF model directory")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if data.get("auto_map") or data.get("model_type") not in CONFIG_MAPPING_NAMES:
            return _config_object(data)  # never runs a model's own code: its architectures field, or a clear error
        return AutoConfig.from_pretrained(path)
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ValueError(f"{model}: no such directory, and not a hub id of the form owner/name")
    try:
        return AutoConfig.from_pretrained(model)
    except OSError as exc:
        raise ValueError(f"{model}: could not read its config from the hub ({exc.__class__.__name__}); "
                         "pass a local directory holding config.json when offline") from exc


@dataclass(frozen=True)
class ModelShape:
    name: str
    n_params: int
    quantizable_params: int  # weights of nn.Linear layers in the decoder blocks (lm_head excluded)
    quantizable_rows: int  # their output rows (LLM.int8 keeps one fp32 scale per row)
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    kv_layers: tuple[kvlayout.LayerCache, ...] = ()  # what each layer keeps (kvlayout.layers)
    active_params: int | None = None  # parameters one token reads: the routed experts it is sent to, not all
    active_quantizable_params: int | None = None
    active_quantizable_rows: int | None = None
    n_experts: int | None = None  # routed experts per MoE layer (None: a dense model)
    experts_per_token: int | None = None

    @property
    def moe(self) -> bool:
        return self.n_experts is not None


def _text_config(cfg: Any) -> Any:
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _count(data: dict[str, Any]) -> moe.Counts:
    """(parameters, quantisable weights, their rows, and the same three for the routed experts alone) of the
    model built from config dict ``data`` on the meta device."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    cfg = _config_object(data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n_params = sum(p.numel() for p in model.parameters())  # parameters() skips tied duplicates
    out_emb = model.get_output_embeddings()
    quant = rows = e_params = e_quant = e_rows = 0
    expert_modules = {id(m) for name, mod in model.named_modules() if name.endswith(".experts")
                      for m in mod.modules()}
    for name, mod in model.named_modules():
        if name.endswith(".experts"):
            e_params += sum(p.numel() for p in mod.parameters())
            # transformers 5 fuses a layer's experts into (experts, out, in) tensors: quantisable weights all the same
            for p in mod.parameters(recurse=False):
                if p.dim() == 3:
                    quant, rows = quant + p.numel(), rows + p.shape[0] * p.shape[1]
                    e_quant, e_rows = e_quant + p.numel(), e_rows + p.shape[0] * p.shape[1]
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not out_emb:
            quant += module.weight.numel()
            rows += module.out_features
            if id(module) in expert_modules:
                e_quant += module.weight.numel()
                e_rows += module.out_features
    return n_params, quant, rows, e_params, e_quant, e_rows


@lru_cache(maxsize=32)
def _shape_cached(config_json: str, name: str) -> ModelShape:
    data = json.loads(config_json)
    routing = moe.routing(kvlayout.text_config(data))
    if routing is None:
        counts = _count(data)
        active = counts[:3]  # a dense model: one token reads every parameter
    else:
        counts, per_expert = moe.extend(_count, data, routing, name)
        active = moe.active(counts, per_expert, routing)
    n_params, quant, rows = counts[:3]
    text = _text_config(_config_object(data))
    # read from the dict: transformers 5 refuses attribute access to a field that varies per layer (Gemma 4's head_dim)
    td = text.to_dict()
    n_heads = int(td["num_attention_heads"])
    head_dim = int(td.get("head_dim") or td["hidden_size"] // n_heads)
    return ModelShape(
        name=name, n_params=n_params, quantizable_params=quant, quantizable_rows=rows,
        n_layers=int(td["num_hidden_layers"]), n_heads=n_heads,
        n_kv_heads=int(td.get("num_key_value_heads") or n_heads),
        head_dim=head_dim, hidden_size=int(td["hidden_size"]), vocab_size=int(td["vocab_size"]),
        max_position_embeddings=td.get("max_position_embeddings"),
        kv_layers=tuple(kvlayout.layers(td)),
        active_params=active[0], active_quantizable_params=active[1], active_quantizable_rows=active[2],
        n_experts=routing.n_experts if routing else None,
        experts_per_token=routing.experts_per_token if routing else None,
    )


def _config_object(data: dict[str, Any]) -> Any:
    """The transformers config of config dict ``data``. A ``model_type`` this transformers does not know, whose
    ``architectures`` names a class it has (Kimi K2: ``DeepseekV3ForCausalLM``), is read as that class's config;
    otherwise ``ValueError`` naming the transformers version and the fix."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        return AutoConfig.for_model(**data)
    except (ValueError, KeyError) as exc:
        known = {cls: mt for mt, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
        for arch in data.get("architectures") or []:
            if arch in known:
                return AutoConfig.for_model(**{**data, "model_type": known[arch]})
        raise ValueError(f"transformers {transformers.__version__} cannot build model_type "
                         f"{data.get('model_type')!r} to count its parameters: a newer transformers knows it "
                         "(pip install -U transformers); kvlayout.layers sizes its KV cache from the config alone") from exc


def shape(model: str | Any) -> ModelShape:
    """The shape of a model given by name/path (see ``load_config``) or by a config object."""
    cfg = load_config(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else getattr(cfg, "_name_or_path", "") or cfg.model_type
    if name == "default":
        name = DEFAULT_MODEL_NAME
    data = cfg.to_dict()
    return _shape_cached(json.dumps(data, sort_keys=True, default=str), str(name))


def weight_bytes(s: ModelShape, dtype: str) -> int:
    """Bytes of the weights as loaded in ``dtype``.

    fp32/fp16/bf16: every parameter at that width. int8 (LLM.int8), int4/nf4 (bitsandbytes), fp8 (E4M3, a scale
    per output channel), nvfp4 and mxfp4 (E2M1 in blocks of 16 / 32, a one-byte scale per block): the decoder's
    linear weights quantised plus their scales (``dtypes.LAYOUTS``); embeddings, norms and lm_head stay fp16.
    """
    return _weights_bytes(s.n_params, s.quantizable_params, s.quantizable_rows, dtype)


def _weights_bytes(n_params: int, quantizable: int, rows: int, dtype: str) -> int:
    dtype = normalize_dtype(dtype)
    if dtype not in QUANTIZED:
        return int(n_params * DTYPE_BYTES[dtype])
    rest = (n_params - quantizable) * DTYPE_BYTES["fp16"]
    return int(rest + layout(dtype).bytes(quantizable, rows))


def kv_value_bytes(kv_dtype: str) -> float:
    """Bytes of one cached key or value element in ``kv_dtype`` (a float type, fp8 or int8)."""
    kv_dtype = normalize_dtype(kv_dtype)
    if kv_dtype in QUANTIZED and kv_dtype not in ("int8", "fp8"):
        raise ValueError(f"KV cache dtype {kv_dtype!r}: must be a float type, fp8 or int8")
    return DTYPE_BYTES[kv_dtype]


def naive_kv_bytes_per_token(s: ModelShape, kv_dtype: str) -> int:
    """The formula every tutorial teaches: 2 (K and V) × layers × KV heads × head_dim × bytes. Exact only when
    every layer is full attention of one size (``kvlayout.uniform``); ``kv_bytes`` is the layer-by-layer figure."""
    return int(2 * s.n_layers * s.n_kv_heads * s.head_dim * kv_value_bytes(kv_dtype))


def layer_caches(s: ModelShape) -> tuple[kvlayout.LayerCache, ...]:
    if s.kv_layers:
        return s.kv_layers
    # a shape built by hand (tests, exercises): every layer full attention of the model's size
    per = 2 * s.n_kv_heads * s.head_dim
    return tuple(kvlayout.LayerCache(i, "full", per, per) for i in range(s.n_layers))


def kv_bytes_per_token(s: ModelShape, kv_dtype: str, expanded: bool = False) -> int:
    """Bytes one more token adds to the cache while the context is shorter than every sliding window: GQA shrinks
    it by heads / KV heads; linear-attention layers add none; an MLA layer adds its latent (``expanded``: the keys
    and values transformers' cache stores instead). For a model of full-attention layers of one size it is the
    naive formula."""
    b = kv_value_bytes(kv_dtype)
    return int(sum((layer.per_token_expanded if expanded else layer.per_token) * b for layer in layer_caches(s)
                   if layer.kind not in ("linear", "shared")))


def kv_bytes(s: ModelShape, kv_dtype: str, context: int, batch: int = 1, expanded: bool = False) -> int:
    """Bytes the cache holds for ``batch`` sequences of ``context`` tokens, summed layer by layer: a sliding layer
    holds at most its window, a linear-attention layer its fixed state (``kv_state_bytes``), an MLA layer its
    latent (``expanded``: transformers' expanded keys and values)."""
    positive("context", context)
    positive("batch", batch)
    b = kv_value_bytes(kv_dtype)
    return batch * sum(layer.bytes(context, b, expanded) for layer in layer_caches(s))


@lru_cache(maxsize=1)
def transformers_keeps_latent() -> bool:
    """Whether the installed transformers caches latent attention as its latent (transformers 5: one
    ``kv_lora_rank`` vector and one ``qk_rope_head_dim`` key per token and layer) or as expanded keys and values
    (transformers 4.57). Asked for real: a one-layer latent-attention model with a few hundred parameters is built,
    prefilled, and its cache's last dimension read."""
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=16, hidden_size=16, intermediate_size=16, moe_intermediate_size=8,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=4,
                           q_lora_rank=8, qk_rope_head_dim=2, qk_nope_head_dim=6, v_head_dim=6, n_routed_experts=2,
                           num_experts_per_tok=1, n_group=1, topk_group=1, first_k_dense_replace=1)
    model = AutoModelForCausalLM.from_config(cfg).eval()  # built on the CPU: its input goes there too
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([[1, 2, 3]], device="cpu"), use_cache=True).past_key_values
    layer = cache.layers[0] if hasattr(cache, "layers") else None
    keys = layer.keys if layer is not None else cache[0][0]
    return int(keys.shape[-1]) == cfg.kv_lora_rank


def transformers_kv_bytes(s: ModelShape, kv_dtype: str, context: int, batch: int = 1) -> int:
    """``kv_bytes`` as the installed transformers' own cache holds it: a latent-attention layer as its latent or as
    expanded keys and values, whichever this transformers keeps (``transformers_keeps_latent``)."""
    expanded = any(layer.kind == "mla" for layer in layer_caches(s)) and not transformers_keeps_latent()
    return kv_bytes(s, kv_dtype, context, batch, expanded=expanded)


def kv_bytes_by_kind(s: ModelShape, kv_dtype: str, context: int, batch: int = 1,
                     expanded: bool = False) -> dict[str, int]:
    """``kv_bytes`` split by layer kind (full, sliding, linear, mla), only the kinds the model has."""
    b = kv_value_bytes(kv_dtype)
    out: dict[str, int] = {}
    for layer in layer_caches(s):
        out[layer.kind] = out.get(layer.kind, 0) + batch * layer.bytes(positive("context", context), b, expanded)
    return {k: out[k] for k in kvlayout.KINDS if k in out}


def kv_state_bytes(s: ModelShape, kv_dtype: str, batch: int = 1) -> int:
    """The fixed part of the cache, per ``batch`` sequences whatever their length: linear attention's states."""
    b = kv_value_bytes(kv_dtype)
    return batch * sum(layer.bytes(0, b) for layer in layer_caches(s))  # no tokens held: the states alone


def active_weight_bytes(s: ModelShape, dtype: str) -> int:
    """Bytes of the weights one token reads in ``dtype``: a mixture of experts reads only the experts it is
    routed to (``active_params``); a dense model reads them all (= ``weight_bytes``)."""
    if not s.moe or s.active_params is None:
        return weight_bytes(s, dtype)
    return _weights_bytes(s.active_params, s.active_quantizable_params or 0, s.active_quantizable_rows or 0, dtype)


def decode_bytes_per_step(weight_b: int, kv_per_token_b: int, context: int, batch: int) -> int:
    """Bytes one decode step must read: every weight once, plus each sequence's KV so far."""
    return weight_b + kv_per_token_b * context * batch


def decode_ceiling(weight_b: int, kv_per_token_b: int, context: int, batch: int, bandwidth_bytes_per_s: float) -> float:
    """Roofline upper bound on aggregate decode tokens/s: batch × bandwidth ÷ bytes read per step."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth {bandwidth_bytes_per_s}: must be positive")
    return batch * bandwidth_bytes_per_s / decode_bytes_per_step(weight_b, kv_per_token_b, context, batch)


def compute_bound_batch(n_params: int, weight_b: int, kv_per_token_b: int, context: int,
                        bandwidth_bytes_per_s: float, flops_per_s: float) -> float | None:
    """Batch size above which a decode step takes longer to compute than to read.

    Compute time 2·N·B / F equals memory time (W + B·K·ctx) / bw at
    B* = (W / bw) / (2N / F − K·ctx / bw). ``None`` when KV reads grow faster than compute:
    then decode never turns compute-bound at this context.
    """
    denom = 2 * n_params / flops_per_s - kv_per_token_b * context / bandwidth_bytes_per_s
    if denom <= 0:
        return None
    return (weight_b / bandwidth_bytes_per_s) / denom


@dataclass
class SizeEstimate:
    model: str
    dtype: str
    kv_dtype: str
    context: int
    batch: int
    n_params: int
    weight_bytes: int
    kv_bytes_per_token: int
    kv_bytes: int
    total_bytes: int
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    bandwidth_gbs: float | None = None
    decode_tokens_per_s_ceiling: float | None = None  # aggregate over the batch
    decode_tokens_per_s_per_sequence_ceiling: float | None = None
    compute_bound_batch: float | None = None
    # layer by layer (kvlayout): the naive formula's figure beside the real one, the real one split by layer kind
    layer_kinds: dict[str, int] = field(default_factory=dict)  # layers of each kind
    kv_bytes_naive: int = 0  # 2 × layers × KV heads × head_dim × bytes × tokens × batch
    kv_bytes_by_kind: dict[str, int] = field(default_factory=dict)
    kv_state_bytes: int = 0  # the part that does not grow with the context (linear attention's states)
    kv_bytes_transformers: int | None = None  # MLA only: what the installed transformers' cache holds (kv_bytes: the latent)
    active_params: int = 0  # parameters one token reads (a mixture of experts: its routed experts only)
    active_weight_bytes: int = 0
    weight_bytes_read_per_step: int = 0  # a decode step of the batch: active experts, more of them as the batch grows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def weight_bytes_read(s: ModelShape, dtype: str, batch: int) -> int:
    """Weight bytes one decode step of ``batch`` sequences reads. Dense: all of them. A mixture of experts: the
    experts its tokens are routed to (``moe.bytes_read``): those of k experts at batch 1, all of them as the batch
    grows."""
    total, active = weight_bytes(s, dtype), active_weight_bytes(s, dtype)
    if not s.moe or not s.experts_per_token or active == total:
        return total
    return moe.bytes_read(total, active, s.n_experts, s.experts_per_token, batch)


def estimate(model: str | Any, dtype: str = "fp16", context: int = 2048, batch: int = 1,
             gpu: str | None = None, bandwidth_gbs: float | None = None) -> SizeEstimate:
    """Weights + KV for ``batch`` sequences of ``context`` tokens, and, with a GPU or a
    bandwidth, whether it fits and the roofline decode ceiling."""
    dtype = normalize_dtype(dtype)
    positive("context", context)
    positive("batch", batch)
    s = shape(model)
    kv_dtype = kv_dtype_for(dtype)
    w = weight_bytes(s, dtype)
    kv = kv_bytes(s, kv_dtype, context, batch)
    kinds = kvlayout.kind_counts(layer_caches(s))
    read = weight_bytes_read(s, dtype, batch)
    est = SizeEstimate(model=s.name, dtype=dtype, kv_dtype=kv_dtype, context=context, batch=batch,
                       n_params=s.n_params, weight_bytes=w, kv_bytes_per_token=kv_bytes_per_token(s, kv_dtype),
                       kv_bytes=kv, total_bytes=w + kv, layer_kinds=kinds,
                       kv_bytes_naive=naive_kv_bytes_per_token(s, kv_dtype) * context * batch,
                       kv_bytes_by_kind=kv_bytes_by_kind(s, kv_dtype, context, batch),
                       kv_state_bytes=kv_state_bytes(s, kv_dtype, batch),
                       kv_bytes_transformers=transformers_kv_bytes(s, kv_dtype, context, batch) if "mla" in kinds else None,
                       active_params=s.active_params or s.n_params, active_weight_bytes=active_weight_bytes(s, dtype),
                       weight_bytes_read_per_step=read)
    flops = None
    if gpu is not None:
        spec = gpus.gpu(gpu)
        est.gpu = spec.name
        est.gpu_memory_bytes = spec.memory_bytes
        est.fits = est.total_bytes <= spec.memory_bytes * USABLE_FRACTION
        if bandwidth_gbs is None:
            bandwidth_gbs = spec.bandwidth_gbs
        flops = spec.flops_for(dtype)
    if bandwidth_gbs is not None:
        if bandwidth_gbs <= 0:
            raise ValueError(f"bandwidth {bandwidth_gbs} GB/s: must be positive")
        bw = bandwidth_gbs * 1e9
        kv_tok = kv / (context * batch)  # per token at this context: sliding windows and fixed states averaged in
        est.bandwidth_gbs = bandwidth_gbs
        est.decode_tokens_per_s_ceiling = decode_ceiling(read, kv_tok, context, batch, bw)
        est.decode_tokens_per_s_per_sequence_ceiling = est.decode_tokens_per_s_ceiling / batch
        if flops:
            est.compute_bound_batch = compute_bound_batch(est.active_params, read, kv_tok, context, bw, flops)
    return est


def bits_per_weight(s: ModelShape, dtype: str) -> float:
    """Stored bits per quantised weight of this model in ``dtype``, scales included (``dtypes.layout_bits_per_weight``)."""
    return layout_bits_per_weight(dtype, s.quantizable_params, s.quantizable_rows)

"""Layer-by-layer sizing (labkit.model.kvlayout, sizing's kv_bytes and active parameters) against what transformers
really holds: tiny random models of each 2026 kind (sliding window, hybrid linear attention, latent attention, mixture
of experts) are built, prefilled, and their caches' tensors counted."""
import pytest
import torch

from labkit.model import kvlayout, sizing

PROMPT = 20  # tokens prefilled: longer than the sliding window below


def _prefill(cfg, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    ids = torch.randint(3, cfg.vocab_size, (1, PROMPT))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    return model, out.past_key_values


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _dynamic_cache_bytes(cache) -> list[int]:
    """Bytes each layer of a transformers DynamicCache holds (its keys and values)."""
    return [_nbytes(layer.keys) + _nbytes(layer.values) for layer in cache.layers]


def test_sliding_window_layers_hold_their_window_not_the_context():
    from transformers import Gemma3TextConfig

    window = 8
    cfg = Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=window,
                           layer_types=["sliding_attention"] * 5 + ["full_attention"], max_position_embeddings=256)
    _, cache = _prefill(cfg)
    s = sizing.shape(cfg)
    assert [layer.kind for layer in s.kv_layers] == ["sliding"] * 5 + ["full"]
    held = _dynamic_cache_bytes(cache)
    per_token = 2 * 1 * 16 * 4  # K and V × 1 KV head × head_dim 16 × fp32
    # transformers keeps window − 1 tokens between steps (the next step's token makes the window); the sizing counts
    # the window a step attends over, so it is one token more on each sliding layer
    for layer, b in zip(s.kv_layers, held):
        assert b == (window - 1 if layer.kind == "sliding" else PROMPT) * per_token
        assert layer.bytes(PROMPT, 4) == layer.tokens_held(PROMPT) * per_token
    assert sizing.kv_bytes(s, "fp32", PROMPT) == sum(held) + 5 * per_token
    naive = sizing.naive_kv_bytes_per_token(s, "fp32") * PROMPT
    assert naive == 6 * PROMPT * per_token > sizing.kv_bytes(s, "fp32", PROMPT)
    # within the window every layer still grows: the two agree
    assert sizing.kv_bytes(s, "fp32", window) == sizing.naive_kv_bytes_per_token(s, "fp32") * window


def test_hybrid_linear_attention_keeps_a_fixed_state_per_sequence():
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                          shared_expert_intermediate_size=16, num_hidden_layers=4, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                          linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
                          num_experts_per_tok=2, layer_types=["linear_attention", "linear_attention",
                                                              "linear_attention", "full_attention"])
    _, cache = _prefill(cfg, torch.bfloat16)
    s = sizing.shape(cfg)
    assert [layer.kind for layer in s.kv_layers] == ["linear"] * 3 + ["full"]
    from labkit.decoding import kv

    held = [sum(_nbytes(t) for t in ts) for ts in kv.layer_tensors(cache)]
    dtypes = {t.dtype for t in kv.layer_tensors(cache)[0]}
    assert dtypes == {torch.bfloat16, torch.float32}  # the recurrent state is fp32: why RECURRENT_STATE_BYTES is 4
    assert [layer.bytes(PROMPT, 2) for layer in s.kv_layers] == held
    assert sizing.kv_bytes(s, "bf16", PROMPT) == sum(held)
    # the states do not grow: twice the context adds only the full-attention layer's tokens
    grow = sizing.kv_bytes(s, "bf16", 2 * PROMPT) - sizing.kv_bytes(s, "bf16", PROMPT)
    assert grow == PROMPT * 2 * 16 * 2
    assert sizing.kv_state_bytes(s, "bf16") == sum(held[:3])


def test_latent_attention_engine_and_transformers_figures_each_labelled():
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8,
                           q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6, n_routed_experts=8,
                           num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
                           first_k_dense_replace=1, max_position_embeddings=256)
    _, cache = _prefill(cfg)
    s = sizing.shape(cfg)
    assert [layer.kind for layer in s.kv_layers] == ["mla"] * 3
    held = sum(_dynamic_cache_bytes(cache))
    latent = 3 * PROMPT * (8 + 4) * 4  # one latent of kv_lora_rank + qk_rope_head_dim per token and layer, no × 2
    expanded = 3 * PROMPT * 4 * (4 * 12 + 4 * 6)  # keys of 4 heads × (8 + 4), values of 4 heads × 6, fp32
    # transformers 4.57 caches the expanded keys and values, transformers 5 the latent: the question is asked for real
    assert held == (latent if sizing.transformers_keeps_latent() else expanded)
    assert sizing.kv_bytes(s, "fp32", PROMPT, expanded=True) == expanded
    assert sizing.kv_bytes(s, "fp32", PROMPT) == latent  # a serving engine's cache
    assert sizing.transformers_kv_bytes(s, "fp32", PROMPT) == held
    est = sizing.estimate(cfg, "fp32", context=PROMPT)
    assert est.kv_bytes_transformers == held and est.kv_bytes == latent


def _expert_params(model) -> int:
    """Routed experts' parameters over all layers, counted on a real model (a ModuleList of experts in transformers
    4.57, fused (experts, out, in) tensors in transformers 5)."""
    return sum(sum(p.numel() for p in mod.parameters()) for name, mod in model.named_modules()
               if name.endswith(".experts"))


@pytest.mark.parametrize("experts", [2, 16])
def test_mixture_of_experts_counts_total_and_active_parameters(experts):
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8,
                           q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
                           n_routed_experts=experts, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
                           topk_group=1, first_k_dense_replace=1)
    model = AutoModelForCausalLM.from_config(cfg)
    real = sum(p.numel() for p in model.parameters())
    routed, e = _expert_params(model), experts
    s = sizing.shape(cfg)  # 16 experts: built with 1, 2 and 3 and extended
    assert s.n_params == real
    assert (s.n_experts, s.experts_per_token) == (experts, 2)
    assert s.active_params == real - routed // e * (e - 2)
    assert sizing.active_weight_bytes(s, "bf16") == 2 * s.active_params
    # the ceiling reads the active weights at batch 1, all of them as the batch grows
    assert sizing.weight_bytes_read(s, "bf16", 1) == sizing.active_weight_bytes(s, "bf16")
    assert sizing.weight_bytes_read(s, "bf16", 10_000) == pytest.approx(sizing.weight_bytes(s, "bf16"), rel=1e-6)
    est = sizing.estimate(cfg, "bf16", context=64, bandwidth_gbs=100)
    kv = sizing.kv_bytes(s, "bf16", 64)
    assert est.decode_tokens_per_s_ceiling == pytest.approx(100e9 / (est.active_weight_bytes + kv))


def test_dense_model_is_sized_as_before():
    s = sizing.shape("default")
    assert kvlayout.uniform(s.kv_layers) and not s.moe
    assert s.active_params == s.n_params
    assert sizing.kv_bytes(s, "fp16", 4096) == sizing.naive_kv_bytes_per_token(s, "fp16") * 4096


def test_unknown_layer_kinds_and_missing_fields_raise_naming_the_field():
    base = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 32}
    with pytest.raises(ValueError, match=r"layer_types\[1\] = 'mamba'"):
        kvlayout.layers({**base, "layer_types": ["full_attention", "mamba"]})
    with pytest.raises(ValueError, match="sliding_window"):
        kvlayout.layers({**base, "layer_types": ["sliding_attention", "full_attention"]})
    with pytest.raises(ValueError, match="linear_num_key_heads"):
        kvlayout.layers({**base, "layer_types": ["linear_attention", "full_attention"]})
    with pytest.raises(ValueError, match="layer_types has 1 entries"):
        kvlayout.layers({**base, "layer_types": ["full_attention"]})


def test_per_layer_overrides_and_shared_kv_layers():
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 512,
           "head_dim": 64, "sliding_window": 512, "global_head_dim": 256, "num_global_key_value_heads": 1,
           "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
           "num_kv_shared_layers": 1, "attention_k_eq_v": True}
    layers = kvlayout.layers(cfg)
    assert [layer.kind for layer in layers] == ["sliding", "sliding", "full", "shared"]
    assert layers[0].per_token == 2 * 4 * 64 and layers[0].window == 512
    assert layers[2].per_token == 2 * 1 * 256  # a full layer's own head size and KV heads
    assert layers[3].bytes(10_000, 2) == 0
    # without attention_k_eq_v a full layer keeps the model's KV heads, at its own head size
    assert kvlayout.layers({**cfg, "attention_k_eq_v": False})[2].per_token == 2 * 4 * 256
    listed = kvlayout.layers({**cfg, "num_kv_shared_layers": 0,
                              "per_layer_config": [{}, {"head_dim": 128}, {}, {"num_key_value_heads": 2}]})
    assert listed[1].per_token == 2 * 4 * 128 and listed[3].per_token == 2 * 2 * 256
    # transformers 5 writes Gemma 4's per-layer sizes as a dict keyed by the zero-padded layer index
    keyed = kvlayout.layers({**cfg, "num_kv_shared_layers": 0, "global_head_dim": None, "num_global_key_value_heads": None,
                             "per_layer_config": {"02": {"head_dim": 512, "num_key_value_heads": 2},
                                                  "03": {"head_dim": 512, "num_key_value_heads": 2}}})
    assert [layer.per_token for layer in keyed] == [2 * 4 * 64, 2 * 4 * 64, 2 * 2 * 512, 2 * 2 * 512]
    # Mistral 7B v0.1: no layer_types, a sliding_window: every layer slides; Qwen2 switches it off
    assert {layer.kind for layer in kvlayout.layers({**cfg, "layer_types": None, "num_kv_shared_layers": 0})} == {"sliding"}
    assert {layer.kind for layer in kvlayout.layers({**cfg, "layer_types": None, "num_kv_shared_layers": 0,
                                                     "use_sliding_window": False})} == {"full"}


def test_notebook_05_says_whether_the_layer_by_layer_figure_is_the_formula():
    from transformers import Gemma3TextConfig

    from labkit.decoding import kv
    from labkit.lessons.nb05 import findings as nb05

    default = sizing.load_config("default")
    said = nb05.layer_by_layer_sentence(default, "fp32", kv.bytes_per_position(default, 4), 1000)
    assert "the same as the formula" in said and "30 full" in said
    cfg = Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"])
    said = nb05.layer_by_layer_sentence(cfg, "fp32", kv.bytes_per_position(cfg, 4), 100)
    # 100 tokens on the full layer, 8 on the sliding one, against 200 in the formula
    assert f"{(100 + 8) * 2 * 16 * 4:,} bytes" in said and f"{108 / 200:.3f}×" in said and "1 sliding, 1 full" in said
    from transformers import DeepseekV3Config

    mla = DeepseekV3Config(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8,
                           q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6, n_routed_experts=4,
                           num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1)
    said = nb05.layer_by_layer_sentence(mla, "fp32", kv.bytes_per_position(mla, 4), 10)
    assert f"{2 * 10 * 12 * 4:,} bytes at 10 tokens" in said
    assert ("keeps it too" in said if sizing.transformers_keeps_latent()
            else f"expanded keys and values instead: {2 * 10 * 4 * (12 + 6) * 4:,}" in said)


def test_the_labs_prefill_and_cache_measure_follow_each_layer_kind():
    """The lab's decode core lets the model make its cache (sliding layers keep their window, a hybrid model gets
    its states), and kv.cache_bytes counts every tensor of it: equal to the layer-by-layer sizing."""
    from transformers import Gemma3TextConfig, Qwen3NextConfig

    from labkit.decoding import decode, kv

    sliding = Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
                               layer_types=["sliding_attention", "full_attention"])
    hybrid = Qwen3NextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
                             num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"])
    from transformers import AutoModelForCausalLM

    for cfg, window_gap in ((sliding, 1), (hybrid, 0)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        ids = torch.randint(3, 128, (1, PROMPT))
        with torch.no_grad():
            _, cache = decode.prefill(model, ids, torch.ones_like(ids))
        s = sizing.shape(cfg)
        per_token_sliding = sum(layer.per_token * 4 for layer in s.kv_layers if layer.kind == "sliding")
        assert kv.cache_bytes(cache) == sizing.kv_bytes(s, "fp32", PROMPT) - window_gap * per_token_sliding
        assert kv.cache_positions(cache) == PROMPT


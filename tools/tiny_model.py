"""A tiny random model of one of 2026's architectures, for running the notebooks with ``LABKIT_MODEL`` pointed at it.

    python -m tools.tiny_model sliding OUT_DIR     # Gemma 3 text: 5 sliding-window layers (window 16) and a full one
    python -m tools.tiny_model hybrid OUT_DIR      # Qwen3-Next: Gated DeltaNet layers and a full-attention layer, MoE
    python -m tools.tiny_model mla OUT_DIR         # DeepSeek-V3: latent attention and routed experts
    python -m tools.tiny_model gemma4 OUT_DIR      # Gemma 4 text: sliding layers, a full layer with its own head size
                                                   # and shared K=V heads, experts beside the dense MLP
    python -m tools.tiny_model qwen3.5 OUT_DIR     # Qwen3.5 MoE text: Gated DeltaNet layers, a full layer, experts

Random weights (seeded), a few hundred thousand parameters beside the embedding, and the default model's tokenizer
(its vocabulary sets the embedding's size), so chat prompts encode as they do for the default model. Its answers
are noise: the notebooks' mechanics run, their quality figures mean nothing. Nothing is downloaded: the tokenizer
comes from ``labkit prepare``'s cache. The model is written as safetensors in fp32.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from labkit.model import models

REPO = Path(__file__).resolve().parent.parent
KINDS = ("sliding", "hybrid", "mla", "gemma4", "qwen3.5")


def tiny_config(kind: str, vocab_size: int, bos: int | None, eos: int | None, pad: int | None) -> Any:
    """The transformers config of a tiny ``kind`` model."""
    ids = {"vocab_size": vocab_size, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
           "tie_word_embeddings": True, "max_position_embeddings": 4096}
    if kind == "sliding":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=16, sliding_window=16,
                                layer_types=["sliding_attention"] * 5 + ["full_attention"], **ids)
    if kind == "hybrid":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                               num_experts=4, num_experts_per_tok=2,
                               layer_types=["linear_attention"] * 3 + ["full_attention"], **ids)
    if kind == "mla":
        from transformers import DeepseekV3Config

        return DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
                                qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                                num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
                                first_k_dense_replace=1, **ids)
    if kind == "gemma4":
        from transformers import Gemma4TextConfig

        return Gemma4TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                                attention_k_eq_v=True, sliding_window=16, enable_moe_block=True, num_experts=4,
                                top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0,
                                vocab_size_per_layer_input=vocab_size,
                                layer_types=["sliding_attention"] * 5 + ["full_attention"], **ids)
    if kind == "qwen3.5":
        from transformers import Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig(hidden_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                    linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
                                    num_experts_per_tok=2,
                                    layer_types=["linear_attention"] * 3 + ["full_attention"], **ids)
    raise ValueError(f"kind {kind!r}: choose one of {', '.join(KINDS)}")


def build(kind: str, out: Path, seed: int = 0) -> Path:
    """Write the tiny ``kind`` model and the default model's tokenizer into ``out``; returns ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer


    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: choose one of {', '.join(KINDS)}")
    source = models.prepare_default()
    tok = AutoTokenizer.from_pretrained(source)
    cfg = tiny_config(kind, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(build(args.kind, args.out, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/tiny_model.py: a tiny random model of each 2026 kind loads as LABKIT_MODEL would load it, generates, and
the lab's cache measure agrees with the layer-by-layer sizing of its config."""
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
from tools import tiny_model

from labkit.decoding import decode, kv  # noqa: E402
from labkit.model import models, sizing  # noqa: E402


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_a_tiny_model_of_each_kind_loads_decodes_and_is_sized_layer_by_layer(kind, tmp_path):
    path = tiny_model.build(kind, tmp_path / kind)
    lm = models.load(str(path))
    expected = {"sliding": {"sliding", "full"}, "hybrid": {"linear", "full"}, "mla": {"mla"},
                "gemma4": {"sliding", "full"}, "qwen3.5": {"linear", "full"}}[kind]
    s = sizing.shape(lm.model.config)
    assert {layer.kind for layer in s.kv_layers} == expected
    assert (s.n_experts is not None) == (kind != "sliding")
    inputs = models.chat_inputs(lm.tokenizer, "What is the capital of France?")
    n = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        _, cache = decode.prefill(lm.model, inputs["input_ids"], inputs["attention_mask"])
        out = lm.model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id)
    assert out.shape[1] == n + 4
    per_token_sliding = sum(layer.per_token * 4 for layer in s.kv_layers
                            if layer.kind == "sliding" and layer.window < n)  # transformers keeps window − 1 tokens
    assert kv.cache_bytes(cache) == sizing.transformers_kv_bytes(s, "fp32", n) - per_token_sliding


def test_unknown_kind_is_refused_naming_the_kinds(tmp_path):
    with pytest.raises(ValueError, match="sliding, hybrid, mla"):
        tiny_model.build("mamba", tmp_path)

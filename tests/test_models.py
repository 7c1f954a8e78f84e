"""labkit.model.models: resolving a model names the fix, chat inputs are left-padded, and the converted default
model is the real chat model."""
from __future__ import annotations

import pytest

from labkit.decoding import generation
from labkit.model import dtypes, models


def test_resolve_errors(tmp_path, monkeypatch):
    with pytest.raises(models.ModelNotFound, match="config.json"):
        models.resolve(str(tmp_path))
    with pytest.raises(models.ModelNotFound, match="LABKIT_MODEL"):
        models.resolve("not-a-hub-id")
    monkeypatch.setenv("LABKIT_MODEL", "./nope/missing")
    with pytest.raises(models.ModelNotFound):
        models.resolve()
    with pytest.raises(ValueError, match="quantised"):
        dtypes.torch_dtype("int8")
    with pytest.raises(ValueError, match="unknown dtype"):
        dtypes.torch_dtype("fp64")


def test_chat_inputs_left_pads():
    tok = models.load_tokenizer()
    enc = models.chat_inputs(tok, ["hi", "a considerably longer question about many things"])
    mask = enc["attention_mask"]
    assert mask.shape[0] == 2 and mask[0, 0] == 0 and mask[0, -1] == 1  # padding on the left
    with pytest.raises(ValueError, match="no prompts"):
        models.chat_inputs(tok, [])


def test_default_model_answers_correctly(default_lm):
    """The converted default model is the real chat model: greedy answer names Paris."""
    assert default_lm.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert sum(p.numel() for p in default_lm.model.parameters()) == 134_515_008
    r = generation.generate(default_lm.model, default_lm.tokenizer, "What is the capital of France?", max_new_tokens=12)
    assert "Paris" in r.text

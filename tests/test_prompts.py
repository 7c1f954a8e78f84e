"""labkit.model.prompts: the shipped prompt sets load by name, and cycling fills a batch."""
from __future__ import annotations

import pytest

from labkit.model import prompts


def test_prompts_and_cycle():
    texts = prompts.load_prompts("prompts")
    assert len(texts) >= 4
    assert prompts.cycle(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="choose one of"):
        prompts.load_prompts("nope")
    with pytest.raises(ValueError):
        prompts.cycle([], 2)

"""The lab's prompts and evaluation text, read from ``data/``: one loader, one error naming the file.

``load_prompts`` reads ``data/prompts.json`` (``kind`` picks a list), ``cycle`` repeats a list to
n entries, ``eval_text`` / ``eval_tokens`` give the prose perplexity is measured on, and ``prompt_of_length``
builds a prompt of an exact token count.
"""
from __future__ import annotations

import json
from collections.abc import Sequence as SequenceABC
from pathlib import Path
from typing import Any

from ..core import config
from ..core.checks import positive

EVAL_DIR = config.DATA_DIR / "eval"
EVAL_TEXT = EVAL_DIR / "labkit_eval.txt"
PROMPTS = config.DATA_DIR / "prompts.json"


def eval_text(path: str | Path | None = None) -> str:
    """The evaluation text (English and Chinese paragraphs written for labkit)."""
    path = Path(path) if path is not None else EVAL_TEXT
    if not path.is_file():
        have = sorted(p.name for p in EVAL_DIR.glob("*.txt")) if EVAL_DIR.is_dir() else []
        raise ValueError(f"{path}: no evaluation text there; choose one of {have} in {EVAL_DIR}")
    return path.read_text(encoding="utf-8")


def eval_tokens(tokenizer: Any, path: str | Path | None = None) -> list[int]:
    """The evaluation text tokenised without special tokens."""
    return list(tokenizer(eval_text(path), add_special_tokens=False)["input_ids"])


def load_prompts(kind: str = "prompts") -> list[str]:
    """The fixed prompts in data/prompts.json: 'prompts' (mixed lengths) or 'questions' (short answers)."""
    data = json.loads(PROMPTS.read_text(encoding="utf-8"))
    choices = sorted(k for k, v in data.items() if isinstance(v, list))
    if kind not in choices:
        raise ValueError(f"prompt set {kind!r} is not in {PROMPTS}: choose one of {choices}")
    return list(data[kind])


def cycle(prompts: SequenceABC[str], n: int) -> list[str]:
    """``n`` prompts taken round-robin from ``prompts``."""
    if not prompts:
        raise ValueError("no prompts: pass at least one string")
    return [prompts[i % len(prompts)] for i in range(positive("n", n))]


def prompt_of_length(tokenizer: Any, n_tokens: int, batch: int = 1, device: str = "cpu") -> dict[str, Any]:
    """Inputs of exactly ``n_tokens`` real tokens (text from data/prompts.json, repeated)."""
    import torch

    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens <= 0:
        raise ValueError(f"n_tokens={n_tokens!r}: must be a positive integer")
    texts = json.loads((config.DATA_DIR / "prompts.json").read_text(encoding="utf-8"))["prompts"]
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer(" ".join(texts), add_special_tokens=False)["input_ids"]
    row = torch.tensor([ids[:n_tokens]] * batch, device=device)
    return {"input_ids": row, "attention_mask": torch.ones_like(row)}

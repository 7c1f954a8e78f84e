"""Paths and run-mode switches, all read from environment variables.

LABKIT_QUICK=1    quick mode (CI): fewer repeats and tokens, the same code path
LABKIT_MODEL      a hub id or a local model directory instead of the default model
LABKIT_CACHE      where converted models and exported ONNX files live (default ~/.cache/labkit)
LABKIT_RESULTS    where notebooks write their JSON results (default <repo>/results)
LABKIT_SERVER_URL the room's shared vllm serve (http://HOST:PORT), read and checked by labkit.serve.shared
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("LABKIT_DATA", REPO_DIR / "data"))


def quick() -> bool:
    """True in quick mode (``LABKIT_QUICK`` set to anything but 0/false/empty)."""
    return os.environ.get("LABKIT_QUICK", "").strip().lower() not in ("", "0", "false", "no")


def pick(full: int, quick_value: int) -> int:
    """Choose a repeat or token count: ``quick_value`` in quick mode, else ``full``."""
    return quick_value if quick() else full


def cache_dir() -> Path:
    path = Path(os.environ.get("LABKIT_CACHE", Path.home() / ".cache" / "labkit"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir() -> Path:
    path = Path(os.environ.get("LABKIT_RESULTS", REPO_DIR / "results"))
    path.mkdir(parents=True, exist_ok=True)
    return path


DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_CONFIG_DIR = DATA_DIR / "configs" / "SmolLM2-135M-Instruct"

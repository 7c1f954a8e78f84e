"""Paths and run-mode switches, all read from environment variables.

LABKIT_QUICK=1    quick mode (CI): fewer repeats and tokens, the same code path
LABKIT_MODEL      a hub id or a local model directory instead of the default model
LABKIT_CACHE      where converted models and exported ONNX files live (default ~/.cache/labkit)
LABKIT_RESULTS    where notebooks write their JSON results (default <repo>/results)
LABKIT_SERVER_URL the room's shared vllm serve (http://HOST:PORT), read and checked by labkit.serve.vllm.shared
LABKIT_HEADLESS=1 a headless run (tools/run_notebooks.py): no progress bars, whose saved state would read 0 %
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("LABKIT_DATA", REPO_DIR / "data"))


def quick() -> bool:
    """True in quick mode (``LABKIT_QUICK`` set to anything but 0/false/empty)."""
    return os.environ.get("LABKIT_QUICK", "").strip().lower() not in ("", "0", "false", "no")


def pick(full: int, quick_value: int) -> int:
    """Choose a repeat or token count: ``quick_value`` in quick mode, else ``full``."""
    return quick_value if quick() else full


def progress_bars() -> bool:
    """Whether labkit shows progress bars: in a live session yes; in a headless run (``LABKIT_HEADLESS``, set by
    tools/run_notebooks.py) no, since a saved notebook keeps a bar's first state, a frozen 0 %, and never its end."""
    return os.environ.get("LABKIT_HEADLESS", "").strip().lower() in ("", "0", "false", "no")


def shown(path: str | Path) -> str:
    """A path as a notebook prints it: relative to the lab's checkout where it lies inside it, "~/…" under the home
    folder, else as it is, so a saved output carries no one machine's absolute layout."""
    p = Path(path).expanduser()
    for root, label in ((REPO_DIR, ""), (Path.home(), "~/")):
        try:
            return label + str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(path)


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


HOSTED = {"colab": "Colab", "kaggle": "Kaggle"}  # notebooks run in the platform's own front end, with no make


def platform(environ: Mapping[str, str] | None = None, colab_module: bool | None = None) -> str:
    """"colab" (COLAB_RELEASE_TAG, or google.colab importable), "kaggle" (KAGGLE_KERNEL_RUN_TYPE or KAGGLE_URL_BASE),
    else "laptop" (any other machine: a laptop, a workstation, a cloud VM)."""
    environ = os.environ if environ is None else environ
    if environ.get("COLAB_RELEASE_TAG"):
        return "colab"
    if environ.get("KAGGLE_KERNEL_RUN_TYPE") or environ.get("KAGGLE_URL_BASE"):
        return "kaggle"
    if colab_module is None:
        try:
            colab_module = importlib.util.find_spec("google.colab") is not None
        except (ImportError, ValueError):
            colab_module = False
    return "colab" if colab_module else "laptop"


def needs_make(target: str, missing: str, hosted_why: str, where: str | None = None) -> str:
    """What to do about ``missing`` (a sentence start: "vLLM not installed here"): in a checkout of the lab,
    ``make TARGET``; on Colab or Kaggle (``where``: ``platform()`` by default), which have no make and give a notebook no
    environment of its own, why not (``hosted_why``) and that the section's reference rows stand in."""
    where = where or platform()
    if where in HOSTED:
        return f"{missing}: on {HOSTED[where]} {hosted_why}; the reference rows stand in"
    return f"{missing}: run `make {target}`"

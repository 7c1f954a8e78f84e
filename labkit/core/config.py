"""Paths and run-mode switches, all read from environment variables.

LABKIT_QUICK=1    quick mode (CI): fewer repeats and tokens, the same code path
LABKIT_MODEL      a hub id or a local model directory instead of the default model
LABKIT_CACHE      where converted models and exported ONNX files live (default ~/.cache/labkit)
LABKIT_RESULTS    where notebooks write their JSON results (default <repo>/results)
LABKIT_SERVER_URL the room's shared vllm serve (http://HOST:PORT), read and checked by labkit.serve.vllm.shared
LABKIT_HEADLESS=1 a headless run (tools/run_notebooks.py): no progress bars, whose saved state would read 0 %

and ``PLATFORMS``, the one table of where notebooks run (Colab, Kaggle, any other machine): how each is recognised
from its environment, named in a sentence, and where a learner finds a GPU there.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
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


KAGGLE_ACCELERATOR = "GPU T4 x2"


@dataclass(frozen=True)
class Platform:
    """Where a notebook runs: what recorded facts call it (``name``), how a sentence names it, whether notebooks run
    in the platform's own front end with no make (``hosted``), what says it is here (any of ``env_vars`` set and
    non-empty, or ``module`` importable), the link that opens a notebook there (``opens``, with ``{notebook}`` for its
    "owner/name/blob/main/notebooks/STEM.ipynb"; empty: none), and how a learner gets a GPU there: ``gpu_how`` when
    there is none, ``newer_gpu`` when the one there is too old (empty: any machine with a newer one)."""

    name: str
    label: str
    hosted: bool
    env_vars: tuple[str, ...] = ()
    module: str | None = None
    opens: str = ""
    gpu_how: str = ""
    newer_gpu: str = ""


ELSEWHERE = "laptop"  # the platform with no sign of its own: every machine that is none of the others
# the platforms, in the order they are looked for
PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("colab", "Colab", True, ("COLAB_RELEASE_TAG",), "google.colab",
             opens="https://colab.research.google.com/github/{notebook}",
             gpu_how="Runtime → Change runtime type → T4 GPU"),
    Platform("kaggle", "Kaggle", True, ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE"),
             opens="https://kaggle.com/kernels/welcome?src=https://github.com/{notebook}",
             gpu_how=f'Settings → Accelerator → "{KAGGLE_ACCELERATOR}"',
             newer_gpu=f'pick the "{KAGGLE_ACCELERATOR}" accelerator (Settings → Accelerator)'),
    Platform(ELSEWHERE, "this machine", False),  # a laptop, a workstation, a cloud VM
)}
HOSTED = {name: p.label for name, p in PLATFORMS.items() if p.hosted}  # no make there: the reference rows stand in


def platform_named(name: str) -> Platform:
    """The record of platform ``name`` ("colab", "kaggle" or "laptop")."""
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ValueError(f"platform {name!r}: choose one of {sorted(PLATFORMS)}") from None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def platform(environ: Mapping[str, str] | None = None, importable: Collection[str] | None = None) -> str:
    """The name of the platform this runs on: the first whose environment variable is set (and not empty), else the
    first whose module is importable (``importable``: the modules taken as importable, None to ask), else "laptop"
    (any other machine)."""
    environ = os.environ if environ is None else environ
    for p in PLATFORMS.values():
        if any(environ.get(var) for var in p.env_vars):
            return p.name
    for p in PLATFORMS.values():
        if p.module and (_importable(p.module) if importable is None else p.module in importable):
            return p.name
    return ELSEWHERE


def needs_make(target: str, missing: str, hosted_why: str, where: str | None = None) -> str:
    """What to do about ``missing`` (a sentence start: "vLLM not installed here"): in a checkout of the lab,
    ``make TARGET``; on Colab or Kaggle (``where``: ``platform()`` by default), which have no make and give a notebook no
    environment of its own, why not (``hosted_why``) and that the section's reference rows stand in."""
    here = platform_named(where or platform())
    if here.hosted:
        return f"{missing}: on {here.label} {hosted_why}; the reference rows stand in"
    return f"{missing}: run `make {target}`"

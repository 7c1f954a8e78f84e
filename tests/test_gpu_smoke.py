"""``make gpu-smoke`` and the set-up on a GPU machine, checked on a CPU: the smoke run's plan (dry run), its
steps under deadlines going on past a failure, and ``make setup`` choosing ONNX Runtime's GPU build where
nvidia-smi lists a GPU (``make -n``, with a stand-in nvidia-smi on PATH)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
from tools import gpu_smoke

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_make_gpu_smoke_dry_prints_the_plan_and_exits_0(tmp_path):
    out = subprocess.run(["make", "-s", "--no-print-directory", "gpu-smoke", "STAGES=dry", f"OUT={tmp_path / 'smoke'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for step in ("pip install [gpu] (one resolve)", "prepare the model", "gpu-check", "notebook 02 (quick)",
                 "notebook 05 (quick)", "notebook 06 (quick)", "notebook 03 (quick)"):
        assert step in text, step
    assert "torch==2.13.0 -e '.[lab,gpu]'" in text  # torch and the [gpu] extra in one resolve
    assert "LABKIT_QUICK=1" in text and "--deadline-s" in text
    assert not (tmp_path / "smoke").exists(), "a dry run writes nothing"
    for line in text.splitlines()[1:]:
        assert "deadline" in line, line


def test_smoke_steps_time_out_go_on_and_leave_a_summary(tmp_path, monkeypatch):
    steps = [gpu_smoke.Step("check", "fails", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], 30),
             gpu_smoke.Step("check", "hangs", [sys.executable, "-c", "import time; time.sleep(60)"], 1),
             gpu_smoke.Step("nb", "works", [sys.executable, "-c", "print('{}')"], 30, stdout_to="works.json")]
    monkeypatch.setattr(gpu_smoke, "plan", lambda *a: steps)
    (tmp_path / "gpu-check.json").write_text(json.dumps({"pass": 1, "fail": 0, "skip": 0, "checks": [
        {"name": "cuda", "status": "PASS", "detail": "NVIDIA H200"}]}))
    code = gpu_smoke.main(["--stages", "check nb", "--out", str(tmp_path)])
    assert code == 1
    assert [s.status for s in steps] == ["failed (exit 3)", "timed out after 1 s", "ok"]
    assert "boom" in (tmp_path / steps[0].log).read_text()
    assert (tmp_path / "works.json").read_text().strip() == "{}"
    page = (tmp_path / "summary.md").read_text()
    assert "| check | hangs | timed out after 1 s |" in page and "PASS cuda: NVIDIA H200" in page
    assert json.loads((tmp_path / "smoke.json").read_text())["ok"] is False


def test_unknown_stage_is_refused_naming_the_stages(capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_smoke.main(["--stages", "setup bogus"])
    assert exc.value.code == 2 and "setup check nb ref" in capsys.readouterr().err


def _make_n(tmp_path: Path, target: str, gpu: bool, venv: Path) -> str:
    """``make -n target`` as a fresh clone on a machine whose nvidia-smi lists a GPU (``gpu``) or is absent."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1111)'\n")
        smi.chmod(0o755)
    elif smi.exists():
        smi.unlink()
    env = {k: v for k, v in os.environ.items() if k not in ("CONDA_PREFIX", "VIRTUAL_ENV", "ORT_EXTRA")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    out = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@needs_make
@pytest.mark.parametrize("target", ["gpu-check", "reference"])
def test_gpu_targets_never_build_a_cpu_environment_beside_a_gpu(tmp_path, target):
    """make gpu-check with no environment active builds .venv through make setup: with the [cpu] extra that
    environment's ONNX Runtime had no CUDA provider, and the preflight passed on the CPU one."""
    plan = _make_n(tmp_path, target, gpu=True, venv=tmp_path / "venv")
    assert ".[lab,gpu]" in plan and ",cpu" not in plan, plan
    assert "uninstall -q -y onnxruntime " in plan  # the CPU build leaves before the GPU one comes
    plan = _make_n(tmp_path, target, gpu=False, venv=tmp_path / "venv2")
    assert ".[lab,cpu]" in plan and ",gpu" not in plan, plan


@needs_make
def test_offline_smoke_reuses_the_machines_torch_and_installs_only_the_carried_wheels(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "gguf-0.17.1-py3-none-any.whl").write_bytes(b"")
    out = subprocess.run(["make", "-s", "--no-print-directory", "gpu-smoke", "STAGES=dry", f"WHEELS={wheels}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # the machine's own Python and CUDA torch: a virtualenv made from a Python that is itself a virtualenv would see
    # the base interpreter's packages instead
    assert "venv" not in text and "--no-index --no-deps --target" in text and "gguf-0.17.1-py3-none-any.whl" in text
    assert text.count("PYTHONPATH=") >= 3, text  # every step after the install finds the carried wheels and labkit
    assert "torch==2.13.0" not in text, "an offline machine cannot fetch torch"
    missing = subprocess.run([sys.executable, "tools/gpu_smoke.py", "--stages", "dry", "--wheels", str(tmp_path / "no")],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "not a folder" in missing.stderr

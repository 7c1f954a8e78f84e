"""labkit.doctor: each check passes or fails on the numbers it reads, with the fix in its line; one summary line."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from labkit import doctor, preflight


def test_python_disk_and_memory_fail_below_what_the_notebooks_need(tmp_path):
    assert doctor.check_python((3, 12, 1)).status == "PASS"
    old = doctor.check_python((3, 9, 18))
    assert old.status == "FAIL" and "3.10 or newer" in old.detail and "make PYTHON=" in old.detail
    assert doctor.check_disk(tmp_path, free_gib=80.0).status == "PASS"
    low = doctor.check_disk(tmp_path, free_gib=1.2)
    assert low.status == "FAIL" and "1.2 GiB free" in low.detail and "LABKIT_CACHE" in low.detail
    need = doctor.memory_needed_gib()
    assert need == pytest.approx(max(doctor.HEAVIEST_NOTEBOOK_GIB,
                                     doctor.NOTEBOOK_GIB + 2 * (doctor.vllm_server.RUNTIME_OVERHEAD_GIB + 1)))
    assert need >= 8.8, "notebook 10 measured 8.8 GiB (RSS) with its two vLLM servers"
    assert doctor.check_memory(total_gib=need + 1).status == "PASS"
    small = doctor.check_memory(total_gib=need - 1)
    assert small.status == "FAIL" and "two vLLM servers" in small.detail


def test_cpu_check_names_the_isa_or_what_the_laptop_does_instead():
    ok = doctor.check_cpu({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16"}, "x86_64")
    assert ok.status == "PASS" and ok.detail.endswith("avx2 fma avx512f avx512_bf16")
    assert doctor.check_cpu({"sse4_2", "avx"}, "x86_64").status == "FAIL"
    mac = doctor.check_cpu({"asimd", "bf16"}, "arm64")
    assert mac.status == "SKIP" and "reference rows" in mac.detail


def test_vllm_check_fails_with_the_make_target_when_its_environment_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(tmp_path / "none" / "python"))
    missing = doctor.check_vllm()
    assert missing.status == "FAIL" and "make vllm" in missing.detail


def test_notebook_check_runs_the_notebook_and_reports_its_failing_cell(tmp_path):
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    for path, source in ((good, "import os\nassert os.environ['LABKIT_QUICK'] == '1'"), (bad, "1 / 0")):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, path)
    assert doctor.check_notebook(good, timeout_s=120).status == "PASS"
    failed = doctor.check_notebook(bad, timeout_s=120)
    assert failed.status == "FAIL" and "ZeroDivisionError" in failed.detail and failed.detail.startswith("bad.ipynb")


def test_summary_line_counts_and_names_the_failures(capsys):
    done = doctor.run([lambda: preflight.CheckResult("python", "PASS", "3.12"),
                       lambda: preflight.CheckResult("vllm", "FAIL", "no env"),
                       lambda: preflight.CheckResult("cpu", "SKIP", "arm64")])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("PASS  python") and printed[1].startswith("FAIL  vllm")
    line = doctor.summary(done)
    assert line.startswith("labkit doctor: NOT READY · 1 pass, 1 fail, 1 skip (vllm) · ") and "Python 3." in line
    assert doctor.summary(done[:1]).startswith("labkit doctor: READY · 1 pass, 0 fail, 0 skip · ")


def test_doctor_fast_on_this_machine_exits_by_its_lines(capsys):
    rc = doctor.command(["--fast", "--notebook", str(Path("notebooks/00_setup.ipynb"))])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[1] for ln in lines[:-1]] == ["python", "disk", "memory", "cpu", "model"]
    failed = [ln for ln in lines[:-1] if ln.startswith("FAIL")]
    assert rc == (1 if failed else 0)
    assert lines[-1].startswith("labkit doctor: " + ("NOT READY" if failed else "READY"))


def test_doctor_and_gpu_check_leave_one_record_and_print_its_line():
    """One frozen record for both preflights: doctor's lines carry no time, gpu-check's do (a skip took none)."""
    import dataclasses

    from labkit import gpu_check

    r = doctor.check_python((3, 12, 1))
    assert type(r) is preflight.CheckResult is gpu_check.CheckResult
    assert r.line() == "PASS  python     3.12.1"
    assert preflight.CheckResult("fp16", "PASS", "8 tokens", 12.34).line(6) == "PASS  fp16   (12.3 s) 8 tokens"
    assert preflight.CheckResult("vllm", "SKIP", "no env", 0.0).line(4) == "SKIP  vllm no env"
    assert preflight.counts([r, r]) == {"PASS": 2, "FAIL": 0, "SKIP": 0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.status = "FAIL"

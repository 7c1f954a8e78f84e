"""`make gpu-check`: the check runner's logic on a CPU (fake checks, mocked capability answers), its one-line
answer on a machine without CUDA, and the real checks' code run against a tiny model on the CPU."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from test_devices import mock_gpu

from labkit import gpu_check, preflight
from labkit.core.env import Capability
from labkit.gpu_check import Context
from labkit.preflight import Check, CheckResult, Skip


def _ok(ctx: Context) -> str:
    return "fine"


def _boom(ctx: Context) -> str:
    raise ValueError("boom\nsecond line")


def _skip(ctx: Context) -> str:
    raise Skip("not on this GPU")


def _lookup(name: str) -> Capability:
    return Capability(name, name != "missing", "", "" if name != "missing" else "not installed: pip install missing")


def test_run_checks_reports_every_check_and_never_stops():
    out = io.StringIO()
    checks = [Check("passes", _ok), Check("raises", _boom), Check("skips itself", _skip),
              Check("needs a missing capability", _ok, ("present", "missing")), Check("passes again", _ok)]
    done = preflight.run_checks(checks, Context(device="cuda"), lookup=_lookup, out=out)
    assert [r.status for r in done] == ["PASS", "FAIL", "SKIP", "SKIP", "PASS"]
    assert done[1].detail == "ValueError: boom" and done[2].detail == "not on this GPU"
    assert done[3].detail == "missing: not installed: pip install missing"
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and [line.split()[0] for line in lines] == ["PASS", "FAIL", "SKIP", "SKIP", "PASS"]
    assert "boom" in lines[1] and "pip install missing" in lines[3]
    report = gpu_check.summary(done)
    assert (report["pass"], report["fail"], report["skip"], report["ok"]) == (2, 1, 2, False)


def test_run_checks_skips_what_the_time_budget_cannot_fit():
    ticks = iter(range(0, 10_000, 100))  # every clock read moves 100 s on
    done = preflight.run_checks([Check(f"c{i}", _ok) for i in range(4)], Context(device="cuda"), budget_s=350,
                                lookup=_lookup, clock=lambda: next(ticks), out=io.StringIO())
    assert [r.status for r in done] == ["PASS", "PASS", "SKIP", "SKIP"]
    assert "time budget of 350 s" in done[-1].detail
    with pytest.raises(ValueError, match="budget_s"):
        preflight.run_checks([], Context(device="cuda"), budget_s=0)
    with pytest.raises(ValueError, match="PASS"):
        CheckResult("x", "MAYBE", "")


def test_a_check_still_running_at_the_deadline_fails_and_the_run_ends():
    import threading
    import time

    release = threading.Event()

    def hangs(ctx):
        release.wait(60)  # a CUDA call that never returns, a TensorRT build that takes too long
        return "finished late"

    t0 = time.monotonic()
    try:
        done = preflight.run_checks([Check("first", _ok), Check("hangs", hangs), Check("after", _ok)],
                                    Context(device="cuda"), lookup=_lookup, out=io.StringIO(), deadline_s=1.0)
    finally:
        release.set()
    assert time.monotonic() - t0 < 10, "the run must end at its deadline, not when the hung check returns"
    assert [r.status for r in done] == ["PASS", "FAIL", "SKIP"]
    assert done[1].detail.startswith("still running after") and "--only" in done[1].detail
    assert "'hangs' was still running" in done[2].detail
    with pytest.raises(ValueError, match="deadline_s"):
        preflight.run_checks([], Context(device="cuda"), deadline_s=0)


def test_without_cuda_one_line_and_exit_0(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = io.StringIO()
    report = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--json", str(report)], out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0]
    data = json.loads(report.read_text())
    assert data["ok"] and data["cuda"] is False and data["checks"] == []


def test_a_gpu_torch_cannot_use_is_a_failure(tmp_path, monkeypatch):
    from labkit.core import env

    monkeypatch.setattr(env, "torch_gpu_reason", lambda: "nvidia-smi lists 1 GPU(s), but torch is a CPU build")
    out = io.StringIO()
    assert gpu_check.main(["--json", str(tmp_path / "r.json")], out=out) == 1
    assert out.getvalue().startswith("gpu-check: FAIL: nvidia-smi lists 1 GPU")


def test_on_a_gpu_lines_then_one_json_document(tmp_path, monkeypatch):
    mock_gpu(monkeypatch, "NVIDIA L4", (8, 9))
    from labkit.core import env

    monkeypatch.setattr(env, "torch_gpu_reason", lambda: "")
    monkeypatch.setattr(gpu_check, "_prompts", lambda: ["Hi"])
    out = io.StringIO()
    report = tmp_path / "r.json"
    checks = [Check("fp16 load + decode", _ok), Check("bitsandbytes int8", _boom), Check("vllm", _skip)]
    assert gpu_check.main(["--json", str(report)], all_checks=checks, out=out) == 1  # a FAIL: exit 1
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ["PASS", "FAIL", "SKIP"]
    last = json.loads(lines[-1])
    assert (last["pass"], last["fail"], last["skip"], last["device"]) == (1, 1, 1, "cuda")
    assert json.loads(report.read_text())["checks"][1]["detail"] == "ValueError: boom"
    out = io.StringIO()
    assert gpu_check.main(["--json", str(report), "--only", "fp16"], all_checks=checks, out=out) == 0
    assert len(out.getvalue().splitlines()) == 2
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "warp-drive"], all_checks=checks, out=io.StringIO())


def test_the_command_line_ends_the_process_when_a_check_hung(tmp_path, monkeypatch):
    """``python -m labkit gpu-check`` goes through ``labkit.__main__``, so gpu_check is never ``__main__``
    there: the hard exit after a hung check must not depend on that."""
    import threading

    from labkit import __main__ as cli
    from labkit.core import env

    mock_gpu(monkeypatch, "NVIDIA L4", (8, 9))
    monkeypatch.setattr(env, "torch_gpu_reason", lambda: "")
    monkeypatch.setattr(gpu_check, "_prompts", lambda: ["Hi"])
    release = threading.Event()
    monkeypatch.setattr(gpu_check, "checks", lambda: [Check("hangs", lambda ctx: release.wait(60) and "late")])

    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(gpu_check.os, "_exit", fake_exit)
    report = tmp_path / "r.json"
    try:
        with pytest.raises(Exited) as exited:
            cli.main(["gpu-check", "--json", str(report), "--deadline-s", "0.5"])
    finally:
        release.set()
    assert exited.value.args == (1,)
    assert json.loads(report.read_text())["checks"][0]["status"] == "FAIL"  # written before the exit
    release.clear()
    # a caller inside Python (a notebook, a test) gets the exit code back instead
    assert gpu_check.main(["--json", str(report), "--deadline-s", "0.5"], out=io.StringIO()) == 1
    release.set()


def test_the_check_table_is_well_formed():
    table = gpu_check.checks()
    names = [c.name for c in table]
    assert len(names) == len(set(names))
    for wanted in ("fp16", "bf16", "bitsandbytes int8", "bitsandbytes nf4", "onnxruntime CUDA", "sdpa",
                   "flash_attention_2", "torch.compile", "profiler", "max_batch_size=1", "max_batch_size=8",
                   "vllm", "TensorRT provider", "torch-tensorrt"):
        assert any(wanted in n for n in names), wanted
    for check in table:
        for need in check.needs:
            assert preflight.capability_lookup(need).name == need  # a misspelt capability would raise here
    # the checks that start vLLM, which takes its share of the GPU's memory, run last
    assert names.index("vllm") >= len(names) - 3 and all("vllm" in n for n in names[names.index("vllm"):]), names


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from labkit.model import models

    tok = models.load_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("tiny-check")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_the_checks_themselves_run_on_a_cpu(tiny_dir, tmp_path, monkeypatch):
    """The real check functions, pointed at the CPU and a tiny model: a check broken by a typo or a changed
    API fails here, not on the instructor's GPU a week before the workshop."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    by_name = {c.name: c for c in gpu_check.checks()}
    ctx = Context(device="cpu", model_name=str(tiny_dir), prompts=["Hi", "Name a colour."])
    names = ["fp16 load + decode", "bitsandbytes nf4", "onnxruntime CUDA provider", "attention sdpa",
             "server max_batch_size=1", "server max_batch_size=8"]
    done = preflight.run_checks([by_name[n] for n in names], ctx, out=io.StringIO())
    # the CPU build of onnxruntime has no CUDA provider: the preflight fails and names the fix, never a CPU PASS
    assert [r.status for r in done] == ["PASS", "PASS", "FAIL", "PASS", "PASS", "PASS"], [r.line() for r in done]
    assert "no CUDAExecutionProvider" in done[2].detail and "pip install -e '.[gpu]'" in done[2].detail
    ctx.release()


def test_make_gpu_check_target_exists():
    text = (Path(__file__).resolve().parent.parent / "Makefile").read_text(encoding="utf-8")
    assert "gpu-check:" in text and "-m labkit gpu-check" in text  # the one command line: python -m labkit <command>


def test_tp_check_says_why_it_cannot_run(monkeypatch, tmp_path):
    """`tp` starts vllm serve --tensor-parallel-size 2 only with two GPUs, vLLM's environment and a model whose
    attention heads split in two; otherwise SKIP with the reason (no GPU is needed to check that)."""
    import torch

    ctx = Context(device="cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(Skip, match="needs 2 visible; 1 here"):
        gpu_check.check_tp(ctx)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(tmp_path / "none"))
    with pytest.raises(Skip, match="make vllm"):
        gpu_check.check_tp(ctx)
    fake = tmp_path / "python"
    fake.write_text("")
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(fake))
    with pytest.raises(Skip, match=r"9 attention heads do not divide by 2.*LABKIT_MODEL"):
        gpu_check.check_tp(ctx)  # the default model: SmolLM2-135M has 9 heads
    assert any(c.name.startswith("tp ") for c in gpu_check.checks())
    assert preflight.select(gpu_check.checks(), ["tp"])[0].run is gpu_check.check_tp


@pytest.fixture
def vllm_calls(monkeypatch):
    """Every vLLM engine the checks would start, in a child bound to the context's GPU, with its options bound to
    vllm_offline's real signature (a keyword it does not take fails here, as it would on the GPU); each returns the
    same 8 tokens, the fp8 one two others."""
    import inspect

    import torch

    from labkit.serve.vllm import offline

    calls = []

    def fake_child(fn, *args, device="cuda", timeout_s=570.0, **kwargs):  # launch.run_in_child's own parameters
        assert fn is offline.vllm_offline and device == "cuda:1"
        inspect.signature(offline.vllm_offline).bind(*args, **kwargs)
        calls.append(kwargs)
        ids = [[1, 2, 3, 4, 5, 6, 7, 8]] if kwargs.get("quantization") is None else [[1, 2, 3, 4, 5, 6, 9, 9]]
        return {"output_tokens": 8, "wall_s": 0.5, "load_s": 20.0, "token_ids": ids}

    monkeypatch.setattr(gpu_check.launch, "run_in_child", fake_child)
    monkeypatch.setattr(gpu_check.Context, "release", lambda self: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: calls_capability[0])
    calls_capability = [(9, 0)]
    return calls, calls_capability


@pytest.mark.parametrize("capability, path", [((9, 0), "W8A8 FP8 on FP8 tensor cores"),
                                              ((8, 9), "W8A8 FP8 on FP8 tensor cores"),
                                              ((8, 0), "weight-only FP8 through vLLM's Marlin kernel")])
def test_the_fp8_check_names_the_path_the_compute_capability_gets(vllm_calls, capability, path):
    calls, cap = vllm_calls
    cap[0] = capability
    detail = gpu_check.check_fp8(Context(device="cuda:1"))
    assert detail.startswith(path) and f"{capability[0]}.{capability[1]}" in detail
    assert "6 of 8 tokens as vLLM's fp16 run" in detail
    assert [c.get("quantization") for c in calls] == [None, "fp8"]


def test_fp8_checks_skip_before_ampere_and_the_kv_check_asks_for_an_fp8_cache(vllm_calls):
    calls, cap = vllm_calls
    cap[0] = (7, 5)
    for check in (gpu_check.check_fp8, gpu_check.check_fp8_kv):
        with pytest.raises(Skip, match="7.5"):
            check(Context(device="cuda:1"))
    assert calls == []
    cap[0] = (9, 0)
    assert "FP8 KV cache" in gpu_check.check_fp8_kv(Context(device="cuda:1"))
    assert [c.get("kv_cache_dtype") for c in calls] == [None, "fp8"]
    assert "8 tokens" in gpu_check.check_vllm(Context(device="cuda:1"))  # its call binds to vllm_offline too
    assert {"fp8 (vllm --quantization fp8)", "fp8-kv (vllm --kv-cache-dtype fp8)"} <= {c.name for c in gpu_check.checks()}

import json
import math

import pytest

from labkit.core import results


def test_round_trip_with_environment(tmp_path):
    res = results.Results("unit_test")
    res.add("decode", batch=1, tokens_per_s=12.5, bad=float("nan"))
    path = res.save(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["rows"][0] == {"section": "decode", "batch": 1, "tokens_per_s": 12.5, "bad": None}
    for key in ("date", "hardware", "versions", "command", "device"):
        assert key in data["env"]
    again = results.load(path)
    assert again.rows == res.rows and again.name == "unit_test"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_replace_section_keeps_others():
    res = results.Results("x")
    res.add("a", v=1)
    res.add("b", v=2)
    res.replace("a", [{"v": 3}, {"v": 4}])
    assert [r["v"] for r in res.section("a")] == [3, 4]
    assert res.section("b") == [{"section": "b", "v": 2}]
    assert list(res.frame("a")["v"]) == [3, 4]


def test_default_path_uses_results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    path = results.Results("nb_x").save()
    assert path == tmp_path / "nb_x.json"
    assert results.load("nb_x").name == "nb_x"


def test_bad_name_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="results name"):
        results.Results("../escape")
    with pytest.raises(FileNotFoundError, match="run its notebook"):
        results.load(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="available"):
        results.reference("no_such_reference")
    with pytest.raises(ValueError, match="not a labkit results file"):
        results.Results.from_dict({"rows": []})


def test_jsonable_handles_dataclasses_and_tensors():
    import torch

    from labkit.core.timing import Measurement

    m = Measurement.from_values("t", [1.0, 2.0])
    out = results.jsonable({"m": m, "t": torch.tensor(3.5), "inf": math.inf})
    assert out["m"]["median"] == 1.5 and out["t"] == 3.5 and out["inf"] is None


def test_reference_files_have_provenance():
    for path in results.reference_dir().glob("*.json"):
        res = results.load(path)
        for key in ("date", "hardware", "versions", "command"):
            assert key in res.env, f"{path.name} lacks env.{key}"
        assert res.rows, f"{path.name} has no rows"


def test_reference_names_keep_gpu_and_cpu_runs_apart(tmp_path, monkeypatch):
    from labkit.core import config

    assert results.reference_name("07_vllm", {"device": "cpu", "hardware": {"gpu": None}}) == "07_vllm"
    gpu_env = {"device": "cuda", "hardware": {"gpu": "NVIDIA H200"}}
    assert results.reference_name("07_vllm", gpu_env) == "07_vllm.nvidia-h200"
    monkeypatch.setattr(config, "DATA_DIR", tmp_path)
    (tmp_path / "reference").mkdir()
    results.Results("07_vllm", env={"device": "cpu"}).save(tmp_path / "reference" / "07_vllm.json")
    assert results.gpu_references("07_vllm") == []
    gpu = results.Results("07_vllm", env=gpu_env)
    gpu.add("vllm", engine="vllm.LLM", output_tokens_per_s=5000.0)
    gpu.save(tmp_path / "reference" / f"{results.reference_name('07_vllm', gpu_env)}.json")
    found = results.gpu_references("07_vllm")
    assert [r.env["hardware"]["gpu"] for r in found] == ["NVIDIA H200"]
    assert found[0].section("vllm")[0]["output_tokens_per_s"] == 5000.0


def test_provenance_names_the_cpu_with_its_instruction_sets():
    """"AMD EPYC" covers AVX2-only and AVX-512-BF16 parts whose bf16 speeds differ 7×: every provenance line and
    every beside-the-reference sentence names the ISA recorded, or says it was not."""
    from labkit.core import cpu, env

    assert cpu.cpu_isa("fpu sse4_2 avx avx2 fma avx512f avx512_bf16 amx_bf16") == ["avx2", "fma", "avx512f",
                                                                                   "avx512_bf16", "amx_bf16"]
    assert cpu.cpu_isa("fp asimd asimdhp bf16 i8mm") == ["asimd", "asimdhp", "bf16", "i8mm"]
    zen4 = results.Results("x", env={"date": "d", "device": "cpu", "hardware": {"cpu": "AMD EPYC 9B14", "gpu": None,
                                                                                  "cpu_isa": ["avx2", "avx512_bf16"]}})
    old = results.Results("x", env={"date": "d", "device": "cpu", "hardware": {"cpu": "AMD EPYC", "gpu": None}})
    assert "on AMD EPYC 9B14 (avx2 avx512_bf16) (cpu)" in results.provenance(zen4)
    assert "on AMD EPYC (ISA not recorded) (cpu)" in results.provenance(old)
    line = results.beside_reference("bf16 ÷ fp32 decode", 0.23, zen4, 1.58)
    assert "in the reference (full mode, AMD EPYC 9B14 (avx2 avx512_bf16))" in line
    assert f"0.23× here ({cpu.cpu_line(env.hardware())})" in line and "off the reference" in line
    assert "cpu_isa" in env.environment()["hardware"], "every result saved records its ISA"


def test_apple_silicon_names_its_isa_from_sysctl(monkeypatch):
    """A Mac has no /proc/cpuinfo: its results would say "ISA not recorded" without sysctl's answers."""
    from labkit.core import cpu

    m2 = {"hw.optional.AdvSIMD": "1\n", "hw.optional.arm.FEAT_FP16": "1\n", "hw.optional.arm.FEAT_BF16": "1\n",
          "hw.optional.arm.FEAT_DotProd": "1\n", "hw.optional.arm.FEAT_I8MM": "1\n"}
    assert cpu.apple_flags("Darwin", "arm64", m2.get) == {"asimd", "asimdhp", "fphp", "bf16", "asimddp", "i8mm"}
    m1 = {**m2, "hw.optional.arm.FEAT_BF16": "0\n", "hw.optional.arm.FEAT_I8MM": "0\n"}
    assert "bf16" not in cpu.apple_flags("Darwin", "arm64", m1.get)
    assert cpu.apple_flags("Linux", "aarch64", m2.get) == set() and cpu.apple_flags("Darwin", "x86_64", m2.get) == set()
    monkeypatch.setattr(cpu, "cpuinfo", lambda *keys: None)
    monkeypatch.setattr(cpu, "apple_flags", lambda: {"asimd", "asimdhp", "bf16", "asimddp"})
    assert cpu.cpu_isa() == ["asimd", "asimdhp", "asimddp", "bf16"]
    assert cpu.cpu_line({"cpu": "Apple M2", "cpu_isa": cpu.cpu_isa()}) == "Apple M2 (asimd asimdhp asimddp bf16)"

"""bench/llm_compressor.py without llm-compressor or vLLM: a failing child is reported with its error line, served
answers are compared with fp32's token by token, and the FP8 KV cache line says refused (with vLLM's reason and
this CPU's instruction sets) or gives the capacity ratio."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import llm_compressor
from labkit.core import results


@pytest.fixture(scope="module")
def bench():
    return llm_compressor


def _child(tmp_path, body):
    script = tmp_path / "child.py"
    script.write_text(body, encoding="utf-8")
    return [str(script)]


def test_a_child_that_fails_names_its_error_and_one_that_works_gives_its_line(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "CHILD", _child(tmp_path, "import sys\nsys.stderr.write('Traceback\\nValueError: Model "
                                                         "Free PTQ cannot calibrate activations.\\n')\nsys.exit(1)\n"))
    row = bench.compress(tmp_path, "NVFP4", tmp_path / "out", Path(sys.executable))
    assert row["status"].startswith("llm-compressor failed (1): ValueError: Model Free PTQ cannot calibrate")
    monkeypatch.setattr(bench, "CHILD", _child(tmp_path, "import json, sys\nprint('noise')\nprint(json.dumps({'scheme': "
                                                         "sys.argv[2], 'bytes': 5, 'format': 'float-quantized'}))\n"))
    row = bench.compress(tmp_path, "FP8_DYNAMIC", tmp_path / "out", Path(sys.executable))
    assert row["status"] == "ok" and row["scheme"] == "FP8_DYNAMIC" and row["bytes"] == 5 and row["wall_s"] > 0


def test_answers_are_compared_with_fp32s_token_by_token(bench):
    base = {"status": "ok", "answers": {"q0": [1, 2, 3, 4], "q1": [5, 6]}, "tpot_median_s": 0.1}
    fp8 = {"status": "ok", "answers": {"q0": [1, 2, 9, 9], "q1": [5, 6]}, "tpot_median_s": 1.3}
    got = bench.against(fp8, base)
    assert got["tokens_vs_fp32"] == "differ: q0 from token 2"
    assert (got["equal_tokens"], got["compared_tokens"]) == (4, 6)
    assert got["tpot_over_fp32"] == pytest.approx(13.0)
    assert bench.against({"status": "refused", "reason": "x"}, base) == {}


def test_the_fp8_kv_line_gives_the_refusal_or_the_capacity(bench):
    base = {"status": "ok", "kv_cache_tokens": 23296, "max_concurrency": 11.38}
    refused = bench.kv_line({"status": "refused", "reason": "NotImplementedError: FP8 KV cache on CPU requires x86 "
                                                            "with AVX-512 or AMX."}, base)
    assert refused.startswith("refused on this CPU (") and "requires x86 with AVX-512 or AMX" in refused
    doubled = bench.kv_line({"status": "ok", "kv_cache_tokens": 46592, "max_concurrency": 22.75}, base)
    assert "46,592 KV tokens against 23,296 (2.00×)" in doubled and "22.75× against 11.38×" in doubled


def test_without_the_environment_it_says_which_make_target_builds_it(bench, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LABKIT_LLMC_PYTHON", str(tmp_path / "none" / "python"))
    assert bench.main([]) == 2
    assert "make llmc" in json.loads(capsys.readouterr().out)["status"]


def test_a_saved_run_keeps_its_provenance_and_drops_the_answers(bench, tmp_path):
    written = [{"scheme": "FP8_DYNAMIC", "status": "ok", "bytes": 5, "versions": {"llmcompressor": "0.14.0.1"}}]
    served = {"fp32": {"name": "fp32", "status": "ok", "answers": {"q0": [1]}},
              "NVFP4A16": {"name": "NVFP4A16", "status": "refused", "reason": "ValueError: Marlin FP4 not available"},
              "fp32-fp8-kv": {"name": "fp32-fp8-kv", "status": "refused",
                              "reason": "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."}}
    summary = {"hardware": "AMD EPYC (avx2 fma)", "versions": {"llmcompressor": "0.14.0.1"}, "vllm": "0.32.0",
               "fp8_kv_cache": "refused on this CPU (avx2): NotImplementedError: …"}
    path = bench.save(written, served, summary, tmp_path)
    res = results.load(path)
    assert path.name == "llm_compressor.json" and res.env["versions"]["vllm"] == "0.32.0"
    assert res.env["command"].startswith("python -m bench.llm_compressor")
    assert [r["name"] for r in res.section("served")] == ["fp32", "NVFP4A16", "fp32-fp8-kv"]
    assert all("answers" not in r for r in res.section("served"))
    # the FP8 KV cache is kept as its row (status and vLLM's reason), never as a sentence about the CPU that ran it
    assert res.section("served")[-1]["reason"].startswith("NotImplementedError") and "fp8_kv_cache" not in res.notes


def test_a_refused_start_keeps_vllms_reason_without_this_machines_log_path(bench, monkeypatch):
    def refuse(*a, **kw):
        raise bench.vs.VLLMStartError("vllm-NVFP4A16 exited with 1 before answering /health: ValueError: Forced NVFP4 "
                                      "kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 not available "
                                      "(log: /x/build/vllm/vllm-NVFP4A16-1.log)")

    monkeypatch.setattr(bench.vs, "serve", refuse)
    row = bench.serve_and_ask("NVFP4A16", Path("/m"), {"q0": [1, 2]}, 4)
    assert row["status"] == "refused"
    assert row["reason"] == ("ValueError: Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 "
                             "not available")

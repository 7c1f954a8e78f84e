"""References store facts, and sentences about them are rendered at display time: no shipped reference says "this
CPU" or "this run" of the run that made it; a reference row's ``where`` names its machine; a reference from another
instruction set is rendered as "the reference machine (…)", never as this machine."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.core import config, results
from labkit.lessons.nb03b import findings as nb03b

DATA = config.DATA_DIR
SHIPPED = sorted([*(DATA / "reference").glob("*.json"), *(DATA / "measured_gpu").glob("*.json")])
DEICTIC = re.compile(r"\bthis (CPU|run|machine|laptop)\b|\bon this\b", re.IGNORECASE)


def _strings(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _strings(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _strings(v, (*path, i))
    elif isinstance(x, str):
        yield path, x


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_no_shipped_reference_speaks_of_this_machine_or_this_run(path: Path) -> None:
    said = [f"{'/'.join(map(str, p))}: {s[:100]!r}" for p, s in _strings(json.loads(path.read_text("utf-8")))
            if DEICTIC.search(s)]
    assert not said, f"{path.name} stores words that are true only where it was made:\n" + "\n".join(said)


def test_the_check_above_finds_a_stored_sentence() -> None:
    planted = {"notes": {"fp8_kv_cache": "refused on this CPU (avx2, fma)"}, "rows": [{"where": "this run"}]}
    assert len([s for _, s in _strings(planted) if DEICTIC.search(s)]) == 2


def _ref(isa: list[str], status: str = "refused") -> results.Results:
    return results.Results("llm_compressor", env={"hardware": {"cpu": "AMD EPYC", "cpu_isa": isa}, "date": "2026-12-04"},
                           rows=[{"section": "served", "name": "fp32", "status": "ok", "kv_cache_tokens": 23296},
                                 {"section": "served", "name": "fp32-fp8-kv", "status": status,
                                  "reason": "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."}])


def test_an_avx2_reference_rendered_on_an_avx512_machine_names_its_machine_and_how_to_run_it_here() -> None:
    said = nb03b.fp8_kv_said(_ref(["avx2", "fma"]), ["avx2", "fma", "avx512f", "avx512_bf16"])
    assert said.startswith("On the reference machine (AMD EPYC (avx2 fma)) vLLM refused an FP8 KV cache")
    assert "this CPU" not in said and "This machine has avx512f" in said and "python -m bench.llm_compressor" in said
    alike = nb03b.fp8_kv_said(_ref(["avx2", "fma"]), ["avx2", "fma"])
    assert alike.endswith("This machine lacks them too.") and "make llmc" not in alike


def test_a_reference_rows_where_names_its_machine() -> None:
    res = results.Results("x", env={"hardware": {"cpu": "AMD EPYC", "cpu_isa": ["avx2", "fma"], "cpu_cores_logical": 2},
                                    "date": "2026-12-03T15:45:34+00:00"},
                          rows=[{"section": "s", "where": results.HERE}, {"section": "s", "where": "elsewhere"}])
    results.as_reference(res)
    assert res.rows[0]["where"] == "reference: AMD EPYC (avx2 fma), 2 cores, 2026-12-03" and res.rows[1]["where"] == "elsewhere"
    assert results.is_reference(res.rows[0]["where"]) and not results.is_reference(results.HERE)

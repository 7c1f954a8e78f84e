"""Property-based tests: whatever arrives, the request parser, `labkit size`, the class merge and the results
files answer with a clear refusal or a result — never a traceback, never a half-written file."""
from __future__ import annotations

import io
import json
import string
import zipfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from labkit.core import results
from labkit.serve import protocol
from labkit.__main__ import main as cli

ROOT = Path(__file__).resolve().parent.parent
from tools import merge_results

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=12)
FIELDS = ["prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n", "temperature",
          "top_p", "seed", "stop", "ignore_eos", "model", "presence_penalty", "logprobs", "user", "role", "content"]
bodies = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, max_size=6)
CFG = protocol.ServerConfig()


def _parse(raw: bytes, chat: bool) -> None:
    try:
        p = protocol.parse_body(raw, chat, CFG)
    except protocol.ApiError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    assert 1 <= p.max_tokens <= CFG.max_tokens_limit
    assert (p.messages if chat else p.prompt) is not None


@FAST
@given(raw=st.binary(max_size=200), chat=st.booleans())
def test_parser_on_any_bytes(raw, chat):
    _parse(raw, chat)


@FAST
@given(body=bodies, chat=st.booleans())
def test_parser_on_any_json_object(body, chat):
    _parse(json.dumps(body).encode(), chat)


@FAST
@given(messages=st.lists(st.fixed_dictionaries({"role": json_values | st.sampled_from(["user", "system"]),
                                                "content": json_values}), max_size=3), extra=bodies)
def test_parser_on_chat_messages(messages, extra):
    _parse(json.dumps({**extra, "messages": messages}).encode(), chat=True)


MODELS = st.sampled_from(["default", str(ROOT / "data/configs/SmolLM2-135M-Instruct"), str(ROOT / "data/configs/Qwen2-7B"),
                          "/no/such/dir", "./nope", str(ROOT / "README.md")]) | st.text(alphabet=string.ascii_letters + string.digits + "-_.~", max_size=12)
NUMBERS = st.integers(min_value=-5, max_value=2**40).map(str) | st.text(max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=MODELS, dtype=st.sampled_from(["fp32", "fp16", "bf16", "int8", "int4", "nf4", "fp8", "", "FP16"]),
       context=NUMBERS, batch=NUMBERS, json_out=st.booleans())
def test_size_cli_answers_or_refuses_in_one_line(model, dtype, context, batch, json_out, capsys):
    argv = ["size", model, "--dtype", dtype, "--context", context, "--batch", batch] + (["--json"] if json_out else [])
    code = cli(argv)
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    elif json_out:
        data = json.loads(out)
        assert data["weight_bytes"] > 0 and data["kv_bytes"] >= 0


VALID = results.Results("00_setup", rows=[{"section": "chat", "decode_tokens_per_s": 12.0}],
                        env={"hardware": {"cpu": "x"}, "device": "cpu", "quick": True}).to_dict()
entries = st.one_of(st.binary(max_size=80), json_values.map(lambda v: json.dumps(v).encode()),
                    st.just(json.dumps(VALID).encode()),
                    st.dictionaries(st.sampled_from(["name", "rows", "env", "notes"]), json_values, max_size=4)
                    .map(lambda d: json.dumps(d).encode()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(zips=st.lists(st.one_of(st.binary(max_size=60), st.lists(entries, min_size=1, max_size=3)), min_size=1, max_size=4))
def test_class_merge_never_loses_the_class_to_one_bad_file(zips, tmp_path_factory):
    inbox = tmp_path_factory.mktemp("inbox")
    n_good = 0
    for i, z in enumerate(zips):
        path = inbox / f"labkit-results-learner{i}.zip"
        if isinstance(z, bytes):
            path.write_bytes(z)  # not a zip at all
            continue
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for j, raw in enumerate(z):
                zf.writestr(f"results/{j:02d}.json", raw)
                n_good += raw == json.dumps(VALID).encode()
        path.write_bytes(buf.getvalue())
    info = merge_results.merge([inbox], tmp_path_factory.mktemp("class"))
    assert info["files"] >= n_good
    assert all(s.split(":", 1)[0].startswith("learner") for s in info["skipped"]), info["skipped"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.dictionaries(st.text(max_size=8), json_values | st.just(object()) | st.just({1, 2}),
                                     max_size=3), max_size=4), crash_after=st.integers(min_value=0, max_value=200))
def test_a_crash_while_writing_leaves_the_previous_file_intact(rows, crash_after, tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("res")
    path = folder / "x.json"
    previous = results.write_json_atomic(path, {"kept": True}).read_text(encoding="utf-8")
    real_dump = json.dump

    def dump_then_crash(obj, fh, **kw):  # the disk fills up after ``crash_after`` characters
        text = json.dumps(obj, **kw)
        fh.write(text[:crash_after])
        if crash_after < len(text):
            raise OSError(28, "No space left on device")
        fh.write(text[crash_after:])

    monkeypatch.setattr(json, "dump", dump_then_crash)
    try:
        results.write_json_atomic(path, {"rows": rows})
        wrote = True
    except (OSError, TypeError, ValueError):
        wrote = False
    finally:
        monkeypatch.setattr(json, "dump", real_dump)
    text = path.read_text(encoding="utf-8")
    assert text == previous if not wrote else json.loads(text)["rows"] is not None
    assert [p.name for p in folder.iterdir()] == ["x.json"], "a temporary file was left behind"


def test_class_page_draws_each_mode_apart():
    from labkit.core import results

    def sub(name, quick, gain):
        res = results.Results("06_batching", env={"hardware": {"cpu": "c"}, "device": "cpu", "quick": quick})
        res.add("static", batch_size=1, total_tokens_per_s=10.0)
        res.add("static", batch_size=8, total_tokens_per_s=10.0 * gain)
        return merge_results.Submission(learner=name, file=f"{name}.json", res=res)

    page, drawn = merge_results.plots_html([sub("alice", True, 3.0), sub("bob", False, 6.0)])
    assert drawn["batching"] == 2 and "<h3>quick mode</h3>" in page and "<h3>full mode</h3>" in page
    assert page.index("<h3>full mode</h3>") < page.index("bob") < page.index("<h3>quick mode</h3>") < page.rindex("alice")
    assert "alice" not in page[:page.index("<h3>quick mode</h3>")]  # each learner only in its own mode's plot
    one, _ = merge_results.plots_html([sub("alice", True, 3.0)])
    assert "mode</h3>" not in one


def test_class_results_are_grouped_by_isa_class():
    """One model name ("AMD EPYC") covers AVX2 and AVX-512 parts: the room's plots and tables group by ISA class."""
    from labkit.core import cpu, results

    def sub(name, isa, gain):
        res = results.Results("06_batching", env={"hardware": {"cpu": "AMD EPYC", "cpu_isa": isa}, "device": "cpu",
                                                  "quick": True})
        res.add("static", batch_size=1, total_tokens_per_s=10.0)
        res.add("static", batch_size=8, total_tokens_per_s=10.0 * gain)
        return merge_results.Submission(learner=name, file=f"{name}.json", res=res)

    subs = [sub("zoe", ["avx2", "fma"], 3.0), sub("amy", ["avx2", "avx512f", "avx512_bf16"], 5.0),
            sub("bob", ["avx2"], 3.2)]
    points = merge_results.batching_points(subs)
    assert {p["learner"]: p["isa_class"] for p in points} == {"zoe": "AVX2", "amy": "AVX-512", "bob": "AVX2"}
    fig = merge_results.batching_figure(points)
    assert list(fig.data[0].x) == ["amy (AVX-512)", "bob (AVX2)", "zoe (AVX2)"]
    df = merge_results.rows_table(subs)
    tables = merge_results.class_html(df, [], subs).split("<h2 id='tables'>")[1]
    assert tables.index("amy") < tables.index("bob") < tables.index("zoe")
    assert cpu.isa_class({"cpu": "Apple M2", "cpu_isa": ["asimd", "bf16"]}) == "Apple silicon"
    assert cpu.isa_class({"cpu": "x", "gpu": "NVIDIA H100"}) == "GPU" and cpu.isa_class({}) == "ISA not recorded"

"""labkit.lessons.exercises itself: verdicts, the helpers checks use, and predictions."""
import pytest
import torch

from exercise_cells import SOLUTIONS, exercise_cells, run_cell
from labkit.lessons import exercises


@exercises.exercise("98.double", "double a tensor")
def _double(fn):
    x = torch.arange(6.0).reshape(2, 3)
    exercises.close(exercises.call(fn, x), 2 * x, "double(x)")


def test_statuses_and_reasons():
    assert exercises.evaluate("98.double", None).status == "not attempted"
    assert exercises.evaluate("98.double", lambda x: None).status == "not attempted"

    def todo(x):
        raise NotImplementedError

    assert exercises.evaluate("98.double", todo).status == "not attempted"
    assert exercises.evaluate("98.double", lambda x: 2 * x).status == "correct"
    off = exercises.evaluate("98.double", lambda x: x + x.max())
    assert off.status == "wrong" and "double(x)[0, 0] is 5, expected 0" in off.because
    shape = exercises.evaluate("98.double", lambda x: (2 * x).flatten())
    assert shape.status == "wrong" and "shape (6,)" in shape.because
    crash = exercises.evaluate("98.double", lambda x: x @ x)
    assert crash.status == "wrong" and crash.because.startswith("it raised RuntimeError")
    assert exercises.evaluate("98.double", 3).because == "expected a function, got int"


def test_check_prints_one_parseable_line(capsys):
    exercises.check("98.double", lambda x: 3 * x)
    line = capsys.readouterr().out.strip()
    m = exercises.LINE.match(line)
    assert m and m["id"] == "98.double" and m["status"] == "wrong" and "because" in line


def test_unknown_ids_and_bad_ids_name_the_fix():
    with pytest.raises(ValueError, match="notebook 98 has"):
        exercises.get("98.nope")
    with pytest.raises(ValueError, match="NN.name"):
        exercises.exercise("double", "x")


def test_reveal_prints_prediction_measurement_and_ratio(capsys):
    row = exercises.reveal("decode tokens/s", 20, 10.0, "tokens/s")
    assert row["ratio"] == 0.5 and "measured / predicted = 0.50×" in capsys.readouterr().out
    row = exercises.reveal("decode tokens/s", None, 10.0)
    assert row["ratio"] is None and "no prediction made" in capsys.readouterr().out
    with pytest.raises(ValueError, match="must be a number"):
        exercises.reveal("x", "ten", 10.0)
    exercises.reveal("KV at 32k tokens", 4.0, 2.0, "GiB", kind="computed")  # from a config: never called measured
    out = capsys.readouterr().out
    assert "computed 2 GiB, computed / predicted = 0.50×" in out and "measured" not in out
    with pytest.raises(ValueError, match="'measured' or 'computed'"):
        exercises.reveal("x", 1.0, 1.0, kind="guessed")
    exercises.reveal_choice("overflows", "fp16", "fp16", ["fp16", "bf16", "neither"])
    assert "as you predicted" in capsys.readouterr().out
    with pytest.raises(ValueError, match="one of"):
        exercises.reveal_choice("overflows", "fp8", "fp16", ["fp16", "bf16", "neither"])


def test_use_takes_the_answer_only_when_correct(capsys):
    lib = lambda x: 2 * x  # noqa: E731
    assert exercises.use("98.double", None, lib) is lib
    assert "using labkit's" in capsys.readouterr().out
    mine = lambda x: x * 2  # noqa: E731
    assert exercises.use("98.double", mine, lib) is mine


def test_tiny_llama_is_deterministic():
    a, b = exercises.tiny_llama(), exercises.tiny_llama()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_checks_take_numpy_scalars_as_numbers():
    """A learner's numpy arithmetic returns np.int64 / np.float16: the checks judge the value, not its type."""
    import numpy as np

    from labkit.lessons import exercises

    solutions = {}
    for stem in ("01_hardware_sizing", "02_fp16_bf16", "04_warmup"):
        for ex_id, src in exercise_cells(SOLUTIONS / f"{stem}.py"):
            ns = run_cell(src, ex_id)
            solutions[ex_id] = ns[exercises.get(ex_id).name]
    as_numpy = {
        "01.weight_bytes": lambda f: lambda *a: np.int64(f(*a)),
        "01.decode_ceiling": lambda f: lambda *a: np.float64(f(*a)),
        "02.float_max": lambda f: lambda *a: np.float64(f(*a)),
        "04.calls_until_settled": lambda f: lambda *a: None if f(*a) is None else np.int64(f(*a)),
        "04.one_time_share": lambda f: lambda *a: np.float64(f(*a)),
    }
    for ex_id, wrap in as_numpy.items():
        verdict = exercises.evaluate(ex_id, wrap(solutions[ex_id]))
        assert verdict.status == "correct", verdict.line


@exercises.exercise("98.triple", "triple a number", hints=(
    "Multiply the number by three: the same number added to itself twice over.",
    "A product, not a sum with one: x + 3 is not three times x, and neither is x * x * x.",
    "Return the product of the number and the integer `3`, keeping its type.",
))
def _triple(fn):
    got = exercises.call(fn, 7)
    if got == 10:
        raise exercises.Wrong("10 is 7 + 3: multiply, do not add", hint=2)
    exercises.close(got, 21, "triple(7)")  # any other answer: a mistake no hint was written for


def test_a_mistake_no_hint_was_written_for_names_the_next_hint_not_seen(monkeypatch, tmp_path, capsys):
    """A catch-all wrong answer used to send the learner to the last hint, the code; it now names the next one."""
    monkeypatch.setenv("LABKIT_PROGRESS", str(tmp_path / "progress.json"))
    known = exercises.evaluate("98.triple", lambda x: x + 3)
    assert known.hint == 2 and 'exercises.hint("98.triple", 2)' in known.line
    first = exercises.evaluate("98.triple", lambda x: x * x)
    assert first.hint is None and first.next_hint == 1 and "hint 1 of 3 is the next you have not seen" in first.line
    exercises.hint("98.triple")  # the learner reads hint 1, then hint 2
    exercises.hint("98.triple")
    assert "hint 3 of 3 is the next" in exercises.evaluate("98.triple", lambda x: x * x).line
    exercises.hint("98.triple", 3)
    done = exercises.evaluate("98.triple", lambda x: x * x).line
    assert "seen all 3 hints" in done and 'exercises.solution("98.triple")' in done
    capsys.readouterr()


def test_e4m3_is_judged_by_what_it_computes_not_by_the_names_it_uses():
    """03.e4m3_round refused any answer naming a float8 dtype, even one reading 448 from torch.finfo; it now refuses
    only a float8 cast, found by running the answer with such casts switched off."""
    def from_finfo(x):
        top = torch.finfo(torch.float8_e4m3fn).max  # 448, read, not cast
        a = x.abs().clamp(max=top)
        e = torch.floor(torch.log2(a.clamp_min(2.0 ** -9))).clamp_min(-6)
        step = torch.exp2(e - 3)
        return torch.copysign((torch.round(a / step) * step).clamp(max=top), x)

    assert exercises.evaluate("03.e4m3_round", from_finfo).status == "correct"
    cast = exercises.evaluate("03.e4m3_round", lambda x: x.to(torch.float8_e4m3fn).float())
    assert cast.status == "wrong" and "torch's own cast" in cast.because
    typed = exercises.evaluate("03.e4m3_round", lambda x: x.type(torch.float8_e4m3fn).float())
    assert typed.status == "wrong" and "torch's own cast" in typed.because

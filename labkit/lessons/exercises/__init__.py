"""Exercises that check themselves, and predictions written before a measurement.

An exercise is two cells in a notebook. The fill-in cell defines one name and runs as shipped (its
placeholder returns ``None`` or raises ``NotImplementedError``); the check cell hands that name over:

    def per_channel_scale(w):           # fill-in cell (self-contained: it imports what it uses)
        return None                     # your code: one scale per output row

    exercises.check("03.per_channel_scale", per_channel_scale)

and prints one line: ``Exercise 03.per_channel_scale · <title>: not attempted``, ``…: correct``, or
``…: wrong, because <what is off>``. Checks build their own inputs (random tensors, a tiny random model),
so they judge the mechanism, not this run's numbers. Each notebook's checks live in its own package,
``labkit.lessons.nbNN.checks``; the solutions live outside the learner's path, in ``notebooks/solutions/``.

Stuck, one exercise at a time and only on request (no notebook calls these): ``hint("06.left_pad")`` prints the
next of its two or three graded hints (the first names the idea, the last one step short of the code; a wrong
verdict names the hint written for that mistake, or, for a mistake no hint was written for, the next one the
learner has not seen), ``solution("06.left_pad")`` that exercise's solution only, ``reset(...)``
forgets its record and prints the cell as shipped. ``progress`` keeps each check's verdict, hints asked and
predictions made in a small JSON file in the lab's cache; ``show_progress()`` (every notebook's last cell) and
``python -m labkit progress`` print it.

A prediction is a variable the learner sets before a measurement (``None`` until then); ``reveal`` prints
the prediction, the measurement and their ratio, or says that no prediction was made, and the notebook
goes on.
"""
from __future__ import annotations

import importlib
import math
import numbers
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import NOTEBOOK
from . import progress

STATUSES = ("not attempted", "correct", "wrong")
LINE = re.compile(r"^Exercise (?P<id>\d\d\.\w+) · .*?: (?P<status>not attempted|correct|wrong)")


class NotAttempted(Exception):
    """The answer is still the placeholder."""


class Wrong(Exception):
    """The answer is off; the message says how, in terms the learner can act on. ``hint``: the number (1…) of the
    exercise's hint written for this mistake, which the verdict names."""

    def __init__(self, message: str, hint: int | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Exercise:
    id: str  # "NN.name": notebook number and the name the learner fills in
    title: str
    check: Callable[[Any], None]  # raises Wrong (or NotAttempted); returns when the answer is right
    hints: tuple[str, ...] = ()  # graded: the first names the idea, the last is nearly code

    @property
    def name(self) -> str:
        return self.id.split(".", 1)[1]


@dataclass(frozen=True)
class Verdict:
    exercise: str
    title: str
    status: str  # one of STATUSES
    because: str = ""
    hint: int | None = None  # the hint written for this mistake (wrong only)
    n_hints: int = 0
    next_hint: int | None = None  # a mistake no hint was written for: the next hint the learner has not seen

    def __post_init__(self) -> None:
        assert self.status in STATUSES, f"unknown status {self.status!r}"

    @property
    def line(self) -> str:
        tail = f", because {self.because}" if self.status == "wrong" else ""
        if self.status == "wrong" and self.n_hints:
            if self.hint:
                tail += (f". Stuck? hint {self.hint} of {self.n_hints} is about this: exercises.hint(\"{self.exercise}\", "
                         f"{self.hint})")
            elif self.next_hint:
                tail += (f". Stuck? hint {self.next_hint} of {self.n_hints} is the next you have not seen: "
                         f"exercises.hint(\"{self.exercise}\", {self.next_hint})")
            else:
                tail += (f". You have seen all {self.n_hints} hints: exercises.solution(\"{self.exercise}\") shows this "
                         "exercise's solution")
        hint = " (fill in the cell above, then run this one again)" if self.status == "not attempted" else ""
        return f"Exercise {self.exercise} · {self.title}: {self.status}{tail}{hint}"


_REGISTRY: dict[str, Exercise] = {}


def exercise(exercise_id: str, title: str, hints: tuple[str, ...] = ()) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register a check: ``@exercise("05.decode_step", "one decode step with the cache", hints=(...))``; the
    hints go from the idea to nearly code, and each recorded mistake's ``Wrong`` names the one written for it."""
    if not re.fullmatch(r"\d\d\.[A-Za-z_]\w*", exercise_id):
        raise ValueError(f"exercise id {exercise_id!r}: use 'NN.name' (notebook number, then the filled-in name)")

    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        assert exercise_id not in _REGISTRY, f"exercise {exercise_id} registered twice"
        _REGISTRY[exercise_id] = Exercise(exercise_id, title, fn, tuple(hints))
        return fn

    return register


_LESSONS = Path(__file__).resolve().parent.parent  # labkit/lessons: one package per notebook (nb03, nb03b, …)


def _load(notebook: str) -> None:
    """Import the checks of notebook ``notebook`` ("03"): the ``checks`` module of every package named for it
    (``nb03`` and ``nb03b``: 03b's ids start with 03, as they always have)."""
    lessons = __name__.rsplit(".", 1)[0]
    for found in sorted(_LESSONS.glob(f"nb{notebook}*/checks.py")):
        if NOTEBOOK.fullmatch(found.parent.name):
            importlib.import_module(f"{lessons}.{found.parent.name}.checks")


def get(exercise_id: str) -> Exercise:
    """The registered exercise (its notebook's checks are imported on first use)."""
    if exercise_id not in _REGISTRY:
        _load(exercise_id[:2])
    if exercise_id not in _REGISTRY:
        nb = sorted(e for e in _REGISTRY if e[:2] == exercise_id[:2])
        raise ValueError(f"no exercise {exercise_id!r}; notebook {exercise_id[:2]} has {nb or 'none'}")
    return _REGISTRY[exercise_id]


def all_exercises() -> list[Exercise]:
    """Every registered exercise, in notebook order."""
    for n in range(100):
        _load(f"{n:02d}")
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; ``None`` back (the placeholder) means not attempted."""
    if not callable(fn):
        raise Wrong(f"expected a function, got {type(fn).__name__}")
    out = fn(*args, **kwargs)
    if out is None:
        raise NotAttempted()
    return out


def evaluate(exercise_id: str, answer: Any) -> Verdict:
    """Run the check on ``answer``: not attempted, correct, or wrong with the reason."""
    ex = get(exercise_id)

    def verdict(status: str, because: str = "", hint: int | None = None) -> Verdict:
        unseen = progress.hints_seen(ex.id) + 1 if status == "wrong" and not hint else None  # a catch-all's next step
        return Verdict(ex.id, ex.title, status, because, hint, len(ex.hints),
                       unseen if unseen is not None and unseen <= len(ex.hints) else None)

    if answer is None or answer is Ellipsis:
        return verdict("not attempted")
    try:
        ex.check(answer)
    except (NotAttempted, NotImplementedError):
        return verdict("not attempted")
    except Wrong as exc:
        return verdict("wrong", str(exc), exc.hint if exc.hint and exc.hint <= len(ex.hints) else None)
    except Exception as exc:  # the learner's code raised: that is the answer being wrong, said plainly
        return verdict("wrong", f"it raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    return verdict("correct")


def check(exercise_id: str, answer: Any) -> None:
    """Evaluate and print the verdict's one line (the check cell of an exercise; ``evaluate`` returns it), and keep
    it in the learner's progress record."""
    v = evaluate(exercise_id, answer)
    print(v.line)
    progress.record_check(exercise_id, v.status)


# ------------------------------------------------------------------------------- the stuck learner's path

_CELL = re.compile(r"^# %%(?P<head>.*)$", re.M)


def _repo_cell(folder: str, exercise_id: str) -> tuple[Path, str] | None:
    """The exercise ``ID``'s cell (``# %% exercise ID`` in a solutions file, ``labkit={"exercise": "ID"}`` in a
    notebook's percent-format source) of notebook NN's file in the checkout's ``notebooks/<folder>/`` (its path and
    source), or None when labkit runs outside a checkout of the repository."""
    root = Path(__file__).resolve().parents[3] / "notebooks" / folder
    for file in sorted(root.glob(f"{exercise_id[:2]}*_*.py")):
        text = file.read_text(encoding="utf-8")
        heads = list(_CELL.finditer(text))
        for i, m in enumerate(heads):
            head = m.group("head")  # a solutions file's "exercise ID", a notebook source's labkit={"exercise": "ID"}
            if exercise_id in head.split() or f'"exercise": "{exercise_id}"' in head:
                end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
                return file, text[m.end():end].strip("\n") + "\n"
    return None


def hint(exercise_id: str, number: int | None = None) -> None:
    """Print the exercise's next hint (the first names the idea, the last is nearly code), or hint ``number``."""
    ex = get(exercise_id)
    if not ex.hints:
        raise ValueError(f"exercise {exercise_id} has no hints: exercises.solution({exercise_id!r}) shows its solution")
    seen = progress.hints_seen(exercise_id)
    n = number if number is not None else min(seen + 1, len(ex.hints))
    if not 1 <= n <= len(ex.hints):
        raise ValueError(f"exercise {exercise_id} has hints 1 to {len(ex.hints)}, not {number}")
    print(f"Hint {n} of {len(ex.hints)} · exercise {exercise_id} · {ex.title}:\n{ex.hints[n - 1]}")
    if n == len(ex.hints):
        print(f"That is the last hint; exercises.solution({exercise_id!r}) shows this exercise's solution.")
    else:
        print(f"Still stuck? exercises.hint({exercise_id!r}) again gives hint {n + 1}.")
    progress.record_hint(exercise_id, n)


def solution(exercise_id: str) -> None:
    """Print this exercise's solution only (from notebooks/solutions/), and note in the record that it was shown."""
    ex = get(exercise_id)
    found = _repo_cell("solutions", exercise_id)
    if found is None:
        raise FileNotFoundError(f"no notebooks/solutions/ beside this labkit ({Path(__file__).resolve().parents[3]}): "
                                "the solutions ship with the repository, not the package; run the notebook from a "
                                "clone (the first cell on Colab or Kaggle makes one)")
    file, source = found
    print(f"Solution of exercise {exercise_id} · {ex.title} ({file.name}); paste it over the cell and run the check:\n")
    print(source)
    progress.record_solution(exercise_id)


def reset(exercise_id: str) -> None:
    """Forget the exercise's verdict, hints and solution shown, and print its cell as shipped to paste back."""
    get(exercise_id)
    had = progress.forget(exercise_id)
    found = _repo_cell("src", exercise_id)
    print(f"Exercise {exercise_id}: {'record cleared' if had else 'nothing recorded yet'}." +
          (" The cell as shipped, to paste back:\n" if found else ""))
    if found:
        print(found[1])


def show_progress() -> None:
    """Print every notebook's exercises (done / wrong / not tried) and predictions made: a notebook's last cell."""
    print(progress.text(progress.table([e.id for e in all_exercises()])))


def use(exercise_id: str, answer: Any, fallback: Any) -> Any:
    """The learner's answer where its check says correct, else ``fallback`` (labkit's own version), so
    the cells after an exercise run either way. Says which one it took."""
    v = evaluate(exercise_id, answer)
    if v.status == "correct":
        print(f"using your {v.title} (exercise {exercise_id})")
        return answer
    print(f"using labkit's {v.title}: exercise {exercise_id} is {v.status}")
    return fallback


# ------------------------------------------------------------------------------------------- helpers


def tiny_llama(vocab_size: int = 96, layers: int = 2, seed: int = 0) -> Any:
    """A small random Llama built in memory (no files, no hub): checks run a learner's decode code on it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = 0
    return model


def close(got: Any, want: Any, what: str, rtol: float = 1e-4, atol: float = 1e-6, hint: int | None = None) -> None:
    """Raise ``Wrong`` (naming ``hint``) unless tensors (or numbers) ``got`` and ``want`` match in shape and value."""
    try:
        _close(got, want, what, rtol, atol)
    except Wrong as exc:
        raise Wrong(str(exc), hint) from None


def _close(got: Any, want: Any, what: str, rtol: float, atol: float) -> None:
    import torch

    if isinstance(want, (int, float)) and not isinstance(want, bool):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Wrong(f"{what} should be a number, got {type(got).__name__}")
        if not math.isclose(got, want, rel_tol=rtol, abs_tol=atol):
            raise Wrong(f"{what} is {got:.6g}, expected {want:.6g}")
        return
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{what} should be a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        raise Wrong(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if got.device != want.device:
        raise Wrong(f"{what} is on {got.device}, expected {want.device}")
    g, w = got.detach().double(), want.detach().double()
    bad = ~torch.isclose(g, w, rtol=rtol, atol=atol)
    if bad.any():
        i = tuple(int(x) for x in bad.nonzero()[0])
        raise Wrong(f"{what}{list(i)} is {g[i].item():.6g}, expected {w[i].item():.6g} "
                    f"({int(bad.sum())} of {bad.numel()} entries differ)")


def number(got: Any, what: str, *, integer: bool = False, hint: int | None = None) -> None:
    """Raise ``Wrong`` unless ``got`` is a number (an ``int`` when ``integer``): ``what`` names what to return."""
    kind = int if integer else numbers.Real
    if isinstance(got, bool) or not isinstance(got, kind):
        raise Wrong(f"return {what}, got {type(got).__name__}", hint)


def slipped(got: Any, want: Any, slips: Iterable[tuple[Any, str, int | None]], where: str, tol: float = 0.0) -> None:
    """Raise the ``Wrong`` of the first slip ``got`` matches: each slip is (the value a known mistake gives, or a
    test of ``got``, why, the hint written for it). A slip whose value equals ``want`` is skipped (on that case the
    mistake gives the right answer). ``where`` starts the message; returns when none matches."""
    for value, why, hint in slips:
        if callable(value):
            if value(got):
                raise Wrong(f"{where}: {why}", hint)
        elif abs(value - want) > tol and abs(got - value) <= tol:
            raise Wrong(f"{where}: {why}", hint)


def follows_device(run: Callable[[], Any], names: Sequence[str], raised: str, moved: str, hint: int | None = None) -> None:
    """The learner's function asked again on torch's 'meta' device (``run`` makes that call): every tensor it returns
    (named ``names``) must come back there. ``raised`` ends the message when it raises (how to build on the device),
    ``moved`` when a tensor comes back elsewhere; ``{name}`` and ``{device}`` in ``moved`` are filled in."""
    try:
        out = run()
    except (Wrong, NotAttempted):
        raise
    except Exception as exc:  # the learner's code failed only because the device changed
        raise Wrong(f"on another device (torch's 'meta') it raised {type(exc).__name__}: {raised}", hint) from None
    for name, t in zip(names, out):
        if t.device.type != "meta":
            raise Wrong(moved.format(name=name, device=t.device), hint)


# ----------------------------------------------------------------------------------------- predictions


def reveal(what: str, predicted: float | None, measured: float, unit: str = "", kind: str = "measured") -> dict[str, Any]:
    """Print the prediction next to the measurement and their ratio (measured / predicted); with no
    prediction, say so and go on. ``kind="computed"`` for a figure worked out (from a config, a formula) rather
    than measured: the sentence says which. Returns the row for the notebook's results."""
    if kind not in ("measured", "computed"):
        raise ValueError(f"kind={kind!r}: 'measured' or 'computed'")
    u = f" {unit}" if unit else ""
    row: dict[str, Any] = {"quantity": what, "predicted": predicted, "measured": measured, "unit": unit,
                           "ratio": None}
    if predicted is None:
        print(f"{what}: no prediction made (set it in the prediction cell above and run this cell again); "
              f"{kind} {measured:.4g}{u}")
        progress.record_prediction(what, None)
        return row
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)) or not math.isfinite(predicted):
        raise ValueError(f"the prediction for {what!r} must be a number (or None), got {predicted!r}")
    progress.record_prediction(what, predicted)
    row["ratio"] = measured / predicted if predicted else None
    ratio = f"{row['ratio']:.2f}×" if row["ratio"] is not None else "undefined (you predicted 0)"
    print(f"{what}: predicted {predicted:.4g}{u}, {kind} {measured:.4g}{u}, {kind} / predicted = {ratio}")
    return row


def reveal_choice(what: str, predicted: str | None, actual: str | None, choices: list[str],
                  undecided: str | None = None) -> dict[str, Any]:
    """The same for a prediction that is one of ``choices`` (which is faster, which overflows…).

    ``actual=None`` with ``undecided`` (the verdict's reason, e.g. "within noise (the p10–p90 ranges overlap)")
    when the run cannot name a winner: the reveal then says so, as the takeaway does, instead of crowning the
    larger of two noisy numbers."""
    if predicted is not None and predicted not in choices:
        raise ValueError(f"the prediction for {what!r} must be one of {choices} (or None), got {predicted!r}")
    progress.record_prediction(what, predicted)
    if actual is None:
        row = {"quantity": what, "predicted": predicted, "measured": None, "unit": "", "ratio": None}
        said = f"you predicted {predicted}; " if predicted is not None else "no prediction made; "
        print(f"{what}: {said}no winner can be named in this run: {undecided or 'no verdict'}")
        return row
    row = {"quantity": what, "predicted": predicted, "measured": actual, "unit": "", "ratio": None}
    if predicted is None:
        print(f"{what}: no prediction made (choose one of {choices} above and run this cell again); "
              f"measured: {actual}")
    else:
        verdict = "as you predicted" if predicted == actual else f"not {predicted}"
        print(f"{what}: you predicted {predicted}; measured: {actual} ({verdict})")
    return row

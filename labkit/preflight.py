"""What both preflights share: the record a check leaves, its line, and the runner of checks under a deadline.

``make doctor`` (``doctor``: is this laptop ready?) and ``make gpu-check`` (``gpu_check``: does every CUDA path
run?) each end a check with one ``CheckResult``: its name, PASS, FAIL or SKIP, one line of detail (what passed,
or why it failed or was skipped, with the fix) and, where it was timed, its seconds. ``line`` prints it as both
commands do, ``counts`` tallies a run.

``run_checks`` runs ``Check``s (a name, a function of a context, the capabilities it needs), each in a thread of
its own: what a check raises becomes its FAIL line and ``Skip`` its SKIP line; a check not started within the
time budget is skipped, saying so, and one still running at the deadline is a FAIL that ends the run (the GPU is
still busy with it). ``select`` picks checks by name. The checks themselves, and what they share (a model loaded
once), are the commands'.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .core import env, timing

STATUSES = ("PASS", "FAIL", "SKIP")
PASS, FAIL, SKIP = STATUSES
DEFAULT_BUDGET_S = 420.0  # checks not started by then are skipped
DEFAULT_DEADLINE_S = 570.0  # a check still running then is a FAIL and the run ends: under 10 minutes in all


class Skip(Exception):
    """Raised by a check that cannot run here; the message is the reason."""


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome, as both preflights print it and ``gpu_check`` writes it to JSON."""

    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str  # what passed, or why it failed / was skipped (on FAIL: the fix)
    seconds: float | None = None  # how long it ran; None where the command does not time its checks

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}; choose one of {STATUSES}")

    def line(self, width: int = 10) -> str:
        """``STATUS  name  detail``, the name padded to ``width``, the time before the detail where it was timed
        (a skipped check took none)."""
        took = f"({self.seconds:.1f} s) " if self.seconds is not None and self.status != SKIP else ""
        return f"{self.status}  {self.name:<{width}} {took}{self.detail}"


def counts(results: Sequence[CheckResult]) -> dict[str, int]:
    """How many checks ended in each status, ``STATUSES`` order."""
    return {s: sum(r.status == s for r in results) for s in STATUSES}


@dataclass(frozen=True)
class Check:
    """One check to run: ``run(ctx)`` returns a one-line detail (PASS), raises ``Skip`` (SKIP) or anything
    else (FAIL). ``needs``: capability names (``labkit.core.env`` / ``labkit.engines``) that must be available,
    else the check is skipped with that capability's reason."""

    name: str
    run: Callable[[Any], str]
    needs: tuple[str, ...] = ()


def capability_lookup(name: str) -> Any:
    """A capability by name (``labkit.core.env`` lists every one a check needs, the TensorRT paths included)."""
    return env.capability(name)


def _run_one(check: Check, ctx: Any, limit_s: float) -> tuple[str, str] | None:
    """(status, detail) of one check run in a thread of its own, or None when it is still running after
    ``limit_s`` (a hung CUDA call, a TensorRT build or a vLLM start that would take the run past its deadline)."""
    box: list[tuple[str, str]] = []

    def target() -> None:
        try:
            timing.bind_thread(ctx.device)  # this thread's unnamed synchronise and allocations go to ctx.device
            box.append((PASS, check.run(ctx)))
        except Skip as why:
            box.append((SKIP, str(why)))
        except BaseException as exc:  # noqa: BLE001  (a preflight reports every failure as a FAIL line)
            text = str(exc).strip().splitlines()
            box.append((FAIL, f"{type(exc).__name__}: {text[0][:300] if text else ''}"))

    worker = threading.Thread(target=target, name=f"gpu-check {check.name}", daemon=True)
    worker.start()
    worker.join(max(limit_s, 0.0))
    return box[0] if box else None


def run_checks(checks: Sequence[Check], ctx: Any, budget_s: float = DEFAULT_BUDGET_S,
               lookup: Callable[[str], Any] = capability_lookup, clock: Callable[[], float] = time.monotonic,
               out: TextIO | None = None, deadline_s: float = DEFAULT_DEADLINE_S) -> list[CheckResult]:
    """Run each check in turn on ``ctx`` (anything with a ``device``) and print its line as it finishes. A check
    never stops the run: what it raises becomes its FAIL line. Checks not started within ``budget_s`` are
    skipped, saying so; a check still running at ``deadline_s`` is a FAIL, and the checks after it are skipped
    (the GPU is still busy with it), so the whole run ends by the deadline."""
    if budget_s <= 0:
        raise ValueError(f"budget_s={budget_s}: must be positive")
    if deadline_s <= 0:
        raise ValueError(f"deadline_s={deadline_s}: must be positive")
    out = out or sys.stdout
    width = max((len(c.name) for c in checks), default=10)
    start = clock()
    done: list[CheckResult] = []
    hung: str | None = None
    for check in checks:
        t0 = clock()
        if hung:
            result = CheckResult(check.name, SKIP, f"not started: {hung!r} was still running at the deadline", 0.0)
        elif t0 - start > budget_s:
            result = CheckResult(check.name, SKIP, f"time budget of {budget_s:.0f} s spent before this check "
                                                   "(raise --budget-s, or run it with --only)", 0.0)
        else:
            missing = [cap for cap in (lookup(n) for n in check.needs) if not cap.available]
            if missing:
                result = CheckResult(check.name, SKIP, f"{missing[0].name}: {missing[0].reason}", 0.0)
            else:
                limit_s = deadline_s - (t0 - start)
                got = _run_one(check, ctx, limit_s)
                if got is None:
                    hung = check.name
                    result = CheckResult(check.name, FAIL, f"still running after {limit_s:.0f} s, at the run's "
                                         f"{deadline_s:.0f} s deadline: run it alone (--only) to see how long it "
                                         "takes, or what it waits for", clock() - t0)
                else:
                    result = CheckResult(check.name, got[0], got[1], clock() - t0)
        done.append(result)
        print(result.line(width), file=out, flush=True)
    return done


def select(all_checks: Sequence[Check], only: Sequence[str] | None) -> list[Check]:
    """The checks whose name contains one of ``only`` (all when ``only`` is empty); ``ValueError`` lists the names."""
    if not only:
        return list(all_checks)
    picked = [c for c in all_checks if any(o.lower() in c.name.lower() for o in only)]
    unknown = [o for o in only if not any(o.lower() in c.name.lower() for c in all_checks)]
    if unknown:
        raise ValueError(f"no check matches {unknown}; checks: {[c.name for c in all_checks]}")
    return picked

"""Takeaways: each notebook's closing sentences, chosen from that notebook's own results, never typed ahead of the run.

This is the framework; each notebook's takeaways live in its own package, ``labkit.lessons.nbNN.findings``, with
``takeaways(...)`` turning that notebook's measurements into a ``Findings``: ``rows`` (``{"finding": text, "value":
number}``, the first one the notebook's headline) and the ``sentences`` they choose. The words for a difference and
its doubts come from ``labkit.core.verdict`` (``phrase``, ``than``, ``Verdict.word``), never from here.

``record(res, found)`` writes the rows as the results' ``summary`` section and the headline into its notes, where
``tools.run_notebooks`` reads it; ``show(found)`` prints the sentences. The pieces several notebooks print live here
too (``compile_sentence``, ``sweep_end``, ``beyond_sweep``, ``step_split``, ``kl_per_prompt``, ``rounds_verdict``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...core import results, verdict

SUMMARY = "summary"  # the results section holding a notebook's findings rows
HEADLINE = "headline"  # the results note holding the first row: {"label", "value"} (and "verdict" where judged)


@dataclass
class Findings:
    """A notebook's takeaways: the numbers (``rows``; the first is the headline) and the sentences they choose."""

    rows: list[dict[str, Any]]
    sentences: list[str]

    @property
    def headline(self) -> dict[str, Any]:
        """The first row with a number, as ``{"label", "value"}`` (plus its ``verdict`` where one judged it)."""
        row = next((r for r in self.rows if isinstance(r.get("value"), (int, float))
                    and not isinstance(r.get("value"), bool)), None)
        if row is None:
            raise ValueError("no finding holds a number: a notebook's headline is the first row with a value")
        return {"label": row["finding"], "value": row["value"], **({"verdict": row["verdict"]} if "verdict" in row else {})}


def record(res: Any, found: Findings) -> None:
    """Write ``found`` into ``res``: its rows as the ``summary`` section, its headline into the notes."""
    res.replace(SUMMARY, found.rows)
    res.notes[HEADLINE] = found.headline


def compile_sentence(story: Any) -> str:
    """torch.compile of the decode step against eager (a ``cache_variants.CompileStory``), with its pay-back: the
    sentence notebooks 04, 05 and 08 print where the compile ran here or ships as a reference."""
    v = story.steady
    pay = verdict.pick(v, better=(f"pays back after {story.break_even_tokens:,.0f} tokens"
                                  if story.break_even_tokens is not None else "never pays back"),
                       worse="never pays back (the compiled decode was slower)",
                       same="shows no pay-back this run can read (its steady decode was not faster than eager's)",
                       unsure="shows no pay-back this run can read (too few timed runs for a verdict)")
    where = f"reference, not this run: {story.provenance}" if results.is_reference(story.where) else story.where
    where += f"; {story.judged}"  # paired rounds, or the unpaired rule of the day the file was recorded
    return (f"torch.compile of the decode step ({where}): " + verdict.phrase(v, "eager's decode tokens/s")
            + f", both with a static cache ({story.compiled_tokens_per_s:.1f} vs {story.eager_tokens_per_s:.1f}); "
            f"its first {story.new_tokens}-token call took {story.compiled_first_s:.1f} s against "
            f"{story.eager_first_s:.1f} s eager, so it {pay}")


def sweep_end(value: float | None, levels: Any, reached: bool | None = None) -> str | None:
    """Where a capacity read off a sweep is censored by the sweep's ends: ``"above"`` when the highest level tried
    still held (or ``reached`` is False: nothing higher stopped holding), so the true value lies beyond it (a lower
    bound); ``"below"`` when no level held (``value`` None), so it lies under the lowest; None when a higher level
    failed, so the value was measured inside the sweep."""
    levels = sorted(float(x) for x in levels)
    if value is None:
        return "below"
    if reached is False or (reached is None and float(value) >= levels[-1]):  # fact: the knee is the top level tried
        return "above"
    return None


def beyond_sweep(end: str | None, levels: Any, unit: str, param: str) -> str:
    """The clause a capacity sentence adds when ``sweep_end`` says the sweep's ends cut it (empty otherwise): where
    the true value lies, and which parameter extends the sweep to find it."""
    levels = sorted(float(x) for x in levels)
    if end == "above":
        return (f"the highest level tried ({levels[-1]:g} {unit}) still held, so the true capacity lies beyond the "
                f"sweep and this is a lower bound: add higher levels to {param} to find it")
    if end == "below":
        return (f"even the lowest level tried ({levels[0]:g} {unit}) missed, so the true capacity lies below the "
                f"sweep: add lower levels to {param} (or relax the SLO)")
    return ""


def kl_per_prompt(row: Any) -> list[float]:
    """The KL of each reference prompt (``kl_per_prompt``), or the row's mean alone where it kept none."""
    kept = row.get("kl_per_prompt") if hasattr(row, "get") else None
    return [float(k) for k in kept] if isinstance(kept, (list, tuple)) and len(kept) else [float(row["kl"])]


def show(found: Findings) -> None:
    """Print the sentences, one bullet each."""
    print("\n".join("- " + s for s in found.sentences))


def step_split(gap: Any) -> str:
    """One decode step in ``hardware.decode_gap``'s three pieces, the clause notebooks 01, 05 and 10 share: each share,
    the largest piece (or the pieces tied for it) and what one operator's cost is measured over."""
    kernel = (f"; {gap['kernel_share']:.0%} more because the matrix-vector kernel read the weights at "
              f"{gap['matmul_gbs']:.1f} GB/s, below the probe's" if gap.get("matmul_gbs") else "")
    tied = gap.get("tied") or [gap["bound"]]
    largest = (f"largest: {tied[0]}" if len(tied) == 1 else
               f"largest: {' and '.join(tied)}, a {verdict.TIE_LABEL}")
    per_op = (f"; one operator costs about {gap['overhead_us_per_op']:.1f} µs, measured as {gap['per_op_basis']}"
              if gap.get("overhead_us_per_op") and gap.get("per_op_basis") else "")
    return (f"{gap['bytes_share']:.0%} its bytes at the probe's bandwidth{kernel}; {gap['overhead_share']:.0%} "
            f"per-operator overhead ({largest}){per_op}")


UNPAIRED = "judged unpaired, recorded"  # how a reference's rounds from before paired verdicts say which rule read them


def recorded(ref: Any, section: str | None = None) -> str:
    """The day a reference (``results.Results``) was measured, as its provenance gives it: "2026-12-03"; with
    ``section``, that section's own provenance where the file keeps one (``notes["section_env"]``)."""
    env = (((ref.notes or {}).get("section_env") or {}).get(section) if section else None) or ref.env
    return str(env.get("date") or "on a date not recorded")[:10]


PAIRED_NOTE = "paired"  # results.notes["verdicts"] of a run whose verdicts were judged paired round by round


def unpaired_reference(ref: Any, section: str) -> str:
    """The line under a reference's verdicts (``section`` of ``ref``, a shipped reference run) recorded before this
    notebook judged its rounds paired (its notes lack ``"verdicts": "paired"``): judged unpaired, and when; empty for
    a reference recorded since, or none."""
    if ref is None or not ref.section(section) or (ref.notes or {}).get("verdicts") == PAIRED_NOTE:
        return ""
    return (f"The reference's verdicts above were {UNPAIRED} {recorded(ref, section)} (before rounds were paired); this "
            "run's verdicts are paired, round by round.")


def rounds_verdict(new: Any, base: Any, *, when: str | None = None, **limits: Any) -> verdict.Verdict:
    """Two sides timed in the same rounds (round i of each at index i), judged paired: ``verdict.compare(…,
    paired=True)``. ``when``: the day (``recorded``) of the reference the two sides come from, where they do: a
    reference measured before paired verdicts, with fewer than ``verdict.MIN_PAIRS`` rounds a side or sides of unequal
    length (its baseline's drift pass among its samples), is read by the unpaired rule instead, and its reason ends
    "judged unpaired, recorded DATE" (``UNPAIRED``)."""
    a, b = list(getattr(new, "samples", new)), list(getattr(base, "samples", base))
    if when and (len(a) != len(b) or len(a) < verdict.MIN_PAIRS):
        v = verdict.compare(a, b, **limits)
        return dataclasses.replace(v, reason=f"{v.reason}; {UNPAIRED} {when}")
    return verdict.compare(a, b, paired=True, **limits)

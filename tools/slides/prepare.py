"""A notebook made fit for a static deck (``prepare``): outputs, not set-up code; scaffolding and stderr dropped;
printed prose as text with what a slide cuts kept whole in the speaker notes, qualifiers never cut; widgets as a
note; then ``layout.paginate``.
"""
from __future__ import annotations

import copy
import html
import json
import math
import re

import nbformat

from labkit.core import config, verdict
from tools.slides.layout import _expand_output, _shows, paginate
from tools.slides.rules import (
    BLOCK_GAP_PX, BUDGET_PX, BULLET_MAX_CHARS, CODE_CHAR_PX, CODE_LINE_PX, CONTENT_W, CONT_PX, H2_PX, NOTE_PX,
    PRINTED_CLASS, PROSE_MAX_CHARS, TEXT_CHAR_PX, TEXT_LINE_PX, TEXT_MAX_LINES, WIDGET_NOTE, WIDGET_VIEW, _PROGRESS,
    _TABLE, _WIDGET_REPR, _is_plotly, _set_slide_type, _slide_type, _text, _wrapped_lines, is_mechanism, left_out,
)
from tools.slides.tables import _cut_note, trim_table


def _widget_output(out: nbformat.NotebookNode) -> None:
    """A live widget becomes a note; a progress bar keeps its text only when it shows a finished count
    (the text saved with a notebook is often the bar's first state, "0/5")."""
    data = out["data"]
    text = _text(data.get("text/plain", ""))
    if not text or _WIDGET_REPR.match(text):
        out["data"] = {"text/html": WIDGET_NOTE, "text/plain": "live widget"}
        return
    count = _PROGRESS.search(text)
    out["data"] = {} if count and count.group(1) != count.group(2) else {"text/plain": text}


def _merge_streams(outputs: list) -> list:
    """Consecutive stdout outputs as one (a loop's prints), stderr dropped (warnings and logs)."""
    merged: list = []
    for out in outputs:
        if out.get("output_type") == "stream":
            if out.get("name") == "stderr":
                continue
            if merged and merged[-1].get("output_type") == "stream":
                merged[-1]["text"] = _text(merged[-1]["text"]) + _text(out["text"])
                continue
            out["text"] = _text(out["text"])
        merged.append(out)
    return merged


def trim_text(text: str, max_lines: int = TEXT_MAX_LINES) -> str:
    """The first ``max_lines`` lines (long ones count as the lines they wrap to), then what was cut."""
    lines = text.rstrip("\n").split("\n")
    per_line = CONTENT_W / CODE_CHAR_PX
    kept, used = [], 0
    for line in lines:
        n = max(1, math.ceil(len(line) / per_line))
        if used + n > max_lines:
            break
        kept.append(line)
        used += n
    if len(kept) == len(lines):
        return text
    return "\n".join(kept) + f"\n… {len(lines) - len(kept)} more lines in the notebook\n"


# the learner's scaffolding: a deck shows what was measured, not which predictions and exercises are still open
SCAFFOLDING = re.compile(r"no prediction made|^Exercise \d\d\.\w+ · .*: not attempted"
                         r"|^using labkit's .*: exercise \d\d\.\w+ is not attempted")


# a cell's value that is only a number, e.g. the count references.show returns
_BARE_NUMBER = re.compile(r"\s*-?\d+(\.\d+)?\s*")


def drop_scaffolding(out: nbformat.NotebookNode) -> nbformat.NotebookNode | None:
    """The output without "no prediction made …" and "Exercise … not attempted" lines; None when nothing is left
    (an exercise-status table, a stream of only such lines)."""
    if out.get("output_type") == "stream":
        kept = [line for line in _text(out["text"]).splitlines(keepends=True) if not SCAFFOLDING.search(line)]
        if not "".join(kept).strip():
            return None
        out["text"] = "".join(kept)
        return out
    html_text = _text((out.get("data") or {}).get("text/html", ""))
    if html_text and not _is_plotly(html_text) and "not attempted" in html_text and _TABLE.search(html_text):
        return None  # an exercise-status table
    plain = _text((out.get("data") or {}).get("text/plain", ""))
    if plain and len(out.get("data") or {}) == 1 and SCAFFOLDING.search(plain):
        return None
    if out.get("output_type") == "execute_result" and set(out.get("data") or {}) == {"text/plain"} \
            and _BARE_NUMBER.fullmatch(plain):
        return None  # an unlabelled number (a helper's return value) under the lines that say what it counts
    return out


def _machine_names() -> list[str]:
    """Every machine or instance name a takeaway may carry: CPU vendors, families and instruction sets, the GPU
    catalog's names (data/gpus.json), the priced instances (data/prices.json)."""
    names = ["AMD", "EPYC", "Intel", "Xeon", "Arm", "Graviton", "Apple", "NVIDIA", "avx2", "avx512", "AVX-512",
             "AVX2", "AMX", "fma", "vnni", "cpu", "GPU"]
    for file, key in (("gpus.json", "gpus"), ("prices.json", "prices")):
        for row in json.loads((config.DATA_DIR / file).read_text(encoding="utf-8"))[key]:
            names += [row["name"], *row["name"].split()[1:], *row.get("aliases", ())]
    return sorted({n for n in names if len(n) > 1}, key=len, reverse=True)


# what qualifies a number (the deck never drops it): a verdict word (the kinds, and the words a real difference
# takes: faster, slower …), "not this run", "reference", "estimate",
# "published", a bound, or a machine or instance name. A shortened line keeps every one of them, or moves whole to
# the speaker notes.
QUALIFIER = re.compile("|".join(
    [r"(?<!\w)" + re.escape(w) + r"(?!\w)"
     for w in (*verdict.KINDS, "implausible", "rerun", "anomalous", "tie", "faster", "slower", "shorter", "longer",
               "sooner", "later", "lower", "higher", "not this run", "not in this run", "not measured here", "estimate",
               "published", "lower bound", "upper bound", "at most", "at least", "≤", "≥", "bound",
               *_machine_names())]
    + [r"(?<!\w)reference(?!\w)(?! prompts?)"]), re.IGNORECASE)  # a reference run, not the reference prompts


def qualifiers(text: str) -> set[str]:
    """The qualifiers ``text`` carries (``QUALIFIER``), lower-cased."""
    return {m.group(0).lower() for m in QUALIFIER.finditer(text)}


def shorten(text: str, limit: int) -> str | None:
    """``text`` within ``limit`` characters, keeping every qualifier it carries: asides in parentheses that carry
    none are dropped (longest first), then clauses after a ";" that carry none, then the text is cut at the last
    clause boundary (; , — :) past a third of the limit, else at a space, with "…". None when no such cut keeps
    every qualifier: the caller moves the whole line to the speaker notes."""
    kept = qualifiers(text)
    while len(text) > limit:
        asides = [a for a in re.findall(r"\s*\([^()]*\)", text) if not qualifiers(a)]
        if not asides:
            break
        text = text.replace(max(asides, key=len), "", 1)
    while len(text) > limit:
        clauses = text.split("; ")
        spare = [i for i, c in enumerate(clauses) if i and not qualifiers(c)]
        if not spare:
            break
        del clauses[spare[-1]]
        text = "; ".join(clauses)
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    cuts = [m.start() for m in re.finditer(r"[;,:]\s| — ", head) if m.start() >= limit // 3]
    end = cuts[-1] if cuts else head.rfind(" ") if head.rfind(" ") > limit // 3 else limit - 1
    cut = head[:end].rstrip(" ,;:—") + " …"
    return cut if qualifiers(cut) >= kept else None


def printed_prose(out: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[str]]:
    """Printed text with a line wider than the slide, as slide text instead of monospace: "- " lines a bullet list
    (each cut to BULLET_MAX_CHARS), other long lines paragraphs (cut to PROSE_MAX_CHARS), short lines kept as
    printed; items beyond what one slide holds are left out with a note. Returns the output and the lines that
    were cut or left out, whole, for the speaker notes. Other outputs come back as they are."""
    per_line = CONTENT_W / CODE_CHAR_PX
    lines = _text(out.get("text", "")).rstrip("\n").split("\n") if out.get("output_type") == "stream" else []
    if not any(len(line) > per_line for line in lines):
        return out, []
    blocks: list[tuple[str, list[str]]] = []  # ("ul" | "p" | "pre", texts)
    for line in lines:
        kind = "ul" if line.startswith("- ") else "p" if len(line) > per_line else "pre"
        if kind == "pre" and not line.strip():
            continue
        text = line[2:] if kind == "ul" else line.strip() if kind == "p" else line
        if blocks and blocks[-1][0] == kind and kind != "p":
            blocks[-1][1].append(text)
        else:
            blocks.append((kind, [text]))
    notes: list[str] = []
    parts: list[str] = []
    height, room, left = 0.0, BUDGET_PX - CONT_PX - H2_PX - NOTE_PX, 0
    for kind, texts in blocks:
        for text in texts:
            shown = text if kind == "pre" else shorten(text, BULLET_MAX_CHARS if kind == "ul" else PROSE_MAX_CHARS)
            if shown is None:  # no cut keeps what qualifies its numbers: the whole line goes to the notes
                left += 1
                notes.append(text)
                continue
            px = (CODE_LINE_PX * _wrapped_lines(shown, per_line) if kind == "pre"
                  else TEXT_LINE_PX * _wrapped_lines(shown, (CONTENT_W - (36 if kind == "ul" else 0)) / TEXT_CHAR_PX) + 10)
            if height + px > room:
                left += 1
                notes.append(text)
                continue
            height += px
            if shown != text:
                notes.append(text)
            item = html.escape(shown, quote=False)
            parts.append({"ul": f"<li>{item}</li>", "p": f"<p>{item}</p>", "pre": f"<pre>{item}</pre>"}[kind])
    body = re.sub(r"((?:<li>.*?</li>)+)", r"<ul>\1</ul>", "".join(parts))
    body = re.sub(r"</pre><pre>", "\n", body)
    if left:
        body += _cut_note(f"{left} more in the notebook")
        height += NOTE_PX
    new = nbformat.v4.new_output("display_data", data={"text/html": f"<div class='{PRINTED_CLASS}'>{body}</div>",
                                                        "text/plain": _text(out["text"])},
                                 metadata={"labkit": {"height_px": height}})
    return new, notes


def _trim_output(out: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Printed text and tables cut to what a slide holds, with a note of the cut."""
    if out.get("output_type") == "stream":
        out["text"] = trim_text(_text(out["text"]))
        return out
    data = out.get("data")
    if not data:
        return out
    if "text/html" in data and not _is_plotly(_text(data["text/html"])):
        text = _text(data["text/html"])
        trimmed = [(table, trim_table(table)) for table in _TABLE.findall(text)]
        if trimmed and all(t is not None for _, t in trimmed):
            height = 0.0
            for table, t in trimmed:
                text = text.replace(table, t.html + (_cut_note(t.cut) if t.cut else ""), 1)
                height += t.height_px + (NOTE_PX if t.cut else 0)
            data["text/html"] = text
            out.setdefault("metadata", {})["labkit"] = {"height_px": height + BLOCK_GAP_PX * (len(trimmed) - 1)}
    elif "text/plain" in data and len(data) == 1:
        data["text/plain"] = trim_text(_text(data["text/plain"]))
    return out


def prepare(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy fit for a static deck (see the deck rules above)."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    cells = []
    carry = None  # a slide start that fell on a cell left out
    for cell in nb.cells:
        if left_out(cell):
            if _slide_type(cell) in ("slide", "subslide"):
                carry = "slide" if "slide" in (carry, _slide_type(cell)) else "subslide"
            continue
        if cell.cell_type == "code":
            for out in cell.get("outputs", []):
                if out.get("data") and WIDGET_VIEW in out["data"]:
                    _widget_output(out)
            kept = [k for o in cell.get("outputs", []) if (k := drop_scaffolding(o)) is not None]
            whole: list[str] = []  # printed lines a slide shows cut: the speaker notes hold them
            prose = []
            for o in _merge_streams(kept):
                o, cut = printed_prose(o)
                prose.append(o)
                whole += cut
            cell.outputs = [_trim_output(piece) for o in prose
                            if o.get("output_type") not in ("display_data", "execute_result") or o.get("data")
                            for piece in _expand_output(o)]
            if not is_mechanism(cell):
                cell.setdefault("metadata", {}).setdefault("transient", {})["remove_source"] = True
        if not _shows(cell):
            if _slide_type(cell) in ("slide", "subslide"):
                carry = "slide" if "slide" in (carry, _slide_type(cell)) else "subslide"
            continue
        if carry and _slide_type(cell) not in ("notes",):
            if _slide_type(cell) != "slide":
                _set_slide_type(cell, carry)
            carry = None
        cells.append(cell)
        if cell.cell_type == "code" and whole:
            cells.append(nbformat.v4.new_markdown_cell("\n".join(f"- {line}" for line in whole),
                                                       metadata={"slideshow": {"slide_type": "notes"}}))
    nb.cells = paginate(cells)
    return nb

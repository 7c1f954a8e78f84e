"""Slides laid out by estimated height: each cell's height on the 1280 × 720 slide, code cut before top-level
statements, and ``paginate``, which splits a cell that does not fit between its outputs, source pieces or
paragraphs and moves the rest to a vertical slide titled "<heading> (continued)".
"""
from __future__ import annotations

import copy
import html
import math
import re
from typing import Any

import nbformat

from tools.slides.rules import (
    BLOCK_GAP_PX, BUDGET_PX, CHART_MAX_PX, CHART_MIN_PX, CODE_CHAR_PX, CODE_LINE_PX, CODE_MAX_SLIDES,
    CODE_SLIDE_LINES, CONTENT_W, CONT_CLASS, CONT_PX, H1_PX, H2_PX, H3_PX, TABLE_ROW_PX, TEXT_CHAR_PX, TEXT_LINE_PX,
    UNKNOWN_HTML_PX, _FENCE, _HEADING, _PRE, _TAG, _is_plotly, _set_slide_type, _slide_type, _text, _wrapped_lines,
    is_mechanism,
)
from tools.summary import ANSI


def markdown_px(source: str) -> float:
    """Headings, paragraphs and list items at their line heights; code fences as code; tables as rows."""
    px, in_fence, prev_blank = 0.0, False, True
    for line in source.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            px += 8
            continue
        if in_fence:
            px += CODE_LINE_PX * _wrapped_lines(line, CONTENT_W / CODE_CHAR_PX)
            continue
        if not line.strip():
            px += 0 if prev_blank else 10  # paragraph margin
            prev_blank = True
            continue
        prev_blank = False
        m = _HEADING.match(line)
        if m:
            px += {1: H1_PX, 2: H2_PX, 3: H3_PX}[len(m.group(1))] * _wrapped_lines(m.group(2), 40 * (len(m.group(1)) + 1))
        elif line.lstrip().startswith("|"):
            px += TABLE_ROW_PX if not set(line.strip()) <= set("|-: ") else 0
        else:
            indent = 36 if re.match(r"^\s*([-*+]|\d+\.)\s", line) else 0
            px += TEXT_LINE_PX * _wrapped_lines(_TAG.sub("", line), (CONTENT_W - indent) / TEXT_CHAR_PX)
    return px


def output_px(out: nbformat.NotebookNode) -> float:
    """The height one (already trimmed) output takes on a slide."""
    kind = out.get("output_type")
    if kind == "stream":
        return CODE_LINE_PX * _wrapped_lines(_text(out.get("text", "")).rstrip("\n"), CONTENT_W / CODE_CHAR_PX) + 8
    if kind == "error":
        return CODE_LINE_PX * _wrapped_lines(ANSI.sub("", "\n".join(out.get("traceback", []))), CONTENT_W / CODE_CHAR_PX) + 8
    data = out.get("data", {})
    if "text/html" in data:
        text = _text(data["text/html"])
        if _is_plotly(text):
            return CHART_MIN_PX
        meta = out.get("metadata", {}).get("labkit", {})
        if "height_px" in meta:
            return meta["height_px"]
        code = _listing(out)
        if code is not None:
            return source_px(code)
        markup = re.sub(r"<(script|style)\b.*?</\1>", "", text, flags=re.IGNORECASE | re.DOTALL).strip()
        visible = _TAG.sub("", markup).strip()
        if visible:
            return TEXT_LINE_PX * _wrapped_lines(html.unescape(visible), CONTENT_W / TEXT_CHAR_PX)
        if re.search(r"<(img|svg|canvas|iframe|video|object|embed)\b", markup, re.IGNORECASE):
            return CHART_MAX_PX
        return UNKNOWN_HTML_PX if markup else 0.0  # drawn by markup alone; only scripts and styles show nothing
    for image in ("image/png", "image/jpeg", "image/svg+xml"):
        if image in data:
            return CHART_MAX_PX
    if "text/markdown" in data:
        return markdown_px(_text(data["text/markdown"]))
    if "text/latex" in data:
        return 2 * TEXT_LINE_PX
    if "text/plain" in data:
        return CODE_LINE_PX * _wrapped_lines(_text(data["text/plain"]), CONTENT_W / CODE_CHAR_PX) + 8
    return 0.0


def _shows_source(cell: nbformat.NotebookNode) -> bool:
    return not cell.get("metadata", {}).get("transient", {}).get("remove_source")


def charts(cell: nbformat.NotebookNode) -> int:
    return sum(_is_plotly(_text(o.get("data", {}).get("text/html", ""))) for o in cell.get("outputs", []))


def source_px(source: str) -> float:
    return CODE_LINE_PX * _wrapped_lines(source, CONTENT_W / CODE_CHAR_PX) + 16


def cell_px(cell: nbformat.NotebookNode) -> float:
    if cell.cell_type == "markdown":
        return markdown_px(cell.source)
    parts = [output_px(o) for o in cell.get("outputs", [])]
    if not cell.get("metadata", {}).get("transient", {}).get("remove_source"):
        parts.append(source_px(cell.source))
    parts = [p for p in parts if p > 0]
    return sum(parts) + BLOCK_GAP_PX * max(0, len(parts) - 1)


def _listing(out: nbformat.NotebookNode) -> str | None:
    """The code of an output that is a code listing (IPython's ``Code``, pygments' HTML), else None."""
    data = out.get("data", {})
    text = _text(data.get("text/html", ""))
    if "<pre" not in text.lower() or "<table" in text.lower() or _is_plotly(text) or "labkit-printed" in text:
        return None
    if "text/plain" in data:
        return _text(data["text/plain"])
    return "\n".join(html.unescape(_TAG.sub("", m)) for m in _PRE.findall(text))


def code_chunks(code: str, max_lines: int = CODE_SLIDE_LINES) -> list[str]:
    """Code cut into pieces of at most ``max_lines`` screen lines (long lines wrap): before the last
    top-level statement that follows a blank line, else at a blank line in the piece's second half."""
    lines = code.rstrip("\n").split("\n")
    per_line = CONTENT_W / CODE_CHAR_PX
    chunks, start = [], 0
    while start < len(lines):
        used, end = 0, start
        while end < len(lines) and used + max(1, math.ceil(len(lines[end]) / per_line)) <= max_lines:
            used += max(1, math.ceil(len(lines[end]) / per_line))
            end += 1
        end = max(end, start + 1)
        if end < len(lines):  # cut before a top-level statement, else at a blank line, else where it is full
            tops = [i for i in range(start + 1, end + 1) if not lines[i - 1].strip() and lines[i][:1].strip()]
            blanks = [i + 1 for i in range(start + (end - start) // 2, end) if not lines[i].strip()]
            end = tops[-1] if tops else blanks[-1] if blanks else end
        chunks.append("\n".join(lines[start:end]).strip("\n"))
        start = end
    return [c for c in chunks if c.strip()]


def _highlighted(code: str) -> nbformat.NotebookNode:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return nbformat.v4.new_output("display_data", data={
        "text/html": highlight(code, PythonLexer(), HtmlFormatter(cssclass="highlight")), "text/plain": code})


def _expand_output(out: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """A long code listing becomes one output per slide-sized piece; an error keeps its last line."""
    if out.get("output_type") == "error":
        out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
        return [out]
    code = _listing(out) if out.get("data") else None
    if code is None or len(code_chunks(code)) == 1:
        return [out]
    return [_highlighted(chunk) for chunk in capped_chunks(code)]


def capped_chunks(code: str) -> list[str]:
    """``code_chunks`` over at most CODE_MAX_SLIDES slides; the last piece then ends with a comment saying how many
    lines more the notebook holds (taking that line from the piece when it is full)."""
    chunks = code_chunks(code)
    if len(chunks) <= CODE_MAX_SLIDES:
        return chunks
    kept = chunks[:CODE_MAX_SLIDES]
    last = kept[-1].split("\n")
    if len(last) >= CODE_SLIDE_LINES:
        last = last[:-1]
    kept[-1] = "\n".join(last)
    shown = sum(len(c.split("\n")) for c in kept)
    kept[-1] += f"\n# … {len(code.rstrip().split(chr(10))) - shown} more lines in the notebook"
    return kept


def _shows(cell: nbformat.NotebookNode) -> bool:
    if cell.cell_type == "markdown":
        return bool(cell.source.strip()) and _slide_type(cell) not in ("skip",)
    if cell.cell_type != "code" or _slide_type(cell) == "skip":
        return False
    return is_mechanism(cell) or cell_px(cell) > 0 or any(
        _is_plotly(_text(o.get("data", {}).get("text/html", ""))) for o in cell.get("outputs", []))


def _heading(cell: nbformat.NotebookNode) -> str | None:
    for line in cell.source.split("\n"):
        m = _HEADING.match(line)
        if m:
            return _TAG.sub("", m.group(2)).strip("*_ ")
    return None


def _continued(title: str | None) -> nbformat.NotebookNode:
    text = f"{title} (continued)" if title else "(continued)"
    cell = nbformat.v4.new_markdown_cell(f"<p class='{CONT_CLASS}'>{html.escape(text)}</p>")
    _set_slide_type(cell, "subslide")
    return cell


def _split_markdown(cell: nbformat.NotebookNode, first: float, rest: float) -> list[nbformat.NotebookNode | None]:
    """Markdown cut between paragraphs, list items or before a heading (never inside a code fence):
    the first piece fills ``first`` px (None when not even one paragraph fits), the others ``rest``."""
    blocks, current, in_fence = [], [], False
    for line in cell.source.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        item = re.match(r"^([-*+]|\d+\.)\s", line)
        if not in_fence and current and (_HEADING.match(line) or item or (not line.strip() and current[-1].strip())):
            blocks.append("\n".join(current))
            current = []
        current.append(line)
    if current:
        blocks.append("\n".join(current))
    groups: list[list[str]] = [[]]
    budget = first
    for block in blocks:
        if markdown_px("\n".join(groups[-1] + [block])) > budget and (groups[-1] or budget == first):
            groups.append([])
            budget = rest
        groups[-1].append(block)
    # no widow: a last piece of one short block takes the block before it along
    if len(groups) > 1 and len(groups[-2]) > 1 and markdown_px("\n".join(groups[-1])) < 3 * TEXT_LINE_PX \
            and markdown_px("\n".join(groups[-2][-1:] + groups[-1])) <= rest:
        groups[-1].insert(0, groups[-2].pop())
    pieces = ["\n".join(g) for g in groups]
    out: list[nbformat.NotebookNode | None] = []
    for i, piece in enumerate(pieces):
        if not piece.strip():
            if i == 0:
                out.append(None)
            continue
        c = copy.deepcopy(cell)
        c.source = piece.strip("\n")
        if i and "id" in c:
            c.id = f"{c.id}-{i}"
        out.append(c)
    return out


def _split_code(cell: nbformat.NotebookNode, first: float, rest: float,
                chart_above: bool = False) -> list[nbformat.NotebookNode | None]:
    """A code cell's source (mechanism) and outputs over several slides, one chart per slide: the
    first piece fills ``first`` px below what the slide holds (``chart_above``: a chart), None when
    nothing fits there; the others fill ``rest``. Source longer than a slide is cut at blank lines
    (``code_chunks``). A script-only output (plotly.js itself) travels with what follows it."""
    show_source = not cell.get("metadata", {}).get("transient", {}).get("remove_source")
    items: list[tuple[str, Any, float, bool]] = []
    if show_source:
        chunks = [cell.source] if source_px(cell.source) <= rest else capped_chunks(cell.source)
        items += [("source", chunk, source_px(chunk), False) for chunk in chunks]
    items += [("output", out, output_px(out), _is_plotly(_text(out.get("data", {}).get("text/html", ""))))
              for out in cell.get("outputs", [])]
    groups: list[list[tuple[str, Any]]] = [[]]
    cap, used, chart = first, 0.0, chart_above
    for kind, item, px, is_chart in items:
        if px == 0:
            groups[-1].append((kind, item))
            continue
        fits = used + (BLOCK_GAP_PX if used else 0) + px <= cap and not (is_chart and chart)
        fresh = cap == rest and not used  # an empty continuation slide: nothing better to do
        if not fits and not fresh:
            groups.append([])
            cap, used, chart = rest, 0.0, False
        groups[-1].append((kind, item))
        used += px + (BLOCK_GAP_PX if used else 0)
        chart = chart or is_chart
    parts: list[nbformat.NotebookNode | None] = []
    carried: list[tuple[str, Any]] = []
    for i, group in enumerate(groups):
        group = carried + group
        carried = []
        if not any(kind == "source" or output_px(item) > 0 for kind, item in group) and i < len(groups) - 1:
            carried = group
            if i == 0:
                parts.append(None)
            continue
        c = copy.deepcopy(cell)
        c.outputs = [item for kind, item in group if kind == "output"]
        sources = [item for kind, item in group if kind == "source"]
        if sources:
            c.source = "\n\n".join(sources)
        else:
            c.setdefault("metadata", {}).setdefault("transient", {})["remove_source"] = True
        if i and "id" in c:
            c.id = f"{c.id}-{i}"
        parts.append(c)
    return parts


def paginate(cells: list[nbformat.NotebookNode], budget: float = BUDGET_PX) -> list[nbformat.NotebookNode]:
    """Lay cells out slide by slide: a cell that does not fit below what a slide holds is split
    (outputs, paragraphs) so the part that fits stays there, and the rest continues on a new vertical
    slide titled "<heading> (continued)"; at most one chart per slide."""
    out: list[nbformat.NotebookNode] = []
    used, title, has_chart = 0.0, None, False
    room_rest = budget - CONT_PX
    for cell in cells:
        kind = _slide_type(cell)
        if kind == "notes":
            out.append(cell)
            continue
        if kind in ("slide", "subslide") or not out:
            used, has_chart = 0.0, False
            if cell.cell_type == "markdown":
                title = _heading(cell) or title
        room = budget - used - (BLOCK_GAP_PX if used else 0)
        px = cell_px(cell)
        if px <= room and not (has_chart and charts(cell)) and charts(cell) <= 1 and (
                cell.cell_type != "code" or _shows_source(cell) is False or source_px(cell.source) <= budget - CONT_PX):
            parts: list[nbformat.NotebookNode | None] = [cell]
        elif cell.cell_type == "markdown":
            parts = _split_markdown(cell, room, room_rest)
        else:
            parts = _split_code(cell, room, room_rest, chart_above=has_chart)
        for i, part in enumerate(parts):
            if part is None:
                continue
            if i:
                out.append(_continued(title))
                _set_slide_type(part, "-")
                used, has_chart = CONT_PX, False
            out.append(part)
            used += cell_px(part) + (BLOCK_GAP_PX if used else 0)
            has_chart = has_chart or charts(part) > 0
    return out


def expected_slides(nb: nbformat.NotebookNode) -> int:
    """Slides (horizontal + vertical) the deck shows: the first visible cell starts one, then every
    'slide' or 'subslide' cell (nbconvert's reveal preprocessor)."""
    kinds = [c.get("metadata", {}).get("slideshow", {}).get("slide_type", "-") for c in nb.cells]
    visible = [i for i, k in enumerate(kinds) if k not in ("notes", "skip")]
    if not visible:
        return 0
    return 1 + sum(k in ("slide", "subslide") for k in kinds[visible[0] + 1:])

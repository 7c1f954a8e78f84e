"""Build one reveal.js deck per executed notebook in build/slides/, working with no internet (``make slides``).

The decks are made from build/executed/*.ipynb (``make run``; a missing executed copy is
run first) with nbconvert's slides exporter and a template (tools/slides_template/) whose
assets are all local: reveal.js and MathJax 3 come from node_modules (``npm ci``, see
package.json) and are copied next to the decks; plotly.js is already embedded in the
executed notebooks by labkit.lessons.plots.setup_offline(). Before export, ``prepare`` turns the
notebook into what a presenter shows (the deck rules below: outputs, not set-up code; trimmed
text and tables; slides that fit 1280 × 720), and live widgets become a note (a deck has no
kernel to drive them). A deck that still references a remote script or stylesheet fails the build.

    python tools/slides.py                # every notebook
    python tools/slides.py --only 00 01   # a subset
"""
from __future__ import annotations

import argparse
import copy
import html
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_notebooks  # noqa: E402  (tools/ is not a package)
from labkit.core import config, verdict  # noqa: E402
from labkit.lessons.plots import readable  # noqa: E402  (one wording of a column's name for legends and tables)

ROOT = run_notebooks.ROOT
BUILD_DIR = run_notebooks.BUILD_DIR
NODE_MODULES = ROOT / "node_modules"
TEMPLATE_DIR = Path(__file__).resolve().parent / "slides_template"
REVEAL_DIR = "reveal.js"  # relative to the decks: --SlidesExporter.reveal_url_prefix
STATIC_DIR = "static"  # MathJax
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<div class='labkit-widget-note'>Live widget: run this cell in JupyterLab "
               "(<code>make lab</code>) to drive it.</div>")
SOLUTION_TAG = "solution"
# a widget's text/plain fallback that is only its constructor repr, e.g. "VBox(children=(...))"
_WIDGET_REPR = re.compile(r"^\s*[A-Za-z_]\w*\(")
# plotly's figure HTML asks for MathJax from a CDN; the deck loads its own local MathJax 3
_PLOTLY_MATHJAX_CDN = re.compile(r"<script[^>]*\bsrc=[\"']https?://[^\"']*mathjax[^\"']*[\"'][^>]*>\s*</script>",
                                 re.IGNORECASE)
# resources a browser would load (not plain <a href> links)
_REMOTE_LOAD = re.compile(
    r"<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)"
    r"|\bimport\s*(?:[\w{}\s,*]+from\s*)?[\"']((?:https?:)?//[^\"']+)[\"']"
    r"|@import\s+url\(\s*[\"']?((?:https?:)?//[^\"')]+)",
    re.IGNORECASE)


@dataclass
class Deck:
    name: str
    title: str
    path: str  # relative to the slides folder
    n_slides: int
    status: str  # the notebook's run status from build/summary.json, "unknown" without one
    wall_s: float | None


def ensure_node_modules(node_modules: Path = NODE_MODULES) -> None:
    """reveal.js and MathJax from the npm registry, installed once from package-lock.json."""
    needed = [node_modules / "reveal.js" / "dist" / "reveal.js", node_modules / "mathjax" / "es5" / "tex-svg-full.js"]
    if all(p.is_file() for p in needed):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("reveal.js is not installed and npm is missing: install Node.js (which brings npm), "
                           "then run `npm ci` in the repository root (or `make slides` again)")
    lock = (ROOT / "package-lock.json").is_file()
    cmd = [npm, "ci" if lock else "install", "--no-audit", "--no-fund"]
    print("installing reveal.js and MathJax:", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise RuntimeError(f"npm finished but these files are missing: {missing}")


def copy_assets(slides_dir: Path, node_modules: Path = NODE_MODULES) -> None:
    """reveal.js (dist + plugins) and one self-contained MathJax file next to the decks."""
    reveal = slides_dir / REVEAL_DIR
    for sub in ("dist", "plugin"):
        shutil.copytree(node_modules / "reveal.js" / sub, reveal / sub, dirs_exist_ok=True)
    (slides_dir / STATIC_DIR / "mathjax").mkdir(parents=True, exist_ok=True)
    shutil.copy2(node_modules / "mathjax" / "es5" / "tex-svg-full.js", slides_dir / STATIC_DIR / "mathjax")


# ------------------------------------------------------------------------------------------- deck rules
#
# What a deck shows (``prepare``):
# - markdown cells, as written; markdown marked ``notes`` becomes speaker notes (``s`` in the deck);
# - code cells show their outputs only: the chart, the table, the printed result; cells tagged
#   ``mechanism`` (nbbuild's ``# %% mechanism``) show their source too;
# - left out: cells tagged ``exercise``, ``check`` or ``solution``, stderr (warnings, logs), progress
#   bars saved before they finished, and code cells with nothing left to show (set-up, parameters);
#   a slide that began on a dropped cell begins on the next cell shown; an error shows its last line;
# - printed text keeps its first TEXT_MAX_LINES lines, a table its first TABLE_MAX_ROWS rows and the
#   columns that fit the slide's width (when not all fit, columns holding one value in every row are
#   folded into a note line first, then columns are cut from the right); a note under each says what
#   was cut, all of which is in the notebook; column names read as words ("decode tokens/s", "TTFT (s)"), long
#   numbers keep four significant digits and a plain 0, 1, 2 … row index is left out;
# - printed prose is not shown in monospace: an output with a line wider than the slide becomes text, its "- "
#   lines a bullet list (takeaways) with each bullet cut to BULLET_MAX_CHARS and other long lines to
#   PROSE_MAX_CHARS at a clause boundary; what was cut goes whole to the speaker notes;
# - a code cell's value that is a bare number (a count a helper returned) is left out: unlabelled, it says nothing;
# - a code listing shows at most CODE_MAX_SLIDES slides of code, then a line saying how much more the notebook holds;
# - slides are laid out by estimated height: a cell that does not fit below what its slide holds is
#   split between its outputs, source pieces or paragraphs, the part that fits stays and the rest
#   goes to a new vertical slide titled "<heading> (continued)"; one chart per slide; code (mechanism
#   source, a listing output) longer than CODE_SLIDE_LINES lines is cut before top-level statements;
# - a plotly chart fills the height the rest of its slide leaves, CHART_MIN_PX to CHART_MAX_PX, and
#   the slide's width (the template's labkitFit script).
# Sizes are logical pixels of the 1280 × 720 slide; reveal.js scales the slide to the screen, so
# what fits at 1280 × 720 fits at 1920 × 1080. The estimates below mirror the template's CSS
# (tools/slides_template/labkit_reveal/index.html.j2); `make test-browser` measures the real decks.

SLIDE_W, SLIDE_H = 1280, 720
PAD_X, PAD_Y = 40, 20  # section padding (CSS)
CONTENT_W = SLIDE_W - 2 * PAD_X
BUDGET_PX = SLIDE_H - 2 * PAD_Y - 36  # what the estimates may fill: a margin for their error
TEXT_LINE_PX, TEXT_CHAR_PX = 30, 11.0  # 22px markdown body (a wide estimate of the average glyph)
H1_PX, H2_PX, H3_PX = 60, 50, 40  # heading lines with their margins
CODE_LINE_PX, CODE_CHAR_PX = 22, 9.7  # 16px monospace, line-height 1.35
TABLE_ROW_PX, TABLE_CHAR_PX, TABLE_HEAD_CHAR_PX, TABLE_CELL_PAD_PX = 29, 7.9, 9.2, 14  # 15px text, bold headers
TABLE_CELL_CHARS = 48  # a longer cell wraps; its text is cut at TABLE_CELL_MAX_CHARS
TABLE_W = 1152  # the widest a table renders on a slide (measured in a deck: 96 % of the content width)
TABLE_CELL_MAX_CHARS = 120
TABLE_MAX_ROWS = 15
TABLE_MAX_COLS = 10
TEXT_MAX_LINES = 12
CODE_SLIDE_LINES = 24  # a longer code listing (mechanism source, a listing output) is split over slides
CODE_MAX_SLIDES = 2  # … over at most this many; the rest stays in the notebook
BULLET_MAX_CHARS = 160  # a printed "- " line (a takeaway) on a slide: about a line and a half of slide text
PROSE_MAX_CHARS = 240  # another printed line wider than the slide: about two lines of slide text
TABLE_DIGITS = 4  # significant digits of a long number in a table
TITLE_MAX_WORDS = 60  # a notebook's title slide: what it is and why it matters (the rest in a notes cell after it)
CHART_MIN_PX, CHART_MAX_PX = 300, 520
UNKNOWN_HTML_PX = 120  # HTML with no text (a drawing in divs): its height is not known here
BLOCK_GAP_PX = 12  # between cells and outputs
NOTE_PX = 26  # one "… cut" note line
CONT_PX = 34  # the "(continued)" line atop a continuation slide
CONT_CLASS = "labkit-continued"
CUT_CLASS = "labkit-cut"
PRINTED_CLASS = "labkit-printed tex2jax_ignore"  # printed prose as text (a "$" in it is not maths)
MECHANISM_TAG = "mechanism"
LEFT_OUT_TAGS = {SOLUTION_TAG, "exercise", "check"}
_TABLE = re.compile(r"<table\b.*?</table>", re.IGNORECASE | re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PRE = re.compile(r"<pre\b[^>]*>(.*?)</pre>", re.IGNORECASE | re.DOTALL)
_PROGRESS = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")  # tqdm's "| 3/5 ["
_TAG = re.compile(r"<[^>]+>")
_HEADING = re.compile(r"^(#{1,3})\s+(.*\S)\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _tags(cell: nbformat.NotebookNode) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _slide_type(cell: nbformat.NotebookNode) -> str:
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type", "-") or "-"


def _set_slide_type(cell: nbformat.NotebookNode, kind: str) -> None:
    cell.setdefault("metadata", {}).setdefault("slideshow", {})["slide_type"] = kind


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value or "")


def left_out(cell: nbformat.NotebookNode) -> bool:
    """Exercises, their checks and solutions stay in the notebook."""
    return bool(LEFT_OUT_TAGS & set(_tags(cell))) or "exercise" in cell.get("metadata", {}).get("labkit", {})


def is_mechanism(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and MECHANISM_TAG in _tags(cell)


def _is_plotly(html_text: str) -> bool:
    return "plotly-graph-div" in html_text


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


def _wrapped_lines(text: str, chars_per_line: float) -> int:
    return sum(max(1, math.ceil(len(line) / chars_per_line)) for line in text.split("\n"))


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


# ---- tables: pandas' HTML (also styled, with spans) read into a grid, trimmed, written back


class _TableReader(HTMLParser):
    """Rows of (tag, attrs, inner html) cells, section by section (thead/tbody), spans kept."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.rows: list[tuple[str, list[tuple[str, dict[str, str], str]]]] = []
        self.section = "tbody"
        self.cell: tuple[str, dict[str, str]] | None = None
        self.inner: list[str] = []
        self.depth = 0  # nested tables inside a cell are kept as text
        self.table_attrs: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if self.cell is not None:
            self.depth += tag == "table"
            self.inner.append(self.get_starttag_text() or "")
            return
        if tag == "table" and not self.table_attrs:
            self.table_attrs = {k: v or "" for k, v in attrs}
        elif tag in ("thead", "tbody", "tfoot"):
            self.section = tag
        elif tag == "tr":
            self.rows.append((self.section, []))
        elif tag in ("td", "th"):
            if not self.rows:
                self.rows.append((self.section, []))
            self.cell, self.inner = (tag, {k: v or "" for k, v in attrs}), []

    def handle_endtag(self, tag: str) -> None:
        if self.cell is not None:
            if tag in ("td", "th") and self.depth == 0:
                self.rows[-1][1].append((self.cell[0], self.cell[1], "".join(self.inner)))
                self.cell = None
                return
            self.depth -= tag == "table"
            self.inner.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.inner.append(data)

    def handle_entityref(self, name: str) -> None:
        self.handle_data(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.handle_data(f"&#{name};")


@dataclass
class _Grid:
    """A table as a full grid: every (row, column) holds the cell covering it; ``origin`` is True where
    the cell starts. ``head`` rows come from thead, ``index_cols`` are the row labels (th in tbody)."""
    cells: list[list[tuple[str, dict[str, str], str, bool]]]
    head: int
    index_cols: int
    attrs: dict[str, str]


def _span(attrs: dict[str, str], name: str) -> int:
    try:
        return max(1, int(attrs.get(name, "1")))
    except ValueError:
        return 1


def read_table(table_html: str) -> _Grid | None:
    reader = _TableReader()
    try:
        reader.feed(table_html)
        reader.close()
    except (AssertionError, ValueError):
        return None
    grid: list[list[Any]] = []
    pending: dict[tuple[int, int], tuple[str, dict[str, str], str, bool]] = {}
    head = 0
    for r, (section, cells) in enumerate(reader.rows):
        row: list[Any] = []
        c = 0
        for tag, attrs, inner in cells:
            while (r, c) in pending:
                row.append(pending.pop((r, c)))
                c += 1
            rs, cs = _span(attrs, "rowspan"), _span(attrs, "colspan")
            plain = {k: v for k, v in attrs.items() if k not in ("rowspan", "colspan")}
            for dc in range(cs):
                row.append((tag, plain, inner, dc == 0))
                for dr in range(1, rs):
                    pending[(r + dr, c + dc)] = (tag, plain, inner, False)
            c += cs
        while (r, c) in pending:
            row.append(pending.pop((r, c)))
            c += 1
        grid.append(row)
        head += section == "thead"
    if not grid or len(grid) <= head:
        return None
    width = max(len(row) for row in grid)
    for row in grid:
        row.extend([("td", {}, "", True)] * (width - len(row)))
    body = grid[head:]
    index_cols = 0
    while index_cols < width and all(row[index_cols][0] == "th" for row in body):
        index_cols += 1
    return _Grid(cells=grid, head=head, index_cols=index_cols, attrs=reader.table_attrs)


def _plain(inner: str) -> str:
    return html.unescape(_TAG.sub("", inner)).strip()


def short_number(text: str) -> str:
    """A decimal with more than TABLE_DIGITS significant digits, rounded to them (4.562898 → 4.563); a number
    of TABLE_DIGITS digits or more before the point loses its fraction. Anything else comes back as it is."""
    if not re.fullmatch(r"-?\d+\.\d+", text) or len(text.lstrip("-").replace(".", "").lstrip("0")) <= TABLE_DIGITS:
        return text
    value = float(text)
    return f"{value:.0f}" if abs(value) >= 10 ** (TABLE_DIGITS - 1) else f"{value:.{TABLE_DIGITS}g}"


def tidy_table(grid: _Grid) -> _Grid:
    """What a slide's reader needs of a table: column names in words (``readable``), long numbers rounded
    (``short_number``), and no row index that only counts 0, 1, 2 …"""
    body = range(grid.head, len(grid.cells))
    if grid.index_cols == 1 and not any(_plain(grid.cells[r][0][2]) for r in range(grid.head)) \
            and [_plain(grid.cells[r][0][2]) for r in body] == [str(i) for i in range(len(body))]:
        grid.cells = [row[1:] for row in grid.cells]
        grid.index_cols = 0
    for r, row in enumerate(grid.cells):
        for c, (tag, attrs, inner, origin) in enumerate(row):
            plain = _plain(inner)
            if inner.strip() != html.escape(plain, quote=False):
                continue  # markup inside: left as it is
            new = readable(plain) if r < grid.head else short_number(plain)
            if new != plain:
                row[c] = (tag, attrs, html.escape(new, quote=False), origin)
    return grid


def _col_chars(grid: _Grid, col: int, rows: list[int]) -> int:
    """Characters a column needs on one line: its longest body value, where a long one wraps at its
    spaces (to TABLE_CELL_CHARS), but never narrower than its longest word."""
    need = [1]
    for r in rows:
        text = _plain(grid.cells[r][col][2])[:TABLE_CELL_MAX_CHARS]
        need.append(max(min(len(text), TABLE_CELL_CHARS), max((len(w) for w in text.split()), default=0)))
    return max(need)


def _col_width(grid: _Grid, col: int, rows: list[int]) -> float:
    """Its body text or its header's longest word (headers wrap at spaces and underscores), in px."""
    words = [len(w) for r in range(grid.head) for w in re.split(r"[\s_]+", _plain(grid.cells[r][col][2])) if w]
    return max(_col_chars(grid, col, rows) * TABLE_CHAR_PX, max(words + [0]) * TABLE_HEAD_CHAR_PX) + TABLE_CELL_PAD_PX


def _row_lines(grid: _Grid, r: int, cols: list[int], allotted: dict[int, float]) -> int:
    """The lines a body row takes: each cell's text at its column's ``allotted`` width (``_allotted``)."""
    def lines(c: int) -> int:
        n = min(len(_plain(grid.cells[r][c][2])), TABLE_CELL_MAX_CHARS)
        return max(1, math.ceil(n * TABLE_CHAR_PX / max(allotted[c] - TABLE_CELL_PAD_PX, TABLE_CHAR_PX)))
    return max([lines(c) for c in cols] + [1])


def _allotted(grid: _Grid, cols: list[int], rows: list[int], width_px: float) -> dict[int, float]:
    """The width a browser's automatic table layout gives each column: its one-line width where all fit
    ``width_px``; else its narrowest (longest word) plus a share of the room left, in proportion to how much wider
    its one-line text is, so a long text column is squeezed and wraps while numbers keep their line."""
    def words(text: str) -> list[int]:  # a browser may break a line at a space or after a hyphen ("2025-01-|08")
        return [len(w) for w in re.split(r"\s+|(?<=-)", text) if w]

    def widest_word(c: int) -> float:
        body = max([n for r in rows for n in words(_plain(grid.cells[r][c][2]))] + [0]) * TABLE_CHAR_PX
        head = max([n for r in range(grid.head) for n in words(_plain(grid.cells[r][c][2]))] + [0])
        return max(body, head * TABLE_HEAD_CHAR_PX) + TABLE_CELL_PAD_PX

    def one_line(c: int) -> float:
        body = max([min(len(_plain(grid.cells[r][c][2])), TABLE_CELL_MAX_CHARS) for r in rows] + [0]) * TABLE_CHAR_PX
        head = max([len(_plain(grid.cells[r][c][2])) for r in range(grid.head)] + [0]) * TABLE_HEAD_CHAR_PX
        return max(body, head) + TABLE_CELL_PAD_PX

    low, high = {c: widest_word(c) for c in cols}, {c: max(one_line(c), widest_word(c)) for c in cols}
    if sum(high.values()) <= width_px:
        return high
    room, stretch = width_px - sum(low.values()), sum(high[c] - low[c] for c in cols)
    if room <= 0 or stretch <= 0:
        return low
    return {c: low[c] + room * (high[c] - low[c]) / stretch for c in cols}


def _header_lines(grid: _Grid, r: int, cols: list[int]) -> int:
    """A header cell wraps at its words to its column's width."""
    most = 1
    for c in cols:
        text = _plain(grid.cells[r][c][2])
        width = _col_width(grid, c, list(range(grid.head, len(grid.cells)))) - TABLE_CELL_PAD_PX
        most = max(most, math.ceil(len(text) * TABLE_HEAD_CHAR_PX / width) if text else 1)
    return most


def _cell_html(tag: str, attrs: dict[str, str], inner: str, origin: bool, header: bool = False) -> str:
    if not origin:  # a spanned cell's other positions: empty, as pandas shows a sparse index
        inner = ""
    text = _plain(inner)
    if len(text) > TABLE_CELL_MAX_CHARS:
        inner = html.escape(text[:TABLE_CELL_MAX_CHARS - 1] + "…")
    elif header and "<" not in inner:  # a column name wraps at its underscores, as the estimate assumes
        inner = inner.replace("_", "_<wbr>")
    attr = "".join(f' {k}="{html.escape(v, quote=True)}"' for k, v in attrs.items())
    return f"<{tag}{attr}>{inner}</{tag}>"


@dataclass
class TrimmedTable:
    html: str
    height_px: float
    cut: str  # what was left out, for the note ("" when nothing)


def trim_table(table_html: str, max_rows: int = TABLE_MAX_ROWS, width_px: float = TABLE_W,
               height_px: float | None = None) -> TrimmedTable | None:
    """The rows and columns of a table that fit: row labels always, then data columns in order while
    they fit ``width_px`` (at most TABLE_MAX_COLS; when the table is too wide, a column with one value
    in all of 3+ rows becomes a note first), then rows while they fit ``height_px`` (at most
    ``max_rows``). None: not a table we read."""
    grid = read_table(table_html)
    if grid is None:
        return None
    grid = tidy_table(grid)
    n_cols = len(grid.cells[0])
    body_rows = list(range(grid.head, len(grid.cells)))
    index = list(range(grid.index_cols))
    data = [c for c in range(grid.index_cols, n_cols)]
    constant = []
    if len(body_rows) >= 3 and len(data) > 2:
        for c in data:
            values = {_plain(grid.cells[r][c][2]) for r in body_rows}
            if len(values) == 1:
                constant.append(c)
    name = {c: " / ".join(t for t in (_plain(grid.cells[r][c][2]) for r in range(grid.head)) if t) or f"column {c}"
            for c in range(n_cols)}
    widths = {c: _col_width(grid, c, body_rows) for c in range(n_cols)}
    if sum(widths.values()) <= width_px and len(data) <= TABLE_MAX_COLS:
        constant = []  # everything fits: the full grid is the clearest picture
    kept, used = [], sum(widths[c] for c in index)
    dropped = []
    for c in data:
        if c in constant:
            continue
        if used + widths[c] <= width_px and len(kept) < TABLE_MAX_COLS:
            kept.append(c)
            used += widths[c]
        else:
            dropped.append(c)
    if not kept and data:  # even one column is too wide: show the first, its text wraps
        kept = [next(c for c in data if c not in constant)] if len(constant) < len(data) else []
        dropped = [c for c in dropped if c not in kept]
    cols = index + kept
    budget = height_px if height_px is not None else math.inf
    head_px = sum(_header_lines(grid, r, cols) * TABLE_ROW_PX for r in range(grid.head))
    rows, height = [], head_px
    allotted = _allotted(grid, cols, body_rows, width_px)
    for r in body_rows:
        px = _row_lines(grid, r, cols, allotted) * TABLE_ROW_PX
        if len(rows) >= max_rows or (rows and height + px > budget):
            break
        rows.append(r)
        height += px
    notes = []
    if constant:
        notes.append("in every row: " + ", ".join(f"{name[c]} = {_plain(grid.cells[body_rows[0]][c][2])}"
                                                  for c in constant))
    if dropped:
        notes.append(f"{len(dropped)} more column{'s' if len(dropped) > 1 else ''} "
                     f"({', '.join(name[c] for c in dropped)})")
    if len(rows) < len(body_rows):
        notes.append(f"{len(body_rows) - len(rows)} more rows")
    cut = ""
    if notes:
        cut = "; ".join(notes) + (" in the notebook" if dropped or len(rows) < len(body_rows) else "")
    out = ["<table" + "".join(f' {k}="{html.escape(v, quote=True)}"' for k, v in grid.attrs.items()) + ">"]
    if grid.head:
        out.append("<thead>" + "".join("<tr>" + "".join(_cell_html(*grid.cells[r][c], header=True) for c in cols) + "</tr>"
                                       for r in range(grid.head)) + "</thead>")
    out.append("<tbody>" + "".join("<tr>" + "".join(_cell_html(*grid.cells[r][c]) for c in cols) + "</tr>"
                                   for r in rows) + "</tbody></table>")
    return TrimmedTable(html="".join(out), height_px=height, cut=cut)


def _cut_note(text: str) -> str:
    return f"<p class='{CUT_CLASS}'>… {html.escape(text)}</p>"


# ---- height estimates (logical px of the 1280 × 720 slide)


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
        return CODE_LINE_PX * _wrapped_lines(_ANSI.sub("", "\n".join(out.get("traceback", []))), CONTENT_W / CODE_CHAR_PX) + 8
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


# ---- preparing cells


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


# the learner's scaffolding: a deck shows what was measured, not which predictions and exercises are still open
SCAFFOLDING = re.compile(r"no prediction made|^Exercise \d\d\.\w+ · .*: not attempted"
                         r"|^using labkit's .*: exercise \d\d\.\w+ is not attempted")
# a cell's value that is only a number, e.g. the count results.show_gpu_references returns
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


def expected_slides(nb: nbformat.NotebookNode) -> int:
    """Slides (horizontal + vertical) the deck shows: the first visible cell starts one, then every
    'slide' or 'subslide' cell (nbconvert's reveal preprocessor)."""
    kinds = [c.get("metadata", {}).get("slideshow", {}).get("slide_type", "-") for c in nb.cells]
    visible = [i for i, k in enumerate(kinds) if k not in ("notes", "skip")]
    if not visible:
        return 0
    return 1 + sum(k in ("slide", "subslide") for k in kinds[visible[0] + 1:])


def remote_references(text: str) -> list[str]:
    """URLs of scripts, stylesheets, images or modules the page would fetch from the network."""
    return sorted({next(g for g in m.groups() if g) for m in _REMOTE_LOAD.finditer(text)})


def make_offline(text: str) -> str:
    return _PLOTLY_MATHJAX_CDN.sub("", text)


def _exporter():
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    c = Config()
    c.SlidesExporter.reveal_url_prefix = REVEAL_DIR
    c.SlidesExporter.reveal_theme = "white"
    c.SlidesExporter.reveal_transition = "none"
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.reveal_width = str(SLIDE_W)
    c.SlidesExporter.reveal_height = str(SLIDE_H)
    c.SlidesExporter.extra_template_basedirs = [str(TEMPLATE_DIR)]
    c.SlidesExporter.template_name = "labkit_reveal"
    c.SlidesExporter.exclude_input_prompt = True
    c.SlidesExporter.exclude_output_prompt = True
    return SlidesExporter(config=c)


def _title(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def export_deck(executed: Path, slides_dir: Path) -> tuple[Path, int]:
    """Write <name>.slides.html; returns its path and the number of slides it holds."""
    nb = prepare(nbformat.read(executed, as_version=4))
    body, _ = _exporter().from_notebook_node(nb, resources={
        "labkit_static": STATIC_DIR, "labkit_chart_min_px": CHART_MIN_PX, "labkit_chart_max_px": CHART_MAX_PX,
        "metadata": {"name": _title(nb, executed.stem)}})
    body = make_offline(body)
    remote = remote_references(body)
    if remote:
        raise RuntimeError(f"{executed.name}: the deck would fetch {remote} from the network; "
                           "make these local in tools/slides.py")
    out = slides_dir / f"{executed.stem}.slides.html"
    out.write_text(body, encoding="utf-8")
    return out, expected_slides(nb)


def _index_html(decks: list[Deck], have_summary: bool) -> str:
    rows = []
    for d in decks:
        cls = "ok" if d.status == "ok" else "bad"
        wall = f"{d.wall_s:.1f} s" if d.wall_s is not None else "–"
        rows.append(f"<tr><td><a href='{html.escape(d.path)}'>{html.escape(d.title)}</a></td>"
                    f"<td>{d.n_slides}</td><td class='{cls}'>{html.escape(d.status)}</td><td>{wall}</td></tr>")
    summary = "<p><a href='../summary.html'>Run summary</a> (status, wall time and key results of every notebook)</p>" \
        if have_summary else ""
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>labkit slides</title><style>"
            "body{font-family:system-ui,sans-serif;margin:2em;max-width:900px}table{border-collapse:collapse}"
            "td,th{border:1px solid #d0d7de;padding:.3em .6em;text-align:left}.ok{color:#1a7f37}.bad{color:#cf222e}"
            "</style></head><body><h1>labkit slide decks</h1>"
            "<p>Open a deck; arrows or space to move, <kbd>s</kbd> for speaker notes, <kbd>f</kbd> for full screen. "
            "Everything here works offline.</p>" + summary +
            "<table><tr><th>deck</th><th>slides</th><th>notebook run</th><th>run time</th></tr>"
            + "".join(rows) + "</table></body></html>\n")


def build(only: list[str] | None = None, build_dir: Path = BUILD_DIR, timeout_s: int = 900) -> list[Deck]:
    notebooks = run_notebooks.discover(only)
    if not notebooks:
        raise ValueError(f"no notebooks in {run_notebooks.NOTEBOOKS_DIR}")
    executed_dir = build_dir / "executed"
    missing = [p for p in notebooks if not (executed_dir / p.name).is_file()]
    if missing:
        print(f"no executed copy of {[p.stem for p in missing]}: running them first", flush=True)
        run_notebooks.run_all(missing, build_dir, timeout_s)
    for p in notebooks:
        if p.stat().st_mtime > (executed_dir / p.name).stat().st_mtime:
            print(f"warning: build/executed/{p.name} is older than {p.relative_to(ROOT)}; `make run` refreshes it",
                  flush=True)
    ensure_node_modules()
    slides_dir = build_dir / "slides"
    slides_dir.mkdir(parents=True, exist_ok=True)
    copy_assets(slides_dir)
    summary_path = build_dir / "summary.json"
    runs: dict[str, Any] = {}
    if summary_path.is_file():
        runs = {r["name"]: r for r in json.loads(summary_path.read_text(encoding="utf-8"))["notebooks"]}
    decks = []
    for p in notebooks:
        out, n = export_deck(executed_dir / p.name, slides_dir)
        run = runs.get(p.stem, {})
        title = _title(nbformat.read(p, as_version=4), p.stem)
        decks.append(Deck(name=p.stem, title=title, path=out.name, n_slides=n,
                          status=run.get("status", "unknown"), wall_s=run.get("wall_s")))
        print(f"wrote {out.relative_to(build_dir.parent) if out.is_relative_to(build_dir.parent) else out} "
              f"({n} slides)", flush=True)
    # the index lists every deck present, also those built by an earlier, wider run
    listed = {d.name for d in decks}
    for extra in sorted(slides_dir.glob("*.slides.html")):
        name = extra.name.removesuffix(".slides.html")
        if name not in listed and (executed_dir / f"{name}.ipynb").is_file():
            nb = nbformat.read(executed_dir / f"{name}.ipynb", as_version=4)
            run = runs.get(name, {})
            decks.append(Deck(name=name, title=_title(nb, name), path=extra.name, n_slides=expected_slides(prepare(nb)),
                              status=run.get("status", "unknown"), wall_s=run.get("wall_s")))
    decks.sort(key=lambda d: d.name)
    (slides_dir / "index.html").write_text(_index_html(decks, summary_path.is_file()), encoding="utf-8")
    (slides_dir / "decks.json").write_text(json.dumps([asdict(d) for d in decks], indent=2) + "\n", encoding="utf-8")
    print(f"index: {(slides_dir / 'index.html')}", flush=True)
    return decks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="notebook names or number prefixes (default: all)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds one cell may run, for notebooks run first")
    ap.add_argument("--build-dir", type=Path, default=BUILD_DIR)
    args = ap.parse_args(argv)
    try:
        build(args.only, args.build_dir, args.timeout)
    except ValueError as exc:
        ap.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

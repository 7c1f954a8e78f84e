"""Tables on a slide: pandas' HTML (also styled, with spans) read into a grid, tidied (a plain row index left out,
long numbers shortened), its rows and columns cut to what fits the slide's width, written back with a note of what
was cut, and its height estimated at the widths a browser's automatic table layout allots its columns.
"""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any


from labkit.lessons.plots import readable  # one wording of a column's name for legends and tables
from tools.slides.rules import (
    CUT_CLASS, TABLE_CELL_CHARS, TABLE_CELL_MAX_CHARS, TABLE_CELL_PAD_PX, TABLE_CHAR_PX, TABLE_DIGITS,
    TABLE_HEAD_CHAR_PX, TABLE_MAX_COLS, TABLE_MAX_ROWS, TABLE_ROW_PX, TABLE_W, _TAG,
)


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

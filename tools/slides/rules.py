"""What a deck shows, in one place: the deck rules, the slide's geometry and the sizes the estimates use (they
mirror the template's CSS, tools/slides_template/labkit_reveal/index.html.j2), and how a cell's tags and slide type
are read.
"""
from __future__ import annotations

import math
import re
from typing import Any

import nbformat

# The deck rules
#
# What a deck shows (``prepare``):
# - markdown cells, as written; markdown marked ``notes`` becomes speaker notes (``s`` in the deck);
# - code cells show their outputs only: the chart, the table, the printed result; cells tagged
#   ``mechanism`` (``tags=["mechanism"]`` in the source) show their source too;
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

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<div class='labkit-widget-note'>Live widget: run this cell in JupyterLab "
               "(<code>make lab</code>) to drive it.</div>")


SOLUTION_TAG = "solution"
# a widget's text/plain fallback that is only its constructor repr, e.g. "VBox(children=(...))"
_WIDGET_REPR = re.compile(r"^\s*[A-Za-z_]\w*\(")

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


def _wrapped_lines(text: str, chars_per_line: float) -> int:
    return sum(max(1, math.ceil(len(line) / chars_per_line)) for line in text.split("\n"))

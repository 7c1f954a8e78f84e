"""A notebook's source as text: jupytext's percent format, read and written here, and a notebook's cells found by
their tag, never by their position.

A cell starts at a ``# %%`` line; ``[markdown]`` after it makes a markdown cell (each of its lines commented
``# ``); then its metadata as ``key=JSON`` pairs, as jupytext writes them::

    # %% [markdown] slideshow={"slide_type": "slide"}
    # # 05 · The KV cache
    # %% slideshow={"slide_type": "fragment"} tags=["mechanism"]
    def step(...): ...
    # %% labkit={"exercise": "05.step"} slideshow={"slide_type": "skip"} tags=["exercise"]

jupytext, VS Code and JupyterLab's jupytext extension open such a file as the notebook it is. The lab's own
metadata: ``slideshow.slide_type`` (slide, subslide, fragment, skip, notes or -), ``tags`` (``parameters`` for
papermill; ``exercise`` with ``labkit.exercise`` its id, and ``check``, both out of the slides; ``mechanism``,
code whose source the slides show) and nothing else: ``parse`` refuses what it does not know.

A solutions file (``notebooks/solutions/NN_name.py``) is a plain script of named snippets, one per
``# %% exercise NN.name`` line: ``named`` reads it.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable

import nbformat

SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")
TAGS = ("parameters", "exercise", "check", "mechanism", "setup", "progress")
KEYS = ("slideshow", "tags", "labkit")
HEADER = ("# ---\n# jupyter:\n#   jupytext:\n#     text_representation:\n#       extension: .py\n"
          "#       format_name: percent\n#   kernelspec:\n#     display_name: Python 3 (ipykernel)\n"
          "#     language: python\n#     name: python3\n# ---\n")
_PAIR = re.compile(r"\s*([A-Za-z_]\w*)=")
_NAMED = re.compile(r"^# %% exercise (\S+)\s*$", re.M)


def _metadata(rest: str, line: str) -> dict:
    """``key=JSON key=JSON …`` of a cell marker, each value decoded as JSON."""
    meta, decoder, i = {}, json.JSONDecoder(), 0
    while rest[i:].strip():
        m = _PAIR.match(rest, i)
        if not m:
            raise ValueError(f"{line!r}: after '# %%' and [markdown] come key=JSON pairs (slideshow=…, tags=…)")
        try:
            value, end = decoder.raw_decode(rest, m.end())
        except ValueError as exc:
            raise ValueError(f"{line!r}: the value of {m.group(1)} is not JSON ({exc})") from None
        meta[m.group(1)], i = value, end
    return meta


def _check(meta: dict, line: str) -> None:
    unknown = sorted(set(meta) - set(KEYS))
    if unknown:
        raise ValueError(f"{line!r}: unknown metadata {unknown}; a cell has {list(KEYS)}")
    slide = (meta.get("slideshow") or {}).get("slide_type", "-")
    if slide not in SLIDE_TYPES:
        raise ValueError(f"{line!r}: slide_type {slide!r}: choose one of {list(SLIDE_TYPES)}")
    tags = meta.get("tags", [])
    if not isinstance(tags, list) or set(tags) - set(TAGS):
        raise ValueError(f"{line!r}: tags {tags!r}: a list of {list(TAGS)}")
    exercise = (meta.get("labkit") or {}).get("exercise")
    if ("exercise" in tags) != bool(exercise):
        raise ValueError(f"{line!r}: an exercise cell has tags=[\"exercise\"] and labkit={{\"exercise\": \"NN.name\"}}, "
                         "both or neither")
    if "hide" in line or "solution" in tags:
        raise ValueError(f"{line!r}: solutions do not live in notebooks; put them in notebooks/solutions/")


def parse(text: str) -> list[nbformat.NotebookNode]:
    """The cells of a percent-format source (jupytext's header, if any, skipped), every one with a slide type."""
    cells: list[nbformat.NotebookNode] = []
    head: str | None = None
    lines: list[str] = []
    kind, meta = "code", {}

    def flush() -> None:
        if head is None:
            return
        body = "\n".join(lines).strip("\n")
        full = {"slideshow": {"slide_type": "-"}, **meta}
        if kind == "markdown":
            body = "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body.split("\n"))
            cells.append(nbformat.v4.new_markdown_cell(body, metadata=full))
        else:
            cells.append(nbformat.v4.new_code_cell(body, metadata=full))

    body_text = text.split("# ---\n", 2)[2] if text.startswith("# ---\n") else text
    for line in body_text.split("\n"):
        if line.startswith("# %%"):
            flush()
            rest = line[4:]
            kind = "markdown" if rest.lstrip().startswith("[markdown]") else "code"
            if kind == "markdown":
                rest = rest.lstrip()[len("[markdown]"):]
            meta = _metadata(rest, line)
            _check(meta, line)
            head, lines = line, []
        elif head is not None:
            lines.append(line)
        elif line.strip():
            raise ValueError(f"{line!r}: text before the first '# %%' cell marker")
    flush()
    return cells


def marker(cell: nbformat.NotebookNode) -> str:
    """The ``# %%`` line of ``cell``: its type, then its metadata in a fixed order."""
    meta = {k: cell.metadata[k] for k in sorted(cell.metadata) if k in KEYS}
    if meta.get("slideshow") == {"slide_type": "-"}:
        del meta["slideshow"]
    pairs = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in meta.items())
    return " ".join(x for x in ("# %%", "[markdown]" if cell.cell_type == "markdown" else "", pairs) if x)


def dumps(cells: Iterable[nbformat.NotebookNode]) -> str:
    """The percent-format text of ``cells`` (``parse(dumps(cells))`` gives them back), with jupytext's header."""
    parts = []
    for cell in cells:
        body = cell.source
        if cell.cell_type == "markdown":
            body = "\n".join(f"# {ln}" if ln else "#" for ln in body.split("\n"))
        parts.append(marker(cell) + "\n" + body)
    return HEADER + "\n" + "\n\n".join(parts) + "\n"


def named(text: str) -> list[tuple[str, str]]:
    """A solutions file's snippets, in order: (exercise id, its source); ``# %% exercise NN.name`` starts each (a
    file of recorded mistakes may hold several for one id)."""
    heads = list(_NAMED.finditer(text))
    if not heads and text.strip():
        raise ValueError("no '# %% exercise NN.name' line: a solutions file names each snippet")
    return [(m.group(1), text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)].strip("\n"))
            for i, m in enumerate(heads)]


def tagged(nb: nbformat.NotebookNode, tag: str) -> list[int]:
    """Indices of the cells carrying ``tag`` (``setup``, ``progress``, ``exercise`` …): how tools find a cell."""
    return [i for i, c in enumerate(nb.cells) if tag in c.metadata.get("tags", [])]


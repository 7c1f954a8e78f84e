"""A reference shown where a measurement cannot run here: its rows, under the line saying where, when and how
they were measured (``core.results.section_provenance``), or one line saying that none ships and how to make it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core import config, results


def show_reference(name: str, section: str, columns: Sequence[str], keep: Any = None) -> int:
    """For a measurement that could not run here: the rows of ``section`` in data/reference/<name>.json (those
    ``keep(row)`` accepts), under the line saying where, when and how they were measured, with vLLM's version where
    the reference recorded it; one line when no reference holds them. Returns how many rows were shown."""
    from IPython.display import display
    import pandas as pd

    path = results.reference_dir() / f"{name}.json"
    ref = results.reference(name) if path.is_file() else None
    rows = [r for r in (ref.section(section) if ref else []) if keep is None or keep(r)]
    if not rows:
        print(f"No reference of it ships yet (data/reference/{name}.json, section {section!r})"
              + ("." if config.platform() in config.HOSTED else
                 f": `make vllm`, then `make reference NOTEBOOKS={name.split('_')[0]}`."))
        return 0
    vllm_version = (ref.notes.get("vllm") or {}).get("platform", {}).get("version")
    print("Reference, measured elsewhere:", results.section_provenance(ref, section)
          + (f"; vLLM {vllm_version}" if vllm_version else ""))
    frame = pd.DataFrame(rows)
    display(frame[[c for c in columns if c in frame]].round(3))
    return len(rows)

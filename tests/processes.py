"""What the launcher tests ask of a process: is it gone (exited, or a zombie nobody has reaped yet)?"""
from __future__ import annotations

import os
import time
from pathlib import Path


def _gone_now(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def gone(pid: int, within_s: float = 2.0) -> bool:
    """True once ``pid`` has exited, waiting up to ``within_s`` (a SIGKILL is delivered, not instant)."""
    deadline = time.monotonic() + within_s
    while not _gone_now(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True

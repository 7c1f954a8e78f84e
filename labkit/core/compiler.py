"""Whether a C compiler can build a Python extension: what Triton (torch.compile's GPU backend, and inductor's CPU
path) compiles on first use, checked once before a notebook relies on it.
"""
from __future__ import annotations

import subprocess
import sysconfig
import tempfile
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=8)
def c_compiler_reason(cc: str) -> str:
    """'' when ``cc`` builds a shared object that includes Python.h (what Triton compiles on first use);
    otherwise its error. Cached: one real compile per compiler and process."""
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(prefix="labkit-cc-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("#include <Python.h>\nint labkit_probe(void) { return 0; }\n", encoding="utf-8")
        cmd = [cc, str(src), "-O1", "-shared", "-fPIC", "-o", str(Path(tmp) / "probe.so"), f"-I{include}"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{cc} did not run: {exc}"
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["no message"])[0]
        return f"{cc} cannot build a Python extension: {first[:160]}"
    return ""

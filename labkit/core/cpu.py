"""The CPU itself: its /proc/cpuinfo lines, its model name and the instruction sets its speeds depend on, and the
one line a result names its CPU with (a model name alone covers parts of different families).
"""
from __future__ import annotations

import platform
from functools import lru_cache
from typing import Any


def cpuinfo(*keys: str) -> str | None:
    """The value of the first line of /proc/cpuinfo whose name starts with one of ``keys``; ``None`` where
    there is no such file (macOS, Windows) or no such line."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# the instruction sets speeds differ by: x86 vectors and matrix units, Arm's fp16/bf16/int8 extensions
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "avx_vnni", "amx_bf16", "amx_int8",
             "asimd", "asimdhp", "asimddp", "bf16", "i8mm", "sve")


def cpu_isa(flags: str | None = None) -> list[str]:
    """The instruction sets of ``ISA_FLAGS`` this CPU has, from /proc/cpuinfo's flags (x86) or Features (Arm), or
    from ``flags``; [] where neither is readable (macOS: ``hardware.cpu_features`` reads sysctl instead)."""
    have = set(((cpuinfo("flags", "Features") if flags is None else flags) or "").split())
    return [f for f in ISA_FLAGS if f in have]


def cpu_line(hw: dict[str, Any]) -> str:
    """A recorded ``hardware`` entry's CPU with its instruction sets: "AMD EPYC 7B13 (avx2 fma)"; older records
    without them say so, since one model name can cover CPUs of different families."""
    isa = hw.get("cpu_isa")
    return f"{hw.get('cpu') or 'unknown CPU'} ({' '.join(isa) if isa else 'ISA not recorded'})"


def machine_line(hw: dict[str, Any]) -> str:
    """Where a recorded ``hardware`` entry ran: its GPU, else ``cpu_line``."""
    return hw.get("gpu") or cpu_line(hw)


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    return cpuinfo("model name") or platform.processor() or platform.machine()

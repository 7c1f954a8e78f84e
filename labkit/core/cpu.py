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


# Apple silicon reports the same features through sysctl, not /proc/cpuinfo (Linux name → sysctl key)
APPLE_SYSCTL = {"asimd": "hw.optional.AdvSIMD", "asimdhp": "hw.optional.arm.FEAT_FP16",
                "bf16": "hw.optional.arm.FEAT_BF16", "asimddp": "hw.optional.arm.FEAT_DotProd",
                "i8mm": "hw.optional.arm.FEAT_I8MM"}


def apple_flags(system: str | None = None, machine: str | None = None, sysctl: Any = None) -> set[str]:
    """Apple silicon's features under their Linux names, from ``sysctl -n`` (``sysctl``: key → its output, for
    tests); empty off macOS on Arm. ``fphp`` comes with ``asimdhp``, as Linux reports them."""
    if (system or platform.system()) != "Darwin" or not (machine or platform.machine()).lower().startswith("arm"):
        return set()
    if sysctl is None:
        import subprocess

        def sysctl(key: str) -> str:
            try:
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5, check=False)
            except (OSError, subprocess.TimeoutExpired):
                return ""
            return out.stdout
    found = {flag for flag, key in APPLE_SYSCTL.items() if sysctl(key).strip() == "1"}
    return found | ({"fphp"} if "asimdhp" in found else set())


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 'flags', Arm 'Features'); on macOS, Apple silicon's
    features from sysctl under their Linux names. Empty where neither says anything."""
    line = cpuinfo("flags", "Features")
    return set(line.split()) if line is not None else apple_flags()


def cpu_isa(flags: str | None = None) -> list[str]:
    """The instruction sets of ``ISA_FLAGS`` this CPU has: from ``flags``, else ``cpu_flags()``; [] where none is
    readable."""
    have = cpu_flags() if flags is None else set(flags.split())
    return [f for f in ISA_FLAGS if f in have]


def cpu_line(hw: dict[str, Any]) -> str:
    """A recorded ``hardware`` entry's CPU with its instruction sets: "AMD EPYC 7B13 (avx2 fma)"; older records
    without them say so, since one model name can cover CPUs of different families."""
    isa = hw.get("cpu_isa")
    return f"{hw.get('cpu') or 'unknown CPU'} ({' '.join(isa) if isa else 'ISA not recorded'})"


def isa_class(hw: dict[str, Any]) -> str:
    """The class a recorded ``hardware`` entry's speeds belong with, for grouping a room's or the answer key's
    results: "GPU" where one ran, else "AVX-512" / "AVX2" (x86), "Apple silicon" / "Arm", or "ISA not recorded"."""
    if hw.get("gpu"):
        return "GPU"
    isa = set(hw.get("cpu_isa") or ())
    if "avx512f" in isa:
        return "AVX-512"
    if "avx2" in isa:
        return "AVX2"
    if isa & {"asimd", "asimdhp", "asimddp", "bf16", "i8mm", "sve"}:
        return "Apple silicon" if "apple" in str(hw.get("cpu") or "").lower() else "Arm"
    return "ISA not recorded"


def machine_line(hw: dict[str, Any]) -> str:
    """Where a recorded ``hardware`` entry ran: its GPU, else ``cpu_line``."""
    return hw.get("gpu") or cpu_line(hw)


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    return cpuinfo("model name") or platform.processor() or platform.machine()


LLC_FALLBACK_BYTES = 64 * 2**20  # assumed where no cache size is readable: above most laptop and server L3s per die
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def _size_bytes(text: str) -> int | None:
    """'32768K' → 33554432 (sysfs sizes are binary; a bare number is bytes); None where it is not a size."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _UNITS and not text[-1:].isdigit() else ""
    number = text[: len(text) - len(unit)]
    return int(number) * _UNITS[unit] if number.isdigit() else None


def llc(sysfs: str = "/sys/devices/system/cpu/cpu0/cache", lscpu: str | None = None) -> tuple[int, str]:
    """(bytes, where it was read) of the last-level cache seen by CPU 0: the highest-level data or unified cache in
    ``sysfs``, else ``lscpu -B``'s largest cache line (``lscpu``: its output, for tests), else ``LLC_FALLBACK_BYTES``
    with a source that says it was assumed."""
    from pathlib import Path

    levels = []
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction" and level.isdigit() and _size_bytes(size):
            levels.append((int(level), _size_bytes(size)))
    if levels:
        level, size = max(levels)
        return size, f"L{level} cache of CPU 0, from {sysfs}"
    if lscpu is None:
        import subprocess

        try:
            lscpu = subprocess.run(["lscpu", "-B"], capture_output=True, text=True, timeout=5, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            lscpu = ""
    found = [(line.split()[0], _size_bytes(line.split(":", 1)[1].split()[0])) for line in lscpu.splitlines()
             if line.startswith("L") and " cache:" in line and line.split(":", 1)[1].split()]
    found = [(name, size) for name, size in found if size and not name.endswith("i")]
    if found:
        name, size = max(found)
        return size, f"{name} cache, from lscpu (the size of all its instances together)"
    return LLC_FALLBACK_BYTES, f"no cache size readable here: {LLC_FALLBACK_BYTES // 2**20} MiB assumed"

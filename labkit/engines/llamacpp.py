"""llama.cpp, the CPU engine many users run, through ``llama-cpp-python``, on the default model's own GGUF.

An optional extra (``pip install 'labkit[llamacpp]'``): it compiles llama.cpp on install. Its default build
targets the build machine's CPU; on some AVX-512 CPUs that build crashes, and a portable AVX2 build works:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" \\
        pip install 'labkit[llamacpp]'

``capability()`` asks the real question in a child process (import, load the GGUF, evaluate two tokens),
so a build that crashes on this CPU becomes a reason, not a dead kernel. ``requantize`` writes other
formats of the GGUF (Q8_0, Q4_0, F16…) with llama.cpp's own quantiser, also in a child process, into the
cache folder. ``timed_greedy`` decodes greedily and stamps every token; ``logits_fn`` gives teacher-forced
logits for ``labkit.decoding.quality.compare``; ``perf`` reads llama.cpp's own timers.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..core import config
from ..core.env import Capability
from ..core.timing import now
from ..model import models

NAME = "llama.cpp"
INSTALL = ("pip install 'labkit[llamacpp]' (compiles llama.cpp; on AVX-512 CPUs where the native build crashes, "
           "set CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF\")")
# llama_ftype values (llama.h) of the formats ``requantize`` writes
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q6_K": 18}
_PROBE = """
import sys
import llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"Hello there", add_bos=False)[:2])
print("ok", llama_cpp.__version__)
"""


def threads() -> int:
    """The threads llama.cpp gets: as many as PyTorch uses (llama-cpp-python's default is half the cores)."""
    import torch

    return max(1, torch.get_num_threads())


def capability(gguf: str | Path | None = None, timeout_s: float = 120.0) -> Capability:
    """Can llama.cpp run the GGUF here? Imports llama-cpp-python, loads ``gguf`` (default: the default
    model's) and evaluates two tokens, in a child process: a crash (an illegal instruction) is reported.
    The answer is ``labkit.core.env``'s ``Capability`` (``detail``: the llama-cpp-python version)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return Capability(NAME, False, "", f"llama-cpp-python is not installed: {INSTALL}")
    path = str(gguf or models.default_gguf())
    version = importlib.metadata.version("llama-cpp-python")
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, path], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Capability(NAME, False, version, f"llama-cpp-python {version}: loading {Path(path).name} took over {timeout_s:g} s")
    if proc.returncode == 0 and proc.stdout.strip().startswith("ok"):
        return Capability(NAME, True, version, "")
    if proc.returncode < 0:
        import signal

        name = signal.Signals(-proc.returncode).name
        return Capability(NAME, False, version, f"llama-cpp-python {version} crashed on this CPU ({name}); "
                                                f"rebuild it portably: {INSTALL}")
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return Capability(NAME, False, version, f"llama-cpp-python {version} failed: {tail[0][:200]}")


def gguf_dir() -> Path:
    path = config.cache_dir() / "gguf"
    path.mkdir(parents=True, exist_ok=True)
    return path


_QUANTIZE = """
import ctypes, sys
import llama_cpp
src, dst, ftype, nthread = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = ftype
params.nthread = nthread
params.allow_requantize = True  # the source is already quantised (Q4_1): dequantise, then quantise again
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
sys.exit(rc)
"""


def requantize(ftype: str, src: str | Path | None = None, force: bool = False, timeout_s: float = 600.0) -> tuple[Path, float | None]:
    """The GGUF in format ``ftype`` (see FTYPES), written by llama.cpp's ``llama_model_quantize`` from ``src``
    (default: the default model's Q4_1 GGUF) into the cache folder once. Returns (path, seconds or None when
    cached). The source's Q4_1 weights are the reference model's weights exactly (the fp32 model was
    dequantised from them), so F16/Q8_0 keep them nearly exactly and Q4_0 rounds them again."""
    if ftype not in FTYPES:
        raise ValueError(f"unknown GGUF format {ftype!r}; choose one of {sorted(FTYPES)}")
    src = Path(src or models.default_gguf())
    ver = importlib.metadata.version("llama-cpp-python") if importlib.util.find_spec("llama_cpp") else "none"
    target = gguf_dir() / f"{src.stem}.{ftype}.llamacpp{ver}.gguf"
    if target.is_file() and not force:
        return target, None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    t0 = now()
    proc = subprocess.run([sys.executable, "-c", _QUANTIZE, str(src), str(tmp), str(FTYPES[ftype]), str(threads())],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"llama_model_quantize to {ftype} failed (exit {proc.returncode}): {tail}")
    os.replace(tmp, target)  # written beside the target, then renamed: never a half file
    return target, now() - t0


def load(path: str | Path, n_ctx: int = 2048, logits_all: bool = False) -> Any:
    """A ``llama_cpp.Llama`` on ``path`` with ``threads()`` threads (quiet)."""
    import llama_cpp

    n = threads()
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=n, n_threads_batch=n, logits_all=logits_all,
                           verbose=False)


def timed_greedy(llm: Any, prompt_ids: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy decode of exactly ``new_tokens`` tokens (end-of-sequence does not stop it) from a fresh state
    (no KV reuse between calls): tokens, TTFT, decode tokens/s from the per-token stamps."""
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens!r}: need at least 2 to time decode")
    llm.reset()  # llama-cpp-python would otherwise reuse the KV of a matching earlier prompt
    tokens, stamps = [], []
    t0 = now()
    for tok in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        stamps.append(now())
        tokens.append(int(tok))
        if len(tokens) == new_tokens:
            break
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return {"tokens": tokens, "ttft_s": stamps[0] - t0, "tpot_s": tpot, "decode_tokens_per_s": 1 / tpot,
            "e2e_s": stamps[-1] - t0}


def perf(llm: Any) -> dict[str, float]:
    """llama.cpp's own timers since the last reset: prompt eval and eval (decode) ms and token counts."""
    import llama_cpp

    d = llama_cpp.llama_perf_context(llm.ctx)
    return {"prompt_eval_ms": d.t_p_eval_ms, "prompt_tokens": d.n_p_eval, "eval_ms": d.t_eval_ms,
            "eval_tokens": d.n_eval, "eval_ms_per_token": d.t_eval_ms / d.n_eval if d.n_eval else None}


def reset_perf(llm: Any) -> None:
    import llama_cpp

    llama_cpp.llama_perf_context_reset(llm.ctx)


def logits_fn(llm: Any):
    """``input_ids (1, T) -> (1, T, V)`` fp32 logits from a ``Llama`` loaded with ``logits_all=True``:
    teacher forcing for ``labkit.decoding.quality.compare``."""
    import numpy as np
    import torch

    if not getattr(llm, "_logits_all", False):
        raise ValueError("load the GGUF with logits_all=True: llama.cpp keeps only the last position's logits otherwise")

    def run(input_ids: Any) -> Any:
        ids = [int(i) for i in input_ids[0].tolist()]
        llm.reset()
        llm.eval(ids)
        return torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))[None]

    return run

"""transformers' cache and compile knobs, shared by the KV-cache measurements and the engines:
``cache_variant_kwargs`` (the ``generate`` arguments of each cache variant), ``compile_config`` and
``fresh_compile_cache`` (an empty inductor cache, so a compile is measured cold), and ``compile_story``: the one
torch.compile reference (``REFERENCE_COMPILE``) notebooks 04, 05 and 08 tell in quick mode, in one unit.
"""
from __future__ import annotations

import shutil  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass
from typing import Any

from ..core import config, env, results, verdict
from ..core.checks import model_device

CACHE_VARIANTS = ("dynamic", "static", "static+compile")
REFERENCE_COMPILE = "05_kv_cache_compile"


def compile_config() -> Any:
    """A CompileConfig that lets ``generate`` compile the decode step on any device (CPU included).

    ``reduce-overhead`` (the default) means CUDA graphs; on CPU plain ``default`` mode is the useful one.
    """
    import torch
    from transformers import CompileConfig

    cfg = CompileConfig(mode="reduce-overhead" if torch.cuda.is_available() else "default")
    cfg._compile_all_devices = True  # transformers only auto-compiles on CUDA unless told otherwise
    return cfg


def cache_variant_kwargs(variant: str) -> dict[str, Any]:
    """``generate`` keyword arguments for one of CACHE_VARIANTS."""
    if variant == "dynamic":
        return {}
    if variant == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    if variant == "static+compile":
        return {"cache_implementation": "static", "compile_config": compile_config()}
    raise ValueError(f"unknown cache variant {variant!r}; choose one of {CACHE_VARIANTS}")


# ---------------------------------------------------------------- first-call costs in this process

@contextmanager
def fresh_compile_cache() -> Iterator[str]:
    """Point inductor at an empty cache directory for the block, so a compile inside it is truly cold.

    Inductor keeps generated code and built libraries on disk (``/tmp/torchinductor_<user>``): after
    one run, the same compile in another process mostly loads them and looks far cheaper. Code
    compiled inside the block stays usable after it.
    """
    # torch >= 2.6: switches the directory and clears inductor's in-memory caches on entry and exit
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    path = tempfile.mkdtemp(prefix="labkit-inductor-")
    try:
        with temporary_cache_dir(path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- the one compile reference, in one unit

@dataclass(frozen=True)
class CompileStory:
    """torch.compile of the decode step against eager, both with a static cache, from one result file: decode
    speed in tokens/s, the first call (compilation included) in seconds, the pay-back in tokens."""

    where: str  # results.HERE, or results.where_of(the reference): "reference: <machine>, <date>"
    provenance: str
    new_tokens: int
    eager_tokens_per_s: float  # static cache, eager
    compiled_tokens_per_s: float  # static cache, compiled
    eager_first_s: float  # first call of a new_tokens request
    compiled_first_s: float  # the same, compilation included
    agreement: float | None = None
    eager_samples: tuple[float, ...] = ()  # each timed round's decode tokens/s, where the file keeps them
    compiled_samples: tuple[float, ...] = ()
    recorded: str = ""  # the date the file was measured (YYYY-MM-DD), for a verdict read by the rule of its day

    @property
    def gain(self) -> float:
        return self.compiled_tokens_per_s / self.eager_tokens_per_s

    @property
    def paired(self) -> bool:
        """Whether the file's runs pair up: one figure per round on each side, at least ``verdict.MIN_PAIRS`` rounds.
        A file measured before paired rounds (fewer rounds, or the baseline's extra pass kept among its samples) is
        judged by the unpaired rule it was recorded under."""
        return len(self.compiled_samples) == len(self.eager_samples) >= verdict.MIN_PAIRS

    @property
    def judged(self) -> str:
        """How ``steady`` was judged, in words: "judged paired", or "judged unpaired, recorded DATE"."""
        return "judged paired" if self.paired else f"judged unpaired, recorded {self.recorded or 'on an unrecorded date'}"

    @property
    def steady(self) -> verdict.Verdict:
        """The compiled decode's speed against eager's, judged on the timed rounds: paired round by round where they
        pair up (``paired``), else by the unpaired rule (one median each where the file kept no samples: a tie or no
        verdict)."""
        if self.paired:
            return verdict.compare(list(self.compiled_samples), list(self.eager_samples), paired=True)
        return verdict.compare(list(self.compiled_samples) or [self.compiled_tokens_per_s],
                               list(self.eager_samples) or [self.eager_tokens_per_s])

    @property
    def extra_first_s(self) -> float:
        """What compiling added to the first call."""
        return max(0.0, self.compiled_first_s - self.eager_first_s)

    @property
    def break_even_tokens(self) -> float | None:
        """Tokens after which the compiled decode has paid back its first call; None when it is not faster."""
        saved = 1 / self.eager_tokens_per_s - 1 / self.compiled_tokens_per_s
        return self.extra_first_s / saved if saved > 0 else None


def static_cache_reason(model: Any, tokenizer: Any) -> str:
    """'' when transformers' static cache holds this model's cache; otherwise why not. Asked for real: one token
    generated with ``cache_implementation="static"`` on a short prompt (latent attention, whose values are narrower
    than its keys, does not fit a StaticCache in transformers 4.57)."""
    import torch


    ids = tokenizer("Hello there", return_tensors="pt").to(model_device(model))
    try:
        with torch.inference_mode():
            model.generate(**ids, max_new_tokens=1, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                           **cache_variant_kwargs("static"))
    except (RuntimeError, ValueError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"transformers' StaticCache cannot hold this model's cache ({type(exc).__name__}: {first[:160]})"
    return ""


def compile_here(device: str | None = None) -> tuple[bool, str]:
    """Does a notebook compile the whole decode step in this run on ``device`` (default: ``env.device()``), and
    if not, why: in full mode yes; in quick mode on a GPU yes too (a cold compile takes about a minute there, and
    no CPU reference may stand in for a GPU's numbers); in quick mode on a CPU no (minutes on 2 cores: the CPU
    reference is shown instead). Never where torch.compile cannot run."""
    cap = env.capability("torch.compile")
    if not cap.available:
        return False, f"torch.compile cannot run here: {cap.reason}"
    device = device or env.device()
    if config.quick() and not str(device).startswith("cuda"):
        return False, "quick mode on a CPU: a cold compile of the whole decode step takes minutes here"
    return True, ""


def compile_reference(device: str | None = None) -> Any:
    """The compile reference measured on this kind of machine, or None where none ships: on a CPU
    ``data/reference/05_kv_cache_compile.json``; on a GPU only that GPU's own file (``….<gpu>.json``, as
    ``kv.write_compile_reference`` names it), so a CPU's figures are never shown beside this GPU's."""
    device = device or env.device()
    if not str(device).startswith("cuda"):
        return results.reference(REFERENCE_COMPILE)
    name = results.reference_name(REFERENCE_COMPILE, {"device": str(device), "hardware": env.hardware()})
    path = results.reference_dir() / f"{name}.json"
    return results.load(path) if name != REFERENCE_COMPILE and path.is_file() else None


def compile_story(ref: Any = None, device: str | None = None) -> CompileStory | None:
    """The compile story of a Results holding 'cache_variants' rows, by default ``compile_reference(device)``'s:
    None when no reference of this kind of machine ships (a GPU without its own file)."""
    ref = ref if ref is not None else compile_reference(device)
    if ref is None:
        return None
    rows = {r["variant"]: r for r in ref.section("cache_variants")}
    missing = [v for v in ("static", "static+compile") if v not in rows]
    if missing:
        raise ValueError(f"{ref.name}: no cache_variants rows for {missing}; rerun `python -m labkit kv reference`")
    eager, comp = rows["static"], rows["static+compile"]
    return CompileStory(where=results.where_of(ref), provenance=results.provenance(ref), new_tokens=int(eager["new_tokens"]),
                        eager_tokens_per_s=eager["decode_tokens_per_s"], compiled_tokens_per_s=comp["decode_tokens_per_s"],
                        eager_first_s=eager["first_call_s"], compiled_first_s=comp["first_call_s"],
                        agreement=comp.get("agreement"),
                        eager_samples=tuple(verdict.samples(eager, "decode_tokens_per_s")),
                        compiled_samples=tuple(verdict.samples(comp, "decode_tokens_per_s")),
                        recorded=str(ref.env.get("date") or "")[:10])

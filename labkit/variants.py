"""One loader for every precision variant, and one measurement for each: speed, memory, quality.

    fp32              PyTorch float32: the reference every other row is compared with
    fp16, bf16        PyTorch half precision (weights and compute)
    bnb-int8          bitsandbytes LLM.int8: int8 weights, one scale per row, fp16 outlier columns
    bnb-nf4           bitsandbytes 4-bit NormalFloat, one absmax per 64 weights (double quant optional)
    ort-fp32          exported to ONNX by optimum-onnx, run by ONNX Runtime
    ort-int8-tensor   ONNX Runtime dynamic int8, one scale per weight tensor
    ort-int8-channel  ONNX Runtime dynamic int8, one scale per output channel

``load_variant(name)`` never crashes for a variant this machine cannot run: it returns a
``Variant`` whose ``status`` says why. Exported and quantised ONNX files are cached under
``labkit.config.cache_dir() / "onnx"`` and reused; each is written to a temporary folder
beside its target and renamed into place, so an interrupted export never leaves half a model.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import config, timing
from .env import Unavailable

VARIANTS: dict[str, str] = {
    "fp32": "PyTorch float32 (the reference)",
    "fp16": "PyTorch float16 weights and compute",
    "bf16": "PyTorch bfloat16 weights and compute",
    "bnb-int8": "bitsandbytes LLM.int8 (int8 weights, fp16 outlier columns)",
    "bnb-nf4": "bitsandbytes 4-bit NF4, block size 64",
    "ort-fp32": "ONNX Runtime float32 (optimum-onnx export)",
    "ort-int8-tensor": "ONNX Runtime dynamic int8, per-tensor scales",
    "ort-int8-channel": "ONNX Runtime dynamic int8, per-channel scales",
}
NAMES: tuple[str, ...] = tuple(VARIANTS)

# sizing.DTYPE_BYTES key for each variant's stored weights
SIZING_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "bnb-int8": "int8", "bnb-nf4": "nf4",
                "ort-fp32": "fp32", "ort-int8-tensor": "int8", "ort-int8-channel": "int8"}

# options each variant accepts (anything else is a ValueError naming these)
OPTIONS: dict[str, dict[str, str]] = {
    "bnb-int8": {"threshold": "outlier threshold of LLM.int8 (default 6.0)"},
    "bnb-nf4": {"double_quant": "also quantise the absmax scales (default False)",
                "compute_dtype": "dtype the 4-bit weights are dequantised to: fp32, fp16 or bf16 "
                                 "(default fp32 on CPU, fp16 on CUDA)"},
    "ort-fp32": {"provider": "ONNX Runtime execution provider (default: CUDA when in use, else CPU)"},
    "ort-int8-tensor": {"provider": "as for ort-fp32",
                        "reduce_range": "quantise weights to 7 bits; default: True on x86 CPUs without VNNI "
                                        "(see int8_saturation_risk), else False as in ONNX Runtime"},
    "ort-int8-channel": {"provider": "as for ort-fp32", "reduce_range": "as for ort-int8-tensor"},
}

_HALF_FLAGS = ("f16c", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16",
               "avx512_vnni", "avx_vnni", "amx_int8")
# Arm: fp16 arithmetic (fphp scalar, asimdhp vector), bf16 instructions, int8 dot products and matrix multiply
_ARM_FLAGS = ("fphp", "asimdhp", "bf16", "asimddp", "i8mm", "sve", "sme")
# Apple silicon reports the same features through sysctl, not /proc/cpuinfo
_APPLE_SYSCTL = {"asimdhp": "hw.optional.arm.FEAT_FP16", "bf16": "hw.optional.arm.FEAT_BF16",
                 "asimddp": "hw.optional.arm.FEAT_DotProd", "i8mm": "hw.optional.arm.FEAT_I8MM"}


def names() -> list[str]:
    """The variant names ``load_variant`` accepts, reference first."""
    return list(NAMES)


def check_name(name: str) -> str:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose one of {list(NAMES)}")
    return name


def cpu_arch(machine: str | None = None) -> str:
    """'x86', 'arm' or 'other', from ``platform.machine()`` (or ``machine``)."""
    import platform

    m = (machine or platform.machine()).lower()
    if m in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "x86"
    if m.startswith(("arm", "aarch64")):
        return "arm"
    return "other"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 'flags', Arm 'Features'); on macOS, Apple silicon's
    features from sysctl under their Linux names. Empty where neither says anything."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return _apple_flags()


def _apple_flags() -> set[str]:
    import platform
    import subprocess

    if platform.system() != "Darwin" or cpu_arch() != "arm":
        return set()
    found = set()
    for flag, key in _APPLE_SYSCTL.items():
        try:
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.stdout.strip() == "1":
            found.add(flag)
    if "asimdhp" in found:
        found.add("fphp")
    return found


def cpu_features() -> dict[str, bool]:
    """The flags that decide half-precision and int8 speed on this CPU's architecture, each True or False
    (x86: AVX-512/AMX/VNNI names; Arm: fphp/asimdhp/bf16/i8mm…; {} for other architectures)."""
    flags = cpu_flags()
    arch = cpu_arch()
    names_ = _HALF_FLAGS if arch == "x86" else _ARM_FLAGS if arch == "arm" else ()
    return {f: f in flags for f in names_}


def half_precision_features(device: str | None = None) -> dict[str, Any]:
    """What decides fp16/bf16 speed on ``device`` (default: the device notebooks use): a GPU's compute
    capability (fp16 tensor cores from 7.0, native bf16 from 8.0), or the CPU's relevant instruction flags."""
    from . import env

    device = device or env.device()
    if device.startswith("cuda"):
        import torch

        index = env.cuda_index(device)
        major, minor = torch.cuda.get_device_capability(index)
        return {"device": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}",
                "fp16_tensor_cores": major >= 7, "bf16_native": major >= 8}
    half = {"x86": ("f16c", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"),
            "arm": ("fphp", "asimdhp", "bf16")}.get(cpu_arch(), ())
    feats = cpu_features()
    return {"device": f"CPU ({cpu_arch()})", **{k: feats[k] for k in half}}


def fast_half_matmul_reason(device: str | None = None) -> str:
    """'' when ``device`` (default: the device notebooks use) has native fp16/bf16 matmul hardware; else one
    line saying why not, in that hardware's own terms (no x86 flags on an Arm CPU or a GPU)."""
    from . import env

    device = device or env.device()
    if device.startswith("cuda"):
        f = half_precision_features(device)
        if f["bf16_native"]:
            return ""
        if f["fp16_tensor_cores"]:
            return (f"{f['device']} (compute capability {f['compute_capability']}) has fp16 tensor cores but no native "
                    "bf16 (it needs Ampere, 8.0+): fp16 speeds up, bf16 does not run natively")
        return (f"{f['device']} (compute capability {f['compute_capability']}) has no tensor cores: "
                "half precision saves bytes, not arithmetic")
    arch = cpu_arch()
    feats = cpu_features()
    if arch == "x86":
        if any(feats[f] for f in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")):
            return ""
        return ("this CPU has no avx512_bf16, avx512_fp16 or AMX instructions: fp16/bf16 matmuls are "
                "converted to fp32 piece by piece, so half precision saves bytes but not arithmetic")
    if arch == "arm":
        if not any(feats.values()):
            return ("this Arm CPU reports no fp16/bf16 arithmetic features here (or none could be read): "
                    "the matmul table above is the evidence")
        if feats["bf16"] or feats["asimdhp"]:
            return ""
        return ("this Arm CPU has no fp16 (asimdhp) or bf16 arithmetic: half-precision matmuls are converted "
                "to fp32, so half precision saves bytes but not arithmetic")
    return "no CPU feature information for this architecture: the matmul table above is the evidence"


def int8_saturation_risk() -> bool:
    """True on an x86 CPU without VNNI: its u8×s8 int8 kernel adds pairs of products into int16
    (``vpmaddubsw``), which saturates when weights use the full int8 range. Never on other architectures."""
    if cpu_arch() != "x86":
        return False
    feats = cpu_features()
    return bool(cpu_flags()) and feats["avx2"] and not (feats["avx512_vnni"] or feats["avx_vnni"] or feats["amx_int8"])


# ---------------------------------------------------------------- the variant object


@dataclass
class Variant:
    """A loaded model variant, or the reason it cannot run here (``status``)."""

    name: str
    status: str = "ok"
    model: Any = None
    tokenizer: Any = None
    backend: str = ""  # torch | bitsandbytes | onnxruntime
    device: str = "cpu"
    load_s: float | None = None
    weight_bytes: int | None = None
    weight_bytes_source: str = ""
    predicted_weight_bytes: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    prepare_s: float | None = None  # seconds spent exporting/quantising now (None: reused from the cache)
    rss_before_bytes: int | None = None
    load_peak_cuda_bytes: int | None = None
    rss_sampler: Any = field(default=None, repr=False)  # memory.RSSSampler from the load to the end of the timed runs
    providers: list[str] = field(default_factory=list)  # ONNX Runtime: the providers the session really got
    note: str = ""  # where and why a variant runs somewhere other than the device asked for

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def description(self) -> str:
        return VARIANTS[self.name]

    def release(self) -> None:
        """Drop the model and hand its memory back, so the next variant's memory reading is its own."""
        self.model = None
        if self.rss_sampler is not None:
            self.rss_sampler.stop()
        gc.collect()
        if importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap otherwise; RSS would not drop

    def summary(self) -> dict[str, Any]:
        return {"variant": self.name, "status": self.status, "backend": self.backend, "device": self.device,
                "load_s": self.load_s, "weight_bytes": self.weight_bytes,
                "weight_bytes_source": self.weight_bytes_source,
                "predicted_weight_bytes": self.predicted_weight_bytes, "prepare_s": self.prepare_s,
                "options": dict(self.options), "providers": list(self.providers), "note": self.note}


def _validate_options(name: str, options: dict[str, Any]) -> None:
    allowed = OPTIONS.get(name, {})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"variant {name!r} takes no option(s) {unknown}; valid: {sorted(allowed) or 'none'}")


def predicted_weight_bytes(name: str, model_name: str | None = None) -> int:
    """labkit.sizing's prediction. ONNX Runtime's dynamic quantisation stores every weight as int8,
    embeddings too, and a tied output embedding becomes its own (transposed) int8 copy, so its
    prediction is (parameters + tied lm_head) × 1 byte rather than sizing's LLM.int8 layout."""
    from . import sizing

    check_name(name)
    model = _sizing_model(model_name)
    s = sizing.shape(model)
    if name.startswith("ort-int8"):
        tied = bool(getattr(sizing.load_config(model), "tie_word_embeddings", False))
        return int((s.n_params + (s.vocab_size * s.hidden_size if tied else 0)) * sizing.DTYPE_BYTES["int8"])
    return sizing.weight_bytes(s, SIZING_DTYPE[name])


def _sizing_model(model_name: str | None) -> str:
    return model_name or os.environ.get("LABKIT_MODEL") or "default"


def load_variant(name: str, model_name: str | None = None, device: str | None = None, **options: Any) -> Variant:
    """Load ``name`` (see ``names()``) of the default model (or ``model_name`` / ``LABKIT_MODEL``).

    Returns a ``Variant``; when this machine cannot run it, ``status`` holds the reason and
    ``model`` is None. Unknown names or options raise ``ValueError`` listing the valid ones.
    """
    from . import env, memory, models

    check_name(name)
    _validate_options(name, options)
    device = device or env.device()
    v = Variant(name=name, device=device, options=dict(options))
    v.predicted_weight_bytes = predicted_weight_bytes(name, model_name)
    reason = _unavailable_reason(name, device)
    if reason:
        v.status = reason
        return v
    if options.get("provider") is not None:
        ort_provider(device, options["provider"])  # a provider this machine lacks is the caller's mistake
        if name.startswith("ort-int8") and options["provider"] != "CPUExecutionProvider":
            raise ValueError(f"{name} runs on provider 'CPUExecutionProvider' only: {INT8_ON_GPU_NOTE}")
    loader = {"fp32": _load_torch, "fp16": _load_torch, "bf16": _load_torch, "bnb-int8": _load_bnb,
              "bnb-nf4": _load_bnb}.get(name, _load_ort)
    v.rss_sampler = memory.RSSSampler().start()  # read in measure_variant: the peak over load and timed runs
    with memory.track(device) as mem, timing.track(device) as t:
        try:
            loader(v, model_name)
        except models.ModelNotFound:
            raise  # a wrong model name is the caller's to fix, not a property of this machine
        except Exception as exc:
            if not env.backend_failure(exc):
                raise  # labkit's own bug: surface it, never report it as a capability gap
            v.status = f"cannot run here: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            v.model = None
            v.rss_sampler.stop()
            return v
    v.load_s = t.seconds - (v.prepare_s or 0.0)
    v.rss_before_bytes = mem.rss_before.bytes
    v.load_peak_cuda_bytes = mem.cuda_peak.bytes
    return v


def _unavailable_reason(name: str, device: str) -> str:
    from . import env

    if name == "bf16" and device.startswith("cuda"):
        cap = env.bf16(device)
        return "" if cap.available else cap.reason
    if name.startswith("bnb-"):
        cap = env.capability("bitsandbytes")
        return "" if cap.available else cap.reason
    if name.startswith("ort-"):
        for cap_name in ("onnxruntime", "optimum-onnx"):
            cap = env.capability(cap_name)
            if not cap.available:
                return cap.reason
    if device.startswith("mps") and not name.startswith(("fp", "bf")):
        return f"{name} has no Apple-GPU kernels here; use device='cpu'"
    return ""


def _load_torch(v: Variant, model_name: str | None) -> None:
    from . import memory, models

    lm = models.load(model_name, dtype=v.name, device=v.device)
    v.model, v.tokenizer, v.backend = lm.model, lm.tokenizer, "torch"
    v.weight_bytes = memory.tensor_bytes(list(lm.model.parameters()) + list(lm.model.buffers()))
    v.weight_bytes_source = "parameter + buffer bytes"


def _quant_state_tensors(model: Any) -> list[Any]:
    """Tensors bitsandbytes keeps beside the weights, not registered as parameters or buffers:
    4-bit absmax/code (and the nested state of double quant), LLM.int8's per-row scales (SCB)."""
    import torch

    out: list[Any] = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        while qs is not None:
            out += [t for t in (qs.absmax, qs.code, getattr(qs, "offset", None)) if isinstance(t, torch.Tensor)]
            qs = getattr(qs, "state2", None)
        scb = getattr(p, "SCB", None)
        if isinstance(scb, torch.Tensor):
            out.append(scb)
    return out


def _load_bnb(v: Variant, model_name: str | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from . import memory, models

    cuda = v.device.startswith("cuda")
    if v.name == "bnb-int8":
        qcfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=float(v.options.get("threshold", 6.0)))
    else:
        compute = v.options.get("compute_dtype", "fp16" if cuda else "fp32")
        qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_use_double_quant=bool(v.options.get("double_quant", False)),
                                  bnb_4bit_compute_dtype=models.torch_dtype(compute))
        v.options.setdefault("compute_dtype", compute)
    tok = models.load_tokenizer(model_name)
    # the layers bitsandbytes leaves alone (embeddings, norms, lm_head) are stored in fp16
    model = AutoModelForCausalLM.from_pretrained(models.resolve(model_name), quantization_config=qcfg,
                                                 dtype=torch.float16, device_map=v.device)
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    v.model, v.tokenizer, v.backend = model, tok, "bitsandbytes"
    v.weight_bytes = memory.tensor_bytes(list(model.parameters()) + list(model.buffers()) + _quant_state_tensors(model))
    v.weight_bytes_source = "parameter + buffer bytes + quantisation scales (absmax / SCB)"


# ---------------------------------------------------------------- ONNX export and quantisation (cached)


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def onnx_root(model_name: str | None = None) -> Path:
    """The cache folder of one model's ONNX files: name plus a hash of its config and the exporter version."""
    from . import models

    path = models.resolve(model_name)
    cfg = Path(path) / "config.json"
    stamp = cfg.read_text(encoding="utf-8") if cfg.is_file() else path
    digest = hashlib.sha1(f"{path}\n{stamp}\n{_version('optimum-onnx')}\n{_version('transformers')}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", models.display_name(model_name).split("/")[-1])
    return config.cache_dir() / "onnx" / f"{slug}-{digest}"


def _complete(folder: Path) -> bool:
    return (folder / "model.onnx").is_file() and (folder / "config.json").is_file()


def onnx_files(folder: Path) -> list[Path]:
    """The files that hold an ONNX model's graph and weights (.onnx plus external data)."""
    return sorted(p for p in folder.iterdir() if p.suffix == ".onnx" or p.name.endswith((".onnx_data", ".onnx.data")))


def onnx_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in onnx_files(folder))


@contextlib.contextmanager
def _atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; rename it to ``target`` when the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        try:
            os.replace(tmp, target)
        except OSError:
            if not _complete(target):  # not a concurrent writer that finished first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence exporter/quantiser chatter (tracer warnings, 'consider pre-processing')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def export_onnx(model_name: str | None = None, force: bool = False) -> tuple[Path, float | None]:
    """Export the model to ONNX (fp32, with KV cache) once; return (folder, seconds or None if cached)."""
    from optimum.exporters.onnx import main_export

    from . import models

    target = onnx_root(model_name) / "fp32"
    if _complete(target) and not force:
        return target, None
    if force and target.exists():
        shutil.rmtree(target)
    t0 = timing.clock()
    with _atomic_dir(target) as tmp, _quiet():
        main_export(model_name_or_path=models.resolve(model_name), output=tmp, task="text-generation-with-past",
                    do_validation=False, device="cpu")
    return target, timing.clock() - t0


def fold_constant_transposes(model: Any) -> int:
    """Replace each Transpose of a stored weight by the transposed weight itself; returns how many.

    The exporter writes a tied lm_head as ``MatMul(x, Transpose(embed_tokens))``. The quantiser
    sees no constant weight behind that MatMul, so it leaves it in fp32 and, worse, makes it
    dequantise the whole int8 embedding on every decode step. Folded, the lm_head gets its own
    int8 weight like every other MatMul.
    """
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    keep, folded = [], 0
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            arr = numpy_helper.to_array(inits[node.input[0]])
            arr = arr.transpose(perm) if perm else arr.T
            model.graph.initializer.append(numpy_helper.from_array(arr.copy(order="C"), node.output[0]))
            folded += 1
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return folded


def quantize_onnx(per_channel: bool, reduce_range: bool | None = None, model_name: str | None = None,
                  force: bool = False) -> tuple[Path, float | None]:
    """Dynamic int8 quantisation of the exported model (weights int8 ahead of time, activations
    quantised on the fly at run time); cached per setting. Returns (folder, seconds or None).

    ``reduce_range=None`` picks 7-bit weights where ``int8_saturation_risk()`` (ONNX Runtime's own
    advice for CPUs without VNNI), else 8-bit.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reduce_range = int8_saturation_risk() if reduce_range is None else bool(reduce_range)
    src, export_s = export_onnx(model_name)
    kind = f"int8-{'channel' if per_channel else 'tensor'}{'-rr' if reduce_range else ''}-ort{_version('onnxruntime')}"
    target = onnx_root(model_name) / kind
    if _complete(target) and not force:
        return target, export_s
    if force and target.exists():
        shutil.rmtree(target)
    t0 = timing.clock()
    external = any(p.name.endswith(("onnx_data", "onnx.data")) for p in src.iterdir())
    with _atomic_dir(target) as tmp, _quiet():
        for f in src.iterdir():
            if f not in onnx_files(src):
                shutil.copy2(f, tmp / f.name)  # config, generation config, tokenizer
        graph = onnx.load(src / "model.onnx")
        fold_constant_transposes(graph)
        quantize_dynamic(graph, tmp / "model.onnx", per_channel=per_channel, reduce_range=reduce_range,
                         weight_type=QuantType.QInt8, use_external_data_format=external)
        del graph
    return target, timing.clock() - t0 + (export_s or 0.0)


def ort_provider(device: str, wanted: str | None = None) -> str:
    """The ONNX Runtime provider to ask for: ``wanted`` (``ValueError`` when this onnxruntime lacks it),
    else CUDA's on a CUDA device where installed, else the CPU's."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if wanted:
        if wanted not in available:
            raise ValueError(f"ONNX Runtime provider {wanted!r} is not available here; choose one of {available}")
        return wanted
    if device.startswith("cuda") and "CUDAExecutionProvider" in available:
        return "CUDAExecutionProvider"
    return "CPUExecutionProvider"


INT8_ON_GPU_NOTE = ("ONNX Runtime's dynamic int8 runs on the CPU provider: its quantised operators (MatMulInteger, "
                    "DynamicQuantizeLinear) have no CUDA kernels. On a GPU, int8 runs as bitsandbytes LLM.int8, or as "
                    "static (QDQ) int8 on the TensorRT provider.")


class ProviderFallback(Unavailable):  # a capability gap, not a bug: load_variant reports it as a row
    """ONNX Runtime created the session on other providers than the ones asked for."""


def session_providers(model: Any) -> list[str]:
    """The execution providers an ONNX Runtime model's session really got (``InferenceSession.get_providers``),
    first one first: what ran, which may differ from what was asked for."""
    session = getattr(model, "session", None)
    if session is not None and hasattr(session, "get_providers"):
        return list(session.get_providers())
    providers = getattr(model, "providers", None)
    if providers is None:
        raise TypeError(f"{type(model).__name__} has no ONNX Runtime session to ask for its providers")
    return list(providers)


def check_providers(asked: str, got: Sequence[str]) -> str:
    """'' when the session runs on ``asked`` first; otherwise the reason the row failed."""
    if got and got[0] == asked:
        return ""
    hint = ""
    if asked in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        hint = (" (ONNX Runtime fell back: the CUDA/cuDNN/TensorRT libraries it needs did not load; import torch "
                "first, and check that onnxruntime-gpu's CUDA major matches torch's, see README)")
    return f"asked ONNX Runtime for {asked}, the session got {list(got)}{hint}"


def _load_ort(v: Variant, model_name: str | None) -> None:
    from optimum.onnxruntime import ORTModelForCausalLM

    from . import models

    if v.name == "ort-fp32":
        folder, prep = export_onnx(model_name)
    else:
        rr = v.options.get("reduce_range")
        rr = int8_saturation_risk() if rr is None else bool(rr)
        v.options["reduce_range"] = rr
        folder, prep = quantize_onnx(per_channel=v.name.endswith("channel"), reduce_range=rr, model_name=model_name)
    v.prepare_s = prep
    if v.name.startswith("ort-int8") and v.device.startswith("cuda"):
        v.device = "cpu"  # labelled: the row says it ran on the CPU, and why
        v.note = INT8_ON_GPU_NOTE
    provider = ort_provider(v.device, v.options.get("provider"))
    v.options["provider"] = provider
    model = ORTModelForCausalLM.from_pretrained(folder, provider=provider, use_cache=True)
    v.providers = session_providers(model)
    problem = check_providers(provider, v.providers)
    if problem:
        raise ProviderFallback(problem)
    tok = models.load_tokenizer(model_name)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    v.model, v.tokenizer, v.backend = model, tok, "onnxruntime"
    v.device = "cpu" if v.providers[0] == "CPUExecutionProvider" else str(model.device)
    v.files = [str(p) for p in onnx_files(folder)]
    v.weight_bytes = onnx_bytes(folder)
    v.weight_bytes_source = "size of the .onnx file(s) and external data"


# ---------------------------------------------------------------- one measurement per variant


@dataclass
class Settings:
    """What every variant is measured with (same prompts and token counts for all)."""

    new_tokens: int = 32  # decode tokens per timed run
    repeats: int = 3  # timed runs (after one warmup)
    answer_tokens: int = 24  # tokens per side-by-side answer
    n_questions: int = 5
    ppl_window_tokens: int = 512
    ppl_stride_tokens: int = 512
    ppl_max_tokens: int | None = None  # None: the whole evaluation text
    ref_prompts: int = 12
    ref_new_tokens: int = 32

    @classmethod
    def default(cls) -> "Settings":
        """Full counts normally, small ones in quick mode (same code path)."""
        pick = config.pick
        return cls(new_tokens=pick(32, 8), repeats=pick(3, 1), answer_tokens=pick(24, 12), n_questions=pick(5, 1),
                   ppl_window_tokens=512, ppl_stride_tokens=512, ppl_max_tokens=None if not config.quick() else 256,
                   ref_prompts=pick(12, 3), ref_new_tokens=pick(32, 12))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Inputs:
    """The reference (fp32 greedy continuations and log-probs), eval tokens and questions."""

    reference: Any
    eval_ids: list[int]
    questions: list[str]
    settings: Settings


def prepare_inputs(reference_variant: Variant, settings: Settings | None = None) -> Inputs:
    """Build the shared inputs once, with the fp32 variant as the reference."""
    from . import quality

    settings = settings or Settings.default()
    if not reference_variant.ok:
        raise ValueError(f"the reference variant {reference_variant.name} did not load: {reference_variant.status}")
    ref = quality.reference(reference_variant.model, reference_variant.tokenizer,
                            quality.prompts("prompts")[: settings.ref_prompts], new_tokens=settings.ref_new_tokens)
    return Inputs(reference=ref, eval_ids=quality.eval_tokens(reference_variant.tokenizer),
                  questions=quality.prompts("questions")[: settings.n_questions], settings=settings)


def _peak_memory(v: Variant) -> tuple[int | None, str]:
    from . import memory

    if v.device.startswith("cuda"):
        if v.backend == "onnxruntime":
            return None, "ONNX Runtime allocates outside PyTorch's CUDA allocator: no allocator peak"
        peak = memory.cuda_peak(v.device)
        return peak.bytes, "cuda_peak: PyTorch allocator peak over load and runs"
    if v.rss_sampler is None or v.rss_before_bytes is None:
        return None, "RSS not sampled for this variant"
    v.rss_sampler.stop()
    return (v.rss_sampler.peak_bytes - v.rss_before_bytes,
            f"rss peak growth: highest process RSS over load and timed runs ({v.rss_sampler.describe()}), "
            "minus the RSS before the load")


def measure_variant(v: Variant, inputs: Inputs) -> dict[str, Any]:
    """One row: footprint, load time, TTFT, decode tokens/s, perplexity, agreement, KL, answers."""
    from . import generation, quality

    row: dict[str, Any] = v.summary()
    if not v.ok:
        return row
    s = inputs.settings
    timing = generation.measure_decode(v.model, v.tokenizer, new_tokens=s.new_tokens, repeats=s.repeats)
    if v.backend == "onnxruntime":  # ONNX Runtime may also fall back while running: label what really ran
        problem = check_providers(v.options["provider"], session_providers(v.model))
        if problem:
            return {**row, "status": f"failed while measuring: {problem}"}
    peak, source = _peak_memory(v)  # read before the quality passes allocate their own buffers
    ppl = quality.perplexity(v.model, inputs.eval_ids, window_tokens=s.ppl_window_tokens,
                             stride_tokens=s.ppl_stride_tokens, max_tokens=s.ppl_max_tokens)
    agree = quality.compare(v.model, inputs.reference)
    answers = quality.answers(v.model, v.tokenizer, inputs.questions, max_new_tokens=s.answer_tokens)
    row.update(ttft_s=timing["ttft_s"], tpot_s=timing["tpot_s"], decode_tokens_per_s=timing["decode_tokens_per_s"],
               decode_spread=timing["spread"], perplexity=ppl.perplexity, ppl_tokens=ppl.n_tokens,
               agreement=agree.agreement, kl=agree.kl, kl_max=agree.kl_max, kl_tokens=agree.n_tokens,
               peak_memory_bytes=peak, peak_memory_source=source, answers=answers)
    return row


def reference_inputs(settings: Settings | None = None, model_name: str | None = None,
                     device: str | None = None) -> Inputs:
    """Load fp32, build the shared inputs (its greedy continuations and log-probs), release it."""
    ref = load_variant("fp32", model_name, device)
    try:
        return prepare_inputs(ref, settings)
    finally:
        ref.release()


def run(variant_names: Sequence[str] | None = None, settings: Settings | None = None,
        model_name: str | None = None, device: str | None = None, progress: bool = True,
        options: dict[str, dict[str, Any]] | None = None, inputs: Inputs | None = None) -> Iterator[dict[str, Any]]:
    """Load, measure and release each variant in turn (fp32 first: it is the reference).

    ``inputs`` (from ``reference_inputs``) is built here when not given. Yields one row per
    variant; a variant that cannot run yields a row whose status says why.
    """
    variant_names = list(variant_names) if variant_names is not None else names()
    for n in variant_names:
        check_name(n)
    options = options or {}
    # the reference is built first and released; fp32 is then reloaded like any other variant,
    # so its memory reading does not include the reference data
    if inputs is None:
        inputs = reference_inputs(settings, model_name, device)
    elif settings is not None and settings != inputs.settings:
        raise ValueError("pass settings or inputs built with them, not both with different values")
    order = sorted(variant_names, key=lambda n: n != "fp32")
    bar = _progress(order, progress)
    for n in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(n)
        t0 = timing.clock()
        v = load_variant(n, model_name, device, **options.get(n, {}))
        try:
            row = measure_variant(v, inputs)
            row["measure_s"] = timing.clock() - t0  # wall time of this row: load, prepare and all passes
        except (MemoryError, RuntimeError) as exc:  # an out-of-memory mid-run becomes a row, the sweep goes on
            row = {**v.summary(), "status": f"failed while measuring: {type(exc).__name__}: {str(exc)[:200]}"}
        finally:
            v.release()
        yield row


def _progress(items: list[str], enabled: bool) -> Any:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="variants", unit="variant")


def best_of(rows: Sequence[dict[str, Any]], candidates: Sequence[str]) -> dict[str, Any] | None:
    """The better-quality row among ``candidates`` that ran: highest agreement, then lowest KL."""
    ok = [r for r in rows if r.get("variant") in candidates and r.get("status") == "ok"]
    if not ok:
        return None
    return max(ok, key=lambda r: (r["agreement"], -r["kl"]))


# ---------------------------------------------------------------- looking inside int8: one layer at a time


@contextlib.contextmanager
def _quantized_matmul(weight: Any, per_channel: bool, reduce_range: bool):
    """A one-MatMul ONNX graph of ``x @ weight.T`` and its ``quantize_dynamic`` int8 copy, in a temporary
    folder: yields (fp32 path, int8 path, the weight as ONNX stores it: (in, out))."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = np.ascontiguousarray(weight.detach().float().cpu().numpy().T)  # ONNX MatMul wants B as (in, out)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", w.shape[1]])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, src)
        quantize_dynamic(src, dst, per_channel=per_channel, reduce_range=reduce_range, weight_type=QuantType.QInt8)
        yield src, dst, w


def ort_matmul_error(weight: Any, x: Any, per_channel: bool, reduce_range: bool) -> float:
    """Relative error ‖Y_int8 − Y_fp32‖ / ‖Y_fp32‖ of one ``x @ weight.T`` run by ONNX Runtime after
    ``quantize_dynamic``: the real CPU kernel on real weights and activations, in milliseconds."""
    import numpy as np
    import onnxruntime as ort

    with _quantized_matmul(weight, per_channel, reduce_range) as (src, dst, w):
        xs = np.ascontiguousarray(x.detach().float().cpu().numpy().reshape(-1, w.shape[0]))
        run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": xs})[0]
               for p in (src, dst)}
    return float(np.linalg.norm(run[dst] - run[src]) / np.linalg.norm(run[src]))


def _fake_quant_weight(w: Any, per_channel: bool, reduce_range: bool) -> Any:
    """Symmetric int8 as ONNX Runtime stores weights: ±127 (±64 with reduce_range), per tensor or per output row."""
    q = 64 if reduce_range else 127
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().max()
    scale = (amax / q).clamp_min(1e-12)
    return (w / scale).round().clamp(-q, q) * scale


def _fake_quant_activation(x: Any) -> Any:
    """uint8 with one scale for the whole tensor, zero included (ONNX DynamicQuantizeLinear)."""
    lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = ((hi - lo) / 255).clamp_min(1e-12)
    zp = (-lo / scale).round().clamp(0, 255)
    return ((x / scale).round() + zp).clamp(0, 255).sub(zp) * scale


LAYER_GROUPS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


@contextlib.contextmanager
def fake_dynamic_int8(model: Any, groups: Sequence[str] = LAYER_GROUPS, per_channel: bool = False,
                      reduce_range: bool = True) -> Iterator[int]:
    """Emulate ONNX Runtime's dynamic int8 in PyTorch on the Linear layers whose name ends with one
    of ``groups``: weights rounded to int8, activations to uint8 with one scale per call. The model's
    own weights are untouched (a tied lm_head keeps its embedding). Yields how many layers it covers."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.split(".")[-1] in groups:
            with torch.no_grad():
                wq = _fake_quant_weight(module.weight.float(), per_channel, reduce_range).to(module.weight.dtype)

            def hook(mod: Any, args: tuple, out: Any, wq: Any = wq) -> Any:
                return F.linear(_fake_quant_activation(args[0]), wq, mod.bias)

            handles.append(module.register_forward_hook(hook))
    try:
        yield len(handles)
    finally:
        for h in handles:
            h.remove()


def layer_sensitivity(model: Any, ref: Any, per_channel: bool = False, reduce_range: bool = True,
                      groups: Sequence[str] = LAYER_GROUPS) -> list[dict[str, Any]]:
    """Quality (agreement, KL against ``ref``) with only one kind of layer in emulated int8, for each
    kind, and with all of them: which layers hurt most."""
    from . import quality

    rows = []
    for group in [*groups, "all"]:
        chosen = groups if group == "all" else (group,)
        with fake_dynamic_int8(model, chosen, per_channel=per_channel, reduce_range=reduce_range) as n:
            res = quality.compare(model, ref)
        rows.append({"layers": group, "n_layers": n, "per_channel": per_channel, "agreement": res.agreement,
                     "kl": res.kl})
    return rows


# ---------------------------------------------------------------- the quantisers written out, and the libraries' own


def absmax_scale(w: Any, per_channel: bool, qmax: int = 127) -> Any:
    """Symmetric absmax scale of an (out, in) weight: one for the whole tensor (shape (1, 1)) or one per output
    row (shape (out, 1)), so that ``w / scale`` spans [-qmax, qmax]."""
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1, 1)
    return (amax / qmax).clamp_min(1e-12)


def int8_round_trip(w: Any, scale: Any, qmax: int = 127) -> tuple[Any, Any]:
    """(int8 codes, dequantised weight): ``round(w / scale)`` clamped to [-qmax, qmax], then ``codes × scale``."""
    import torch

    q = torch.round(w / scale).clamp(-qmax, qmax).to(torch.int8)
    return q, q.to(w.dtype) * scale


def nf4_quantize(blocks: Any, code: Any) -> tuple[Any, Any]:
    """(indices, absmax) of (n, block) values: each block divided by its absmax, each value then mapped to the
    index of the nearest of the 16 NF4 ``code`` values. Dequantise with ``code[indices] * absmax``."""
    absmax = blocks.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)  # (n, 1)
    idx = ((blocks / absmax).unsqueeze(-1) - code).abs().argmin(dim=-1)  # (n, block): nearest code
    return idx, absmax


def ort_quantized_weight(weight: Any, per_channel: bool, reduce_range: bool) -> tuple[Any, Any]:
    """What ``onnxruntime.quantization.quantize_dynamic`` stores for one (out, in) Linear weight: its int8
    values as (out, in) and its scale(s) as (out, 1) or (1, 1), both torch tensors on the weight's device, read
    from the initializers of a quantised one-MatMul graph."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    with _quantized_matmul(weight, per_channel, reduce_range) as (_, dst, _w):
        inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(dst).graph.initializer}
    q = torch.from_numpy(inits["w_quantized"].T.copy()).to(weight.device)  # (out, in) int8
    scale = torch.from_numpy(np.asarray(inits["w_scale"], dtype=np.float32).reshape(-1, 1)).to(weight.device)
    return q, scale


def bnb_layer(weight: Any, kind: str, threshold: float = 6.0) -> Any:
    """One bitsandbytes Linear (``kind`` 'int8': Linear8bitLt, 'nf4': Linear4bit, block 64, fp32 compute) holding
    ``weight`` (out, in), quantised on the weight's device, in eval mode as in the loaded variants."""
    import bitsandbytes as bnb
    import torch

    out_f, in_f = weight.shape
    w = weight.detach().float().cpu()  # bitsandbytes quantises while moving a host tensor to its device
    if kind == "int8":
        layer = bnb.nn.Linear8bitLt(in_f, out_f, bias=False, has_fp16_weights=False, threshold=threshold)
        layer.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    elif kind == "nf4":
        layer = bnb.nn.Linear4bit(in_f, out_f, bias=False, compute_dtype=torch.float32, quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", blocksize=64)
    else:
        raise ValueError(f"kind={kind!r}: choose 'int8' or 'nf4'")
    return layer.to(weight.device).eval()


def ops_called(module: Any, x: Any) -> list[str]:
    """The operators one ``module(x)`` call dispatches, as torch.profiler names them (``aten::_int_mm``,
    ``bitsandbytes::gemv_4bit``…), first seen first. One untimed call runs before, so the list is the steady
    call's: a layer that repacks its weights on its first call (bitsandbytes NF4 on AVX512-BF16 CPUs) shows
    what every later call runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        module(x)
        with _quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
            module(x)
    seen: dict[str, None] = {}
    for e in prof.events():
        seen.setdefault(e.name, None)
    return list(seen)


def bnb_route(kind: str, ops: Sequence[str], device: str) -> str:
    """What a bitsandbytes layer's call did, read from the operators it dispatched (``ops_called``)."""
    if kind == "int8":
        if "aten::_int_mm" in ops:
            return "int8 × int8 → int32 matrix multiply (torch._int_mm): the weights stay int8"
        if device.startswith("cuda"):
            if "bitsandbytes::int8_linear_matmul" in ops:
                return "bitsandbytes' own CUDA int8 matmul (bitsandbytes::int8_linear_matmul): the weights stay int8"
            return "no bitsandbytes int8 operator seen: " + ", ".join(o for o in ops if "::" in o)[:200]
        return ("the int8 weights and activations converted to fp32 and multiplied in floating point "
                "(bitsandbytes' default int8_linear_matmul): integers stored, float arithmetic")
    if kind == "nf4":
        if "bitsandbytes::dequantize_4bit" in ops:
            return ("the whole weight dequantised to floating point (bitsandbytes::dequantize_4bit), then a float "
                    "matmul: every call rebuilds the weight")
        if "bitsandbytes::gemv_4bit" in ops:
            return ("one fused kernel (bitsandbytes::gemv_4bit) decodes the 4-bit codes inside the matrix product: "
                    "no full-precision copy of the weight is built")
        return "no bitsandbytes 4-bit operator seen: " + ", ".join(o for o in ops if "::" in o)[:200]
    raise ValueError(f"kind={kind!r}: choose 'int8' or 'nf4'")


def bnb_cpu_conditions() -> dict[str, Any]:
    """What the installed bitsandbytes reads on a CPU to choose its kernels (backends/cpu/ops.py): int8 goes
    through torch._int_mm when torch >= 2.6 reports an AVX-512 CPU; NF4 repacks for a fused kernel when the
    CPU has AVX512-BF16."""
    import torch

    from bitsandbytes.functional import has_avx512bf16

    capability = torch.backends.cpu.get_cpu_capability()
    return {"torch": torch.__version__, "torch >= 2.6": bool(torch.__version__ >= (2, 6)),
            "torch CPU capability": capability, "avx512bf16 (bitsandbytes' probe)": bool(has_avx512bf16())}


INT8_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QLinearMatMul", "MatMulIntegerToFloat")


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ran", fn()
    except TypeError as exc:
        return f"refused: TypeError: {exc}", None


def audit_ort_claims(fp32_folder: Path, int8_folder: Path) -> list[dict[str, Any]]:
    """The call articles write (``use_quantized=True``) next to the real API, each run here: what it did, and
    how many int8 operators the model it gave holds (a model that loads but holds none ignored the argument)."""
    import inspect

    import onnxruntime as ort
    from onnxruntime.quantization import quantize_dynamic

    from .engines import graph_ops

    def int8_ops(folder: Path) -> int:
        return sum(n for op, n in graph_ops(folder / "model.onnx").items() if op in INT8_OPS)

    rows = []
    with _quiet():
        how, _ = _outcome(lambda: ort.InferenceSession(str(fp32_folder / "model.onnx"), use_quantized=True,
                                                       providers=["CPUExecutionProvider"]))
    rows.append({"source": "article", "call": 'ort.InferenceSession("model.onnx", use_quantized=True)',
                 "what it does here": how + (f"; the session runs the fp32 graph ({int8_ops(fp32_folder)} int8 "
                                             "operators): the argument was accepted and ignored" if how == "ran" else "")})
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        how, _ = _outcome(lambda: quantize_dynamic(fp32_folder / "model.onnx", Path(tmp) / "q.onnx",
                                                   use_quantized=True))
    rows.append({"source": "article", "call": 'quantize_dynamic("model.onnx", "q.onnx", use_quantized=True)',
                 "what it does here": how})
    params = list(inspect.signature(quantize_dynamic).parameters)
    rows.append({"source": "real", "call": "quantize_dynamic(src, dst, per_channel=…, reduce_range=…, "
                                           "weight_type=QuantType.QInt8)  # what labkit.variants runs",
                 "what it does here": f"{int8_ops(int8_folder)} int8 operators in the cached result "
                                      f"({int8_folder.name}); its parameters: {', '.join(params)}"})
    try:
        from optimum.onnxruntime import ORTQuantizer  # noqa: F401
        from optimum.onnxruntime.configuration import AutoQuantizationConfig

        qparams = list(inspect.signature(AutoQuantizationConfig.avx512_vnni).parameters)
        optimum_row = ("exists (not run here: labkit.variants calls quantize_dynamic directly); "
                       f"AutoQuantizationConfig.avx512_vnni takes {', '.join(qparams)}")
    except ImportError as exc:
        optimum_row = f"not installed here: {exc}"
    rows.append({"source": "real", "call": "ORTQuantizer.from_pretrained(folder).quantize("
                                           "AutoQuantizationConfig.avx512_vnni(is_static=False), save_dir)",
                 "what it does here": optimum_row})
    return rows


# the 16 NF4 values (bitsandbytes.functional.get_4bit_type("nf4")), for machines without bitsandbytes
NF4_CODE = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)


def _rel(a: Any, b: Any) -> float:
    return float((a - b).norm() / b.norm())


def library_agreement(w: Any, x: Any, int8_hand: tuple[Any, Any, Any], nf4_hand: Any, hand: Any,
                      round_trip: Any, scale_of: Any) -> Any:
    """One row per library form: do bitsandbytes and ONNX Runtime store what the notebook's quantiser computed?

    ``int8_hand``: (codes, scales, dequantised) of the per-channel int8 written in the notebook; ``nf4_hand``: its
    dequantised NF4 weight; ``hand``: its table (bytes, output_error by form); ``round_trip`` and ``scale_of``:
    the notebook's functions, applied to bitsandbytes' fp16 copy of the weight. Libraries missing here give a
    row that says so."""
    import pandas as pd

    from . import env

    y = x @ w.T
    rows: list[dict[str, Any]] = []

    def row(library: str, form: str, ours: Any, theirs: Any, our_bytes: int, their_bytes: int, our_err: float,
            their_err: float) -> None:
        same = int((ours == theirs).sum()) if ours.dtype == theirs.dtype else 0
        rows.append({"library": library, "form": form, "equal_values": same, "values": ours.numel(),
                     "max_value_diff": float((ours.double() - theirs.double()).abs().max()),
                     "our_bytes": our_bytes, "their_bytes": their_bytes, "our_output_error": our_err,
                     "their_output_error": their_err})

    if env.capability("bitsandbytes").available:
        import bitsandbytes.functional as bnbf

        w16 = w.half()  # bitsandbytes' loader quantises the fp16 copy of each weight
        cb, scb, _ = bnbf.int8_vectorwise_quant(w16)  # (out, in) int8, (out,) row absmax
        s16 = scale_of(w16.float())  # (out, 1), the notebook's scales of the same fp16 weight
        q16, _ = round_trip(w16.float(), s16)
        row("bitsandbytes int8_vectorwise_quant (fp16 copy)", "int8 per row", q16, cb,
            q16.numel() + s16.numel() * 4, cb.numel() * cb.element_size() + scb.numel() * scb.element_size(),
            _rel(x @ (q16.float() * s16).T, y), _rel(x @ (cb.float() * scb[:, None] / 127).T, y))
        packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4")
        theirs = bnbf.dequantize_4bit(packed, state).float()
        row("bitsandbytes quantize_4bit → dequantize_4bit", "nf4, block 64 (dequantised values)", nf4_hand, theirs,
            int(hand.bytes["nf4"]), packed.numel() * packed.element_size() + state.absmax.numel() * state.absmax.element_size(),
            float(hand.output_error["nf4"]), _rel(x @ theirs.T, y))
    else:
        rows.append({"library": "bitsandbytes", "form": env.capability("bitsandbytes").reason})
    if env.capability("onnxruntime").available:
        q, scale, _ = int8_hand
        oq, oscale = ort_quantized_weight(w, per_channel=True, reduce_range=False)
        row("onnxruntime quantize_dynamic", "int8 per channel, 8-bit", q, oq, int(hand.bytes["per-channel"]),
            oq.numel() * oq.element_size() + oscale.numel() * oscale.element_size(),
            float(hand.output_error["per-channel"]), _rel(x @ (oq.float() * oscale).T, y))
    else:
        rows.append({"library": "onnxruntime", "form": env.capability("onnxruntime").reason})
    return pd.DataFrame(rows)


@dataclass
class Findings:
    """Notebook 03's takeaways: the numbers (``rows``) and the sentences they choose (``sentences``)."""

    rows: list[dict[str, Any]]
    sentences: list[str]


def findings(*, table: Any, hand: Any, agree: Any, routes: dict[str, str], layer_error: dict[str, float],
             verdict: Any) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``table``: variant rows indexed by name (status, weight_bytes, decode_tokens_per_s, agreement, kl);
    ``hand``: the hand-written layer table (bytes, output_error by form); ``agree``: ``library_agreement``;
    ``routes``: bitsandbytes kernel per kind; ``layer_error``: worst ONNX Runtime layer error by form;
    ``verdict``: the claims table."""
    rows: list[dict[str, Any]] = []
    says: list[str] = []
    ratio = hand.output_error["per-tensor"] / hand.output_error["per-channel"]
    rows.append({"finding": "per-tensor / per-channel output error, hand-written", "value": ratio})
    says.append(f"On one real layer, one scale per tensor gave {ratio:.1f}× the output error of one scale per row "
                f"({hand.output_error['per-tensor']:.2%} vs {hand.output_error['per-channel']:.2%}); NF4 gave "
                f"{hand.output_error['nf4']:.2%} in {hand.fraction_of_fp32['nf4']:.1%} of fp32's bytes "
                f"(int8: {hand.fraction_of_fp32['per-channel']:.1%}).")
    if "equal_values" in agree:
        full = agree.dropna(subset=["equal_values"])
        parts = []
        for r in full.itertuples():
            same = "identical" if r.equal_values == r.values else f"{r.equal_values / r.values:.4%} equal"
            parts.append(f"{r.library}: {same} values, {'the same' if r.our_bytes == r.their_bytes else 'other'} bytes")
        says.append("The libraries against the hand-written quantiser — " + "; ".join(parts) + ".")
    base = table.loc["fp32"]
    ok = table[table.status == "ok"]
    for v in ("bnb-int8", "bnb-nf4", "ort-int8-channel"):
        if v in ok.index:
            frac = ok.weight_bytes[v] / base.weight_bytes
            rows.append({"finding": f"{v} weight bytes / fp32", "value": frac})
    int8 = ok[ok.index.isin(["bnb-int8", "ort-int8-tensor", "ort-int8-channel"])]
    if len(int8):
        fast = int8.decode_tokens_per_s.idxmax()
        speed = int8.decode_tokens_per_s[fast] / base.decode_tokens_per_s
        rows.insert(0, {"finding": f"fastest int8 ({fast}) decode / fp32", "value": speed})
        word = "faster than" if speed > 1.02 else "slower than" if speed < 0.98 else "as fast as"
        says.append(f"The fastest int8 variant here, {fast}, decoded {speed:.2f}× fp32's speed ({word} fp32) with "
                    f"{int8.agreement[fast]:.0%} greedy agreement and KL {int8.kl[fast]:.3g}; the most faithful int8, "
                    f"{int8.agreement.idxmax()}, agreed on {int8.agreement.max():.0%}.")
    for kind, route in routes.items():
        says.append(f"bitsandbytes {kind} on this machine: {route}.")
    if layer_error:
        lo = min(layer_error, key=layer_error.get)
        says.append(f"In ONNX Runtime's kernel the lowest worst-layer error came from {lo} "
                    f"({layer_error[lo]:.3f}, against {', '.join(f'{k} {v:.3f}' for k, v in layer_error.items() if k != lo)}).")
    if "memory_holds" in verdict:
        held = verdict.dropna(subset=["memory_holds"])
        both = held[held.memory_holds.astype(bool) & held.accuracy_holds.astype(bool)]
        says.append(f"Of {len(held)} published claims measured here, {len(both)} held on both memory and accuracy"
                    + (f" ({', '.join(both.variant)})" if len(both) else "") + ".")
    return Findings(rows=rows, sentences=says)

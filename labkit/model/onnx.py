"""The exported ONNX model and its quantised forms, cached under ``LABKIT_CACHE``, and the providers a
session really got.

``export_onnx`` exports the model once (optimum-onnx); ``quantize_onnx`` (dynamic int8) and ``quantize_nbits``
(MatMulNBits 4/8-bit blocks) quantise that export; each writes into a temporary folder and renames it, so an
interrupted run never leaves a half-written model. ``ort_provider`` picks the execution provider a device
asks for and ``check_providers`` compares it with the ones a session reports: a label comes from what ran.
``graph_ops`` / ``fused_ops`` / ``count_ops`` count a graph's operators.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core import config, env, timing
from ..core.env import Unavailable
from . import models
from .hardware import int8_saturation_risk

# ---------------------------------------------------------------- ONNX export and quantisation (cached)


def _version(package: str) -> str:
    """The version that names a cache folder: ``"none"`` when the package is not installed."""
    return env.version(package) or "none"


def onnx_root(model_name: str | None = None) -> Path:
    """The cache folder of one model's ONNX files: name plus a hash of its config and the exporter version."""
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
def quiet() -> Iterator[None]:
    """Silence exporter/quantiser chatter (tracer warnings, 'consider pre-processing')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def _reuse(target: Path, force: bool) -> bool:
    """True when ``target`` is a complete cached model to reuse; with ``force``, delete it so it is rebuilt."""
    if _complete(target) and not force:
        return True
    if force and target.exists():
        shutil.rmtree(target)
    return False


def export_onnx(model_name: str | None = None, force: bool = False) -> tuple[Path, float | None]:
    """Export the model to ONNX (fp32, with KV cache) once; return (folder, seconds or None if cached)."""
    from optimum.exporters.onnx import main_export

    target = onnx_root(model_name) / "fp32"
    if _reuse(target, force):
        return target, None
    t0 = timing.clock()
    with _atomic_dir(target) as tmp, quiet():
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


@contextlib.contextmanager
def _derived_graph(src: Path, target: Path) -> Iterator[tuple[Path, Any]]:
    """A model folder built from the export in ``src``: yields (the folder being written, the export's graph with
    its constant transposes folded); the config and tokenizer files are copied, and the folder becomes
    ``target`` only when the block finishes."""
    import onnx

    with _atomic_dir(target) as tmp, quiet():
        for f in src.iterdir():
            if f not in onnx_files(src):
                shutil.copy2(f, tmp / f.name)  # config, generation config, tokenizer
        graph = onnx.load(src / "model.onnx")
        fold_constant_transposes(graph)
        yield tmp, graph


def quantize_onnx(per_channel: bool, reduce_range: bool | None = None, model_name: str | None = None,
                  force: bool = False) -> tuple[Path, float | None]:
    """Dynamic int8 quantisation of the exported model (weights int8 ahead of time, activations
    quantised on the fly at run time); cached per setting. Returns (folder, seconds or None).

    ``reduce_range=None`` picks 7-bit weights where ``int8_saturation_risk()`` (ONNX Runtime's own
    advice for CPUs without VNNI), else 8-bit.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reduce_range = int8_saturation_risk() if reduce_range is None else bool(reduce_range)
    src, export_s = export_onnx(model_name)
    kind = f"int8-{'channel' if per_channel else 'tensor'}{'-rr' if reduce_range else ''}-ort{_version('onnxruntime')}"
    target = onnx_root(model_name) / kind
    if _reuse(target, force):
        return target, export_s
    t0 = timing.clock()
    external = any(p.name.endswith(("onnx_data", "onnx.data")) for p in src.iterdir())
    with _derived_graph(src, target) as (tmp, graph):
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


def cuda_provider_reason() -> str:
    """'' when this onnxruntime offers CUDAExecutionProvider; otherwise why not and the fix. Without it a session
    asked for the GPU silently runs on the CPU provider (the CPU build, ``onnxruntime``, installed by the
    [cpu] extra, beside or instead of ``onnxruntime-gpu``)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ""
    builds = ", ".join(f"{d} {env.version(d)}" for d in ("onnxruntime", "onnxruntime-gpu") if env.version(d)) or "none"
    return (f"this onnxruntime {ort.__version__} has no CUDAExecutionProvider (providers {available}; installed: "
            f"{builds}): pip uninstall -y onnxruntime onnxruntime-gpu && pip install -e '.[gpu]' in this environment "
            "(both wheels write the same package; never install [cpu] beside [gpu])")


def graph_ops(path: str | Path) -> dict[str, int]:
    """Operator counts of an ONNX graph (without loading its weights), most frequent first."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


def fused_ops(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Operators that appear (or grow) after optimisation: the fused ones, with their counts."""
    return {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}


# ------------------------------------------------------------------------- ONNX Runtime MatMulNBits


NBITS_INSTALL = "pip install 'labkit[cpu-engines]'"  # onnx-ir: ONNX Runtime's MatMulNBits quantiser imports it


def nbits_reason() -> str:
    """'' when ONNX Runtime's MatMulNBits quantiser can run here; else why not."""

    for module, dist in (("onnxruntime", "onnxruntime"), ("onnx_ir", "onnx-ir")):
        if importlib.util.find_spec(module) is None:
            return f"{dist} is not installed: ONNX Runtime's MatMulNBits quantiser needs it ({NBITS_INSTALL})"
    return ""


def quantize_nbits(bits: int = 4, block_size: int = 32, symmetric: bool = True, accuracy_level: int | None = 4,
                   model_name: str | None = None, force: bool = False) -> tuple[Path, float | None]:
    """The exported ONNX model with every constant-weight MatMul (the lm_head included, once its transposed
    embedding is folded) turned into ``MatMulNBits``; cached per setting. Returns (folder, seconds or None)."""
    if bits not in (4, 8):
        raise ValueError(f"bits={bits!r}: choose 4 or 8")
    if block_size not in (16, 32, 64, 128, 256):
        raise ValueError(f"block_size={block_size!r}: choose one of 16, 32, 64, 128, 256")
    if accuracy_level not in (None, 0, 1, 2, 3, 4):
        raise ValueError(f"accuracy_level={accuracy_level!r}: None or 0–4 (4: int8 activations)")
    reason = nbits_reason()
    if reason:
        raise RuntimeError(reason)
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    src, export_s = export_onnx(model_name)
    kind = (f"nbits{bits}-b{block_size}-{'sym' if symmetric else 'asym'}-acc{accuracy_level}"
            f"-ort{_version('onnxruntime')}")
    target = onnx_root(model_name) / kind
    if _reuse(target, force):
        return target, export_s
    t0 = timing.clock()  # host work: an export and a graph rewrite
    with _derived_graph(src, target) as (tmp, graph):
        quant = MatMulNBitsQuantizer(graph, bits=bits, block_size=block_size, is_symmetric=symmetric,
                                     accuracy_level=accuracy_level)
        quant.process()
        quant.model.save_model_to_file(str(tmp / "model.onnx"), use_external_data_format=False)
        del graph, quant
    return target, timing.clock() - t0 + (export_s or 0.0)


def count_ops(folder: Path, op_type: str) -> int:
    """How many nodes of ``op_type`` the graph in ``folder`` has (``graph_ops``, without its weights)."""
    return graph_ops(Path(folder) / "model.onnx").get(op_type, 0)


GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def gpu_provider_options(provider: str, device: str) -> dict[str, str]:
    """What labkit sets on a GPU provider for ``device`` ("cuda" or "cuda:N"): ``device_id``, the GPU it runs
    on (without it every session runs on GPU 0); on the CUDA provider also ``use_tf32=0``: its default runs
    fp32 matmuls in TF32, while the exported model's rows are labelled fp32 and PyTorch's fp32 stays IEEE.
    Other providers get nothing."""
    if provider not in GPU_PROVIDERS:
        return {}
    import torch

    # plain "cuda" is the current device; without CUDA here (a session that will fall back) GPU 0
    index = env.cuda_index(device) if torch.cuda.is_available() else (torch.device(device).index or 0)
    options = {"device_id": str(index)}
    if provider == "CUDAExecutionProvider":
        options["use_tf32"] = "0"
    return options


def session_arguments(provider: str, device: str | None = None, providers: Sequence[str] | None = None,
                      provider_options: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The provider arguments of ``ORTModelForCausalLM.from_pretrained`` for a session that runs on
    ``provider`` first (then ``providers[1:]``): every GPU provider gets ``gpu_provider_options`` for
    ``device`` (default: the device in use, else "cuda") under the caller's own options, and a GPU session
    uses IO binding (optimum turns it on only for the CUDA provider: without it the TensorRT provider's decode
    copies the whole KV cache between host and device at every step)."""
    providers = list(providers) if providers else [provider]
    if providers[0] != provider:
        raise ValueError(f"providers={providers} must start with provider={provider!r}")
    given = list(provider_options) if provider_options is not None else [{} for _ in providers]
    if len(given) != len(providers):
        raise ValueError(f"{len(given)} provider option dict(s) for {len(providers)} providers {providers}")
    on_gpu = provider in GPU_PROVIDERS
    if on_gpu and not str(device or "").startswith("cuda"):
        device = env.device() if env.device().startswith("cuda") else "cuda"
    options = [{**(gpu_provider_options(p, device) if on_gpu else {}), **dict(o)} for p, o in zip(providers, given)]
    args: dict[str, Any] = {"providers": providers, "provider_options": options}
    if on_gpu:
        args["use_io_binding"] = True
    return args


def ort_model(folder: Path, tokenizer: Any, provider: str, *, device: str | None = None,
              providers: Sequence[str] | None = None, provider_options: Sequence[dict[str, Any]] | None = None,
              session_options: Any = None) -> tuple[Any, list[str]]:
    """The one ONNX Runtime model builder: an ``ORTModelForCausalLM`` on ``folder`` whose session must run on
    ``provider`` (``providers``: it first, then what takes the operators it does not), on ``device``'s GPU for
    a GPU provider, with the options ``session_arguments`` sets. Returns (the model, the providers its session
    really got). A session that did not get ``provider`` raises ``ProviderFallback`` with the reason: its
    numbers would be another provider's."""
    from optimum.onnxruntime import ORTModelForCausalLM

    chosen = session_arguments(provider, device, providers, provider_options)
    if session_options is not None:
        chosen["session_options"] = session_options
    model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True, **chosen)
    got = session_providers(model)
    problem = check_providers(provider, got)
    if problem:
        raise ProviderFallback(problem)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, got


def load_ort(folder: Path, tokenizer: Any, device: str = "cpu") -> Any:
    """An ``ORTModelForCausalLM`` on ``folder`` with the provider ``device`` calls for, on that device (``ort_model``)."""
    return ort_model(folder, tokenizer, ort_provider(device), device=device)[0]

"""The exported ONNX model and its quantised forms, cached under ``LABKIT_CACHE``, and the providers a
session really got.

``export_onnx`` exports the model once (transformers' own exporter, ``transformers.exporters.OnnxExporter``: torch.export
then ``torch.onnx``), as one decoder graph with its KV cache in and out; ``quantize_onnx`` (dynamic int8) and ``quantize_nbits``
(MatMulNBits 4/8-bit blocks) quantise that export; each writes into a temporary folder and renames it, so an
interrupted run never leaves a half-written model. ``ort_provider`` picks the execution provider a device
asks for and ``check_providers`` compares it with the ones a session reports: a label comes from what ran.
``graph_ops`` / ``fused_ops`` / ``count_ops`` count a graph's operators.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import importlib.metadata
import importlib.util
import io
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
from .ort_decoder import OrtCausalLM

# ---------------------------------------------------------------- ONNX export and quantisation (cached)


def _version(package: str) -> str:
    """The version that names a cache folder: ``"none"`` when the package is not installed."""
    return env.version(package) or "none"


def onnx_root(model_name: str | None = None) -> Path:
    """The cache folder of one model's ONNX files: name plus a hash of its config and the exporter version."""
    path = models.resolve(model_name)
    cfg = Path(path) / "config.json"
    stamp = cfg.read_text(encoding="utf-8") if cfg.is_file() else path
    exporter = "\n".join([*(_version(p) for p in EXPORTER_PACKAGES), repr(sorted(EXPORT_OPTIONS.items())), GRAPH_FORM])
    digest = hashlib.sha1(f"{path}\n{stamp}\n{exporter}".encode()).hexdigest()[:10]
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
    """Silence exporter/quantiser chatter (tracer warnings, 'consider pre-processing', torch.onnx's progress lines)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
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


EXPORTER_PACKAGES = ("transformers", "torch", "onnxscript", "onnx-ir")  # what writes the graph: its versions name the cache
# The graph is written as traced, without onnxscript's rewrite pass: ONNX Runtime fuses at session creation (the
# optimisation levels notebook 08 measures), and the pass took 60 of a 145 s export on two cores. It names the cache.
EXPORT_OPTIONS = {"dynamic": True, "optimize": False}
GRAPH_FORM = "traced, node metadata stripped"  # what write_export does after the exporter: it names the cache too
# The sample a graph is traced on: a left-padded batch of two, continuing a cache, so batch, new tokens, past tokens and
# the attention mask all stay dynamic in the graph (a batch of one would fix the batch at 1).
SAMPLE_PROMPTS = ("The capital of France is", "Hi")


def exported_names(inputs: Sequence[str], outputs: Sequence[str]) -> dict[str, str]:
    """The graph's names as ``OrtCausalLM`` reads them, keyed by the exporter's: the cache of layer N comes in as
    ``past_key_values.N.key``/``.value`` and goes out as ``present.N.key``/``.value`` (the exporter writes
    ``input.past_key_values.layers.N.keys`` and ``output.past_key_values.layers.N.keys``); other names stay."""
    pattern = re.compile(r"^(input|output)\.past_key_values\.layers\.(\d+)\.(key|value)s$")
    renamed = {}
    for name in [*inputs, *outputs]:
        m = pattern.match(name)
        if m:
            side, layer, kind = m.groups()
            renamed[name] = f"{'past_key_values' if side == 'input' else 'present'}.{layer}.{kind}"
    return renamed


def name_dims(graph: Any) -> None:
    """Name the dynamic dimensions of an exported graph's inputs and outputs as readers expect them:
    ``batch_size``, ``sequence_length`` (new tokens), ``past_sequence_length`` and their sum; a size the exporter
    left symbolic although fixed (heads, head size: "3", "64") becomes that number. TensorRT's shape profiles
    (``labkit.engines.onnxruntime``) are built from these names."""
    import onnx_ir as ir

    values = {v.name: v for v in [*graph.inputs, *graph.outputs]}
    past = next(v for v in graph.inputs if v.name.startswith("past_key_values."))
    ids = values["input_ids"].shape
    names = {ids[0].value: "batch_size", ids[1].value: "sequence_length", past.shape[2].value: "past_sequence_length"}

    def named(dim: Any) -> Any:
        if isinstance(dim, int) or dim.value is None:
            return dim
        if dim.value.isdigit():
            return int(dim.value)
        return ir.SymbolicDim(re.sub(r"\bs\d+\b", lambda m: names.get(m.group(0), m.group(0)), dim.value))

    for value in values.values():
        value.shape = ir.Shape([named(d) for d in value.shape])
    if "attention_mask" in values:  # its own symbols in the trace; it covers past and new tokens
        values["attention_mask"].shape = ir.Shape(["batch_size", "past_sequence_length + sequence_length"])


def write_export(model: Any, tokenizer: Any, folder: Path) -> None:
    """Trace ``model``'s decode step (any number of new tokens after any number of cached ones, the prompt's
    prefill included) on the CPU in fp32 and write it with its config and tokenizer into ``folder``."""
    import torch
    from transformers.exporters import OnnxConfig, OnnxExporter
    from transformers.exporters.utils import decompose_prefill_decode

    tok = copy.copy(tokenizer)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    sample = dict(tok(list(SAMPLE_PROMPTS), return_tensors="pt", padding=True))
    with torch.inference_mode(False), torch.no_grad():
        # a decode that takes several tokens at once keeps the new-token axis dynamic: the same graph prefills
        decoder, inputs = decompose_prefill_decode(model, sample, multi_token_decode=True)["decode"]
        program = OnnxExporter().export(decoder, inputs, OnnxConfig(**EXPORT_OPTIONS))
    graph = program.model.graph
    renamed = exported_names([v.name for v in graph.inputs], [v.name for v in graph.outputs])
    for value in [*graph.inputs, *graph.outputs]:
        value.name = renamed.get(value.name, value.name)
    name_dims(graph)
    for node in graph.all_nodes():  # the tracer's notes (stack traces, FX names): most of the .onnx file, no weights
        node.metadata_props.clear()
    program.save(str(folder / "model.onnx"), external_data=True)
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def export_onnx(model_name: str | None = None, force: bool = False) -> tuple[Path, float | None]:
    """Export the model to ONNX (fp32, with KV cache) once; return (folder, seconds or None if cached)."""
    target = onnx_root(model_name) / "fp32"
    if _reuse(target, force):
        return target, None
    import torch
    from transformers import AutoModelForCausalLM

    t0 = timing.clock()
    with _atomic_dir(target) as tmp, quiet():
        model = AutoModelForCausalLM.from_pretrained(models.resolve(model_name), dtype=torch.float32).eval()
        write_export(model, models.load_tokenizer(model_name), tmp)
        del model
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
                "first, and check that onnxruntime-gpu's CUDA major matches torch's, see docs/gpu.md)")
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
    """The provider arguments of ``OrtCausalLM.from_pretrained`` for a session that runs on
    ``provider`` first (then ``providers[1:]``): every GPU provider gets ``gpu_provider_options`` for
    ``device`` (default: the device in use, else "cuda") under the caller's own options, and a GPU session
    uses IO binding (without it every decode step copies the whole KV cache between host and device)."""
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
    """The one ONNX Runtime model builder: an ``OrtCausalLM`` on ``folder`` whose session must run on
    ``provider`` (``providers``: it first, then what takes the operators it does not), on ``device``'s GPU for
    a GPU provider, with the options ``session_arguments`` sets. Returns (the model, the providers its session
    really got). A session that did not get ``provider`` raises ``ProviderFallback`` with the reason: its
    numbers would be another provider's."""
    chosen = session_arguments(provider, device, providers, provider_options)
    if session_options is not None:
        chosen["session_options"] = session_options
    model = OrtCausalLM.from_pretrained(folder, **chosen)
    got = session_providers(model)
    problem = check_providers(provider, got)
    if problem:
        raise ProviderFallback(problem)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, got


def load_ort(folder: Path, tokenizer: Any, device: str = "cpu") -> Any:
    """An ``OrtCausalLM`` on ``folder`` with the provider ``device`` calls for, on that device (``ort_model``)."""
    return ort_model(folder, tokenizer, ort_provider(device), device=device)[0]

"""What the libraries really do with a layer, checked against the hand-written quantisers.

ONNX Runtime's int8 matmul on one weight, bitsandbytes' int8 and NF4 layers, the operators each dispatches
to (``ops_called``) and the route that implies on this device (``bnb_route``), per-layer sensitivity, and an
audit of what ONNX Runtime's int8 export claims against the graph it wrote.
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core import env
from ..decoding import quality
from ..model.onnx import quiet, graph_ops
from .quantisers import fake_quant_activation, fake_quant_weight

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
    with tempfile.TemporaryDirectory() as tmp, quiet():
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
                wq = fake_quant_weight(module.weight.float(), per_channel, reduce_range).to(module.weight.dtype)

            def hook(mod: Any, args: tuple, out: Any, wq: Any = wq) -> Any:
                return F.linear(fake_quant_activation(args[0]), wq, mod.bias)

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
    rows = []
    for group in [*groups, "all"]:
        chosen = groups if group == "all" else (group,)
        with fake_dynamic_int8(model, chosen, per_channel=per_channel, reduce_range=reduce_range) as n:
            res = quality.compare(model, ref)
        rows.append({"layers": group, "n_layers": n, "per_channel": per_channel, "agreement": res.agreement,
                     "kl": res.kl})
    return rows


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
        with quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
            module(x)
    seen: dict[str, None] = {}
    for e in prof.events():
        seen.setdefault(e.name, None)
    return list(seen)


# the float matrix products a dequantise-then-multiply route dispatches (F.linear and what it calls)
FLOAT_MATMUL_OPS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm")


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
        if "bitsandbytes::gemm_4bit" in ops:
            # CUDA's gemm_4bit (backends/cuda/ops.py) picks a route per call: its fused kernel for a few input rows
            # (always at most 4, up to a per-GPU limit beyond), else a dequantised copy and a float matmul (F.linear)
            if any(o in ops for o in FLOAT_MATMUL_OPS):
                return ("bitsandbytes::gemm_4bit took its dequantise + matmul route: the weight is dequantised to a "
                        "full-precision copy, then multiplied by a float matmul (F.linear) — every call rebuilds it")
            return ("bitsandbytes::gemm_4bit took its fused route: one kernel decodes the 4-bit codes inside the "
                    "matrix product (as for a decode step's few rows); no full-precision copy of the weight is built")
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

    def int8_ops(folder: Path) -> int:
        return sum(n for op, n in graph_ops(folder / "model.onnx").items() if op in INT8_OPS)

    rows = []
    with quiet():
        how, _ = _outcome(lambda: ort.InferenceSession(str(fp32_folder / "model.onnx"), use_quantized=True,
                                                       providers=["CPUExecutionProvider"]))
    rows.append({"source": "article", "call": 'ort.InferenceSession("model.onnx", use_quantized=True)',
                 "what it does here": how + (f"; the session runs the fp32 graph ({int8_ops(fp32_folder)} int8 "
                                             "operators): the argument was accepted and ignored" if how == "ran" else "")})
    with tempfile.TemporaryDirectory() as tmp, quiet():
        how, _ = _outcome(lambda: quantize_dynamic(fp32_folder / "model.onnx", Path(tmp) / "q.onnx",
                                                   use_quantized=True))
    rows.append({"source": "article", "call": 'quantize_dynamic("model.onnx", "q.onnx", use_quantized=True)',
                 "what it does here": how})
    params = list(inspect.signature(quantize_dynamic).parameters)
    rows.append({"source": "real", "call": "quantize_dynamic(src, dst, per_channel=…, reduce_range=…, "
                                           "weight_type=QuantType.QInt8)  # what labkit.precision.variants runs",
                 "what it does here": f"{int8_ops(int8_folder)} int8 operators in the cached result "
                                      f"({int8_folder.name}); its parameters: {', '.join(params)}"})
    try:
        from optimum.onnxruntime import ORTQuantizer  # noqa: F401
        from optimum.onnxruntime.configuration import AutoQuantizationConfig

        qparams = list(inspect.signature(AutoQuantizationConfig.avx512_vnni).parameters)
        optimum_row = ("exists (not run here: labkit.precision.variants calls quantize_dynamic directly); "
                       f"AutoQuantizationConfig.avx512_vnni takes {', '.join(qparams)}")
    except ImportError:
        optimum_row = ("not in the lab's environment: optimum-onnx 0.1 caps transformers below 4.58; "
                       "labkit.precision.variants calls quantize_dynamic directly")
    rows.append({"source": "real", "call": "ORTQuantizer.from_pretrained(folder).quantize("
                                           "AutoQuantizationConfig.avx512_vnni(is_static=False), save_dir)",
                 "what it does here": optimum_row})
    return rows


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


def bnb_state_tensors(model: Any) -> list[Any]:
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

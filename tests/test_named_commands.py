"""Every command the project tells a reader to run exists: ``python -m X`` names a module of the checkout (or an
installed one), ``python path/to/file.py`` a file that is not inside a package (a package's module runs as
``python -m``), ``make TARGET`` a target of the Makefile, and ``labkit SUB`` / ``python -m labkit SUB`` a command
``labkit/__main__.py`` declares. Read in the docs, the README, the Makefile, the solutions, the notebook sources
and the docstrings and messages of labkit, tools and bench."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from labkit import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("labkit", "tools", "bench")  # packages of the checkout: a module of theirs must be a file here
# modules of other environments, never installed in the lab's own (.venv-vllm, .venv-clients, .venv-llmc)
OUTSIDE = {"vllm", "aiperf", "guidellm", "llmcompressor"}

PYTHON = re.compile(r"(?:^|(?<=[\s`\"'(]))(?:[\w./$()\"-]*/)?(?:python3?(?:\.\d+)?|\$\((?:ENV_)?PY\)|\"\$V\")"
                    r"\s+(?:-m\s+(?P<module>[\w.]+)(?:\s+(?P<sub>[a-z][\w-]*))?|(?P<script>[\w./-]+\.py)\b)")
SPAN = re.compile(r"`([^`\n]+)`")
BARE_SCRIPT = re.compile(r"^((?:[\w.-]+/)+[\w-]+\.py)\s+\S")  # `tools/x.py --flag`: a file named as a command
MAKE = re.compile(r"^make\s+(.*)")
LABKIT = re.compile(r"^labkit\s+([a-z][\w-]*)")
TARGET = re.compile(r"^([\w./$()-]+(?:[ \t]+[\w./$()-]+)*)[ \t]*:(?![=:])", re.M)


def sources() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "Makefile", ROOT / ".ci" / "run", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "notebooks" / "solutions").glob("*.py")),
             *sorted((ROOT / "notebooks" / "src").glob("*.py")), *sorted((ROOT / "tools").glob("*.sh")),
             *(p for pkg in PROJECT for p in sorted((ROOT / pkg).rglob("*.py")))]
    assert len(found) > 200, f"the scan must see the sources (found {len(found)})"
    return found


def snippets(text: str) -> list[str]:
    """Where a command can stand: code spans, fenced blocks' lines, a Makefile's ``@echo`` help lines."""
    fenced = [line.strip() for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S) for line in block.splitlines()]
    echoed = re.findall(r"^\t@echo \"(.*)\"$", text, re.M)
    return SPAN.findall(text) + fenced + echoed


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {t for group in TARGET.findall(text) for t in group.split() if "$" not in t and "/" not in t}


def commands() -> set[str]:
    return set(cli.COMMANDS) | set(cli.OWN_ARGUMENTS)


def module_file(module: str) -> Path | None:
    """The file ``python -m module`` runs in the checkout, or None."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__main__.py"):
        if path.is_file():
            return path
    return None


def in_a_package(path: Path) -> bool:
    return (path.parent / "__init__.py").is_file()


def make_words(rest: str) -> list[str]:
    """The targets of ``make <rest>``: every word when the rest is a command line (targets, VAR=value, options),
    else the first alone (``make test needs npm …`` quotes a message)."""
    rest = re.split(r"\s{2,}|#|;|&&|\||->", rest)[0]  # a help line's or a code line's comment, a second command
    rest = re.sub(r"\b[A-Z_]+=(?:\"[^\"]*\"|'[^']*'|\S*)", "", rest)
    words = [w for w in rest.split() if not w.startswith("-")]
    named = [bool(re.fullmatch(r"[a-z][\w-]*", w)) for w in words]
    if not words or not named[0]:
        return []  # a placeholder: make TARGET, make {target}
    return words if all(named) else words[:1]


def problems(text: str, targets: set[str], subcommands: set[str]) -> list[str]:
    """What in ``text`` names a command that does not exist, each with its fix."""
    bad = []
    for m in PYTHON.finditer(text):
        module, sub, script = m.group("module"), m.group("sub"), m.group("script")
        if module and (not module.islower() or module.endswith(".")):
            continue  # a placeholder: python -m tools.NAME, python -m bench.$$b
        if module:
            top = module.split(".")[0]
            if top in PROJECT and module_file(module) is None:
                bad.append(f"python -m {module}: no {module.replace('.', '/')}.py or __main__.py in the checkout")
            elif top not in PROJECT and top not in OUTSIDE and importlib.util.find_spec(top) is None:
                bad.append(f"python -m {module}: no module {top} in the checkout or installed here")
            elif module == "labkit" and sub and sub not in subcommands:
                bad.append(f"python -m labkit {sub}: labkit has no command {sub!r}; choose from {sorted(subcommands)}")
        else:
            path = ROOT / script
            if not path.is_file():
                bad.append(f"python {script}: no such file in the checkout")
            elif in_a_package(path):
                name = script.removesuffix(".py").replace("/", ".")
                bad.append(f"python {script}: a package's module; run it as `python -m {name}`")
    for snippet in snippets(text):
        snippet = snippet.strip()
        if (m := BARE_SCRIPT.match(snippet)) and (ROOT / m.group(1)).is_file():
            name = m.group(1).removesuffix(".py").replace("/", ".")
            bad.append(f"{snippet}: a file named as a command; write `python -m {name}`")
        if m := MAKE.match(snippet):
            bad += [f"make {word}: no such target in the Makefile" for word in make_words(m.group(1))
                    if word not in targets]
        if (m := LABKIT.match(snippet)) and m.group(1) not in subcommands:
            bad.append(f"labkit {m.group(1)}: labkit has no command {m.group(1)!r}; choose from {sorted(subcommands)}")
    return bad


def test_every_named_command_exists():
    targets, subcommands = make_targets(), commands()
    assert {"lab", "test", "setup", "bench", "reference"} <= targets, "the Makefile's targets must be read"
    found = [f"{path.relative_to(ROOT)}: {p}" for path in sources()
             for p in problems(path.read_text(encoding="utf-8"), targets, subcommands)]
    assert not found, "commands that do not exist as written:\n" + "\n".join(found)


@pytest.mark.parametrize("text, expected", [
    ("# run with `python tools/run_notebooks.py --only 01 --solutions`", "python -m tools.run_notebooks"),
    ("(run by `tools/run_notebooks.py --solutions`)", "python -m tools.run_notebooks"),
    ("python bench/nothing_here.py", "no such file"),
    ("flock /tmp/x.lock .venv/bin/python bench/trust.py --trials 3", "python -m bench.trust"),
    ("python -m tools.run_notebook --only 01", "no tools/run_notebook.py"),
    ("`python -m labkit serv --model x`", "no command 'serv'"),
    ("`labkit sizes MODEL`", "no command 'sizes'"),
    ("`make refrence NOTEBOOKS=07`", "make refrence"),
    ("`make setup vllm clinets WHEELS=DIR`", "make clinets"),
    ("python -m labkt info", "no module labkt"),
])
def test_a_wrong_name_is_caught(text, expected):
    found = problems(text, make_targets(), commands())
    assert len(found) == 1 and expected in found[0], found


def test_right_names_pass():
    text = ("`python -m tools.run_notebooks --only 01 --solutions`, `python -m tools.slides`, `labkit serve`, "
            "`make setup vllm clients WHEELS=DIR`, `make reference NOTEBOOKS=\"07 09\"`, "
            "`python -m labkit size MODEL`, `python -m vllm.entrypoints.openai.api_server`, `python -m bench.trust`")
    assert problems(text, make_targets(), commands()) == []

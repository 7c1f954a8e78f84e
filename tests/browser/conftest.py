"""Fixtures for the real-browser tests: Debian's chromium driven by Playwright, network blocked.

Tests marked ``browser`` run under ``make test-browser`` (which sets LABKIT_BROWSER_TESTS=1,
installs chromium when missing and builds the decks first); a plain ``pytest tests`` skips
them with that reason. Screenshots land in build/screenshots/ for a human to look at.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BUILD = ROOT / "build"
SCREENSHOTS = BUILD / "screenshots"
CHROMIUM = Path(os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ENABLE_ENV = "LABKIT_BROWSER_TESTS"
LAB_START_TIMEOUT_S = 120


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives a real chromium (make test-browser)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENABLE_ENV, "") == "1":
        return
    skip = pytest.mark.skip(reason=f"real-browser test: run `make test-browser` (sets {ENABLE_ENV}=1)")
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(skip)


def screenshot_path(name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / f"{name}.png"


# plotly's 'notebook' renderer puts a MathJax <script src=cdnjs...> in every figure's HTML (needed
# only for LaTeX in plot labels). In JupyterLab it fails offline without harm; the decks strip it.
PLOTLY_MATHJAX_CDN = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/"


@dataclass
class NetworkLog:
    """Every request the page made; anything not file://, data:, blob: or 127.0.0.1 was aborted."""
    allowed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def blocked_except_plotly_mathjax(self) -> list[str]:
        return [u for u in self.blocked if not u.startswith(PLOTLY_MATHJAX_CDN)]


def _is_local(url: str) -> bool:
    return url.startswith(("file://", "data:", "blob:", "http://127.0.0.1:", "ws://127.0.0.1:", "about:"))


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (apt-get install -y chromium, as root)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def offline_page(browser):
    """A page whose every non-local request is aborted and logged; page errors are collected."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    log = NetworkLog()

    def route(r) -> None:
        url = r.request.url
        if _is_local(url):
            log.allowed.append(url)
            r.continue_()
        else:
            log.blocked.append(url)
            r.abort()

    context.route("**", route)
    page = context.new_page()
    page.errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))  # type: ignore[attr-defined]
    page.network = log  # type: ignore[attr-defined]
    yield page
    context.close()


@pytest.fixture(scope="session")
def slides_dir() -> Path:
    """build/slides as `make slides` made it; built here (running missing notebooks) when absent."""
    out = BUILD / "slides"
    if not (out / "decks.json").is_file():
        from tools.slides import build

        build.build()
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT
    token: str
    root: Path
    log: Path

    def open_url(self, notebook: str) -> str:
        # reset: a fresh layout each time, so a notebook left open by an earlier test is not restored beside it
        return f"{self.url}/lab/tree/{notebook}?reset&token={self.token}"


def _lab_settings(settings_dir: Path) -> None:
    """Every cell attached to the DOM (the test finds cells by text), no news or update checks."""
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                            "checkForUpdates": False},
    }
    for rel, data in files.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1 (free port, random token) over a scratch folder: notebooks are
    copied there, so nothing the test runs or autosaves touches the repository."""
    base = tmp_path_factory.mktemp("lab")
    root, settings = base / "root", base / "settings"
    root.mkdir()
    _lab_settings(settings)
    token = secrets.token_hex(16)
    env = {**os.environ, "LABKIT_QUICK": "1", "LABKIT_RESULTS": str(base / "results"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(base / "runtime")}
    log_path = base / "jupyterlab.log"
    last_error = ""
    for _attempt in range(3):  # a port taken between picking and binding: pick another
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                 f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                 f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                 "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
                 *(["--allow-root"] if os.geteuid() == 0 else [])],
                cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + LAB_START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        if proc.poll() is None and time.monotonic() < deadline:
            break
        last_error = log_path.read_text(encoding="utf-8")[-2000:]
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    else:
        pytest.fail(f"JupyterLab did not start on 127.0.0.1:\n{last_error}")
    try:
        yield LabServer(url=url, token=token, root=root, log=log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def copy_notebook(src: Path, lab: LabServer) -> str:
    shutil.copy2(src, lab.root / src.name)
    return src.name

"""One ``vllm serve`` for the room: ``LABKIT_SERVER_URL`` points every laptop's vLLM load at the instructor's GPU box.

A room with one GPU machine starts one OpenAI-compatible server there (docs/instructor.md, "One GPU server for the
room") and each laptop sets ``LABKIT_SERVER_URL=http://HOST:PORT``. ``server_url()`` is the one reader of that
variable: it checks the text is ``http(s)://host:port`` and nothing more. ``shared_server()`` then asks the server
``/health`` and ``/v1/models`` and returns its URL with the model it serves; unset, it returns None and every cell
runs as before. A bad or silent URL raises ``SharedServerError`` naming the fix.

What it replaces: the cells that would start a local ``vllm serve`` only to put load on it (notebooks 06 and 09).
The lab's own servers, whose settings are the lesson, and comparisons that need servers started with different
flags stay on this machine (``local_only`` gives the one line that says so).

Numbers measured against it are another machine's, under the whole room's load: ``SharedServer.label`` and
``SharedServer.provenance`` say so, so no row reads as this laptop's.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV = "LABKIT_SERVER_URL"
GUIDE = 'docs/instructor.md, "One GPU server for the room"'
ELSEWHERE = "its hardware is not this machine's"
MEMORY_NOTE = "the shared server's memory is on its own machine: not readable from here"


class SharedServerError(ValueError):
    """``LABKIT_SERVER_URL`` is malformed, or the server there does not answer as ``vllm serve`` does; the message
    names the fix."""


@dataclass(frozen=True)
class SharedServer:
    """The room's server as this laptop sees it: its base URL, the model it reports at ``/v1/models`` and its
    version (``/version``; None where it has none)."""

    url: str
    model: str
    version: str | None = None

    @property
    def label(self) -> str:
        """The row label for numbers measured against it: never to be read as this machine's."""
        return f"vllm serve on the shared server at {self.url}, {self.model} ({ELSEWHERE})"

    def provenance(self) -> dict[str, Any]:
        """What a results file records about where the numbers were made."""
        return {"where": f"shared server at {self.url} ({ELSEWHERE}; the room's other load shares it)",
                "server_url": self.url, "served_model": self.model, "server_version": self.version}

    def platform(self) -> dict[str, Any]:
        """The fields a local ``vllm serve``'s ``platform()`` gives, as far as HTTP tells them."""
        return {"version": self.version, "platform": f"shared server at {self.url}", "attention_backend": None,
                "kernel_library": None, "isa": None, **self.provenance()}


def server_url(environ: Mapping[str, str] | None = None) -> str | None:
    """``LABKIT_SERVER_URL`` checked as text (no network): ``http(s)://host:port`` without a trailing slash, or
    None when unset or empty."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    example = f"e.g. {ENV}=http://192.168.1.20:8000"
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SharedServerError(f"{ENV}={raw!r}: give the server's address as http://HOST:PORT ({example}), "
                                f"or unset {ENV} to run every server on this machine")
    try:
        port = parts.port
    except ValueError:
        raise SharedServerError(f"{ENV}={raw!r}: the port must be a number from 1 to 65535 ({example})") from None
    if port is None:
        raise SharedServerError(f"{ENV}={raw!r}: add the port vllm serve listens on ({example}; vllm serve's "
                                "default is 8000)")
    root = f"{parts.scheme}://{parts.netloc}"
    if parts.path.rstrip("/") or parts.query or parts.fragment:
        raise SharedServerError(f"{ENV}={raw!r}: give the server's root, {root}, without "
                                f"{raw[len(root):]!r}: labkit adds /v1/completions and the other paths itself")
    return root


def _get(url: str, path: str, timeout_s: float) -> tuple[int, bytes]:
    """(HTTP status, body) of GET ``url + path``; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def probe(url: str, timeout_s: float = 5.0) -> SharedServer:
    """Ask the server at ``url`` whether it serves: ``/health`` (vLLM's; a server without it is asked
    ``/v1/models`` alone), then the model id from ``/v1/models`` and the version from ``/version``."""
    unset = f"or unset {ENV} to run every server on this machine"
    try:
        health, _ = _get(url, "/health", timeout_s)
        if health not in (200, 404):
            raise SharedServerError(f"{ENV}={url}: /health answered HTTP {health}, so its engine is not ready: ask "
                                    f"the instructor to check vllm serve's log, {unset}")
        status, body = _get(url, "/v1/models", timeout_s)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SharedServerError(f"{ENV}={url} did not answer ({reason}): is vllm serve running there with "
                                f"--host 0.0.0.0, and does this laptop reach that address ({GUIDE})? "
                                f"Else {unset}") from None
    try:
        models = json.loads(body).get("data") if status == 200 else None
    except (ValueError, AttributeError):
        models = None
    if not models or not isinstance(models, list) or not isinstance(models[0], dict) or "id" not in models[0]:
        raise SharedServerError(f"{ENV}={url}: /v1/models answered HTTP {status} without a model list, so this is "
                                f"not an OpenAI-compatible server: point it at vllm serve ({GUIDE}), {unset}")
    return SharedServer(url=url, model=str(models[0]["id"]), version=_version(url, timeout_s))


def _version(url: str, timeout_s: float) -> str | None:
    try:
        status, body = _get(url, "/version", timeout_s)
        return str(json.loads(body).get("version")) if status == 200 else None
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None


def shared_server(environ: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> SharedServer | None:
    """The room's server from ``LABKIT_SERVER_URL``, checked and asked what it serves; None when unset."""
    url = server_url(environ)
    return None if url is None else probe(url, timeout_s)


def local_only(what: str, why: str, environ: Mapping[str, str] | None = None) -> str | None:
    """With ``LABKIT_SERVER_URL`` set: the one line saying ``what`` stays on this machine, and ``why``;
    None when unset (nothing to say)."""
    url = server_url(environ)
    return None if url is None else f"{what} stays on this machine, not on the shared server at {url}: {why}."

"""The server's options and the OpenAI wire format, without a network: ``ServerConfig`` (checked on
construction), ``parse_body`` (one request body into ``Params``, or an ``ApiError`` naming the field),
``Detokenizer`` (token ids into text that never splits a UTF-8 character) and ``StopText`` (stop strings
that may arrive split across tokens). A ``response_format`` (json_schema, json_object or text) is checked here,
schema included (``decoding.grammar.check_schema``), and kept on ``Params`` as a ``decoding.grammar.ResponseFormat``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ..decoding.sampling import Sampling
from ..decoding.grammar import ResponseFormat, check_schema

TINY_RANDOM = "tiny-random"  # a 2-layer random Llama with the default tokenizer: fast tests, nonsense text
DEFAULT_HOST = "127.0.0.1"
BATCHING = ("dynamic", "continuous")


# ---------------------------------------------------------------------------------------------- config


@dataclass
class ServerConfig:
    """Everything the server can be told. Validated by ``check()``."""

    model: str | None = None  # None/'default', a directory, a hub id, or 'tiny-random'
    dtype: str = "fp32"
    host: str = DEFAULT_HOST
    port: int = 8000  # 0: an ephemeral port, reported back
    max_batch_size: int = 8
    max_wait_ms: float = 20.0  # how long the oldest queued request may wait for others to join
    max_queue: int = 256  # requests waiting beyond this get 503
    max_tokens_limit: int = 1024  # a request asking for more tokens gets 400
    default_max_tokens: int = 64  # when a request does not say
    max_prompt_tokens: int = 2048  # a longer prompt gets 400
    drop_finished: bool = True  # False: finished sequences ride along until the longest one ends
    drain_s: float = 10.0  # on shutdown, how long running requests may finish before they get an error
    max_body_bytes: int = 1 << 20  # a larger request body gets 413
    batching: str = "dynamic"  # dynamic: wait up to max_wait_ms, decode a batch to its end; continuous: join at every step
    prefix_cache_tokens: int = 0  # continuous only: KV positions of prompt prefixes kept for reuse (0: off)
    prefill_chunk_tokens: int = 0  # continuous only: prompt tokens prefilled per step (0: a whole prompt at once)
    prefix_cache_disk_dir: str | None = None  # with a prefix cache: evicted entries go to files here, read back on a hit

    def check(self) -> "ServerConfig":
        for name in ("max_batch_size", "max_queue", "max_tokens_limit", "default_max_tokens", "max_prompt_tokens",
                     "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port!r}: must be 0 (any free port) to 65535")
        if not isinstance(self.max_wait_ms, (int, float)) or self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms={self.max_wait_ms!r}: must be 0 or more milliseconds")
        if not isinstance(self.drain_s, (int, float)) or self.drain_s < 0:
            raise ValueError(f"drain_s={self.drain_s!r}: must be 0 or more seconds")
        if self.batching not in BATCHING:
            raise ValueError(f"batching={self.batching!r}: choose one of {list(BATCHING)}")
        for name in ("prefix_cache_tokens", "prefill_chunk_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}: must be 0 (off) or a positive integer")
            if value and self.batching != "continuous":
                raise ValueError(f"{name} needs batching='continuous' (the dynamic batcher prefills whole batches)")
        if self.prefix_cache_disk_dir is not None and not self.prefix_cache_tokens:
            raise ValueError("prefix_cache_disk_dir is the prefix cache's second tier: turn the cache on too "
                             "(prefix_cache_tokens > 0, batching='continuous')")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"default_max_tokens={self.default_max_tokens} exceeds max_tokens_limit="
                             f"{self.max_tokens_limit}; lower it or raise the limit")
        return self


def server_config(**kwargs: Any) -> ServerConfig:
    names = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ValueError(f"unknown server option(s) {unknown}; choose from {sorted(names)}")
    return ServerConfig(**kwargs).check()


# ---------------------------------------------------------------------------------------- validation


class ApiError(Exception):
    """A request the server refuses: HTTP status plus an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def kind(self) -> str:
        if self.status == 503:
            return "service_unavailable"
        if self.status == 413:
            return "request_too_large"
        if self.status == 404:
            return "not_found"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class Params:
    """A validated generation request."""

    chat: bool
    prompt: str | None = None
    prompt_ids: list[int] | None = None  # a completions prompt sent as token ids (OpenAI's array of integers)
    messages: list[dict[str, str]] | None = None
    max_tokens: int = 64
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False  # vLLM's extension: each streamed chunk carries its token ids
    model: str | None = None
    sampling: Sampling | None = None  # None: greedy
    stop: list[str] = field(default_factory=list)
    response_format: ResponseFormat | None = None  # None: free text


_ROLES = ("system", "user", "assistant")
MAX_STOP = 4  # as the OpenAI API
# what this server does with every request parameter it knows; anything else is refused by name
_ACCEPTED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n",
             "temperature", "top_p", "seed", "stop", "ignore_eos", "return_token_ids", "response_format",
             "user", "metadata"}  # the last two only label a request: they change no output
# parameters the API defines that this server does not implement: refused unless they ask for the default
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {},
                                         "logprobs": None, "top_logprobs": None, "best_of": 1, "echo": False,
                                         "suffix": None, "tools": None, "tool_choice": None, "functions": None,
                                         "function_call": None}


def _number(body: dict[str, Any], name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not (low < value if low_open else low <= value) or value > high:
        lo = f"above {low:g}" if low_open else f"from {low:g}"
        raise ApiError(400, f"'{name}' must be a number {lo} to {high:g}, got {json.dumps(value)[:40]}", name)
    return float(value)


def _sampling(body: dict[str, Any]) -> Sampling | None:
    """Greedy when the request sets none of temperature, top_p and seed (or temperature 0); otherwise
    sampled, with OpenAI's default temperature of 1 where only top_p or seed is given."""
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63):
        raise ApiError(400, "'seed' must be an integer (a 64-bit one)", "seed")
    if temperature is None and top_p is None and seed is None:
        return None
    if temperature == 0:
        return None  # greedy: top_p and seed cannot change an argmax
    return Sampling(temperature=1.0 if temperature is None else temperature,
                    top_p=1.0 if top_p is None else top_p, seed=seed)


def _stop(value: Any) -> list[str]:
    """'stop': a string or a list of up to MAX_STOP non-empty strings."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops) or len(stops) > MAX_STOP:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return [_utf8_text(x, "stop") for x in stops]


_FORMAT_TYPES = ("json_schema", "json_object", "text")
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name


def _only(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(set(value) - set(allowed))
    if extra:
        raise ApiError(400, f"unknown field {where}.{extra[0]}; {where} takes {list(allowed)}", f"{where}.{extra[0]}")


def _response_format(value: Any) -> ResponseFormat | None:
    """OpenAI's response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"?,
    "description"?}}, {"type": "json_object"} (any JSON object) or {"type": "text"} (no constraint)."""
    where = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, f"'{where}' must be an object like {{\"type\": \"json_schema\", \"json_schema\": "
                            "{\"name\": ..., \"schema\": {...}}}", where)
    kind = value.get("type")
    if kind not in _FORMAT_TYPES:
        raise ApiError(400, f"{where}.type must be one of {list(_FORMAT_TYPES)}, got {json.dumps(kind)[:40]}",
                       f"{where}.type")
    if kind != "json_schema":
        _only(value, ("type",), where)
        return ResponseFormat.json_object() if kind == "json_object" else None
    _only(value, ("type", "json_schema"), where)
    spec = value.get("json_schema")
    where += ".json_schema"
    if not isinstance(spec, dict):
        raise ApiError(400, f"{where} is required with type 'json_schema' and must be an object like {{\"name\": \"answer\", "
                            "\"schema\": {\"type\": \"object\", ...}}", where)
    _only(spec, ("name", "description", "schema", "strict"), where)
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise ApiError(400, f"{where}.name is required: 1 to 64 letters, digits, '_' or '-'", f"{where}.name")
    if not isinstance(spec.get("description", ""), str):
        raise ApiError(400, f"{where}.description must be a string", f"{where}.description")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, f"{where}.strict must be true, false or null", f"{where}.strict")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise ApiError(400, f"{where}.schema must be a JSON Schema object like {{\"type\": \"object\", "
                            f"\"properties\": {{...}}}}, got {json.dumps(schema)[:40]}", f"{where}.schema")
    fmt = ResponseFormat.json_schema(schema, name=name, strict=strict)
    try:
        check_schema(fmt.schema)
    except ValueError as exc:
        raise ApiError(400, f"{where}.schema cannot be turned into a grammar (xgrammar: {exc}); fix or simplify "
                            "the schema", f"{where}.schema") from None
    except RuntimeError as exc:  # xgrammar is not installed
        raise ApiError(400, f"{where}: structured outputs are not available on this server ({exc})", where) from None
    return fmt


def _refuse_unsupported(body: dict[str, Any], chat: bool) -> None:
    """No parameter is silently ignored: one this server does not implement gets a 400 naming it."""
    for name, default in _UNSUPPORTED_DEFAULTS.items():
        value = body.get(name)
        if name == "logprobs" and value is False:
            continue
        if value is not None and value != default:
            raise ApiError(400, f"'{name}' is not supported by this server; leave it out", name)
    unknown = sorted(set(body) - _ACCEPTED - set(_UNSUPPORTED_DEFAULTS))
    if unknown:
        raise ApiError(400, f"unknown parameter '{unknown[0]}' for /v1/{'chat/' if chat else ''}completions; "
                            f"this server accepts {sorted(_ACCEPTED)}", unknown[0])


def _utf8_text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} is not valid UTF-8 text (it holds an unpaired surrogate escape)",
                       param) from None
    return value


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or a list of {'type': 'text', 'text': ...} parts."""
    if isinstance(value, str):
        return _utf8_text(value, where)
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return _utf8_text("".join(p["text"] for p in value), where)
    raise ApiError(400, f"{where} must be a string (or a list of text parts)", where)


def parse_body(raw: bytes, chat: bool, cfg: ServerConfig) -> Params:
    """Validate a request body; raise ``ApiError`` (4xx) naming the field and the fix."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    p = Params(chat=chat, max_tokens=cfg.default_max_tokens)
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "'messages' is required: a non-empty list of {'role': ..., 'content': ...}",
                           "messages")
        p.messages = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in _ROLES:
                raise ApiError(400, f"messages[{i}] needs a 'role' out of {list(_ROLES)}", f"messages[{i}].role")
            p.messages.append({"role": m["role"], "content": _content(m.get("content"), f"messages[{i}].content")})
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            p.prompt_ids = [int(i) for i in prompt]  # token ids, sent as they are (checked against the vocabulary later)
        elif not isinstance(prompt, str):
            raise ApiError(400, "'prompt' is required: one string, or one list of token ids (this server takes one "
                                "prompt per request)", "prompt")
        else:
            p.prompt = _utf8_text(prompt, "prompt")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise ApiError(400, f"'{key}' must be an integer, got {json.dumps(max_tokens)[:40]}", key)
        if not 1 <= max_tokens <= cfg.max_tokens_limit:
            raise ApiError(400, f"'{key}'={max_tokens}: must be between 1 and {cfg.max_tokens_limit}", key)
        p.max_tokens = max_tokens
    for name in ("stream", "ignore_eos", "return_token_ids"):
        value = body.get(name, False)
        if value is not None and not isinstance(value, bool):
            raise ApiError(400, f"'{name}' must be true or false", name)
        setattr(p, name, bool(value))
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
            raise ApiError(400, "'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
        p.include_usage = bool(opts.get("include_usage", False))
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError(400, "'n' must be 1: this server returns one choice per request", "n")
    p.sampling = _sampling(body)
    p.stop = _stop(body.get("stop"))
    p.response_format = _response_format(body.get("response_format"))
    if p.response_format is not None and p.ignore_eos:
        raise ApiError(400, "'ignore_eos' cannot be combined with a response_format (the answer ends where its JSON "
                            "does); leave ignore_eos out", "ignore_eos")
    _refuse_unsupported(body, chat)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", "model")
    p.model = model
    return p


# ------------------------------------------------------------------------------------------ the server


class Detokenizer:
    """Text deltas from a growing list of token ids, never splitting a multi-byte character."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # start of the window decoded for context
        self.read = 0  # tokens already turned into text

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tok.decode(self.ids[start:end], skip_special_tokens=True)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._text(self.prefix, self.read)
        after = self._text(self.prefix)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
        before = self._text(self.prefix, self.read)
        after = self._text(self.prefix)
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class StopText:
    """The text of a growing answer, cut at the first OpenAI ``stop`` string (which is not part of it).

    ``add(token)`` returns the text that can be sent now: a tail that might be the start of a stop string
    is held back until the next token shows whether it is. ``stopped`` turns True when one completed.
    """

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.detok = Detokenizer(tokenizer)
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def add(self, token: int) -> str:
        return self._release(self.detok.add(token))

    def finish(self) -> str:
        """After the last token: whatever is still held (no stop string can complete any more)."""
        text = self._release(self.detok.flush())
        if self.stopped:
            return text
        text, self.held = text + self.held, ""
        return text

    def _release(self, delta: str) -> str:
        if self.stopped:
            return ""
        text = self.held + delta
        hits = [text.find(s) for s in self.stops if s in text]
        if hits:
            self.stopped, self.held = True, ""
            return text[:min(hits)]
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

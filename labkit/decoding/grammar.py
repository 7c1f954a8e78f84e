"""Structured outputs on the lab's server: an answer that is JSON following a schema, by construction.

``ResponseFormat`` is a parsed OpenAI ``response_format`` (``json_schema`` or ``json_object``); ``check_schema``
says whether xgrammar can turn a JSON Schema into a grammar (the reason becomes the request's 400).
``grammars(tokenizer, vocab_size)`` is the ``GrammarCache`` of one tokenizer: it compiles a format once and
hands back the same ``Grammar`` afterwards (``Grammar.compile_s``: what the first call cost; ``hits`` and
``misses`` count the calls). ``Constraint`` is one sequence's ``xgrammar.GrammarMatcher``: ``mask`` sets every
token that would leave the grammar to -inf in that sequence's row of logits, ``accept`` advances the matcher by
the token chosen. End-of-sequence is allowed only once the JSON is complete, and then it is the only choice.

Masks are applied with xgrammar's CPU kernel on CPU logits and with its plain-torch kernel elsewhere (no Triton).
JSON is written compactly (no free whitespace): a small model cannot wander into runs of blanks.
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..core.checks import positive
from ..core.timing import clock

KINDS = ("json_schema", "json_object")
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # response_format json_object: any JSON object (as vLLM reads it)
# how every schema becomes a grammar: one line, ", " and ": " separators, no properties beyond the schema's
JSON_OPTIONS: dict[str, Any] = {"any_whitespace": False, "strict_mode": True}
MAX_GRAMMARS = 64  # compiled grammars kept per tokenizer; the least recently used goes first
_XGR_PREFIX = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+:\d+:\s*")  # "[21:59:00] /project/cpp/x.cc:123: " before the reason


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise RuntimeError("structured outputs need xgrammar: pip install xgrammar") from None
    return xgrammar


def xgrammar_reason(exc: BaseException) -> str:
    """xgrammar's error message without its C++ source location: the part that names what is wrong."""
    text = str(exc).strip() or type(exc).__name__
    return _XGR_PREFIX.sub("", text.splitlines()[0] if text else text).strip() or text


@dataclass(frozen=True)
class ResponseFormat:
    """A parsed ``response_format`` that constrains the answer (``{"type": "text"}`` is no constraint: None)."""

    kind: str  # json_schema | json_object
    schema: str  # the JSON Schema as compact JSON text, key order kept (properties are written in that order)
    name: str | None = None
    strict: bool | None = None  # accepted as OpenAI sends it; the schema is always enforced strictly

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: choose one of {list(KINDS)}")

    @property
    def key(self) -> tuple[str, str]:
        """What makes two formats the same grammar."""
        return self.kind, self.schema

    @classmethod
    def json_schema(cls, schema: dict[str, Any], name: str | None = None, strict: bool | None = None) -> "ResponseFormat":
        if not isinstance(schema, dict):
            raise ValueError(f"schema must be a JSON object (a dict), got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, ensure_ascii=False, separators=(",", ":")), name, strict)

    @classmethod
    def json_object(cls) -> "ResponseFormat":
        return cls("json_object", JSON_OBJECT_SCHEMA)


@lru_cache(maxsize=256)
def _check(schema: str) -> None:
    xgr = _xgr()
    try:
        xgr.Grammar.from_json_schema(schema, **JSON_OPTIONS)
    except Exception as exc:  # xgrammar raises RuntimeError with the converter's reason; any failure is a refusal
        raise ValueError(xgrammar_reason(exc)) from None


def check_schema(schema: str) -> None:
    """Raise ``ValueError(reason)`` when xgrammar cannot turn the JSON Schema text into a grammar. No tokenizer
    needed; a schema that passes is remembered (the request parser calls this for every request)."""
    _check(schema)


@dataclass(frozen=True)
class Grammar:
    """One compiled format: xgrammar's ``CompiledGrammar`` and what compiling it cost."""

    format: ResponseFormat
    compiled: Any  # xgrammar.CompiledGrammar
    vocab_size: int
    compile_s: float  # seconds the first compile took; a cache hit returns this same object, costing ~nothing
    memory_bytes: int


class GrammarCache:
    """Compiled grammars for one tokenizer (xgrammar's ``TokenizerInfo`` is built once, ``tokenizer_info_s``).

    ``compile(fmt)`` compiles on a miss and returns the cached ``Grammar`` on a hit; ``last_s`` is what the
    latest call took (a hit: microseconds), ``compile_s_total`` the seconds spent compiling. Thread-safe: the
    server compiles off its event loop, one grammar at a time.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, max_grammars: int = MAX_GRAMMARS) -> None:
        positive("vocab_size", vocab_size)
        positive("max_grammars", max_grammars)
        xgr = _xgr()
        start = clock()
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.tokenizer_info_s = clock() - start
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)  # this class is the cache
        self.vocab_size = vocab_size
        self.max_grammars = max_grammars
        self.entries: OrderedDict[tuple[str, str], Grammar] = OrderedDict()
        self.hits = self.misses = 0
        self.compile_s_total = 0.0
        self.last_s = 0.0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def compile(self, fmt: ResponseFormat) -> Grammar:
        """The compiled grammar of ``fmt``; ``ValueError(xgrammar's reason)`` when it cannot be compiled."""
        if not isinstance(fmt, ResponseFormat):
            raise ValueError(f"compile takes a ResponseFormat, got {type(fmt).__name__}; build one with "
                             "ResponseFormat.json_schema(schema)")
        start = clock()
        with self._lock:
            grammar = self.entries.get(fmt.key)
            if grammar is not None:
                self.entries.move_to_end(fmt.key)
                self.hits += 1
            else:
                try:
                    compiled = self.compiler.compile_json_schema(fmt.schema, **JSON_OPTIONS)
                except Exception as exc:
                    raise ValueError(xgrammar_reason(exc)) from None
                seconds = clock() - start
                grammar = Grammar(fmt, compiled, self.vocab_size, seconds, int(compiled.memory_size_bytes))
                self.misses += 1
                self.compile_s_total += seconds
                self.entries[fmt.key] = grammar
                while len(self.entries) > self.max_grammars:
                    self.entries.popitem(last=False)
            self.last_s = clock() - start
        return grammar

    def stats(self) -> dict[str, Any]:
        return {"grammars": len(self.entries), "hits": self.hits, "misses": self.misses,
                "compile_s_total": self.compile_s_total, "tokenizer_info_s": self.tokenizer_info_s,
                "memory_bytes": sum(g.memory_bytes for g in self.entries.values())}


_CACHES: "weakref.WeakKeyDictionary[Any, dict[int, GrammarCache]]" = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def grammars(tokenizer: Any, vocab_size: int) -> GrammarCache:
    """The ``GrammarCache`` of this tokenizer and vocabulary size (the model's ``config.vocab_size``, which may
    exceed the tokenizer's): built at the first call, shared by every server that serves the same tokenizer."""
    with _CACHES_LOCK:
        per_tokenizer = _CACHES.setdefault(tokenizer, {})
        cache = per_tokenizer.get(vocab_size)
        if cache is None:
            cache = per_tokenizer[vocab_size] = GrammarCache(tokenizer, vocab_size)
        return cache


class Constraint:
    """One sequence's place in its grammar: ``mask`` its row of logits before a token is chosen, ``accept`` the
    token after. ``eos``: the ids that end a sequence (the grammar's stop tokens; None: the tokenizer's)."""

    def __init__(self, grammar: Grammar, eos: set[int] | None = None) -> None:
        if not isinstance(grammar, Grammar):
            raise ValueError(f"Constraint needs a compiled Grammar (GrammarCache.compile), got {type(grammar).__name__}")
        xgr = _xgr()
        self.grammar = grammar
        self.matcher = xgr.GrammarMatcher(grammar.compiled, override_stop_tokens=sorted(eos) if eos else None)
        self.bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)  # int32 on the CPU, where xgrammar fills it
        self.accepted = 0

    @property
    def completed(self) -> bool:
        """The JSON is complete: end-of-sequence is the only token left."""
        return bool(self.matcher.is_completed())

    @property
    def terminated(self) -> bool:
        """End-of-sequence was accepted: the matcher takes no more tokens."""
        return bool(self.matcher.is_terminated())

    def mask(self, logits: Any) -> None:
        """Set the logits of every token the grammar forbids next to -inf, in place. ``logits``: one row, (V,) or
        (1, V), on any device (the bitmask is copied there)."""
        xgr = _xgr()
        if self.terminated:
            raise RuntimeError("this sequence's grammar already ended (end-of-sequence was accepted); stop decoding it")
        row = logits.unsqueeze(0) if logits.dim() == 1 else logits
        if row.dim() != 2 or row.shape[0] != 1:
            raise ValueError(f"mask takes one row of logits, (V,) or (1, V); got shape {tuple(logits.shape)}")
        if row.shape[-1] > self.grammar.vocab_size:
            raise ValueError(f"logits have {row.shape[-1]} entries but the grammar was compiled for "
                             f"{self.grammar.vocab_size}; compile it with the model's config.vocab_size")
        self.matcher.fill_next_token_bitmask(self.bitmask)
        cpu = row.device.type == "cpu"
        bits = self.bitmask if cpu else self.bitmask.to(row.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(row, bits, vocab_size=row.shape[-1], backend="cpu" if cpu else "torch_native")

    def accept(self, token: int) -> None:
        """Advance the grammar by the chosen token; a token the mask would have forbidden is a bug, raised."""
        if not self.matcher.accept_token(int(token)):
            raise RuntimeError(f"token {int(token)} breaks the response_format grammar; choose tokens from logits "
                               "masked by Constraint.mask")
        self.accepted += 1

"""Command line: ``python -m labkit info | size | prepare | ...``.

Bad input exits 2 with one line naming the fix, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2


class UsageError(Exception):
    """A user mistake: printed as one line, exit status 2."""


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def cmd_info(args: argparse.Namespace) -> int:
    from . import env

    data = {"device": env.device(), "hardware": env.hardware(), "versions": env.versions(),
            "capabilities": [c.__dict__ for c in env.capabilities()]}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    hw = data["hardware"]
    print(f"device: {data['device']}   cpu: {hw['cpu']} ({hw['cpu_cores_logical']} cores)   "
          f"memory: {_fmt_bytes(hw['memory_total_bytes'])}   gpu: {hw['gpu'] or 'none'}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items() if v))
    print(f"{'capability':<14} {'ok':<4} detail / reason")
    for c in data["capabilities"]:
        print(f"{c['name']:<14} {'yes' if c['available'] else 'no':<4} {c['detail'] if c['available'] else c['reason']}")
    return 0


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {value}")
        return value
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bandwidth must be a number of GB/s, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"bandwidth must be positive, got {value}")
    return value


def cmd_size(args: argparse.Namespace) -> int:
    from . import sizing

    try:
        est = sizing.estimate(args.model, dtype=args.dtype, context=args.context, batch=args.batch,
                              gpu=args.gpu, bandwidth_gbs=args.bandwidth_gbs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    data = est.to_dict()
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"{est.model}: {est.n_params:,} parameters")
    print(f"  weights ({est.dtype}): {_fmt_bytes(est.weight_bytes)}")
    print(f"  KV cache ({est.kv_dtype}): {est.kv_bytes_per_token:,} B/token × {est.context} tokens × {est.batch} "
          f"= {_fmt_bytes(est.kv_bytes)}")
    print(f"  total: {_fmt_bytes(est.total_bytes)}")
    if est.gpu:
        print(f"  {est.gpu} ({est.gpu_memory_bytes / 1e9:.0f} GB): {'fits' if est.fits else 'does NOT fit'}"
              f" (weights + KV within {sizing.USABLE_FRACTION:.0%} of memory)")
    if est.decode_tokens_per_s_ceiling is not None:
        print(f"  decode ceiling at {est.bandwidth_gbs:g} GB/s: {est.decode_tokens_per_s_ceiling:,.1f} tokens/s "
              f"({est.decode_tokens_per_s_per_sequence_ceiling:,.1f} per sequence)")
    if est.compute_bound_batch is not None:
        print(f"  decode turns compute-bound above batch ≈ {est.compute_bound_batch:,.0f}")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from . import models

    try:
        path = models.prepare_default(force=args.force)
    except models.ModelNotFound as exc:
        raise UsageError(str(exc)) from None
    print(f"default model ready: {path}")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message} (see --help)")


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help_text: str):
    """Register a sub-command: ``@command(name, help)(run)`` with ``run.configure(parser)``."""
    def wrap(run: Callable[[argparse.Namespace], int]):
        def configure(p: argparse.ArgumentParser) -> None:
            getattr(run, "configure", lambda _p: None)(p)
        COMMANDS[name] = (help_text, run, configure)
        return run
    return wrap


def _configure_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object")


def _configure_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="'default', a hub id (owner/name) or a directory holding config.json")
    p.add_argument("--dtype", default="fp16", help="fp32, fp16, bf16, int8, int4 or nf4 (default fp16)")
    p.add_argument("--context", type=_positive_int("context"), default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--batch", type=_positive_int("batch"), default=1, help="sequences (default 1)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--gpu", help="a GPU from data/gpus.json, e.g. T4, L4, A100-80GB, H100-SXM, H200")
    group.add_argument("--bandwidth-gbs", type=_positive_float, help="memory bandwidth in GB/s")
    p.add_argument("--json", action="store_true", help="one JSON object")


def _configure_prepare(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="convert again even if the cache is complete")


cmd_info.configure = _configure_info  # type: ignore[attr-defined]
cmd_size.configure = _configure_size  # type: ignore[attr-defined]
cmd_prepare.configure = _configure_prepare  # type: ignore[attr-defined]
command("info", "device, versions and what this machine can run")(cmd_info)
command("size", "weights, KV cache, fit and decode ceiling of a model")(cmd_size)
command("prepare", "convert the default model into the cache (done by make setup)")(cmd_prepare)


def _load_plugins() -> None:
    """Sub-commands defined next to their modules (e.g. serving's ``serve``)."""
    import importlib

    for module in ("labkit.serving",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = _Parser(prog="python -m labkit", description="labkit: measure LLM inference on this machine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, run, configure) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.run(args) or 0)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

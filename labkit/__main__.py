"""Command line: ``python -m labkit info | size | prepare | ...``.

Bad input exits 2 with one line naming the fix, never a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import fields

from . import doctor, gpu_check
from .core import env
from .decoding import kv
from .engines import warmup
from .lessons import exercises
from .lessons.exercises import progress
from .model import models, onnx, sizing
from .serve import loadgen
from .serve.agents import prefix_lint
from .serve.experiments import scheduler
from .serve.launch import LISTENING
from .serve.protocol import BATCHING, DEFAULT_HOST, TINY_RANDOM, ServerConfig, server_config
from .serve.server import Server, load_model

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


def _positive(name: str, convert: Callable[[str], float] = int, what: str = "a whole number") -> Callable[[str], float]:
    """An argparse ``type``: ``convert`` the text, and refuse what is not a positive number, naming ``name``."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {value}")
        return value
    return parse


def cmd_size(args: argparse.Namespace) -> int:
    try:
        est = sizing.estimate(args.model, dtype=args.dtype, context=args.context, batch=args.batch,
                              gpu=args.gpu, bandwidth_gbs=args.bandwidth_gbs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    data = est.to_dict()
    if args.json:
        print(json.dumps(data))
        return 0
    active = f" ({est.active_params:,} active per token)" if est.active_params != est.n_params else ""
    print(f"{est.model}: {est.n_params:,} parameters{active}")
    print(f"  weights ({est.dtype}): {_fmt_bytes(est.weight_bytes)}"
          + (f"; a token reads {_fmt_bytes(est.active_weight_bytes)}" if active else ""))
    kinds = ", ".join(f"{n} {k}" for k, n in est.layer_kinds.items())
    if est.kv_bytes == est.kv_bytes_naive:
        print(f"  KV cache ({est.kv_dtype}): {est.kv_bytes_per_token:,} B/token × {est.context} tokens × {est.batch} "
              f"= {_fmt_bytes(est.kv_bytes)} ({kinds} layers)")
    else:
        split = ", ".join(f"{k} {_fmt_bytes(b)}" for k, b in est.kv_bytes_by_kind.items())
        print(f"  KV cache ({est.kv_dtype}), layer by layer ({kinds} layers): {_fmt_bytes(est.kv_bytes)} for "
              f"{est.context} tokens × {est.batch} ({split}); the formula 2 × layers × KV heads × head_dim says "
              f"{_fmt_bytes(est.kv_bytes_naive)} ({est.kv_bytes_naive / est.kv_bytes:.1f}×)")
        if est.kv_state_bytes:
            print(f"  of which fixed per sequence (linear attention's state): {_fmt_bytes(est.kv_state_bytes)}")
        if est.kv_bytes_transformers is not None:
            same = est.kv_bytes_transformers == est.kv_bytes
            print(f"  latent attention: a serving engine keeps the latent ({_fmt_bytes(est.kv_bytes)}); this "
                  + ("transformers' cache keeps the latent too" if same else "transformers' cache keeps expanded keys "
                     f"and values: {_fmt_bytes(est.kv_bytes_transformers)}"))
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
    try:
        path = models.prepare_default(force=args.force)
    except models.ModelNotFound as exc:
        raise UsageError(str(exc)) from None
    print(f"default model ready: {path}")
    if args.no_onnx:
        return 0
    export = env.capability("onnx-export")
    if not export.available:
        print(f"ONNX export skipped: {export.reason}")
        return 0
    folder, seconds = onnx.export_onnx(force=args.force)  # notebooks 03, 08 and 10 read it; an export takes minutes
    print(f"ONNX export ready: {folder}" + (f" (exported in {seconds:.0f} s)" if seconds is not None else ""))
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _configure_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object")


def _configure_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="'default', a hub id (owner/name) or a directory holding config.json")
    p.add_argument("--dtype", default="fp16", help="fp32, fp16, bf16, int8, int4, nf4, fp8, nvfp4 or mxfp4 (default fp16)")
    p.add_argument("--context", type=_positive("context"), default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--batch", type=_positive("batch"), default=1, help="sequences (default 1)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--gpu", help="a GPU from data/gpus.json, e.g. T4, L4, A100-80GB, H100-SXM, H200")
    group.add_argument("--bandwidth-gbs", type=_positive("bandwidth", float, "a number of GB/s"), help="memory bandwidth in GB/s")
    p.add_argument("--json", action="store_true", help="one JSON object")


def _configure_prepare(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="convert (and export) again even if the cache is complete")
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX export notebooks 03, 08 and 10 read")


# ----------------------------------------------------------------------------------------------- CLI


async def _serve_forever(server: Server) -> None:
    url = await server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows / not main thread
            loop.add_signal_handler(sig, server.request_stop)
    print(f"{LISTENING}{url}", flush=True)
    torch = sys.modules.get("torch")  # loaded with the model
    threads = f" · {torch.get_num_threads()} torch threads" if torch is not None else ""
    print(f"model {server.lm.name} · {server.cfg.batching} batching · max_batch_size {server.cfg.max_batch_size} · "
          f"max_wait_ms {server.cfg.max_wait_ms:g} · queue {server.cfg.max_queue}{threads} · Ctrl-C stops", flush=True)
    await server.serve_until_stopped()
    print("labkit serve: stopped", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    options = {f.name: getattr(args, f.name) for f in fields(ServerConfig) if hasattr(args, f.name)}
    try:
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"threads={args.threads}: a positive number of torch threads (1 for one core per replica)")
        cfg = server_config(**options)
        if cfg.host not in (DEFAULT_HOST, "localhost", "::1"):
            print(f"warning: listening on {cfg.host}: anyone who can reach this machine can use the server",
                  file=sys.stderr)
        if args.threads is not None:  # before the model loads: a replica beside others keeps to its own cores
            import torch

            torch.set_num_threads(args.threads)
        lm = load_model(cfg.model, cfg.dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    asyncio.run(_serve_forever(Server(lm, cfg)))
    return 0


def cmd_progress(args: argparse.Namespace) -> int:
    try:
        if args.reset:
            exercises.reset(args.reset)
            return 0
        rows = progress.table([e.id for e in exercises.all_exercises()])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps({"file": str(progress.path()), "notebooks": rows}, indent=1) if args.json else progress.text(rows))
    return 0


def _configure_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object (what tools/merge_results.py carries)")
    p.add_argument("--reset", metavar="NN.name", help="forget one exercise's record and print its cell as shipped")


def _configure_serve(p: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    p.add_argument("--model", default=None, help=f"'default', a directory, a hub id or '{TINY_RANDOM}'")
    p.add_argument("--dtype", default=d.dtype, help="fp32, fp16 or bf16 (default fp32)")
    p.add_argument("--host", default=d.host, help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=d.port, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="sequences per batch (default 8)")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long the oldest request waits for others to join (default 20)")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="queued requests before 503 (default 256)")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens_limit, help="largest max_tokens accepted")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens, help="max_tokens when unset")
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens, help="longest prompt accepted")
    p.add_argument("--drain-s", type=float, default=d.drain_s, help="on shutdown, seconds running requests get")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413 beyond)")
    p.add_argument("--batching", default=d.batching, choices=BATCHING,
                   help="dynamic (default): batches wait up to max-wait-ms; continuous: requests join at every step")
    p.add_argument("--prefix-cache-tokens", type=int, default=d.prefix_cache_tokens,
                   help="continuous batching: KV positions of shared prompt prefixes kept for reuse (0: off)")
    p.add_argument("--prefix-cache-disk-dir", default=None,
                   help="with --prefix-cache-tokens: evicted entries go to files here and are read back on a hit")
    p.add_argument("--prefill-chunk-tokens", type=int, default=d.prefill_chunk_tokens,
                   help="continuous batching: prompt tokens prefilled per step (0: a whole prompt at once)")
    p.add_argument("--no-drop-finished", dest="drop_finished", action="store_false",
                   help="keep finished sequences in the batch until the longest ends (static batching's cost)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's own count; 1 for replicas sharing a machine)")


# ------------------------------------------------------------------------------------------- commands

Command = tuple[str, Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None]]
# every command of ``python -m labkit``, declared here: (help, run, configure)
COMMANDS: dict[str, Command] = {
    "info": ("device, versions and what this machine can run", cmd_info, _configure_info),
    "size": ("weights, KV cache, fit and decode ceiling of a model", cmd_size, _configure_size),
    "prepare": ("convert the default model into the cache and export its ONNX graph (done by make setup)", cmd_prepare, _configure_prepare),
    "progress": ("exercises done / wrong / not tried and predictions made, per notebook (LABKIT_PROGRESS: "
                 "another record)", cmd_progress, _configure_progress),
    "serve": ("OpenAI-compatible server with dynamic or continuous batching (binds 127.0.0.1)", cmd_serve,
              _configure_serve),
}
# commands that parse their own arguments (``python -m labkit NAME --help`` shows them): (help, main(argv))
OWN_ARGUMENTS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "loadgen": ("drive an OpenAI-compatible server with a request mix; JSON summary", loadgen.main),
    "gpu-check": ("GPU preflight: every CUDA path once, PASS / FAIL / SKIP with the reason", gpu_check.command),
    "doctor": ("is this laptop ready for the workshop: PASS / FAIL per check and one summary line", doctor.command),
    "kv": ("KV-cache reference measurements (kv reference)", kv.main),
    "prefix-lint": ("does a chat request extend the one before it (a prefix-cache hit)? exit 0 yes, 1 no and why",
                    prefix_lint.main),
    "requests": ("measure data/requests.json's request mix against the default model", scheduler.main),
    "cold-start": ("time a cold start in this fresh process, print JSON (what warmup.cold_start spawns)",
                   warmup.cold_start_child),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m labkit", description="labkit: measure LLM inference on this machine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, run, configure) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(run=run)
    for name, (help_text, _run) in OWN_ARGUMENTS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in OWN_ARGUMENTS:
            return int(OWN_ARGUMENTS[argv[0]][1](argv[1:]) or 0)
        args = build_parser().parse_args(argv)
        return int(args.run(args) or 0)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``shellseam`` command line: ``run``, ``doctor``, ``mcp`` and ``bench``.

``run`` prints the model-facing rendering of one command and exits with its code (128+n
for a signal). Usage errors and invalid requests print one line on stderr and exit 2;
infrastructure failures print one line and exit 125. Never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import service as _service
from .errors import INVALID_REQUEST, ShellError
from .limits import containment_report
from .local import LocalShellExecutor
from .render import render_result
from .sandbox import SandboxShellExecutor, enforcement_for, landlock_abi, sandbox_facts
from .service import SubprocessService, default_spill_parent
from .types import SANDBOX_MODES, SandboxMode, ShellExecRequest

EXIT_USAGE = 2
EXIT_INFRASTRUCTURE = 125


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no multi-line usage dump on stderr)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shellseam", description="Run shell commands for LLM agents.")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one command and print the model-facing result")
    run.add_argument("--timeout-ms", type=int, default=None, help="timeout in milliseconds")
    run.add_argument("--workdir", default=None, help="working directory (default: cwd)")
    run.add_argument("--sandbox", choices=SANDBOX_MODES, default=None, help="Landlock mode")
    run.add_argument("--json", action="store_true", help="print the ShellRunResult as JSON")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")

    sub.add_parser("doctor", help="report Landlock support, enforcement, spill dir, limits")

    mcp = sub.add_parser("mcp", help="serve bash + task tools over MCP on stdio")
    mcp.add_argument("--sandbox", choices=SANDBOX_MODES, default=None)
    mcp.add_argument("--workdir", default=None)
    mcp.add_argument("--home", default=None, help="DSH_HOME (default ~/.shellseam)")

    bench = sub.add_parser("bench", help="side-by-side benchmarks as ratios")
    bench.add_argument("--quick", action="store_true", help="the small CI-sized set")
    return parser


def _fail(code: int, message: str) -> int:
    print(f"shellseam: {message}", file=sys.stderr)
    return code


def _exit_status(exit_code: int | None, signal: str | None) -> int:
    if exit_code is not None:
        return exit_code
    import signal as signals

    try:
        return 128 + int(signals.Signals[signal or "SIGKILL"])
    except KeyError:
        return 128 + 9


def cmd_run(args: argparse.Namespace) -> int:
    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        return _fail(EXIT_USAGE, "run: expected a command after --")
    command = " ".join(words)
    service = SubprocessService(keep_spill=True)
    mode: SandboxMode | None = args.sandbox
    executor = (
        LocalShellExecutor(service=service)
        if mode is None
        else SandboxShellExecutor(mode=mode, service=service)
    )
    try:
        spec = executor.resolve(
            ShellExecRequest(command=command, workdir=args.workdir, timeout_ms=args.timeout_ms)
        )
        result = executor.run_sync(spec)
    except ShellError as err:
        code = EXIT_USAGE if err.code == INVALID_REQUEST else EXIT_INFRASTRUCTURE
        return _fail(code, f"{err.code}: {err.reason}")
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    finally:
        service.dispose()
    if args.json:
        print(json.dumps(dataclasses.asdict(result), ensure_ascii=False))
    else:
        print(render_result(result))
    return _exit_status(result.exit_code, result.signal)


def _read_int(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def cmd_doctor(_args: argparse.Namespace) -> int:
    abi = landlock_abi()
    print(f"landlock abi: {abi}" + ("" if abi else " (no Landlock: confined modes fail closed)"))
    if abi:
        print(f"kernel fs rights: {', '.join(_service.landlock_fs_rights())}")
    for mode in SANDBOX_MODES:
        for network in (True, False):
            if mode == "danger-full-access" and not network:
                continue
            label = mode if mode == "danger-full-access" else f"{mode} network={network}"
            if mode == "danger-full-access":
                print(f"mode {label}: nothing confined")
                continue
            enforcement = enforcement_for(mode, network)
            missing = _service.landlock_missing(network)
            detail = "" if not missing else " — missing: " + "; ".join(missing)
            print(f"mode {label}: {enforcement}{detail}")
    print(f"spill parent: {default_spill_parent()} (one private 0700 directory per service)")
    for line in sandbox_facts():
        print(line)
    print("\n".join(containment_report()))
    ex = LocalShellExecutor()
    print(
        "defaults: "
        f"timeout_ms={ex.timeout_ms} max_timeout_ms={ex.max_timeout_ms} "
        f"max_output_bytes={ex.max_output_bytes} max_spill_bytes={ex.max_spill_bytes} "
        f"grace_ms={ex.grace_ms}"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"open files limit: soft={soft} hard={hard}")
    print(f"pipe max size: {_read_int('/proc/sys/fs/pipe-max-size')} bytes")
    print(f"pid max: {_read_int('/proc/sys/kernel/pid_max')}")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from .mcp_server import run as run_mcp

    home = args.home or os.path.join(os.path.expanduser("~"), ".shellseam")
    return run_mcp(sandbox=args.sandbox, workdir=args.workdir or os.getcwd(), home=home)


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import format_table, run

    print(format_table(run(quick=args.quick)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"run": cmd_run, "doctor": cmd_doctor, "mcp": cmd_mcp, "bench": cmd_bench}
    try:
        return handlers[args.cmd](args)
    except KeyboardInterrupt:
        return _fail(130, "interrupted")


if __name__ == "__main__":
    sys.exit(main())

"""The ``shellseam`` command line: ``run``, ``doctor``, ``mcp``, ``clean`` and ``bench``.

Argument parsing, exit codes and one-line errors live here; running one command (stdin,
``--stream``, stop signals) lives in ``_cli_run``. Usage errors and invalid requests print
one line on stderr and exit 2; infrastructure failures print one line and exit 125; a
missing optional extra is one line naming its ``pip install`` command, exit 2. Never a
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import resource
import signal
import sys
import time
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import NoReturn

from . import __version__
from . import service as _service
from .checks import LIMIT_FIELDS
from .errors import INVALID_REQUEST, ShellError
from .factory import MissingExtra, require_extra
from .limits import containment_report
from .local import LocalShellExecutor
from .paths import cli_spill_parents, remove_tree
from .sandbox import enforcement_for, landlock_abi, sandbox_facts
from .service import default_spill_parent
from .types import SANDBOX_MODES

EXIT_USAGE = 2
EXIT_INFRASTRUCTURE = 125
#: ``shellseam clean`` removes CLI spill folders untouched for longer than this.
CLEAN_AFTER_S = 24 * 3600
#: Largest value a limit accepts (rlimits and cgroup files take signed 64-bit values).
MAX_LIMIT = 2**63 - 1

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmgt]i?b?|[kmgt]?b)?", re.IGNORECASE)
_BINARY = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a plain number of bytes, or a number with a unit, case-insensitive:
    ``K``/``M``/``G``/``T`` and ``Ki``/``Mi``/``Gi``/``Ti`` are binary (``1K`` = 1024),
    ``KB``/``MB``/``GB``/``TB`` decimal (``1KB`` = 1000); ``B`` means bytes. Fractions are
    allowed when they come to whole bytes (``1.5K``). ``ValueError`` for anything else,
    for zero, and for more than 2**63 - 1."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid size {text!r} (expected e.g. 512M, 2G, 1.5GiB, 100MB)")
    number, unit = match.group(1), (match.group(2) or "").lower()
    if unit in ("", "b"):
        factor = 1
    elif unit.endswith("b") and not unit.endswith("ib"):
        factor = _DECIMAL[unit[0]]
    else:
        factor = _BINARY[unit[0]]
    try:
        value = Decimal(number) * factor
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"invalid size {text!r}") from None
    if value != value.to_integral_value():
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    if not 0 < value <= MAX_LIMIT:
        raise ValueError(f"invalid size {text!r}: must be between 1 byte and 2**63 - 1 bytes")
    return int(value)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive_int(text: str) -> int:
    # ASCII digits only, as sizes take: int() also takes other scripts' digits and "1_000".
    if re.fullmatch(r"[0-9]+", text.strip(), re.ASCII) is None:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected an integer")
    value = int(text)
    if not 0 < value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: must be a positive integer")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no multi-line usage dump on stderr)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


_EXAMPLES = """\
examples:
  shellseam run -- 'ls -la | head -3'        run one command, print what a model would read
  echo data | shellseam run -- cat           stdin is passed on when it is not a terminal
  shellseam run --stream -- 'make -j4'       show output live, then the markers on stderr
  shellseam run --sandbox workspace-write --no-network -- 'pytest -q'
  shellseam run --memory 2G --max-processes 256 --cpu-ms 60000 -- ./build.sh
  shellseam mcp --sandbox workspace-write --workdir ~/project
  shellseam doctor                           what this kernel can confine and contain
  shellseam clean                            remove the CLI's spill files older than a day

exit codes of `shellseam run`:
  N      the command's own exit code; 128+n when it was killed by signal n
  2      usage error, or a request shellseam refuses (one line on stderr)
  125    the command could not be started: no such workdir, no Landlock... (one line)
  128+n  shellseam itself got SIGINT, SIGTERM or SIGHUP (n): it killed the command first
"""

_RUN_DESCRIPTION = """\
Run one command with `bash -c` and print the model-facing rendering: stdout, then stderr in
a section of its own, then the markers, the exit status last. The words after `--` are
joined with single spaces into ONE command that bash parses again, so quote the whole
command as one argument: `shellseam run -- "echo it's"`, not `shellseam run -- echo "it's"`.
When shellseam's own stdin is not a terminal it is passed to the command. Spill files of
truncated output are kept (under the spill parent's cli/ folder) so that printed paths stay
readable; `shellseam clean` removes old ones.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``shellseam`` argument parser (every option has help)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="shellseam",
        description="Run shell commands for LLM agents: safely, boundedly, fast.",
        epilog=_EXAMPLES,
        formatter_class=fmt,
    )
    parser.add_argument(
        "--version", action="version", version=f"shellseam {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="run one command and print the model-facing result",
        description=_RUN_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=fmt,
    )
    run.add_argument(
        "--timeout-ms",
        type=int,
        default=None,
        metavar="N",
        help="kill the command after N ms (default 120000, at most 600000)",
    )
    run.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="working directory of the command (default: the current directory)",
    )
    run.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default=None,
        metavar="MODE",
        help="confine the command with Landlock: " + ", ".join(SANDBOX_MODES),
    )
    run.add_argument(
        "--no-network",
        action="store_true",
        help="no sockets at all for the command (needs a confining --sandbox)",
    )
    run.add_argument(
        "--memory",
        type=_size_arg,
        default=None,
        metavar="SIZE",
        help="memory limit of the whole call, e.g. 512M, 2G (K/M/G/T binary, KB/MB/GB/TB decimal)",
    )
    run.add_argument(
        "--max-processes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="processes and threads of the call alive at once (default 4096)",
    )
    run.add_argument(
        "--cpu-ms",
        type=_positive_int,
        default=None,
        metavar="N",
        help="CPU time of the whole call in ms (user + system)",
    )
    out = run.add_mutually_exclusive_group()
    out.add_argument(
        "--stream",
        action="store_true",
        help="show stdout and stderr live, then print the markers on stderr",
    )
    out.add_argument(
        "--json", action="store_true", help="print the ShellRunResult as one JSON object instead"
    )
    run.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the command; several words are joined with spaces",
    )

    sub.add_parser(
        "doctor",
        help="report what this kernel confines and contains, the spill directory, the limits",
        description="Report the Landlock ABI, enforcement per sandbox mode, what a confined "
        "command can still do here, the spill directory and the default limits.",
    )

    mcp = sub.add_parser(
        "mcp",
        help="serve the bash and task tools over MCP on stdio",
        description="A Model Context Protocol server on stdio exposing bash, task_output, "
        "task_list and task_kill. One client connection is one session; its tasks are "
        "killed when it disconnects. Needs the 'mcp' extra: pip install 'shellseam[mcp]'.",
    )
    mcp.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default=None,
        metavar="MODE",
        help="confine every command with Landlock: "
        + ", ".join(SANDBOX_MODES)
        + " (default: unconfined)",
    )
    mcp.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="the session's working directory and sandbox workspace (default: cwd)",
    )
    mcp.add_argument(
        "--home",
        default=None,
        metavar="DIR",
        help="exported to commands as DSH_HOME (default: ~/.shellseam)",
    )
    mcp.add_argument(
        "--no-network",
        action="store_true",
        help="no sockets for any command (needs a confining --sandbox)",
    )
    mcp.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run commands on this Ray cluster ('auto': the local one); needs "
        "pip install 'shellseam[ray]'",
    )

    clean = sub.add_parser(
        "clean",
        help="remove the CLI's spill folders older than a day",
        description="Remove the spill folders `shellseam run` kept (under the spill "
        "parent's cli/ folder) that have not been touched for a day.",
    )
    clean.add_argument("--all", action="store_true", help="remove every CLI spill folder")

    bench = sub.add_parser(
        "bench",
        help="side-by-side benchmarks, as a table of ratios",
        description="Measure shellseam against posix_spawn, subprocess and asyncio; each "
        "row is printed as it finishes. Do not run it next to other heavy work.",
    )
    bench.add_argument("--quick", action="store_true", help="the small CI-sized set")
    bench.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this benchmark (repeatable)",
    )
    bench.add_argument(
        "--ray",
        action="store_true",
        help="the Ray rows instead (a fresh local cluster, or --ray-address; needs shellseam[ray])",
    )
    bench.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster for --ray")
    return parser


def fail(code: int, message: str) -> int:
    """Prints ``shellseam: <message>`` as one line on stderr; returns ``code``."""
    print("shellseam: " + " ".join(message.split()), file=sys.stderr)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    from ._cli_run import run_command

    return run_command(args)


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
    limits = [(name, getattr(ex.limits, name)) for name in LIMIT_FIELDS]
    asked = ", ".join(f"{name}={value}" for name, value in limits if value is not None)
    print(f"default limits: {asked or 'none'}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"open files limit: soft={soft} hard={hard}")
    print(f"pipe max size: {_read_int('/proc/sys/fs/pipe-max-size')} bytes")
    print(f"pid max: {_read_int('/proc/sys/kernel/pid_max')}")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    server = require_extra("shellseam.mcp_server", extra="mcp", feature="shellseam mcp")
    home = args.home or os.path.join(os.path.expanduser("~"), ".shellseam")
    status: int = server.run(
        sandbox=args.sandbox,
        workdir=args.workdir or os.getcwd(),
        home=home,
        network=not args.no_network,
        ray_address=args.ray_address,
    )
    return status


def _last_touched(path: str) -> float:
    """The newest mtime of a spill folder and the files directly in it."""
    newest = os.lstat(path).st_mtime
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except OSError:
                continue
    return newest


def cmd_clean(args: argparse.Namespace) -> int:
    now = time.time()
    for parent in cli_spill_parents():
        removed = kept = 0
        with os.scandir(parent) as entries:
            # Only spill directories of ours: the parent may be a shared directory.
            folders = [
                e
                for e in entries
                if e.name.startswith("shellseam-")
                and e.is_dir(follow_symlinks=False)
                and e.stat(follow_symlinks=False).st_uid == os.geteuid()
            ]
        for entry in folders:
            try:
                old = args.all or now - _last_touched(entry.path) > CLEAN_AFTER_S
            except OSError:
                continue
            if not old:
                kept += 1
                continue
            remove_tree(entry.path)
            removed += 1
        print(
            f"removed {removed} spill folder{'s' * (removed != 1)} from {parent}"
            + (f" ({kept} younger than a day kept)" if kept else "")
        )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ._bench.cli import main as bench_main

    argv = ["--quick"] if args.quick else []
    for name in args.only or ():
        argv += ["--only", name]
    if args.ray or args.ray_address:
        argv.append("--ray")
        if args.ray_address:
            argv += ["--ray-address", args.ray_address]
    return bench_main(argv)


_HANDLERS = {
    "run": cmd_run,
    "doctor": cmd_doctor,
    "mcp": cmd_mcp,
    "clean": cmd_clean,
    "bench": cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        # Bare `shellseam` prints the usage (SPEC §6) where --help does, on stdout; it still
        # exits 2, as argparse does for any other missing argument.
        sys.stdout.write(parser.format_help())
        return EXIT_USAGE
    if sys.stdout is None:  # started with fd 1 closed: the output goes nowhere
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    try:
        return _HANDLERS[args.cmd](args)
    except MissingExtra as err:
        return fail(EXIT_USAGE, str(err))
    except ShellError as err:  # e.g. `mcp --ray-address` of a cluster that is not there
        return fail(EXIT_USAGE if err.code == INVALID_REQUEST else EXIT_INFRASTRUCTURE, str(err))
    except KeyboardInterrupt:
        return 128 + 2
    except BrokenPipeError:
        # `shellseam run -- yes | head`: the reader left, as SIGPIPE would end a command
        # (the call is already killed and cleaned up); nothing more can be said on stdout.
        _discard_stdout()
        return 128 + signal.SIGPIPE
    except OSError as err:
        # Still one line, never a traceback; most likely the output could not be written
        # (a full disk, /dev/full).
        if err.errno not in _OUTPUT_ERRNOS:
            return fail(EXIT_INFRASTRUCTURE, err.strerror or str(err))
        _discard_stdout()
        return fail(EXIT_INFRASTRUCTURE, f"cannot write the output: {err.strerror or err}")


#: What writing the output can fail with.
_OUTPUT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT, errno.EFBIG, errno.EPIPE}
)


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so that the interpreter's last flush cannot fail too."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())

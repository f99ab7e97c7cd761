"""``SandboxShellExecutor``: the local executor with a confinement per call.

The confinement (a Landlock ruleset, a seccomp filter and the privilege drop) is built
here, in the harness, and applied by the child between clone and exec; the harness itself
is never restricted. A confined mode without Landlock fails closed: ``run`` raises
``ShellError(SANDBOX_UNAVAILABLE)`` and a background start settles ``killed`` with
``runner_failed``.

Roots are pinned: each root path is resolved to its real path at ``resolve`` and the
directory it names the first time (device, inode) is remembered with an ``O_PATH`` fd held
for the executor's life. Rules are built from those fds, never from paths a command may
have swapped since, and a root path that later names another directory is refused
(``workspace root changed: <path>``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from . import service as native
from ._forksafe import ForkSafeLock
from .checks import config_bool
from .errors import INVALID_REQUEST, SANDBOX_UNAVAILABLE, ShellError
from .local import Confinement, LocalShellExecutor
from .paths import remove_tree
from .service import (
    ConfinedCall,
    EnvBuilder,
    NativeError,
    RootCheck,
    Ruleset,
    ShellTemplate,
    SpecRunner,
    SubprocessService,
    default_service,
    native_error,
)
from .types import (
    SANDBOX_MODES,
    SandboxEnforcement,
    SandboxMode,
    SandboxPolicy,
    ShellExecSpec,
    ShellRunResult,
    ShellSandboxInfo,
)

#: Permission signatures (matched case-insensitively in the stdout and stderr tails) that
#: mark a failed confined command as a sandbox denial.
DENIAL_SIGNATURES = (
    "permission denied",
    "read-only file system",
    "operation not permitted",
    "eacces",
    "eperm",
    "erofs",
)
_DENIAL_RE = re.compile("|".join(re.escape(s) for s in DENIAL_SIGNATURES), re.IGNORECASE)
#: bash's own message when the command names a file it cannot execute (exit 126).
#: The shell's own "cannot execute" line: bash's (`bash: line 1: ./x: Permission denied`) and
#: dash's (`/bin/sh: 1: ./x: Permission denied`), for the ``shell=`` option.
_EXEC_DENIED_RE = re.compile(
    r"^[^\s:]*sh: (?:(?:line )?\d+: )?.*: permission denied\s*$", re.IGNORECASE
)

#: Roots every workspace-write call may write besides its own (spec §3).
_SHARED_WRITABLE = ("/tmp", "/dev/shm")
#: Variables pointed at the per-service cache directory unless the caller set them.
_CACHE_VARS = ("XDG_CACHE_HOME", "PIP_CACHE_DIR", "npm_config_cache")
#: Removed from a confined command's inherited environment (spec.env may pass it back).
_CONFINED_DROPS = (b"SSH_AUTH_SOCK",)

#: The shared writable roots as real paths (resolved once: the system's own layout).
_SHARED_REALS = tuple(os.path.realpath(root) for root in _SHARED_WRITABLE)

_RULESET_CACHE_SIZE = 64
_MAX_PINNED_ROOTS = 4096

Identity = tuple[int, int]


@functools.cache
def landlock_abi() -> int:
    """The running kernel's Landlock ABI (0: none). Read once: it is the kernel's, fixed until
    reboot, and every confined call asks."""
    return native.landlock_abi()


@functools.cache
def _landlock_missing(network: bool) -> bool:
    return bool(native.landlock_missing(network))


def enforcement_for(mode: SandboxMode, network: bool = True) -> SandboxEnforcement | None:
    """``"full"``/``"partial"`` for a confined mode on this kernel (``"partial"`` when some
    requested feature, or Landlock altogether, is missing); None when nothing is confined."""
    if mode == "danger-full-access":
        return None
    return "partial" if _landlock_missing(network) else "full"


def _refuse(reason: str) -> ShellError:
    return ShellError(SANDBOX_UNAVAILABLE, reason)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def is_denial(exit_code: int | None, stdout_tail: str, stderr_tail: str) -> bool:
    """Whether a confined command's failure reads as a permission denial: a nonzero exit
    (not a signal) with a permission signature in either tail, except bash's exit 126 for a
    file it cannot execute (its last stderr line)."""
    if exit_code is None or exit_code == 0:
        return False
    if exit_code == 126:
        # The shell's message is the last line of stderr, or of stdout when a front end
        # merged the streams (mini-swe-agent).
        stderr_tail = _without_exec_denial(stderr_tail)
        stdout_tail = _without_exec_denial(stdout_tail)
    return bool(_DENIAL_RE.search(stderr_tail) or _DENIAL_RE.search(stdout_tail))


def _without_exec_denial(tail: str) -> str:
    lines = tail.rstrip("\n").split("\n")
    if lines and _EXEC_DENIED_RE.match(lines[-1]):
        return "\n".join(lines[:-1])
    return tail


#: Real paths of every writable root pinned in this process (bounded): a symlink inside one
#: of them, or inside a shared writable root, may have been planted by a confined command.
_WRITABLE_REALS: set[str] = set()
_WRITABLE_LOCK = ForkSafeLock()


#: Symlinks one walk follows before it gives up (the kernel's own bound: ELOOP past it).
_MAX_LINKS = 40
_WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class _Walked(NamedTuple):
    fd: int  #: O_PATH on what the path named during the walk (the caller closes it)
    followed: bool  #: a symlink was followed on the way
    planted: str | None  #: the first planted link on the way (see ``_walk``), if any


class _LeavesLink(NamedTuple):
    """On the walk's stack below a followed link's target: once the target is walked, the
    walk is where that link led."""

    link: str
    planted: bool


def _fd_path(fd: int) -> str:
    """The kernel's path of what ``fd`` is open on."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _realpath(path: str) -> str:
    """``realpath`` of a root that is not there (to name it): a command swapping a symlink
    under it made ``realpath`` raise EINVAL out of ``resolve`` (found by attacking)."""
    try:
        return os.path.realpath(path)
    except OSError:
        raise _refuse(f"workspace root changed: {path}") from None


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino)


def _walk(path: str, *, writable: bool) -> _Walked | None:
    """Opens ``path`` as the kernel resolves it, one component at a time from held directory
    fds (``openat`` with ``O_NOFOLLOW``, symlinks read with ``readlinkat`` on the link's own
    fd), so every check looks at the objects the final fd was reached through. A path looked
    at three times (``realpath``, a walk of ``lstat``s, ``open``) let a confined command that
    swapped a directory and a symlink under /tmp decide what the three saw: the link's
    target got pinned as a writable root (found by attacking). None when nothing is there.

    For a ``writable`` root, ``planted`` names the first symlink that sits in a directory
    confined commands may write (a shared writable root, or a writable root pinned in this
    process) and leads out of the shared writable roots: any earlier command could have
    planted it, so following it would let that command decide what a later call may write.
    A link that stays within ``/tmp`` or ``/dev/shm`` grants nothing every workspace-write
    call does not have."""
    with _WRITABLE_LOCK:
        writable_reals = [*_SHARED_REALS, *_WRITABLE_REALS] if writable else []
    stack: list[str | _LeavesLink] = [part for part in reversed(path.split("/")) if part]
    fd = os.open("/", _WALK_FLAGS | os.O_DIRECTORY)
    links, followed, planted = 0, False, None
    walked = None
    try:
        while stack:
            part = stack.pop()
            if isinstance(part, _LeavesLink):
                if part.planted and planted is None:
                    led_to = _fd_path(fd)
                    if not any(_inside(led_to, root) for root in _SHARED_REALS):
                        planted = part.link
                continue
            if part == ".":
                continue
            try:
                nxt = os.open(part, _WALK_FLAGS, dir_fd=fd)
            except OSError:
                return None
            try:
                is_link = stat.S_ISLNK(os.fstat(nxt).st_mode)
                target = os.readlink("", dir_fd=nxt) if is_link else ""
            except OSError:
                os.close(nxt)
                return None
            if not is_link:
                os.close(fd)
                fd = nxt
                continue
            os.close(nxt)
            links += 1
            if links > _MAX_LINKS or not target:
                return None
            followed = True
            here = _fd_path(fd)
            in_writable = any(_inside(here, root) for root in writable_reals)
            stack.append(_LeavesLink(os.path.join(here, part), in_writable))
            stack.extend(step for step in reversed(target.split("/")) if step)
            if target.startswith("/"):
                top = os.open("/", _WALK_FLAGS | os.O_DIRECTORY)
                os.close(fd)
                fd = top
        walked = _Walked(fd, followed, planted)
        return walked
    finally:
        if walked is None:  # nothing there, or an error: the caller gets no fd to close
            os.close(fd)


#: Kernel interface filesystems a writable root must never lie on: writing there moves
#: processes between cgroups (out of the call's), tunes the kernel, or reaches devices.
_KERNEL_FILESYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "debugfs",
        "tracefs",
        "securityfs",
        "bpf",
        "configfs",
        "efivarfs",
        "pstore",
        "fusectl",
        "binfmt_misc",
        "devtmpfs",
        "devpts",
        "mqueue",
    }
)


def _kernel_filesystem_under(real: str) -> tuple[str, str] | None:
    """(mount point, type) of a kernel interface filesystem that ``real`` (a real path) lies
    on, or that is mounted beneath it (a Landlock rule reaches through mount points); None
    when there is none, or the mount table cannot be read."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    on: tuple[str, str] | None = None  # the mount ``real`` lies on, the longest seen so far
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        fstype = fields[2]
        if _inside(real, point) and (on is None or len(point) >= len(on[0])):
            on = (point, fstype)
        elif fstype in _KERNEL_FILESYSTEMS and _inside(point, real):
            return point, fstype
    if on is not None and on[1] in _KERNEL_FILESYSTEMS:
        return on
    return None


class _PinnedRoots:
    """Root path → the directory identity it had when first seen, with an O_PATH fd held
    on that directory (so the identity can never be reused while the executor lives)."""

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self._known: dict[str, tuple[str, Identity]] = {}
        self._absent: set[str] = set()
        self._fds: dict[Identity, int] = {}
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    def pin(self, path: str, *, writable: bool = False) -> tuple[str, Identity] | None:
        """(real path, identity) of ``path``; None when nothing exists there (a root that
        does not exist grants nothing and is not pinned). A path seen before costs one
        ``stat``: it must still name the same directory. A ``writable`` root seen for the
        first time must not lead through a symlink a confined command could have planted."""
        known = self._known.get(path)
        if known is not None:
            try:
                st = os.stat(path)
            except OSError:
                raise _refuse(f"workspace root changed: {path}") from None
            if _identity(st) != known[1]:
                raise _refuse(f"workspace root changed: {path}")
            return known
        return self._pin_first(path, writable)

    def _pin_first(self, path: str, writable: bool) -> tuple[str, Identity] | None:
        try:
            walked = _walk(path, writable=writable)
        except OSError:
            raise _refuse(f"workspace root changed: {path}") from None
        if walked is None:
            with self._lock:
                if len(self._absent) < _MAX_PINNED_ROOTS:
                    self._absent.add(path)
            return None
        fd = walked.fd
        try:
            real = _fd_path(fd)
            ident = _identity(os.fstat(fd))
            same = real.startswith("/") and _identity(os.stat(real)) == ident
        except OSError:
            same = False
        if not same:  # moved or removed while it was walked
            os.close(fd)
            raise _refuse(f"workspace root changed: {path}")
        refusal = None
        if path in self._absent and (walked.followed or real != os.path.normpath(path)):
            # Nothing was there when first seen; what appeared since goes through a symlink
            # a command may have planted (e.g. `ln -s / /tmp/later`): never grant it.
            refusal = f"workspace root changed: {path}"
        elif writable and walked.planted is not None:
            refusal = (
                f"workspace root {path} leads through {walked.planted}, a symlink in a "
                "directory confined commands can write: pass the root's real path"
            )
        elif writable:
            kernel = _kernel_filesystem_under(real)
            if kernel is not None:
                where, fs = kernel
                refusal = f"writable root {path} reaches the kernel's {fs} filesystem at {where}"
        if refusal is not None:
            os.close(fd)
            raise _refuse(refusal)
        with self._lock:
            for key in (path, real):
                known = self._known.get(key)
                if known is not None and known[1] != ident:
                    os.close(fd)
                    raise _refuse(f"workspace root changed: {path}")
            if ident in self._fds:
                os.close(fd)
            elif len(self._fds) >= _MAX_PINNED_ROOTS:
                os.close(fd)
                raise _refuse(f"too many distinct sandbox roots (over {_MAX_PINNED_ROOTS})")
            else:
                self._fds[ident] = fd
            self._known.setdefault(path, (real, ident))
            self._known.setdefault(real, (real, ident))
        if writable:
            with _WRITABLE_LOCK:
                if len(_WRITABLE_REALS) < _MAX_PINNED_ROOTS:
                    _WRITABLE_REALS.add(real)
        return real, ident

    def fd(self, ident: Identity) -> int:
        with self._lock:
            return self._fds[ident]


def _close_all(fds: dict[Identity, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class _ServiceCache:
    """The per-service cache directory confined commands use for XDG/pip/npm caches (never
    the user's real caches: a poisoned cache would later run unconfined). Removed when
    the service is collected or the interpreter exits."""

    _lock: ClassVar[ForkSafeLock] = ForkSafeLock()
    _dirs: ClassVar[weakref.WeakKeyDictionary[SubprocessService, str]] = weakref.WeakKeyDictionary()

    @classmethod
    def path(cls, service: SubprocessService) -> str:
        """The service's cache directory (made on first use; the caller's pin check tells
        when it was removed or replaced, then ``renew`` makes another)."""
        path = cls._dirs.get(service)
        if path is not None:
            return path
        with cls._lock:
            path = cls._dirs.get(service)
            return path if path is not None else cls._create(service)

    @classmethod
    def renew(cls, service: SubprocessService) -> str:
        """A fresh directory, when a command removed or replaced the previous one (it may:
        the directory is writable) — never a refusal of every later call."""
        with cls._lock:
            return cls._create(service)

    @classmethod
    def _create(cls, service: SubprocessService) -> str:
        path = service.scratch_dir("cache-")
        cls._dirs[service] = path
        weakref.finalize(service, remove_tree, path)
        return path


_protected = False
_protect_lock = ForkSafeLock()


def make_harness_non_dumpable() -> None:
    """Makes the harness non-dumpable (once): its ``/proc/<pid>/environ``, ``mem`` and
    ``maps`` then need CAP_SYS_PTRACE, which no confined command has."""
    global _protected
    with _protect_lock:
        if not _protected:
            native.protect_harness()
            _protected = True


class SandboxShellExecutor(LocalShellExecutor):
    """Confines each command according to its ``SandboxPolicy``.

    ``protect_harness=True`` (default) makes the harness process non-dumpable when the
    executor is built, so that no command can read its environment or memory through
    ``/proc``; it also hides the harness from same-uid debuggers (``py-spy``, ``gdb -p``).
    """

    def __init__(
        self,
        *,
        mode: SandboxMode = "workspace-write",
        protect_harness: bool = True,
        **config: Any,
    ) -> None:
        if mode not in SANDBOX_MODES:
            raise ValueError(f"mode must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}")
        config_bool(protect_harness, "protect_harness")
        super().__init__(**config)
        self.default_mode: SandboxMode = mode
        self.sandbox_mode = mode
        self.protect_harness = protect_harness
        self._pins = _PinnedRoots()
        self._spill_reals: dict[str, str] = {}
        self._rulesets: OrderedDict[object, Ruleset] = OrderedDict()
        self._rulesets_lock = ForkSafeLock()
        self._confined_env = self._env_builder(_CONFINED_DROPS)
        self._cache_envs: dict[str, EnvBuilder] = {}
        self._prepared: dict[
            object, tuple[SubprocessService, RootCheck, Confinement, ConfinedCall]
        ] = {}
        #: The workspace-write call prepared last, which ``run_sync`` runs in one native
        #: call while a spec's policy has its values (a subclass with hooks of its own
        #: never sets it).
        self._fast: tuple[SubprocessService, ShellTemplate, SpecRunner] | None = None
        #: One record per (mode, network, denied): records are immutable, so results share.
        self._infos: dict[tuple[SandboxMode, bool, bool], ShellSandboxInfo] = {}
        if protect_harness:
            make_harness_non_dumpable()

    #: This class's confinement hooks are its own (a subclass's may not be): the policy
    #: prepared last then runs in one native call (``run_sync``).
    _native_confined: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        base = SandboxShellExecutor
        cls._native_confined = cls._native_specs and all(
            getattr(cls, hook) is getattr(base, hook)
            for hook in ("_prepare", "_policy", "_sandbox_info", "_result")
        )

    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        fast = self._fast
        if fast is not None:
            # The hot path: a spec of the policy prepared last, its roots unchanged, runs in
            # the one native call that checks them (no Python step of it runs cold), while
            # the service and the spawn settings are the ones it was bound to.
            service, template, run = fast
            shell = self._template
            if (
                service is (self._service if self._service is not None else default_service())
                and shell is not None
                and shell[1] is template
            ):
                try:
                    done = run(spec)
                except NativeError as err:
                    raise native_error(err, spec.workdir) from None
                if done is not None:
                    return done if done.sandbox is not None else self._result(spec, done)
        return super().run_sync(spec)

    # -- resolve: validate, realpath and pin the roots ---------------------------------

    def _stamp_policy(self, policy: SandboxPolicy | None) -> SandboxPolicy:
        if policy is None:
            policy = SandboxPolicy(mode=self.default_mode, workspace_root=self.cwd)
        elif not isinstance(policy, SandboxPolicy):
            raise ShellError(INVALID_REQUEST, "sandbox_policy must be a SandboxPolicy")
        if policy.mode not in SANDBOX_MODES:
            raise ShellError(INVALID_REQUEST, f"unknown sandbox mode {policy.mode!r}")
        if not isinstance(policy.network, bool):
            raise ShellError(INVALID_REQUEST, "sandbox_policy.network must be a bool")
        workspace = _absolute(policy.workspace_root, "workspace_root")
        extra = policy.writable_roots
        if isinstance(extra, str) or not isinstance(extra, Sequence):
            raise ShellError(INVALID_REQUEST, "writable_roots must be a sequence of paths")
        roots = [_absolute(r, "writable_roots") for r in extra]
        if policy.mode == "danger-full-access":
            return SandboxPolicy(
                mode=policy.mode,
                workspace_root=workspace,
                writable_roots=tuple(roots),
                network=policy.network,
            )
        pinned = self._pins.pin(workspace, writable=policy.mode == "workspace-write")
        workspace = pinned[0] if pinned else _realpath(workspace)
        real_roots: list[str] = []
        if policy.mode == "workspace-write":
            tmpdir = os.environ.get("TMPDIR")
            if tmpdir and os.path.isabs(tmpdir) and "\0" not in tmpdir:
                # "$TMPDIR" means the harness's value at resolve time.
                roots.append(tmpdir)
            for root in roots:
                got = self._pins.pin(root, writable=True)
                real = got[0] if got else _realpath(root)
                if real not in real_roots and real != workspace:
                    real_roots.append(real)
        return SandboxPolicy(
            mode=policy.mode,
            workspace_root=workspace,
            writable_roots=tuple(real_roots),
            network=policy.network,
        )

    def _policy(self, spec: ShellExecSpec) -> SandboxPolicy:
        return spec.sandbox_policy or self._stamp_policy(None)

    # -- spawn: the confinement of one call --------------------------------------------

    def _prepare(self, spec: ShellExecSpec) -> Confinement:
        policy = self._policy(spec)
        if policy.mode == "danger-full-access":
            return super()._prepare(spec)
        if landlock_abi() < 1:
            raise _refuse("Landlock is not available on this kernel")
        service = self.service
        if policy.mode == "read-only":
            return self._prepare_read_only(spec, policy, service)
        key = (policy.workspace_root, policy.writable_roots, policy.network, id(service))
        hit = self._prepared.get(key)
        if hit is not None and hit[0] is service and hit[1].still_same():
            self._bind_fast(service, hit[3])
            return hit[2]
        roots = [policy.workspace_root, *policy.writable_roots, *_SHARED_WRITABLE]
        idents = self._writable_identities(roots, service)
        cache = _ServiceCache.path(service)
        try:
            cache_pin = self._pins.pin(cache, writable=True)
        except ShellError:
            cache_pin = None
        if cache_pin is None:  # removed (not pinned yet) or replaced (refused): a fresh one
            cache = _ServiceCache.renew(service)
            cache_pin = self._pins.pin(cache, writable=True)
        if cache_pin is not None:
            idents.append(cache_pin[1])
        ruleset = self._cached_ruleset(idents, policy.network, read_only=False)
        builder = self._cache_env(cache)
        conf = Confinement(ruleset=ruleset, env_builder=builder)
        # The next call of this policy only re-checks that every root is the same directory
        # (one stat each, natively).
        checks = [
            (os.fsencode(path), got[1] if got else None)
            for path in dict.fromkeys((*roots, cache))
            for got in (self._pins.pin(path, writable=True),)
        ]
        roots_check = RootCheck(checks)
        info = self._info(policy.mode, policy.network, denied=False)
        confined = ConfinedCall(policy, roots_check, ruleset, builder, conf.env, info)
        if len(self._prepared) >= _RULESET_CACHE_SIZE:
            self._prepared.clear()
        self._prepared[key] = (service, roots_check, conf, confined)
        self._bind_fast(service, confined)
        return conf

    def _bind_fast(self, service: SubprocessService, confined: ConfinedCall) -> None:
        """Makes ``confined`` the call ``run_sync`` runs natively (unless a subclass has
        hooks of its own)."""
        if self._native_confined:
            template = self._shell_template(service)
            self._fast = (service, template, service.confined_runner(template, confined))

    def _cache_env(self, cache: str) -> EnvBuilder:
        """The confined environment rules with the cache variables fixed (a call's own env
        still wins): one builder per cache directory, so its environment stays cached."""
        builder = self._cache_envs.get(cache)
        if builder is None:
            fixed = [(name, cache) for name in _CACHE_VARS]
            builder = self._cache_envs[cache] = self._env_builder(_CONFINED_DROPS, fixed)
        return builder

    def _writable_identities(self, roots: list[str], service: SubprocessService) -> list[Identity]:
        """Pins every writable root (refusing a swapped one) and refuses roots that contain
        the service's spill directory."""
        spill = self._real_spill(service.spill_location)
        idents: list[Identity] = []
        for root in roots:
            if not os.path.isabs(root):
                raise ShellError(INVALID_REQUEST, f"sandbox roots must be absolute, got {root!r}")
            got = self._pins.pin(root, writable=True)
            if got is None:
                continue
            real, ident = got
            if _inside(spill, real):
                raise _refuse(f"spill directory {spill} lies inside writable root {real}")
            if ident not in idents:
                idents.append(ident)
        return idents

    def _real_spill(self, location: str) -> str:
        real = self._spill_reals.get(location)
        if real is None:
            real = self._spill_reals[location] = os.path.realpath(location)
        return real

    def _cached_ruleset(self, idents: list[Identity], network: bool, *, read_only: bool) -> Ruleset:
        # A confinement can be applied by any number of children: reuse it while the roots
        # are the same pinned directories.
        key = (tuple(sorted(idents)), network, read_only)
        with self._rulesets_lock:
            cached = self._rulesets.get(key)
            if cached is not None:
                self._rulesets.move_to_end(key)
                return cached
        ruleset = self._build(idents, network, read_only)
        with self._rulesets_lock:
            self._rulesets[key] = ruleset
            while len(self._rulesets) > _RULESET_CACHE_SIZE:
                self._rulesets.popitem(last=False)
        return ruleset

    def _build(self, idents: list[Identity], network: bool, read_only: bool) -> Ruleset:
        return native.build_ruleset([self._pins.fd(i) for i in idents], network, read_only)

    def _prepare_read_only(
        self, spec: ShellExecSpec, policy: SandboxPolicy, service: SubprocessService
    ) -> Confinement:
        # A private scratch directory as $TMPDIR (bash here-docs over 64 KiB need one),
        # made where no other confined command can write, removed when the call settles.
        tmpdir = service.scratch_dir("tmp-")
        try:
            fd = os.open(tmpdir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                ruleset = native.build_ruleset([fd], policy.network, True)
            finally:
                os.close(fd)
        except BaseException:
            service.remove_scratch_dir(tmpdir)
            raise
        env = [] if spec.env and "TMPDIR" in spec.env else [(b"TMPDIR", os.fsencode(tmpdir))]
        return Confinement(
            ruleset=ruleset,
            env=env,
            env_builder=self._confined_env,
            cleanup=lambda: service.remove_scratch_dir(tmpdir),
        )

    # -- results ------------------------------------------------------------------------

    def _sandbox_info(
        self, spec: ShellExecSpec, exit_code: int | None, stdout_tail: str, stderr_tail: str
    ) -> ShellSandboxInfo:
        policy = self._policy(spec)
        mode = policy.mode
        denied = mode != "danger-full-access" and is_denial(exit_code, stdout_tail, stderr_tail)
        return self._info(mode, policy.network, denied)

    def _info(self, mode: SandboxMode, network: bool, denied: bool) -> ShellSandboxInfo:
        key = (mode, network, denied)
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = ShellSandboxInfo(
                mode=mode, denied=denied, enforcement=enforcement_for(mode, network)
            )
        return info

    def _runner_failed_info(self, spec: ShellExecSpec) -> ShellSandboxInfo:
        # The command never ran: no exit code, so never a denial.
        policy = spec.sandbox_policy
        mode = policy.mode if policy is not None else self.default_mode
        network = policy.network if policy is not None else True
        return ShellSandboxInfo(
            mode=mode,
            denied=False,
            enforcement=enforcement_for(mode, network),
            runner_failed=True,
        )


def _absolute(path: object, name: str) -> str:
    if not isinstance(path, str) or not path or "\0" in path:
        raise ShellError(INVALID_REQUEST, f"{name} must be a non-empty path, got {path!r}")
    if not os.path.isabs(path):
        raise ShellError(INVALID_REQUEST, f"{name} must be absolute, got {path!r}")
    return os.path.normpath(path)


def sandbox_facts() -> list[str]:
    """What ``shellseam doctor`` says about confinement beyond the per-mode enforcement:
    what every confined mode adds, and what a confined command can still do here."""
    can_setpcap, _last_cap = native.capability_facts()
    lines = [
        "confined modes add: every capability dropped (bounding set cleared"
        + ("" if can_setpcap else ": the harness lacks CAP_SETPCAP, nothing to clear")
        + "), securebits locked, no_new_privs, no terminal, a seccomp filter (sockets and "
        "non-stream socketpairs refused when network=False; chmod/chown/utime/xattr/"
        "file-attribute writes refused in read-only; keyrings, io_uring, new namespaces, "
        "clone(CLONE_PARENT), TIOCSTI/TIOCLINUX, System V IPC and POSIX message queues, "
        "prlimit64 and the priority/scheduling calls on other processes always refused; "
        "syscalls newer than the "
        "filter answer ENOSYS)",
        "harness protection: a SandboxShellExecutor makes the harness non-dumpable "
        f"(protect_harness=True; dumpable now: {native.harness_dumpable()})",
        "denial detection: permission signatures in the stdout/stderr tails "
        "(Landlock audit records are not read)",
        "a confined command can still: connect to pathname unix sockets it can see when "
        "network=True (Landlock has no right for that on ABI <= 7)",
        "a confined command can still: read every file the harness's user can read outside "
        "/dev (in /dev only null, zero, full, random, urandom and shm: no terminal, console, "
        "input device or disk)",
        "a confined command can still: write /tmp and /dev/shm in workspace-write mode, "
        "shared with every other process",
    ]
    if os.geteuid() == 0:
        lines.append(
            "a confined command can still: chmod/chown root-owned files outside its writable "
            "roots in workspace-write mode (the harness runs as root; Landlock has no right "
            "for metadata; read-only refuses it)"
        )
    lines.append(
        "a confined command can still: write .git/hooks and .git/config inside a writable "
        "workspace (Landlock cannot carve a read-only hole in a writable root)"
    )
    spill = os.path.realpath(native.default_spill_parent())
    for root in (*_SHARED_WRITABLE, os.environ.get("TMPDIR") or ""):
        if root and _inside(spill, os.path.realpath(root)):
            lines.append(
                f"warning: the spill parent {spill} lies inside writable root {root}: "
                "workspace-write calls will be refused (set XDG_CACHE_HOME or spill_parent)"
            )
    return lines

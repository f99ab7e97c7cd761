"""Where the front ends keep spill files: the service's default spill parent, moved out of a
sandbox's writable roots when it lies inside them.

A confined call whose writable roots contain the spill directory is refused (a command must
not rewrite what the model will read). ``~/.cache/shellseam`` lies inside a workspace rooted
at ``~``, so a front end whose workspace contains the default parent puts its spill files in
``/var/tmp/shellseam-<uid>`` instead, which no confined mode's default roots contain.
``shellseam run`` keeps its spill files (printed paths must stay readable after it exits) in
a ``cli/`` folder of that parent, which ``shellseam clean`` sweeps.
"""

from __future__ import annotations

import contextlib
import os

from .service import _owned_dir, _private_dir, default_spill_parent


def logical_cwd() -> str:
    """The working directory as the shell that started us names it (``$PWD``, as ``pwd -L``
    prints it) when that still names the current directory, else ``os.getcwd()``: a sandbox
    must see a symlink the directory was entered through to judge who could have planted it."""
    cwd = os.getcwd()
    pwd = os.environ.get("PWD")
    if not pwd or not os.path.isabs(pwd) or "\0" in pwd or pwd == cwd:
        return cwd
    try:
        here, there = os.stat(cwd), os.stat(pwd)
    except OSError:
        return cwd
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        return cwd
    return os.path.normpath(pwd)


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def _outside_parent() -> str:
    return f"/var/tmp/shellseam-{os.geteuid()}"


def spill_parent_outside(*roots: str) -> str:
    """The default spill parent, or ``/var/tmp/shellseam-<uid>`` when the default lies inside
    one of ``roots`` (and that one can be ours)."""
    base = default_spill_parent()
    if not any(_inside(base, root) for root in roots):
        return base
    fallback = _outside_parent()
    return fallback if _private_dir(fallback) else base


def cli_spill_parent(*roots: str) -> str:
    """``<spill parent outside roots>/cli``, created private; the parent itself when that
    folder cannot be ours (e.g. someone else made it in a shared temp directory)."""
    base = spill_parent_outside(*roots)
    path = os.path.join(base, "cli")
    return path if _private_dir(path) else base


def cli_spill_parents() -> list[str]:
    """Every folder ``shellseam run`` may have kept spill files in (for ``shellseam clean``)."""
    parents = [cli_spill_parent()]
    other = os.path.join(_outside_parent(), "cli")
    # /var/tmp is everyone's: only a fallback that is ours all the way down (never a folder
    # or a symlink someone else made there, which could point clean at live spill files).
    if other not in parents and _owned_dir(_outside_parent()) and _owned_dir(other):
        parents.append(other)
    return parents


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> None:
    """Removes ``path`` and everything under it, however deep; never raises.

    Commands write the trees this removes (a read-only call's ``$TMPDIR``, the cache
    directory), so it may not recurse (``shutil.rmtree`` hits the recursion limit at ~1,000
    levels, and ``mkdir d && cd d`` in a loop builds that in a second), may not hold one fd
    per level, and never follows a symlink. It walks down and back up with one directory
    fd at a time and a stack of (name, identity) per level; what cannot be removed is left
    in place.

    A command still running may move the directory the walk is in while it walks (to a
    shallower place in the tree, or out of it): every step back up checks that ``..`` is
    the very directory the walk came down from, and stops otherwise, so the walk never
    climbs out of the tree into directories the command could not write.
    """
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # not a directory (or already gone)
        return
    # One entry per level below ``path``: the name taken down, and the (dev, inode) of the
    # directory it was taken from (where the walk must come back up to).
    names: list[tuple[str, tuple[int, int]]] = []
    stuck: set[tuple[int, int]] = set()  # (dev, inode) that would not go: skipped from then on
    try:
        while True:
            here = os.fstat(fd)
            dev = here.st_dev
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if (dev, entry.inode()) in stuck:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry
                        break
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        stuck.add((dev, entry.inode()))
            if sub is not None:
                try:
                    child = os.open(sub.name, _OPEN_DIR, dir_fd=fd)
                except OSError:
                    stuck.add((dev, sub.inode()))
                    continue
                os.close(fd)
                fd = child
                names.append((sub.name, (here.st_dev, here.st_ino)))
                continue
            if not names:
                break
            parent = os.open("..", _OPEN_DIR, dir_fd=fd)
            os.close(fd)
            fd = parent
            name, came_from = names.pop()
            up = os.fstat(fd)
            if (up.st_dev, up.st_ino) != came_from:
                break  # moved while we walked: ".." is no longer where we came from
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                stuck.add((here.st_dev, here.st_ino))
    except OSError:
        pass  # the tree changed under us or the fd limit was hit: leave the rest
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)

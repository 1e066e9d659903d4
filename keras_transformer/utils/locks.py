"""One writer a directory: the exclusive lock that every command writing a
directory takes (`train`, `export`, `export-marian`, `convert`, and
`save_to_preset`), so that two processes never write one directory at once.

`locked(directory, purpose)` holds an exclusive advisory lock on
`directory` while its block runs. A second writer, in another process or
another thread, gets a `DirectoryInUseError` at once, naming the holder's
process id, instead of interleaving its files with the first's. The lock is
the operating system's (`flock`, through the `filelock` package) on a file
beside the directory, `.NAME.lock`, which works across the machines that
share a network file system too: the kernel releases it when its process
ends, however it ends, so a writer killed with SIGKILL leaves no lock
behind, only the empty file, which the next writer locks again. While the
lock is held, `.NAME.lock.pid` names its holder (process id, host, purpose).
Both files go when the holder releases the lock (with filelock 3, which
cannot tell a removed lock file from a live one, the lock file stays). A
writer that holds the lock may take it again inside its block (a `convert`
saves its preset through `save_to_preset`).

>>> import os, tempfile
>>> run = os.path.join(tempfile.mkdtemp(), "run")
>>> with locked(run, "training"):
...     holder(run)["purpose"]
'training'
>>> holder(run) is None
True
"""

import contextlib
import errno
import json
import os
import socket
import threading

import filelock

_held = threading.local()  # this thread's locked directories: {path: depth}
# filelock 4 drops a lock on a file that was removed before its flock took
# hold (it tries again, or times out), so a holder may remove the file as it
# releases it. With filelock 3 a writer that had opened the file just before
# would hold a lock that the next writer, on a new file, does not see.
REMOVES_LOCK_FILE = int(filelock.__version__.split(".")[0]) >= 4


class DirectoryInUseError(OSError):
    """Another writer holds the directory's lock; the message names it."""

    def __init__(self, directory, found):
        who = "another process"
        if found:
            who = f"process {found['pid']}" + (f" on {found['host']}" if found.get("host") != socket.gethostname() else "")
            who += f" ({found['purpose']})" if found.get("purpose") else ""
        super().__init__(
            errno.EBUSY,
            f"{directory!r} is being written by {who}: two writers of one directory would mix their files. "
            "Wait for it to finish (or stop it), or choose another directory",
        )
        self.holder = found

    def __str__(self):
        return self.strerror


def lock_file(directory):
    """The lock file of `directory`: `.NAME.lock` beside it."""
    parent, name = os.path.split(_canonical(directory))
    return os.path.join(parent, f".{name or 'root'}.lock")


@contextlib.contextmanager
def locked(directory, purpose="writing"):
    """Holds the exclusive lock on `directory` for the block (see the module
    docstring); yields its absolute path.

    Args:
        directory: the directory to write (it need not exist yet; its parent
            is made, where the lock file goes).
        purpose: what the holder does, for the error that a second writer
            gets ("train", "export"...).

    Raises:
        DirectoryInUseError: another writer holds it (an `OSError`).
    """
    path = _canonical(directory)
    depth = _held.__dict__.setdefault("paths", {})
    if path in depth:  # taken again by its holder
        depth[path] += 1
        try:
            yield path
        finally:
            depth[path] -= 1
        return
    lock_path = lock_file(path)
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    lock = filelock.FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise DirectoryInUseError(path, _read_holder(lock_path)) from None
    depth[path] = 1
    try:
        _write_holder(lock_path, purpose)
        yield path
    finally:
        del depth[path]
        for name in (lock_path + ".pid", lock_path) if REMOVES_LOCK_FILE else (lock_path + ".pid",):
            with contextlib.suppress(OSError):
                os.remove(name)  # while the lock is held
        lock.release()


def holder(directory):
    """Who holds `directory`'s lock: `{"pid", "host", "purpose"}`, or None
    when no live writer does."""
    lock_path = lock_file(directory)
    if not os.path.exists(lock_path):
        return None
    lock = filelock.FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return _read_holder(lock_path) or {}
    lock.release()
    return None


def _canonical(directory):
    return os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(directory))))


def _write_holder(lock_path, purpose):
    with open(lock_path + ".pid", "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose}, f)


def _read_holder(lock_path):
    """The holder recorded beside the lock, or None if the record is missing,
    unreadable, or left by a process that has ended (the lock's new holder
    has not written its own yet)."""
    try:
        with open(lock_path + ".pid", encoding="utf-8") as f:
            found = json.load(f)
        pid = int(found["pid"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if found.get("host") == socket.gethostname() and not _alive(pid):
        return None
    return found


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True

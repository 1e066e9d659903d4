"""File helpers shared by the presets, the exports and the datasets."""

import contextlib
import errno
import fnmatch
import hashlib
import os
import shutil
import tempfile


def sha256(path):
    """The SHA-256 of a file's bytes, as a hex string, read in 1 MiB blocks.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(delete=False) as f:
    ...     _ = f.write(b"abc")
    >>> sha256(f.name)[:16]
    'ba7816bf8f01cfea'
    >>> import os; os.remove(f.name)
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def matching(directory, patterns):
    """The names in `directory` that match any of `patterns` (names or glob
    patterns such as `model_*.weights.h5`)."""
    return {name for name in os.listdir(directory) if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


@contextlib.contextmanager
def staging_directory(target, purpose="writing"):
    """A fresh directory beside `target` to write into, removed afterwards
    (what it still holds was not moved into place: a failed write).

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> with staging_directory(os.path.join(root, "out")) as staging:
    ...     os.path.dirname(staging) == root
    True
    >>> os.listdir(root)
    []
    """
    target = os.path.abspath(os.fspath(target))
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.{purpose}-", dir=parent)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def written_atomically(path):
    """A temporary name beside `path` (a file or a directory) to write to;
    it takes `path`'s place when the block ends without an error, so that a
    kill or an error mid-write leaves nothing truncated under the real name.
    The temporary name keeps `path`'s suffix (Keras checks it) and starts
    with a dot (no glob for the real names matches it).

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> with written_atomically(os.path.join(root, "a.txt")) as partial:
    ...     _ = open(partial, "w").write("whole")
    >>> os.listdir(root), open(os.path.join(root, "a.txt")).read()
    (['a.txt'], 'whole')
    """
    path = os.fspath(path)
    partial = os.path.join(os.path.dirname(path), f".partial-{os.path.basename(path)}")
    _remove(partial)
    try:
        yield partial
        os.replace(partial, path)
    finally:
        _remove(partial)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def move_into_place(staging, target, replaces=()):
    """Moves every entry of `staging` into the directory `target`.

    Entries of `target` with the same names, and those matching `replaces`
    (names or glob patterns: what an earlier write of the same kind left),
    are replaced; every other entry of `target` stays. The old entries are
    set aside first and put back if a move fails, so that `target` is either
    as it was or fully written.

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> new, out = os.path.join(root, "new"), os.path.join(root, "out")
    >>> for path in (new, out): os.makedirs(path)
    >>> for path in ("new/a", "out/a", "out/old", "out/NOTES.md"):
    ...     open(os.path.join(root, path), "w").close()
    >>> move_into_place(new, out, replaces=["old"])
    >>> sorted(os.listdir(out))
    ['NOTES.md', 'a']
    """
    os.makedirs(target, exist_ok=True)
    written = set(os.listdir(staging))
    replaced = written | matching(target, replaces)
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.previous-", dir=os.path.dirname(target))
    moved_aside, moved_in = [], []
    try:
        for name in sorted(replaced):
            if os.path.lexists(os.path.join(target, name)):
                os.replace(os.path.join(target, name), os.path.join(aside, name))
                moved_aside.append(name)
        for name in sorted(written):
            os.replace(os.path.join(staging, name), os.path.join(target, name))
            moved_in.append(name)
    except BaseException:
        for name in moved_in:
            os.replace(os.path.join(target, name), os.path.join(staging, name))
        for name in moved_aside:
            os.replace(os.path.join(aside, name), os.path.join(target, name))
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def is_disk_full(error):
    """Whether `error` (an `OSError`, or another library's error such as
    TensorFlow's `ResourceExhaustedError` or h5py's) reports a full disk."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "no space left on device" in str(error).lower() or "disk quota exceeded" in str(error).lower():
            return True
        error = error.__cause__ or error.__context__
    return False


class DiskFullError(OSError):
    """A write failed because the disk is full; nothing was left behind."""

    def __init__(self, what, path):
        super().__init__(
            errno.ENOSPC,
            f"no space left on the device while {what} {path!r}. Nothing was left behind and "
            "existing files are as they were: free some space or choose another directory",
        )

    def __str__(self):
        return self.strerror


@contextlib.contextmanager
def reporting_full_disk(what, path):
    """Turns any error that reports a full disk into a `DiskFullError`
    naming `what` was written where."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        if is_disk_full(error):
            raise DiskFullError(what, path) from error
        raise

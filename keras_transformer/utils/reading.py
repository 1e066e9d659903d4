"""Reading the files of a preset (or a run) with a bound: only regular
files, and no more than a limit of bytes.

A preset is a directory anyone may hand over: one of its files may be a
symlink to a device (`/dev/zero`, which never ends) or a FIFO (whose
reader waits for a writer forever). Each file is opened without waiting
(`O_NONBLOCK`), refused unless it is a regular file, and read only up to
its limit, so that such a file gives an error that names it rather than
a hang or a `MemoryError`.
"""

import json
import os
import stat

# Limits of the files a preset holds: far above what this package writes
# (a config is a few KiB, a vocabulary a few MiB, Marian's vocab.json under
# 10 MiB), far below what would exhaust a machine.
JSON_LIMIT = 64 << 20
VOCABULARY_LIMIT = 512 << 20
# Weights are read by h5py and NumPy, which stream them: only their kind is
# checked, and their size against this.
WEIGHTS_LIMIT = 1 << 40


class UnreadableFileError(ValueError):
    """A file that is not a regular file, or larger than its limit."""


def check_regular_file(path, limit):
    """The size of `path`, which must be a regular file (a symlink to one
    is fine) of at most `limit` bytes; an `UnreadableFileError` that names
    it otherwise (`FileNotFoundError` if it does not exist)."""
    with _opened(path) as fd:
        return _checked_size(path, os.fstat(fd), limit)


def read_bytes(path, limit):
    """The bytes of `path`, a regular file of at most `limit` bytes.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(delete=False) as f:
    ...     _ = f.write(b"abc")
    >>> read_bytes(f.name, limit=3)
    b'abc'
    >>> read_bytes(f.name, limit=2)
    Traceback (most recent call last):
    ...
    keras_transformer.utils.reading.UnreadableFileError: ... is 3 bytes, more than the 2 bytes such a file may have...
    >>> import os; os.remove(f.name)
    """
    with _opened(path) as fd:
        _checked_size(path, os.fstat(fd), limit)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > limit:  # the file grew while it was read
        raise UnreadableFileError(_too_large(path, len(data), limit))
    return data


def read_text(path, limit=JSON_LIMIT):
    """The UTF-8 text of `path` (see `read_bytes`); `UnicodeDecodeError`
    if it is not UTF-8."""
    return read_bytes(path, limit).decode("utf-8")


def read_json(path, limit=JSON_LIMIT):
    """The JSON value in `path` (see `read_bytes`); `json.JSONDecodeError`
    or `UnicodeDecodeError` if it is not UTF-8 JSON."""
    return json.loads(read_text(path, limit))


class _opened:
    """`os.open` of `path` for reading without waiting for a FIFO's writer."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        return self.fd

    def __exit__(self, *exc):
        os.close(self.fd)


def _checked_size(path, status, limit):
    if not stat.S_ISREG(status.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(status.st_mode) else "a device" if (
            stat.S_ISCHR(status.st_mode) or stat.S_ISBLK(status.st_mode)
        ) else "a socket" if stat.S_ISSOCK(status.st_mode) else "not a regular file"
        raise UnreadableFileError(
            f"{os.fspath(path)!r} is {kind}, not a regular file" + (
                f" (a link to {os.path.realpath(path)!r})" if os.path.islink(path) else ""
            ) + ": a preset's files must be regular files. Copy the preset again, or save the model again."
        )
    if status.st_size > limit:
        raise UnreadableFileError(_too_large(path, status.st_size, limit))
    return status.st_size


def _too_large(path, size, limit):
    return (
        f"{os.fspath(path)!r} is {size} bytes, more than the {limit} bytes such a file may have: it is "
        "not the file a preset holds. Copy the preset again, or save the model again."
    )

"""File helpers shared by the presets and the datasets."""

import hashlib


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

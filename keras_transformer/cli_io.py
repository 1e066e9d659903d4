"""The command line's text in and out: the sentences `translate` reads (its
TEXT arguments, a file, or standard input) and the lines it writes.

A line ends at "\\n", "\\r\\n" or "\\r" (`utils.text.split_lines`), so that
every input line gets one output line whatever made the file. The output
file is written whole or not at all: the translations go to a temporary
file beside it, which takes its name at the end, so that an interrupted or
failed run (Ctrl-C, a full disk) leaves an earlier file as it was.
"""

import codecs
import contextlib
import os
import select
import shutil
import sys
import tempfile

from keras_transformer.utils.text import split_lines


def decode_lines(data, name):
    """The lines of UTF-8 bytes read from `name` (a file or standard
    input), a byte order mark at the start dropped; an error naming the first
    line that is not UTF-8."""
    return split_lines(decode_text(data, name))


def decode_text(data, name):
    """UTF-8 bytes read from `name` as text, as `decode_lines` reads them."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = len(split_lines(data[: error.start].decode("utf-8") + "x"))  # the line it is on
        raise ValueError(
            f"line {line} of {name} is not valid UTF-8 (byte {data[error.start]:#04x}). Convert the text to "
            "UTF-8 first, for example with `iconv -f LATIN1 -t UTF-8`."
        ) from None
    return text


def read_sentences(text, path, whole=False):
    """The sentences to translate: the TEXT arguments `text`, else the lines
    of the file `path`, else those of standard input. With `whole`, the
    texts to translate as documents: each TEXT argument, or the whole of
    the file or of standard input, as one text."""
    decode = (lambda data, name: [decode_text(data, name)]) if whole else decode_lines
    if text:
        return list(text)
    if path:
        with open(path, "rb") as f:
            return decode(f.read(), path)
    if sys.stdin is None or sys.stdin.closed:
        raise SystemExit(
            "error: no sentences to translate: standard input is closed. Give them as TEXT arguments, "
            "in a file (--input FILE), or on standard input (a pipe or a redirect)."
        )
    if sys.stdin.isatty():
        print("Type sentences, one a line; end with Ctrl-D.", file=sys.stderr)
    return decode(read_interruptibly(sys.stdin.buffer), "standard input")


def read_interruptibly(stream, wait=0.2):
    """All the bytes of `stream` until its end, read so that Ctrl-C stops
    the read at once. A blocking `read` returns only when input comes where
    the kernel hands SIGINT to another of the process's threads (PyTorch's
    and TensorFlow's start threads at import): Python's main thread then
    learns of it only after the next line. So the read waits at most `wait`
    seconds at a time (`select`), and Python handles the signal between
    waits."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (tests' in-memory streams)
        return stream.read()
    chunks = []
    while True:
        ready, _, _ = select.select([descriptor], [], [], wait)
        if not ready:
            continue
        chunk = os.read(descriptor, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def check_output_path(path, reads=None):
    """Fails before any work if `path` cannot be written, so that a long
    run is not lost at the end (the file itself is written only then), or
    if it is the file `reads`, whose lines it would replace. Without
    `path` (standard output), fails if standard output is closed."""
    if path is None:
        if sys.stdout is None or sys.stdout.closed:
            raise SystemExit("error: standard output is closed: write the translations to a file with -o FILE.")
        return
    if reads is not None and os.path.exists(path) and os.path.samefile(path, reads):
        raise SystemExit(
            f"error: --output {path} is the --input file: its sentences would be replaced by their "
            "translations. Write to another file."
        )
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Cannot write {path!r}: the directory {directory!r} does not exist.")
    if os.path.isdir(target):
        raise IsADirectoryError(f"Cannot write {path!r}: it is a directory.")
    if os.path.exists(target) and not os.path.isfile(target):  # /dev/null, a pipe: written in place
        if not os.access(target, os.W_OK):
            raise PermissionError(f"Cannot write {path!r}: it is not writable.")
        return
    if not os.access(directory, os.W_OK | os.X_OK):  # also a read-only file system
        raise PermissionError(
            f"Cannot write {path!r}: the directory {directory!r} is not writable (the file is written "
            "beside its name first, then renamed, so that an interrupted run leaves no half-written file)."
        )


def write_lines(lines, path=None, ends=True):
    """Writes `lines`, each ended with "\\n" (unless not `ends`: the texts
    as they are), to the file `path` whole or not at all (see the module
    docstring), or to standard output."""
    text = "".join(line + "\n" if ends else line for line in lines)
    if path is None:
        sys.stdout.write(text)
        return
    target = os.path.realpath(path)
    if os.path.exists(target) and not os.path.isfile(target):
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        return
    with _replaced_at_the_end(target) as partial:
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)


@contextlib.contextmanager
def _replaced_at_the_end(target):
    """A new temporary file beside `target`, with `target`'s permissions
    (or a new file's), that takes `target`'s name when the block ends
    without an error, and is removed otherwise."""
    directory, name = os.path.split(target)
    descriptor, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
    os.close(descriptor)
    try:
        if os.path.exists(target):
            shutil.copymode(target, partial)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(partial, 0o666 & ~umask)
        yield partial
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise

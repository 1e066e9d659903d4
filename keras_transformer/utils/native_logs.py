"""The C++ libraries' start-up lines kept off the terminal, in the
command's own processes (`keras-transformer`, and the server's worker
processes)."""

import os
import sys

# Set to 1 to see the C++ libraries' log lines (see `quiet_native_logs`).
NATIVE_LOGS_VARIABLE = "KERAS_TRANSFORMER_NATIVE_LOGS"


def quiet_native_logs():
    """Keeps the C++ libraries' start-up notes off the terminal.

    TensorFlow and tensorflow-text write lines such as "oneDNN custom
    operations are on", "Could not find cuda drivers" or SentencePiece's
    "precompiled_charsmap is empty" straight to the process's stderr, some
    before and regardless of TF_CPP_MIN_LOG_LEVEL. Python's own messages
    (progress bars, warnings, errors) keep going to the terminal through a
    copy of stderr; what the C++ code writes to the process's stderr goes to
    the null device. Called by the console script (and each of the server's
    worker processes) before anything imports TensorFlow;
    `KERAS_TRANSFORMER_NATIVE_LOGS=1` keeps the lines.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ.get(NATIVE_LOGS_VARIABLE) == "1":
        return
    try:
        sys.stderr.flush()
        terminal = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        sys.stderr = os.fdopen(terminal, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    except (OSError, ValueError, AttributeError):  # no stderr to redirect: leave it
        pass

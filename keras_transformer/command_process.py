"""How a command's own process starts: the steps the `keras-transformer`
command takes before anything imports a backend, in one place for the
command's process (`cli.run`) and for the worker processes of `serve
--workers` (`serving.workers`), which fresh interpreters run.

- `prepare(command)`: for `translate`, `evaluate` and `serve`, PyTorch
  without the JAX and matplotlib that Keras imports; the native libraries'
  start-up lines off the terminal (not for `train`, whose native errors
  matter in long runs); freed memory kept for reuse by the commands that
  compute.
- `leave_out_tensorflow(names)`: on JAX and PyTorch, SentencePiece presets
  translate without TensorFlow, which takes seconds to import; decided
  once the command's presets are known, before anything imports keras-hub.

Only in a process of the command's own: a caller of `cli.main` keeps the
process it has.
"""

import os

# The commands that skip JAX and matplotlib on PyTorch, and those that
# keep freed memory for reuse (utils/memory.py).
DECODING_COMMANDS = ("translate", "evaluate", "serve")
COMPUTING_COMMANDS = ("train", *DECODING_COMMANDS)


def prepare(command):
    """The start-up steps of `command` (a subcommand's name, or None),
    taken before anything imports Keras or a backend."""
    from keras_transformer.utils import tensorflow_free

    if command in DECODING_COMMANDS:
        tensorflow_free.skip_jax_and_matplotlib()
    if command != "train":
        from keras_transformer.utils.native_logs import quiet_native_logs

        quiet_native_logs()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if command in COMPUTING_COMMANDS:
        # Set before the backends start their threads (which keep the heap
        # they start with).
        from keras_transformer.utils.memory import reuse_freed_memory

        reuse_freed_memory()


def leave_out_tensorflow(names):
    """Leaves TensorFlow out of this process where every preset of `names`
    (names or directories) is a SentencePiece one, on JAX and PyTorch
    (utils/tensorflow_free.py)."""
    from keras_transformer.presets.registry import sentencepiece_presets
    from keras_transformer.utils import tensorflow_free

    if sentencepiece_presets(names):
        tensorflow_free.skip_tensorflow()

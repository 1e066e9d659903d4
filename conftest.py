"""Doctest collection (`--doctest-modules`) of the package's modules.

The modules made for PyTorch alone import it at their top and hold no
doctests: they are collected in PyTorch's run only, so that the JAX and
TensorFlow runs do not load PyTorch's native libraries for nothing.
"""

import os

if os.environ.get("KERAS_BACKEND", "tensorflow") != "torch":
    collect_ignore_glob = ["keras_transformer/runtime/torch_*.py"]

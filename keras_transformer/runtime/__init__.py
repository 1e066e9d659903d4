"""The backend wing: what exists for one backend, below the paper's layers
and the search.

`layers/` and `decoding/` are written in Keras ops. Where one backend needs
another way to run the same computation (PyTorch, which runs eagerly and
pays Keras' conversions and checks at every op), that way lives here,
chosen in one place (`array_ops`).
"""

from keras_transformer.runtime.array_ops import array_ops

__all__ = ["array_ops"]

"""Small random models of the package, the same on every backend (NumPy's
random weights), and token ids to translate with them."""

import numpy as np

from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM

START, END = 2, 3


def small_model(seed=0, vocabulary_size=64, d_model=16, num_layers=1):
    """A random model, the same on every backend (NumPy's random weights)."""
    backbone = TransformerBackbone(
        vocabulary_size, num_layers=num_layers, d_model=d_model, d_ff=2 * d_model, num_heads=2,
        dropout=0.0, max_sequence_length=32,
    )
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        shape = tuple(variable.shape)
        if variable.path.endswith("embeddings"):
            # Large random embeddings make the next-token distributions peaked.
            variable.assign(rng.normal(0, 1.5, shape).astype("float32"))
        elif variable.path.endswith("kernel"):  # about the size of Keras's initial kernels
            variable.assign(rng.normal(0, 0.5 * d_model**-0.5, shape).astype("float32"))
    return TransformerSeq2SeqLM(backbone)


def token_inputs(rows, vocabulary_size=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, 8), "int32")
    for row in range(rows):
        length = rng.integers(3, 8)
        ids[row, :length] = [START, *rng.integers(4, vocabulary_size, length - 2), END]
    return {"encoder_token_ids": ids, "encoder_padding_mask": (ids != 0).astype("int32")}

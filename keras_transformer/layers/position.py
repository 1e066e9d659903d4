"""Positional encodings (paper section 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

and, as Table 3 row (E), learned positional embeddings. Both come from
keras-hub, whose layers already compute exactly this; the subclasses here
only give them the paper's names, section references and this package's
serialization names.
"""

import keras
import keras_hub

from keras_transformer.runtime.dispatch import DirectCall


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(DirectCall, keras_hub.layers.SinePositionEncoding):
    """The fixed sinusoidal encoding of section 3.5: sine on even, cosine on
    odd dimensions, wavelengths from 2*pi to `max_wavelength` * 2*pi.

    Args:
        max_wavelength: the 10000 of the formula.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: embedded tokens `(batch, length, d_model)`; only the shape is
            used.
        start_index: position of the first token (for incremental decoding).

    Returns:
        The encodings, broadcast to the shape of `inputs`, to be added to them.

    Example:

    >>> import numpy as np
    >>> pe = SinusoidalPositionEncoding()(np.zeros((1, 50, 128), "float32"))
    >>> float(pe[0, 0, 1])  # cos(0)
    1.0
    """


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionEmbedding(DirectCall, keras_hub.layers.PositionEmbedding):
    """Learned positional embeddings, Table 3 row (E).

    Args:
        sequence_length: the longest sequence the model accepts.
        initializer: initializer of the position table.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: embedded tokens `(batch, length, d_model)`.
        start_index: position of the first token (for incremental decoding).

    Example:

    >>> import numpy as np
    >>> layer = LearnedPositionEmbedding(sequence_length=64)
    >>> tuple(layer(np.zeros((2, 10, 32), "float32")).shape)
    (2, 10, 32)
    """

    def call(self, inputs, start_index=0, positions=None):
        length = inputs.shape[-2]
        if positions is None and isinstance(length, int) and isinstance(start_index, int):
            if start_index + length > self.sequence_length:
                # keras-hub's slice of the table fails with a broadcast error.
                raise ValueError(
                    f"A sequence of {start_index + length} positions is longer than the "
                    f"{self.sequence_length} learned positions (max_sequence_length): cut the "
                    "sequences, or build a model with a larger max_sequence_length."
                )
        return super().call(inputs, start_index=start_index, positions=positions)

"""Positional encodings (paper section 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

and, as Table 3 row (E), learned positional embeddings. Both come from
keras-hub, whose layers already compute exactly this; the subclasses here
only give them the paper's names, section references and this package's
serialization names.

Imported fairseq checkpoints (M2M100, NLLB-200) use a variant of the
sinusoids (`style="fairseq"`): the sines in the first half of d_model and
the cosines in the second, the frequencies 10000^(-i / (d_model/2 - 1)),
and positions counted from `offset` (padding id + 1) instead of 0.
"""

import math

import keras
import keras_hub
from keras import ops

from keras_transformer.runtime.dispatch import DirectCall


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(DirectCall, keras_hub.layers.SinePositionEncoding):
    """The fixed sinusoidal encoding of section 3.5: sine on even, cosine on
    odd dimensions, wavelengths from 2*pi to `max_wavelength` * 2*pi.

    Args:
        max_wavelength: the 10000 of the formula.
        style: `"paper"` (sines and cosines interleaved, section 3.5) or
            `"fairseq"` (sines then cosines, frequencies
            max_wavelength^(-i / (d_model/2 - 1)), as fairseq's M2M100 and
            NLLB models).
        offset: the position of the first token (fairseq: padding id + 1).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: embedded tokens `(batch, length, d_model)`; only the shape is
            used.
        start_index: position of the first token (for incremental decoding),
            counted after `offset`.

    Returns:
        The encodings, broadcast to the shape of `inputs`, to be added to them.

    Example:

    >>> import numpy as np
    >>> pe = SinusoidalPositionEncoding()(np.zeros((1, 50, 128), "float32"))
    >>> float(pe[0, 0, 1])  # cos(0)
    1.0
    >>> fairseq = SinusoidalPositionEncoding(style="fairseq", offset=2)
    >>> float(fairseq(np.zeros((1, 5, 8), "float32"))[0, 0, 0])  # sin(2)
    0.9092974066734314
    """

    STYLES = ("paper", "fairseq")

    def __init__(self, max_wavelength=10000, style="paper", offset=0, **kwargs):
        if style not in self.STYLES:
            raise ValueError(f"Unknown sinusoid style={style!r}; expected one of {self.STYLES}.")
        super().__init__(max_wavelength=max_wavelength, **kwargs)
        self.style, self.offset = style, int(offset)

    def call(self, inputs, start_index=0, positions=None):
        if self.style == "paper" and not self.offset:
            return super().call(inputs, start_index=start_index, positions=positions)
        shape = ops.shape(inputs)
        if positions is None:
            positions = ops.arange(shape[-2]) + start_index
        positions = ops.cast(positions, "float32") + float(self.offset)
        if len(positions.shape) == 1:
            positions = positions[None, :]
        if self.style == "paper":
            return super().call(inputs, positions=ops.cast(positions, self.compute_dtype))
        half = shape[-1] // 2
        frequencies = ops.exp(ops.arange(half, dtype="float32") * (-math.log(self.max_wavelength) / (half - 1)))
        angles = positions[..., None] * frequencies
        encodings = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
        return ops.broadcast_to(ops.cast(encodings, self.compute_dtype), shape)

    def get_config(self):
        return {**super().get_config(), "style": self.style, "offset": self.offset}


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

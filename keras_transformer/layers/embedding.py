"""Embeddings and softmax (paper section 3.4).

One learned matrix serves three roles: the source embedding, the target
embedding and the pre-softmax linear transformation. As an embedding its
output is multiplied by sqrt(d_model). The paper's softmax has no bias;
imported checkpoints such as Marian's add one to the logits
(`output_bias=True`).
"""

import math

import keras
from keras import ops

from keras_transformer.layers.initializers import unless_skipped
from keras_transformer.runtime.bfloat16_products import bfloat16_product
from keras_transformer.runtime.bfloat16_products import bfloat16_products_in_float32
from keras_transformer.runtime.bfloat16_products import float32_product
from keras_transformer.runtime.bfloat16_products import int8_product_in_float32
from keras_transformer.runtime.bfloat16_products import int8_products_in_float32
from keras_transformer.runtime.bfloat16_products import output_columns_of
from keras_transformer.runtime.backend_choices import reads_output_columns
from keras_transformer.runtime.dispatch import DirectCall

@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedTokenEmbedding(DirectCall, keras.layers.ReversibleEmbedding):
    """The token embedding shared by source, target and output projection.

    Built on `keras.layers.ReversibleEmbedding` with tied weights: called on
    integer token ids it returns `embeddings[ids] * sqrt(d_model)`; called
    with `reverse=True` on hidden states it returns the logits
    `hidden @ embeddings^T` (without the scaling, as in the paper).

    Args:
        vocabulary_size: size of the shared subword vocabulary.
        d_model: width of the embeddings.
        scale_embeddings: multiply embeddings by sqrt(d_model) (section 3.4).
        embeddings_initializer: defaults to a normal distribution with
            standard deviation d_model^-0.5, which with the sqrt(d_model)
            scaling gives embeddings of unit variance (as tensor2tensor).
        output_bias: add a learned `(vocabulary_size,)` bias to the logits
            (Marian's `final_logits_bias`); the paper has none.
        **kwargs: further `keras.layers.ReversibleEmbedding` arguments.

    Call arguments:
        inputs: integer token ids `(batch, length)`, or hidden states
            `(batch, length, d_model)` with `reverse=True`.
        reverse: whether to project hidden states to logits.

    Example:

    >>> import numpy as np
    >>> embedding = SharedTokenEmbedding(vocabulary_size=100, d_model=16)
    >>> hidden = embedding(np.array([[5, 9, 2]]))
    >>> tuple(embedding(hidden, reverse=True).shape)
    (1, 3, 100)
    """

    def __init__(
        self,
        vocabulary_size,
        d_model,
        scale_embeddings=True,
        embeddings_initializer=None,
        output_bias=False,
        **kwargs,
    ):
        kwargs.pop("input_dim", None)
        kwargs.pop("output_dim", None)
        kwargs.pop("tie_weights", None)
        if embeddings_initializer is None:
            embeddings_initializer = unless_skipped(keras.initializers.RandomNormal(stddev=int(d_model) ** -0.5))
        super().__init__(
            input_dim=int(vocabulary_size),
            output_dim=int(d_model),
            tie_weights=True,
            embeddings_initializer=embeddings_initializer,
            **kwargs,
        )
        self.scale_embeddings = scale_embeddings
        self.output_bias = bool(output_bias)

    def build(self, inputs_shape=None):
        super().build(inputs_shape)
        self.logits_bias = None
        if self.output_bias:
            self.logits_bias = self.add_weight(
                shape=(self.input_dim,), initializer="zeros", name="logits_bias"
            )

    @property
    def vocabulary_size(self):
        return self.input_dim

    @property
    def d_model(self):
        return self.output_dim

    @property
    def variable_serialization_spec(self):
        # Keras saves an embedding's variables by this list: the logits bias
        # goes after the embeddings (in every quantization mode).
        spec = super().variable_serialization_spec
        if self.output_bias:
            spec = {mode: [*names, "logits_bias"] for mode, names in spec.items()}
        return spec

    def compute_output_spec(self, inputs, reverse=False):
        spec = super().compute_output_spec(inputs, reverse=reverse)
        if reverse and self._mixed_precision():
            return keras.KerasTensor(spec.shape, dtype="float32")  # (mixed precision's logits)
        return spec

    def _mixed_precision(self):
        """Whether the layer computes in mixed precision (float weights of
        another dtype than it computes in): its logits are then float32."""
        return self.quantization_mode is None and self.compute_dtype != self.variable_dtype

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses of ReversibleEmbedding only when they
        # opt in: the scaling and the logits bias here wrap its own call,
        # which reads the quantized weights, so its quantization holds.
        super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, reverse=False):
        return self._shared_call(super().call, inputs, reverse)

    def quantized_call(self, inputs, reverse=False):
        # Keras calls this instead of `call` once the layer is quantized.
        return self._shared_call(super().quantized_call, inputs, reverse)

    def output_columns(self):
        """The output projection's matrix, `(d_model, vocabulary_size)`: a
        copy of the embeddings transposed, made once and kept while the
        embeddings stay as they are, for decoding compiled by JAX on a CPU
        (`keras_transformer.runtime.compiled.compile_for_models` passes it
        to the compiled functions). None elsewhere, and for weights that
        are neither float32 nor bfloat16 (computing in their own dtype) or
        not tied, a quantized layer or a soft cap. bfloat16 columns give
        float32 logits (`bfloat16_products.float32_product`: XLA's fast bfloat16
        product is the one into float32, and only from this layout).

        XLA's CPU product of a few rows by the transpose of a stored
        matrix runs at half the speed of a product by a stored matrix of
        the transposed layout (2-core AMD EPYC, in a compiled loop: 4 rows
        by a 256 x 8,000 matrix 221 against 120 us, 16 rows 562 against
        431; the same from 64 rows up), and XLA cannot lay out the weights
        it is given: so the copy is made once, outside the compiled
        function. It costs the memory of the embeddings again.

        Example:

        >>> embedding = SharedTokenEmbedding(vocabulary_size=10, d_model=4)
        >>> embedding.build()
        >>> columns = embedding.output_columns()
        >>> columns is None or tuple(columns.shape) == (4, 10)
        True
        """
        if not (reads_output_columns() and self.projects_through_columns()):
            return None
        embeddings = self.embeddings.value
        held = self.__dict__.get("_output_columns")
        if held is None or held[0] is not embeddings:  # (JAX arrays are immutable: a write replaces them)
            held = (embeddings, ops.transpose(embeddings))
            object.__setattr__(self, "_output_columns", held)
        return held[1]

    def projects_through_columns(self):
        """Whether the output projection may read a `(d_model,
        vocabulary_size)` copy of the embeddings (`output_columns`): tied
        float32 or bfloat16 weights that the layer computes in, not
        quantized, no soft cap."""
        return (
            self._tied_projection()
            and self.compute_dtype == self.variable_dtype
            and self.compute_dtype in ("float32", "bfloat16")
        )

    def _tied_projection(self, quantization_mode=None):
        """Whether the output projection is a plain product by the
        embeddings, float (or quantized in `quantization_mode`): tied, no
        reverse dtype or soft cap."""
        return (
            self.quantization_mode == quantization_mode and self.tie_weights and self.reverse_dtype is None
            and self.logit_soft_cap is None
        )

    def _shared_call(self, embedding_call, inputs, reverse):
        """`ReversibleEmbedding`'s call (float or quantized), scaled by
        sqrt(d_model) as an embedding, plus the logits bias as the output
        projection."""
        if reverse:
            columns = output_columns_of(self)
            mixed = self._mixed_precision()
            if columns is not None:
                logits = float32_product(inputs, columns)  # (`output_columns`)
            elif self._tied_projection() and bfloat16_products_in_float32(self, inputs, self.embeddings):
                logits = bfloat16_product(inputs, ops.transpose(self.embeddings.value))
            elif self._tied_projection("int8") and int8_products_in_float32(self, self.output_dim):
                # Keras' int8 output projection, its product in float32
                # (`int8_product_in_float32`).
                quantized, inputs_scale = self.inputs_quantizer(inputs)
                kernel = ops.transpose(self._embeddings)
                logits = ops.cast(int8_product_in_float32(quantized, kernel), self.compute_dtype)
                logits = ops.divide(logits, ops.multiply(inputs_scale, ops.transpose(self.embeddings_scale)))
            elif mixed:
                # Mixed precision. Keras' `Embedding` does not autocast its
                # variable (a lookup casts the rows it reads), so its output
                # projection would multiply in float32: on a CPU with
                # bfloat16 matrix units, the slowest product of a training
                # step (d_model 512, 4,096 tokens: 3 x 90-115 ms in float32
                # on PyTorch, 15-34 ms in bfloat16). It runs in the compute
                # dtype, as every other projection does.
                kernel = ops.transpose(ops.cast(self.embeddings, self.compute_dtype))
                inputs = ops.cast(inputs, self.compute_dtype)
                if bfloat16_products_in_float32(self, inputs, kernel):
                    # (Into float32, rounded once after the bias, as the
                    # other projections on JAX: `bfloat16_product`.)
                    logits = bfloat16_product(inputs, kernel)
                else:
                    logits = ops.matmul(inputs, kernel)
            else:
                logits = embedding_call(inputs, reverse=True)
            if self.logits_bias is not None:
                logits = logits + ops.cast(self.logits_bias, logits.dtype)
            if mixed:
                # Float32 logits, as Keras' mixed-precision guide has a
                # model's last layer give, for the softmax and the loss
                # (which would cast them to float32 anyway). On JAX they
                # are the product's float32 sums: rounding them to bfloat16
                # and the loss converting them back were two more passes
                # over (tokens, vocabulary) arrays (a mixed-precision
                # training step of the 3+3-layer model: 0.98 of the time
                # without them, medians of 14 alternating steps).
                logits = ops.cast(logits, "float32")
            return logits
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if "int" not in dtype:
            raise TypeError(
                f"{self.name} expects integer token ids, got dtype {dtype}. "
                "Tokenize the text first and pass int32 or int64 ids."
            )
        outputs = embedding_call(inputs)
        if self.scale_embeddings:
            outputs = outputs * ops.cast(math.sqrt(self.output_dim), outputs.dtype)
        return outputs

    def get_config(self):
        config = super().get_config()
        for key in ("input_dim", "output_dim", "tie_weights"):
            config.pop(key)
        config.update(
            {
                "vocabulary_size": self.input_dim,
                "d_model": self.output_dim,
                "scale_embeddings": self.scale_embeddings,
                "output_bias": self.output_bias,
            }
        )
        return config

"""The paper layers' PyTorch calls inside `direct_calls()`.

The layers of `keras_transformer.layers` are plain Keras. On PyTorch, inside
`direct_calls()`, a decoding step calls each of them eagerly, and Keras' ops
between the arithmetic (each converting and checking its inputs) took longer
than the arithmetic. The calls here compute the same thing with PyTorch's
own functions on the layers' weights, for the cases decoding runs, and call
the layer's `call` for anything else. They are registered under the
layers' Keras names (`runtime.layer_calls.register`), so that the layers
need not know of them:

- `TransformerDecoderLayer`: a decoding step (one position, written into
  the self-attention cache, no dropout) as `torch_decoding_step.decoding_step`;
- `TransformerEncoderLayer`: a whole source without dropout or gradients as
  `torch_decoding_step.encoding_step` (whose joined projection is a copy
  that gradients would not reach);
- `SinusoidalPositionEncoding`: rows of a table computed once, for
  positions counted from an int `start_index` (the table's few ops cost
  more than a decoding step's embedding);
- `SharedTokenEmbedding`: the lookup (scaled) and the output projection
  (with its bias) one PyTorch call each; with Keras' int8 weights, the
  output projection as one int8 product.
"""

import math

import keras

from keras_transformer.runtime.direct_calls import derived_once
from keras_transformer.runtime.int8_products import int8_product
from keras_transformer.runtime.int8_products import prepacked_product
from keras_transformer.runtime.layer_calls import LayerCall
from keras_transformer.runtime.layer_calls import register
from keras_transformer.runtime.torch_decoding_step import decoding_step
from keras_transformer.runtime.torch_decoding_step import encoding_step
from keras_transformer.runtime.torch_decoding_step import sinusoid_table
from keras_transformer.runtime.torch_step_weights import step_weights

# The most rows an output projection takes through `_torch_projection_columns`.
FEW_ROWS = 32


def decoder_layer_call(
    layer,
    decoder_sequence,
    encoder_sequence=None,
    decoder_padding_mask=None,
    encoder_padding_mask=None,
    self_attention_cache=None,
    self_attention_cache_update_index=None,
    cross_attention_cache=None,
    return_attention_scores=False,
    training=None,
):
    """`TransformerDecoderLayer.call`: a decoding step as plain PyTorch
    calls, anything else as `call`."""
    index = self_attention_cache_update_index
    step = (
        self_attention_cache is not None
        and cross_attention_cache is not None
        and isinstance(index, int)
        and decoder_sequence.shape[1] == 1
        and decoder_padding_mask is None
        and not return_attention_scores
        and not training
    )
    weights = step_weights(layer) if step else None
    if weights is None:
        return layer.call(
            decoder_sequence, encoder_sequence, decoder_padding_mask, encoder_padding_mask,
            self_attention_cache, index, cross_attention_cache, return_attention_scores, training,
        )
    return decoding_step(
        layer, weights, decoder_sequence, index, self_attention_cache, cross_attention_cache, encoder_padding_mask
    )


def encoder_layer_call(layer, inputs, padding_mask=None, return_attention_scores=False, training=None):
    """`TransformerEncoderLayer.call`: a source encoded for translation
    (no dropout, no gradients) as plain PyTorch calls, anything else as
    `call`."""
    import torch

    plain = not (return_attention_scores or training or torch.is_grad_enabled())
    weights = step_weights(layer) if plain else None
    if weights is None:
        return layer.call(inputs, padding_mask, return_attention_scores, training)
    return encoding_step(layer, weights, inputs, padding_mask)


def sinusoidal_call(layer, inputs, start_index=0, positions=None):
    """`SinusoidalPositionEncoding.call`: rows of a table computed once."""
    if positions is not None or not isinstance(start_index, int):
        return layer.call(inputs, start_index=start_index, positions=positions)
    length = inputs.shape[-2]
    table = sinusoid_table(layer, start_index + length, inputs)
    return table[start_index : start_index + length].expand(inputs.shape)


def embedding_call(layer, inputs, reverse=False):
    """`SharedTokenEmbedding.call` with float weights: the lookup (scaled)
    or the output projection (with its bias), one PyTorch call each."""
    import torch
    from torch.nn.functional import embedding
    from torch.nn.functional import linear

    embeddings = layer._embeddings.value
    if reverse and layer.reverse_dtype is not None:
        return layer.call(inputs, reverse=True)
    if reverse:
        bias = None if layer.logits_bias is None else layer.logits_bias.value
        if not torch.is_grad_enabled() and inputs.dtype == embeddings.dtype:
            # Inference: bfloat16 weights (and float32 ones on AMD
            # processors) prepacked once, kept while they stay as they
            # are (`int8_products.prepacked_product`).
            product = derived_once(
                layer, "_torch_prepacked_projection", embeddings, lambda: prepacked_product(embeddings)
            )
            if product is not None:
                return product(inputs, bias)
            if inputs.numel() <= FEW_ROWS * layer.output_dim and embeddings.device.type == "cpu":
                # A few rows (a sentence's beams): the product reads the
                # embeddings as a `(d_model, vocabulary)` matrix, a copy
                # made once. With the `(vocabulary, d_model)` matrix
                # itself, PyTorch's CPU product re-lays the whole matrix
                # out at every call: 4 x 128 by 128 x 8,000 took 140 us
                # against 58 (2-core Intel Xeon), the same from 64 rows up.
                columns = derived_once(
                    layer, "_torch_projection_columns", embeddings, lambda: embeddings.detach().t().contiguous()
                )
                return linear(inputs, columns.t(), bias)
        return linear(inputs, embeddings, bias)
    # (A decoding step's token ids are a NumPy array: its dtype's kind is
    # read directly, where Keras' `standardize_dtype` took 6 us.)
    kind = getattr(inputs.dtype, "kind", None)
    if kind not in ("i", "u") and "int" not in keras.backend.standardize_dtype(inputs.dtype):
        return layer.call(inputs)  # (which raises the error for it)
    outputs = embedding(torch.as_tensor(inputs, device=embeddings.device), embeddings)
    return outputs * math.sqrt(layer.output_dim) if layer.scale_embeddings else outputs


def embedding_int8_call(layer, inputs, reverse=False):
    """`SharedTokenEmbedding.quantized_call` with Keras' int8 weights: the
    output projection as one int8 product (the inputs quantized, times the
    transposed int8 embeddings, de-scaled by the inputs' scales and each
    token's)."""
    if not reverse:
        return layer.quantized_call(inputs)
    logits = int8_product(
        layer.inputs_quantizer, inputs, 1, layer._embeddings.value.t(), layer.embeddings_scale.value, inputs.dtype
    )
    return logits if layer.logits_bias is None else logits + layer.logits_bias.value.to(logits.dtype)


register("keras_transformer>TransformerDecoderLayer", LayerCall(decoder_layer_call, takes_training=True))
register("keras_transformer>TransformerEncoderLayer", LayerCall(encoder_layer_call, takes_training=True))
register("keras_transformer>SinusoidalPositionEncoding", LayerCall(sinusoidal_call))
register(
    "keras_transformer>SharedTokenEmbedding",
    LayerCall(
        embedding_call, int8_call=embedding_int8_call,
        plan=lambda layer: layer.tie_weights and layer.logit_soft_cap is None,
    ),
)

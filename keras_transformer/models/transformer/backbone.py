"""The encoder-decoder of "Attention Is All You Need" (paper section 3,
Figure 1) as a functional Keras model."""

import keras
import keras_hub

from keras_transformer.layers.decoder import TransformerDecoderLayer
from keras_transformer.runtime.direct_layers import Dropout
from keras_transformer.runtime.direct_layers import LayerNormalization
from keras_transformer.layers.embedding import SharedTokenEmbedding
from keras_transformer.layers.encoder import TransformerEncoderLayer
from keras_transformer.layers.position import LearnedPositionEmbedding
from keras_transformer.layers.position import SinusoidalPositionEncoding
from keras_transformer.runtime.torch_decoding_step import cross_attention_cache
from keras_transformer.runtime.torch_decoding_step import decoder_step
from keras_transformer.models.preset_io import PresetIO
from keras_transformer.models.transformer.backbone_inputs import KERAS_HUB_NAMES
from keras_transformer.models.transformer.backbone_inputs import check_inputs
from keras_transformer.presets import int8
from keras_transformer.utils.arguments import check_model_keywords

# "fairseq_sinusoidal": the sinusoids of fairseq checkpoints (M2M100, NLLB).
POSITION_ENCODINGS = ("sinusoidal", "learned", "fairseq_sinusoidal")

@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerBackbone(PresetIO, keras_hub.models.Backbone):
    """The Transformer encoder-decoder (section 3, Figure 1).

    Source and target token ids go through one shared embedding scaled by
    sqrt(d_model) (section 3.4), plus positional encodings (section 3.5),
    plus dropout (section 5.4); then through `num_layers` encoder layers and
    `num_layers` decoder layers (section 3.1). Following keras-hub, the
    backbone returns hidden states; `backbone.token_embedding(hidden,
    reverse=True)` turns decoder states into logits over the shared
    vocabulary with the same matrix (the pre-softmax projection of
    section 3.4), which `TransformerSeq2SeqLM` does.

    Every hyper-parameter of Table 3 is an argument;
    `keras_transformer.models.PAPER_CONFIGS` holds the paper's rows:
    `TransformerBackbone(vocabulary_size=37000, **PAPER_CONFIGS["base"])`.

    Args:
        vocabulary_size: size of the shared source/target vocabulary.
        num_layers: N, the number of encoder layers and of decoder layers.
        d_model: width of embeddings and of every layer output.
        d_ff: inner width of the feed-forward networks.
        num_heads: h, attention heads per attention layer.
        key_dim: d_k, per-head query/key size; defaults to d_model // h.
        value_dim: d_v, per-head value size; defaults to `key_dim`.
        dropout: P_drop, on embeddings + positions and on every sub-layer
            output.
        attention_dropout: dropout on attention weights (the paper: 0).
        position_encoding: `"sinusoidal"` (the paper), `"learned"`
            (Table 3 row E), or `"fairseq_sinusoidal"` (sines then cosines,
            as fairseq's M2M100 and NLLB checkpoints).
        position_offset: the position of the first token of the
            sinusoids (the paper: 0; fairseq: padding id + 1).
        max_sequence_length: longest source or target sequence; the size of
            the learned position tables, and the limit checked when
            translating.
        normalize_first: pre-norm layers (with a final LayerNorm after each
            stack) instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of every LayerNorm.
        activation: the feed-forward non-linearity (the paper: `"relu"`;
            Marian's opus-mt models: `"silu"`, also called swish).
        scale_embeddings: multiply embeddings by sqrt(d_model) (section 3.4).
        output_bias: a learned bias added to the logits (Marian's
            `final_logits_bias`; the paper has none).
        dtype: dtype policy of the model, such as `"mixed_bfloat16"`.
        **kwargs: `keras_hub.models.Backbone` arguments (`name`...).

    Inputs (a dict):
        encoder_token_ids: int `(batch, source_length)`.
        encoder_padding_mask: `(batch, source_length)`, 1 at real tokens.
        decoder_token_ids: int `(batch, target_length)`.
        decoder_padding_mask: `(batch, target_length)`, 1 at real tokens.

    Outputs (a dict):
        encoder_sequence_output: `(batch, source_length, d_model)`.
        decoder_sequence_output: `(batch, target_length, d_model)`.

    Example:

    >>> import numpy as np
    >>> backbone = TransformerBackbone(
    ...     vocabulary_size=1000, num_layers=2, d_model=64, d_ff=128, num_heads=4
    ... )
    >>> outputs = backbone({
    ...     "encoder_token_ids": np.array([[5, 8, 2, 0]]),
    ...     "encoder_padding_mask": np.array([[1, 1, 1, 0]]),
    ...     "decoder_token_ids": np.array([[1, 7, 9]]),
    ...     "decoder_padding_mask": np.array([[1, 1, 1]]),
    ... })
    >>> logits = backbone.token_embedding(
    ...     outputs["decoder_sequence_output"], reverse=True
    ... )
    >>> tuple(logits.shape)
    (1, 3, 1000)
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers=6,
        d_model=512,
        d_ff=2048,
        num_heads=8,
        key_dim=None,
        value_dim=None,
        dropout=0.1,
        attention_dropout=0.0,
        position_encoding="sinusoidal",
        max_sequence_length=1024,
        position_offset=0,
        normalize_first=False,
        layer_norm_epsilon=1e-5,
        activation="relu",
        scale_embeddings=True,
        output_bias=False,
        dtype=None,
        **kwargs,
    ):
        check_model_keywords(type(self), kwargs, renamed=KERAS_HUB_NAMES)
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"Unknown position_encoding={position_encoding!r}; "
                f"expected one of {POSITION_ENCODINGS}."
            )
        if position_offset and position_encoding == "learned":
            raise ValueError("position_offset is for sinusoidal encodings; learned positions start at 0.")
        check_heads(d_model, num_heads, key_dim)
        # === Layers ===
        self.token_embedding = SharedTokenEmbedding(
            vocabulary_size,
            d_model,
            scale_embeddings=scale_embeddings,
            output_bias=output_bias,
            dtype=dtype,
            name="token_embedding",
        )
        if position_encoding != "learned":
            # The sinusoids have no weights: one layer serves both stacks.
            style = "fairseq" if position_encoding == "fairseq_sinusoidal" else "paper"
            self.encoder_position = SinusoidalPositionEncoding(
                style=style, offset=position_offset, dtype=dtype, name="position_encoding"
            )
            self.decoder_position = self.encoder_position
        else:
            self.encoder_position, self.decoder_position = (
                LearnedPositionEmbedding(max_sequence_length, dtype=dtype, name=f"{side}_position_embedding")
                for side in ("encoder", "decoder")
            )
        self.encoder_embeddings_dropout = Dropout(
            dropout, dtype=dtype, name="encoder_embeddings_dropout"
        )
        self.decoder_embeddings_dropout = Dropout(
            dropout, dtype=dtype, name="decoder_embeddings_dropout"
        )
        layer_kwargs = dict(
            num_heads=num_heads,
            d_ff=d_ff,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            normalize_first=normalize_first,
            layer_norm_epsilon=layer_norm_epsilon,
            activation=activation,
            dtype=dtype,
        )
        self.encoder_layers = [
            TransformerEncoderLayer(**layer_kwargs, name=f"encoder_layer_{i}")
            for i in range(num_layers)
        ]
        self.decoder_layers = [
            TransformerDecoderLayer(**layer_kwargs, name=f"decoder_layer_{i}")
            for i in range(num_layers)
        ]
        self.encoder_norm = self.decoder_norm = None
        if normalize_first:
            self.encoder_norm, self.decoder_norm = (
                LayerNormalization(
                    epsilon=layer_norm_epsilon, dtype=dtype, name=f"{side}_norm"
                )
                for side in ("encoder", "decoder")
            )

        # === Functional model ===
        encoder_token_ids = keras.Input((None,), dtype="int32", name="encoder_token_ids")
        encoder_padding_mask = keras.Input((None,), dtype="int32", name="encoder_padding_mask")
        decoder_token_ids = keras.Input((None,), dtype="int32", name="decoder_token_ids")
        decoder_padding_mask = keras.Input((None,), dtype="int32", name="decoder_padding_mask")
        encoder_output = self.encode(encoder_token_ids, encoder_padding_mask)
        decoder_output = self.decode(
            decoder_token_ids, encoder_output, decoder_padding_mask, encoder_padding_mask
        )
        super().__init__(
            inputs={
                "encoder_token_ids": encoder_token_ids,
                "encoder_padding_mask": encoder_padding_mask,
                "decoder_token_ids": decoder_token_ids,
                "decoder_padding_mask": decoder_padding_mask,
            },
            outputs={
                "encoder_sequence_output": encoder_output,
                "decoder_sequence_output": decoder_output,
            },
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.d_model = d_model
        self.d_ff = d_ff
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.position_encoding = position_encoding
        self.max_sequence_length = max_sequence_length
        self.position_offset = position_offset
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = keras.activations.serialize(keras.activations.get(activation))
        self.scale_embeddings = scale_embeddings
        self.output_bias = output_bias

    def call(self, inputs, training=None, mask=None):
        check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask)

    def embed(self, token_ids, position_layer, dropout_layer, start_index=0, training=None):
        """Embedding * sqrt(d_model) + positional encoding, then dropout."""
        x = self.token_embedding(token_ids)
        x = x + position_layer(x, start_index=start_index)
        return dropout_layer(x, training=training)

    def encode(self, token_ids, padding_mask=None, training=None, return_attention_scores=False):
        """The encoder stack: token ids to `(batch, source_length, d_model)`.

        With `return_attention_scores`, also a list of each layer's
        self-attention weights, `(batch, heads, source_length, source_length)`.
        """
        x = self.embed(
            token_ids, self.encoder_position, self.encoder_embeddings_dropout, training=training
        )
        scores = []
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training, return_attention_scores=return_attention_scores)
            if return_attention_scores:
                x, weights = x
                scores.append(weights)
        x = x if self.encoder_norm is None else self.encoder_norm(x)
        return (x, scores) if return_attention_scores else x

    def decode(
        self,
        token_ids,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        training=None,
        return_attention_scores=False,
        cache=None,
        cache_index=0,
    ):
        """The decoder stack: the whole target at once (teacher forcing), or
        the next positions of an incremental decoding (section 6.1).

        Args:
            token_ids: int `(batch, target_length)`; with a cache, the
                tokens at positions `cache_index` to `cache_index +
                target_length - 1`.
            encoder_output: `(batch, source_length, d_model)`; not needed
                with a cache, which holds its keys and values.
            decoder_padding_mask: optional `(batch, target_length)`.
            encoder_padding_mask: optional `(batch, source_length)`.
            training: whether dropout is active.
            return_attention_scores: also return a list with each layer's
                `{"self_attention": ..., "cross_attention": ...}` weights,
                `(batch, heads, target_length, target_length | source_length)`.
            cache: optional, one `(self_attention_cache,
                cross_attention_cache)` per decoder layer: from
                `empty_self_attention_cache` and `cross_attention_cache`, or
                from a previous call.
            cache_index: where `token_ids` go in the self-attention caches.

        Returns:
            The decoder output `(batch, target_length, d_model)`; then the
            attention weights if asked for; then, with a cache, the cache
            with the positions of `token_ids` written.
        """
        if cache is not None and encoder_output is None and decoder_padding_mask is None and not (
            training or return_attention_scores
        ):
            # A search's step on PyTorch: its layers' plain calls in a row.
            stepped = decoder_step(self, token_ids, cache_index, cache, encoder_padding_mask)
            if stepped is not None:
                return stepped
        x = self.embed(
            token_ids,
            self.decoder_position,
            self.decoder_embeddings_dropout,
            start_index=0 if cache is None else cache_index,
            training=training,
        )
        scores, new_cache = [], []
        for i, layer in enumerate(self.decoder_layers):
            self_cache, cross_cache = (None, None) if cache is None else cache[i]
            outputs = layer(
                x,
                encoder_output,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=None if cache is None else cache_index,
                cross_attention_cache=cross_cache,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores or cache is not None:
                x, *rest = outputs
                if return_attention_scores:
                    scores.append(rest.pop(0))
                if cache is not None:
                    new_cache.append((rest.pop(0), cross_cache))
            else:
                x = outputs
        x = x if self.decoder_norm is None else self.decoder_norm(x)
        outputs = (x,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (new_cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def cross_attention_cache(self, encoder_output):
        """The encoder output's keys and values for the encoder-decoder
        attention of every decoder layer: computed once per source, read
        at every decoding step. A list of `(key_heads, value_heads)`."""
        caches = cross_attention_cache(self, encoder_output)  # (PyTorch, within a search; else None)
        if caches is not None:
            return caches
        return [layer.cross_attention.project_key_value(encoder_output) for layer in self.decoder_layers]

    def empty_self_attention_cache(self, batch_size, max_length, beams=None):
        """Zeroed self-attention key/value caches of `max_length` positions,
        one `(keys, values)` per decoder layer, each `(batch_size, heads,
        max_length, d_k | d_v)`; with `beams`, one cache a layer that beam
        search never reorders, for `batch_size` sources of `beams` beams
        (`runtime.beam_cache`)."""
        return [
            layer.self_attention.empty_cache(batch_size, max_length, self.compute_dtype, beams=beams)
            for layer in self.decoder_layers
        ]

    def load_weights(self, filepath, *args, **kwargs):
        """Keras' `load_weights`, which also reads weights stored in int8
        (`keras_transformer.presets.int8`) into this float model: the
        `model.weights.h5` that keras-hub's own loader passes for such a
        preset (or the index of the archive of earlier versions)."""
        if int8.load_preset_weights(self, filepath):
            return None
        return super().load_weights(filepath, *args, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "d_model": self.d_model,
                "d_ff": self.d_ff,
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "position_encoding": self.position_encoding,
                "max_sequence_length": self.max_sequence_length,
                "position_offset": self.position_offset,
                "normalize_first": self.normalize_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "activation": self.activation,
                "scale_embeddings": self.scale_embeddings,
                "output_bias": self.output_bias,
            }
        )
        return config


def check_heads(d_model, num_heads, key_dim=None):
    """Refuses `num_heads` that do not divide `d_model` (without `key_dim`)."""
    if key_dim is None and d_model % num_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}. Pass key_dim (d_k) and value_dim "
            "(d_v), or choose num_heads dividing d_model."
        )

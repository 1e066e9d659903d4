"""Strings to model inputs and labels (teacher forcing, paper section 3)."""

import keras
import keras_hub

from keras_transformer.models.transformer.backbone import INPUT_NAMES
from keras_transformer.models.transformer.backbone import TransformerBackbone
from keras_transformer.models.transformer.tokenizer import TransformerTokenizer
from keras_transformer.presets import PresetIO


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLMPreprocessor(PresetIO, keras_hub.models.Seq2SeqLMPreprocessor):
    """Tokenizes source/target pairs for `TransformerSeq2SeqLM`.

    The source becomes `<s> source </s>`, padded to `encoder_sequence_length`;
    the target `<s> target </s>`, padded to `decoder_sequence_length + 1`, is
    split into decoder inputs (all but the last token) and labels (all but
    the first), so that position i learns to predict token i + 1. The sample
    weights are 0 at padding.

    Inputs that are already token ids (a dict with `encoder_token_ids`, as
    `keras_transformer.data.token_budget_batches` makes) pass through
    unchanged, so `fit` takes raw strings and length-bucketed batches alike.

    Unlike keras-hub's base class, the sequence lengths are part of
    `get_config`, so they survive saving and loading.

    Args:
        tokenizer: a `TransformerTokenizer` (or `TransformerWordPieceTokenizer`).
        encoder_sequence_length: padded source length, start and end tokens
            included.
        decoder_sequence_length: padded target length.
        **kwargs: `keras_hub.models.Seq2SeqLMPreprocessor` arguments.

    Call arguments:
        x: a dict with `"encoder_text"` and `"decoder_text"` strings (single
            or batched).
        y, sample_weight: must be None; labels come from `decoder_text`.

    Example:

    ```python
    preprocessor = TransformerSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=64, decoder_sequence_length=64
    )
    x, y, sample_weight = preprocessor(
        {"encoder_text": ["A dog runs."], "decoder_text": ["Ein Hund rennt."]}
    )
    ```
    """

    backbone_cls = TransformerBackbone
    tokenizer_cls = TransformerTokenizer
    preset_needs = ("preprocessor",)

    def __init__(self, tokenizer, encoder_sequence_length=128, decoder_sequence_length=128, **kwargs):
        super().__init__(
            tokenizer=tokenizer,
            encoder_sequence_length=encoder_sequence_length,
            decoder_sequence_length=decoder_sequence_length,
            **kwargs,
        )

    def call(self, x, y=None, sample_weight=None, **kwargs):
        if isinstance(x, dict) and set(INPUT_NAMES) <= set(x):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        if not isinstance(x, dict) or not {"encoder_text", "decoder_text"} <= set(x):
            raise ValueError(
                "TransformerSeq2SeqLMPreprocessor takes a dict with keys "
                "'encoder_text' (sources) and 'decoder_text' (targets), or "
                f"already tokenized inputs with keys {INPUT_NAMES}; got {_describe(x)}."
            )
        if y is not None:
            raise ValueError(
                "Targets go in x['decoder_text'], not in y: the labels are the "
                "target tokens shifted by one."
            )
        return super().call(x, y=y, sample_weight=sample_weight, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "encoder_sequence_length": self.encoder_sequence_length,
                "decoder_sequence_length": self.decoder_sequence_length,
            }
        )
        return config


def _describe(x):
    if isinstance(x, dict):
        return f"a dict with keys {sorted(x)}"
    return type(x).__name__

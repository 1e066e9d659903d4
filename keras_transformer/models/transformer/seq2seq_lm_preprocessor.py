"""Strings to model inputs and labels (teacher forcing, paper section 3)."""

import keras
import keras_hub
import numpy as np
from keras_hub.layers import StartEndPacker

from keras_transformer.runtime.array_ops import id_list
from keras_transformer.models.preset_io import PresetIO
from keras_transformer.models.transformer.backbone_inputs import INPUT_NAMES
from keras_transformer.models.transformer.backbone import TransformerBackbone
from keras_transformer.models.transformer.special_tokens import special_token_ids
from keras_transformer.models.transformer.text_checks import text_list
from keras_transformer.models.transformer.text_checks import too_long
from keras_transformer.models.transformer.tokenizer import TransformerTokenizer
from keras_transformer.utils.keras_hub_internals import preprocessing_function
from keras_transformer.utils.text import is_blank


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLMPreprocessor(PresetIO, keras_hub.models.Seq2SeqLMPreprocessor):
    """Tokenizes source/target pairs for `TransformerSeq2SeqLM`.

    This is the one place where text is framed with special tokens (their
    ids come from the tokenizer, see `special_token_ids`). With this
    package's tokenizers the source becomes `<s> source </s>`, padded to
    `encoder_sequence_length`; the target `<s> target </s>`, padded to
    `decoder_sequence_length + 1`, is split into decoder inputs (all but the last token) and labels (all but
    the first), so that position i learns to predict token i + 1. The sample
    weights are 0 at padding.

    Inputs that are already token ids (a dict with `encoder_token_ids`, as
    `keras_transformer.data.token_budget_batches` makes) pass through
    unchanged, so `fit` takes raw strings and length-bucketed batches alike.

    With a `MarianTokenizer` (imported opus-mt models) the source is
    `source </s>` and the target starts from the padding id, as Marian
    trained them; the target side is segmented with the target vocabulary.

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

    @property
    def special_token_ids(self):
        """The tokenizer's `SpecialTokenIds` (pad, start, end, unk, and the
        source's start id or None)."""
        return special_token_ids(self.tokenizer)

    def build(self, input_shape):
        # keras-hub's packers put the decoder's start id before sources too;
        # some vocabularies (Marian) give sources no start token.
        special = self.special_token_ids
        self.encoder_packer = StartEndPacker(
            start_value=special.source_start,
            end_value=special.end,
            pad_value=special.pad,
            sequence_length=self.encoder_sequence_length,
            return_padding_mask=True,
        )
        self.decoder_packer = StartEndPacker(
            start_value=special.start,
            end_value=special.end,
            pad_value=special.pad,
            sequence_length=self.decoder_sequence_length,
            return_padding_mask=True,
        )
        self.built = True

    def generate_preprocess(self, texts, max_length=None):
        """Source strings to framed token id lists, as `generate` reads them.

        Args:
            texts: a list of strings.
            max_length: the model's `max_sequence_length`; a longer source
                is an error that names the limit.

        Returns:
            One list of ids per text (start and end tokens as the vocabulary
            frames sources); `[]` for a blank text (`utils.text.is_blank`:
            empty, whitespace or invisible format characters).
        """
        special = self.special_token_ids
        sources = [[] for _ in texts]
        kept = [i for i, text in enumerate(texts) if not is_blank(text)]
        # All texts in one tokenizer call (SentencePiece encodes a list at
        # once): one call a text took 6% of a batch of 64's translation.
        pieces = token_id_lists(self.tokenizer.tokenize, [texts[i] for i in kept])
        for i, ids in zip(kept, pieces):
            sources[i] = special.frame_source(ids)
        long = [i for i, ids in enumerate(sources) if max_length is not None and len(ids) > max_length]
        if long:
            raise too_long(
                "source", long, len(texts), f"the model's max_sequence_length={max_length}",
                f"{len(sources[long[0]])} tokens", texts[long[0]], "Split the text into sentences first.",
            )
        return sources

    def generate_postprocess(self, outputs):
        """Output token id lists (no start or end token) to strings, all in
        one tokenizer call; `""` for an empty list."""
        outputs = [id_list(ids) for ids in outputs]
        texts = [""] * len(outputs)
        kept = [i for i, ids in enumerate(outputs) if ids]
        if kept:
            for i, text in zip(kept, _strings(self.tokenizer.detokenize([outputs[i] for i in kept]))):
                texts[i] = text
        return texts

    def target_token_ids(self, texts):
        """Target strings to unframed piece ids (the target vocabulary's
        segmentation where the tokenizer has one, as Marian's)."""
        tokenize = getattr(self.tokenizer, "tokenize_target", self.tokenizer.tokenize)
        return [np.asarray(tokenize(text)).tolist() for text in texts]

    def decoder_inputs(self, text):
        """A target string as teacher forcing feeds it to the decoder: the
        start id and the target's pieces (labels would be the pieces and the
        end id)."""
        return self.special_token_ids.frame_target(self.target_token_ids([text])[0])[:-1]

    def call(self, x, y=None, sample_weight=None, **kwargs):
        if self.check_inputs(x, y):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        if hasattr(self.tokenizer, "tokenize_target"):
            return self._call_with_target_vocabulary(x, **kwargs)
        return super().call(x, y=y, sample_weight=sample_weight, **kwargs)

    def check_inputs(self, x, y=None):
        """Refuses what `call` cannot take, with what it takes; True for
        inputs that are tokenized already (they pass through).

        `TransformerSeq2SeqLM.fit`, `evaluate` and `predict` call it on data
        held in memory before it goes into `tf.data`, whose traceback
        would bury the message."""
        if isinstance(x, dict) and set(INPUT_NAMES) <= set(x):
            return True
        if not isinstance(x, dict) or not {"encoder_text", "decoder_text"} <= set(x):
            raise ValueError(
                "TransformerSeq2SeqLMPreprocessor takes a dict with keys "
                "'encoder_text' (sources) and 'decoder_text' (targets), or "
                f"already tokenized inputs with keys {INPUT_NAMES}; got {_describe(x)}"
                + (" as x and targets as y" if y is not None else "") + "."
            )
        if y is not None:
            raise ValueError(
                "Targets go in x['decoder_text'], not in y: the labels are the "
                "target tokens shifted by one."
            )
        _check_pairs(x["encoder_text"], x["decoder_text"])
        return False

    @preprocessing_function
    def _call_with_target_vocabulary(self, x, encoder_sequence_length=None, decoder_sequence_length=None):
        """keras-hub's `call`, with targets segmented by the target vocabulary."""
        if not self.built:
            self.build(None)
        encoder_text, decoder_text = x["encoder_text"], x["decoder_text"]
        encoder_ids, encoder_mask = self.encoder_packer(
            self.tokenizer.tokenize(encoder_text),
            sequence_length=encoder_sequence_length or self.encoder_sequence_length,
        )
        decoder_ids, decoder_mask = self.decoder_packer(
            self.tokenizer.tokenize_target(decoder_text),
            sequence_length=(decoder_sequence_length or self.decoder_sequence_length) + 1,
        )
        inputs = {
            "encoder_token_ids": encoder_ids,
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": decoder_ids[..., :-1],
            "decoder_padding_mask": decoder_mask[..., :-1],
        }
        return keras.utils.pack_x_y_sample_weight(inputs, decoder_ids[..., 1:], decoder_mask[..., 1:])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "encoder_sequence_length": self.encoder_sequence_length,
                "decoder_sequence_length": self.decoder_sequence_length,
            }
        )
        return config


def _check_pairs(sources, targets):
    """Refuses batches of sources and targets that do not pair up (lists
    and arrays; a tensor's batch is checked by TensorFlow)."""
    sized = (list, tuple, np.ndarray)
    if isinstance(sources, sized) and isinstance(targets, sized):
        if np.ndim(sources) != np.ndim(targets) or len(sources) != len(targets):
            raise ValueError(
                f"encoder_text has {_count(sources)}, decoder_text {_count(targets)}: each source "
                "needs its target (the same number of texts in both)."
            )


def _count(texts):
    count = 1 if np.ndim(texts) == 0 else len(texts)
    return f"{count} text" + ("" if count == 1 else "s")


def source_texts(inputs):
    """`(texts, single)`: the source strings of `generate`'s `inputs` (a
    string, bytes, or a list, array or string tensor of them), and whether
    `inputs` was one text; checked by the rule of `fit`'s texts
    (`text_checks.text_list`)."""
    return text_list(
        inputs,
        "generate() takes a string, a list of strings (or a string array or tensor), or a dict of "
        "token ids (`encoder_token_ids`, `encoder_padding_mask`)",
    )


def _describe(x):
    if isinstance(x, dict):
        return f"a dict with keys {sorted(x)}"
    return type(x).__name__


def token_id_lists(tokenize, texts):
    """`tokenize(texts)` (a tokenizer's ids for a batch of texts: lists, a
    ragged or dense tensor), one call, as one list of Python ints a text."""
    if not texts:
        return []
    tokens = tokenize(list(texts))
    if hasattr(tokens, "to_list"):  # tf.RaggedTensor
        return tokens.to_list()
    if keras.ops.is_tensor(tokens) or isinstance(tokens, np.ndarray):
        return keras.ops.convert_to_numpy(tokens).tolist()
    return [id_list(ids) for ids in tokens]


def _strings(texts):
    """A tokenizer's detokenized batch (a list, an array or a string
    tensor) as Python strings."""
    if hasattr(texts, "numpy"):
        texts = texts.numpy()
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    return [text.decode("utf-8") if isinstance(text, bytes) else str(text) for text in np.asarray(texts, object).reshape(-1)]

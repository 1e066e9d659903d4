"""The shared subword vocabulary of paper section 5.1.

Source and target text go through one vocabulary, so that one embedding
matrix can serve both (section 3.4). The paper used byte-pair encoding
(about 37,000 tokens for English-German); that is the default here, through
SentencePiece, which keras-hub and tensorflow-text already run inside
`tf.data` and which detokenizes exactly back to text, as BLEU on raw
references needs. WordPiece (keras-hub's trainer and tokenizer) is the
alternative; its detokenization puts spaces around punctuation, so BLEU
against raw references suffers.
"""

import io

import keras
import keras_hub
import numpy as np

from keras_transformer.models.preset_io import PresetIO
from keras_transformer.models.transformer.backbone import TransformerBackbone

PAD, UNK, START, END = "<pad>", "<unk>", "<s>", "</s>"
ALGORITHMS = ("bpe", "unigram", "wordpiece")
# Fewer texts (or id lists) than this go through the `sentencepiece`
# package one call each, not as one batch call (`TransformerTokenizer`).
FEW_TEXTS = 64


def _check_unpadded(kwargs):
    """The model's preprocessing adds `<s>` and `</s>` and pads itself; a
    tokenizer that pads or adds them too would put `</s>` after padding."""
    wrong = {key: kwargs[key] for key in ("sequence_length", "add_bos", "add_eos") if kwargs.get(key)}
    if wrong:
        raise ValueError(
            f"The Transformer's tokenizers give unpadded ids without start or end tokens; got {wrong}. "
            "TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length, "
            "decoder_sequence_length) adds <s> and </s> and pads."
        )


def _add_special_tokens(tokenizer):
    tokenizer._add_special_token(PAD, "pad_token")
    tokenizer._add_special_token(START, "start_token")
    tokenizer._add_special_token(END, "end_token")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerTokenizer(PresetIO, keras_hub.tokenizers.SentencePieceTokenizer):
    """A SentencePiece tokenizer with the Transformer's special tokens.

    `<pad>` is id 0, `<unk>` 1, `<s>` (start) 2 and `</s>` (end) 3. Train
    one with `TransformerTokenizer.from_texts` or `train_tokenizer`, save it
    with the model's preset, and use it inside `tf.data` on any backend.

    Note: create tokenizers after `keras.utils.set_random_seed` (or
    `tf.random.set_seed`), not before: setting TensorFlow's seed clears the
    kernel cache that holds tensorflow-text's SentencePiece resource, and a
    tokenizer made earlier then fails inside `tf.data`.

    Args:
        proto: a serialized SentencePiece model (bytes) or the path of a
            `.spm` file.
        **kwargs: further `keras_hub.tokenizers.SentencePieceTokenizer`
            arguments (`dtype`...); not `sequence_length`, `add_bos` or
            `add_eos`: the preprocessor adds `<s>` and `</s>` and pads.

    Example:

    >>> tokenizer = TransformerTokenizer.from_texts(
    ...     ["Ein Mann fährt Fahrrad.", "A man rides a bicycle."] * 50,
    ...     vocabulary_size=300,
    ... )
    >>> ids = tokenizer("Ein Mann fährt.")
    >>> tokenizer.detokenize(ids)
    'Ein Mann fährt.'
    """

    backbone_cls = TransformerBackbone
    preset_needs = ("tokenizer",)

    def __init__(self, proto=None, **kwargs):
        _check_unpadded(kwargs)
        _add_special_tokens(self)
        super().__init__(proto=proto, **kwargs)

    # Outside `tf.data`, keras-hub tokenizes with the `sentencepiece`
    # package, and hands it every call as a batch, for which SentencePiece
    # starts a pool of threads: 0.1 ms for one sentence alone, and 0.45 ms
    # right after PyTorch's work, against 4-12 us for the sentence as one
    # string (2 cores). Translating one sentence at a time pays that twice
    # a sentence. So fewer than `FEW_TEXTS` texts (or id lists) are encoded
    # (decoded) one call each, with the same ids (texts); more go as one
    # batch, where the threads pay (1,000 sentences: 3.8 ms against 7.8).
    def _tokenize_spm(self, inputs):
        single = isinstance(inputs, str)
        if not single and not (
            isinstance(inputs, (list, tuple)) and len(inputs) < FEW_TEXTS and all(isinstance(t, str) for t in inputs)
        ):
            return super()._tokenize_spm(inputs)
        self._maybe_initialized_spm()
        encode = self._sentence_piece_spm.Encode  # the add_bos and add_eos it was made with
        if single:
            return np.array(encode(inputs), dtype=self.compute_dtype)
        return [encode(text) for text in inputs]

    def _detokenize_spm(self, inputs):
        id_lists, batched = self._canonicalize_detokenize_spm_inputs(inputs)
        self._maybe_initialized_spm()
        _check_ids_in_vocabulary(id_lists, self._sentence_piece_spm.GetPieceSize())
        decode = self._sentence_piece_spm.Decode
        texts = decode(id_lists) if len(id_lists) >= FEW_TEXTS else [decode(ids) for ids in id_lists]
        return texts if batched else texts[0]

    @classmethod
    def from_texts(cls, texts, vocabulary_size=8000, model_type="bpe", max_sentences=2_000_000, **kwargs):
        """A tokenizer whose SentencePiece vocabulary is trained on `texts`.

        Named `from_texts`, not `train`: a layer's `train` would shadow
        `torch.nn.Module.train`, which Keras' `fit` calls on every sublayer
        on PyTorch (`train_tokenizer` is the function form).

        Uses the `sentencepiece` trainer directly rather than keras-hub's
        `compute_sentence_piece_proto`, which cannot set the special token
        ids or turn on byte fallback. Byte fallback spells any character the
        vocabulary lacks as bytes, so that no text becomes `<unk>`; the
        identity normalization keeps the text as written. Detokenization
        gives back the text exactly, except that runs of spaces become
        one space and leading and trailing spaces go.

        Args:
            texts: an iterable of strings: source and target sentences
                together, for the shared vocabulary.
            vocabulary_size: number of subword tokens.
            model_type: `"bpe"` (the paper's byte-pair encoding) or
                `"unigram"`.
            max_sentences: at most this many sentences are used.
            **kwargs: passed to the `TransformerTokenizer` constructor.
        """
        import sentencepiece

        if model_type not in ("bpe", "unigram"):
            raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}.")
        texts = [t for t in texts if t and t.strip()]
        if not texts:
            raise ValueError("Cannot train a tokenizer on no text: `texts` holds no non-empty string.")
        model = io.BytesIO()
        try:
            _train_sentencepiece(sentencepiece, texts, model, vocabulary_size, model_type, max_sentences)
        except RuntimeError as error:
            if "Vocabulary size is smaller than required_chars" in str(error):
                raise ValueError(
                    f"vocabulary_size={vocabulary_size} is too small: the 256 byte "
                    "tokens, the 4 special tokens and every character of the "
                    "text need a place. Use a larger vocabulary_size."
                ) from error
            raise
        return cls(proto=model.getvalue(), **kwargs)


def _check_ids_in_vocabulary(id_lists, size):
    """Names an id outside the vocabulary (SentencePiece says "piece id is
    out of range", without the id)."""
    for ids in id_lists:
        if len(ids) and (min(ids) < 0 or max(ids) >= size):
            bad = next(i for i in ids if not 0 <= i < size)
            raise ValueError(
                f"Token id {bad} is outside the vocabulary of {size} ids (0 to {size - 1}): "
                "detokenize the ids of a model that uses this tokenizer."
            )


def _train_sentencepiece(sentencepiece, texts, model, vocabulary_size, model_type, max_sentences):
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type=model_type,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece=PAD,
        unk_piece=UNK,
        bos_piece=START,
        eos_piece=END,
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name="identity",
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        num_threads=2,
        # A small corpus may not fill the vocabulary; use what it gives.
        hard_vocab_limit=False,
        minloglevel=2,
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerWordPieceTokenizer(PresetIO, keras_hub.tokenizers.WordPieceTokenizer):
    """A WordPiece tokenizer with the Transformer's special tokens.

    The alternative to the default SentencePiece BPE. Its detokenization
    joins word pieces with spaces (`"A man , riding ."`), so it is not exact.

    Args:
        vocabulary: a list of tokens or the path of a vocabulary file, with
            `<pad>`, `<unk>`, `<s>` and `</s>` first.
        **kwargs: further `keras_hub.tokenizers.WordPieceTokenizer`
            arguments; not `sequence_length`: the preprocessor pads.
    """

    backbone_cls = TransformerBackbone
    preset_needs = ("tokenizer",)

    def __init__(self, vocabulary=None, **kwargs):
        _check_unpadded(kwargs)
        _add_special_tokens(self)
        kwargs.setdefault("oov_token", UNK)
        super().__init__(vocabulary=vocabulary, **kwargs)

    @classmethod
    def from_texts(cls, texts, vocabulary_size=8000, **kwargs):
        """A tokenizer whose WordPiece vocabulary is trained on `texts` with
        keras-hub's trainer (`compute_word_piece_vocabulary`)."""
        texts = [t for t in texts if t and t.strip()]
        if not texts:
            raise ValueError("Cannot train a tokenizer on no text: `texts` holds no non-empty string.")
        import tensorflow as tf

        # A list would be read as file names; a dataset is read as text.
        data = tf.data.Dataset.from_tensor_slices(texts).batch(1024)
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            data, vocabulary_size, reserved_tokens=[PAD, UNK, START, END]
        )
        return cls(vocabulary=vocabulary, **kwargs)


def train_tokenizer(texts, vocabulary_size=8000, algorithm="bpe", **kwargs):
    """Trains the shared source/target vocabulary (section 5.1).

    Args:
        texts: source and target sentences together.
        vocabulary_size: number of subword tokens.
        algorithm: `"bpe"` (default, the paper's; SentencePiece),
            `"unigram"` (SentencePiece) or `"wordpiece"` (keras-hub).
        **kwargs: passed to the tokenizer constructor.

    Returns:
        A `TransformerTokenizer`, or a `TransformerWordPieceTokenizer`.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}.")
    if algorithm == "wordpiece":
        return TransformerWordPieceTokenizer.from_texts(texts, vocabulary_size, **kwargs)
    return TransformerTokenizer.from_texts(texts, vocabulary_size, model_type=algorithm, **kwargs)

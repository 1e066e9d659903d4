"""The tokenizer of Marian (opus-mt) checkpoints.

A Marian model has one joint vocabulary (`vocab.json`, piece -> id) and two
SentencePiece models: `source.spm` segments sources, `target.spm` segments
targets and joins output pieces back into text. The ids come from
`vocab.json`, not from the SentencePiece models. A leading `>>xx<<`
(the target language of a multilingual model) stays one token. `</s>` ends
sequences, the padding id is also the first decoder input, and sources get no
start token.

keras-hub has no tokenizer of this kind (it segments and numbers with the
same SentencePiece model), so this one is written with tensorflow-text's
SentencePiece and a `tf.lookup` table: it runs inside `tf.data` on every
backend and inside an exported SavedModel.
"""

import json
import os

import keras
import keras_hub
import numpy as np

from keras_transformer.models.preset_io import PresetIO
from keras_transformer.models.transformer.backbone import TransformerBackbone
from keras_transformer.utils.keras_hub_internals import preprocessing_function
from keras_transformer.utils.reading import VOCABULARY_LIMIT
from keras_transformer.utils.reading import read_bytes

SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON = "source.spm", "target.spm", "vocab.json"
PAD, UNK, END = "<pad>", "<unk>", "</s>"
# A leading target-language token such as `>>fr<<` (as transformers' Marian
# tokenizer reads it: from `>>` to the first `<<`).
LANGUAGE_CODE = r"(?s)^(>>.*?<<)?.*$"


def _read(path_or_bytes, binary=True):
    if isinstance(path_or_bytes, bytes) or path_or_bytes is None:
        return path_or_bytes
    data = read_bytes(path_or_bytes, VOCABULARY_LIMIT)
    return data if binary else data.decode("utf-8")


def graph_tokenizer(source_proto, target_proto, pieces, unk_id, skip_ids):
    """A `tf.Module` that tokenizes and detokenizes in TensorFlow graphs.

    `tokenize(text)` takes 1-D strings and gives ragged int32 ids (no
    framing); `detokenize(ids)` takes ragged ids and gives 1-D strings,
    dropping `skip_ids`. Its lookup table and SentencePiece models are
    tracked, so a SavedModel holding it saves them.
    """
    import tensorflow as tf
    import tensorflow_text as tf_text

    class MarianGraphTokenizer(tf.Module):
        def __init__(self):
            super().__init__(name="marian_tokenizer")
            self.source = tf_text.SentencepieceTokenizer(model=source_proto, out_type=tf.string)
            self.target = tf_text.SentencepieceTokenizer(model=target_proto, out_type=tf.string)
            keys = [piece for piece in pieces if piece is not None]
            values = [i for i, piece in enumerate(pieces) if piece is not None]
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(keys, tf.string), tf.constant(values, tf.int32)
                ),
                default_value=unk_id,
            )
            self.pieces = tf.constant([piece or "" for piece in pieces], tf.string)
            self.skip_ids = tf.constant(sorted(skip_ids), tf.int32)

        def tokenize(self, text, target=False):
            code = tf.strings.regex_replace(text, LANGUAGE_CODE, r"\1")
            rest = tf.strings.regex_replace(text, r"(?s)^>>.*?<<", "", replace_global=False)
            rest = tf.where(tf.equal(code, ""), text, rest)
            spm = self.target if target else self.source
            codes = tf.ragged.boolean_mask(code[:, None], tf.not_equal(code, "")[:, None])
            pieces = tf.concat([codes, spm.tokenize(rest)], axis=1)
            return tf.ragged.map_flat_values(self.table.lookup, pieces)

        def detokenize(self, ids):
            ids = tf.cast(ids, tf.int32)
            keep = tf.reduce_all(tf.not_equal(ids.flat_values[:, None], self.skip_ids[None, :]), axis=1)
            ids = tf.ragged.boolean_mask(ids, ids.with_flat_values(keep))
            text = self.target.detokenize(tf.ragged.map_flat_values(tf.gather, self.pieces, ids))
            # Pieces that only the source model knows come back verbatim:
            # their word-start marks become spaces, as transformers does.
            return tf.strings.strip(tf.strings.regex_replace(text, "▁", " "))

    return MarianGraphTokenizer()


@keras.saving.register_keras_serializable(package="keras_transformer")
class MarianTokenizer(PresetIO, keras_hub.tokenizers.Tokenizer):
    """Marian's tokenizer: SentencePiece segmentation, ids from `vocab.json`.

    Loaded with an imported opus-mt model (`TransformerSeq2SeqLM.from_preset`
    of a Marian directory or `hf://` handle), or built from the files that
    transformers' `MarianTokenizer.save_pretrained` writes.

    Args:
        source_spm: the source SentencePiece model (bytes or a path).
        target_spm: the target SentencePiece model (bytes or a path).
        vocabulary: the joint vocabulary, a dict from piece to id or the
            path of a `vocab.json`.
        source_start_token: a piece put before every source, or None (as
            in opus-mt models). Models of this package written out with
            `export_marian` read `<s>` first; their `config.json` says so
            in `bos_token_id`.
        **kwargs: base `keras_hub.tokenizers.Tokenizer` arguments.

    Example:

    ```python
    tokenizer = MarianTokenizer("opus-mt-en-de/source.spm",
                                "opus-mt-en-de/target.spm",
                                "opus-mt-en-de/vocab.json")
    ids = tokenizer.tokenize("A dog runs.")   # no </s>: the preprocessor frames
    tokenizer.detokenize(ids)                 # 'A dog runs.'
    ```
    """

    backbone_cls = TransformerBackbone
    preset_needs = ("tokenizer",)

    def __init__(self, source_spm=None, target_spm=None, vocabulary=None, source_start_token=None, **kwargs):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        self.source_start_token = source_start_token
        self.file_assets = [SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON]
        # The attributes `set_vocabulary` sets, so that a tokenizer built
        # from its config (whose vocabulary comes with its assets) has them.
        self.source_spm = self.target_spm = self.vocabulary = self._pieces = None
        self.pad_token_id = self.unk_token_id = self.end_token_id = self.start_token_id = None
        self.pad_token = self.end_token = self.start_token = None
        self.source_start_token_id = None
        self._graph = None
        if source_spm is not None or target_spm is not None or vocabulary is not None:
            self.set_vocabulary(source_spm, target_spm, vocabulary)

    def set_vocabulary(self, source_spm, target_spm, vocabulary):
        """Sets the two SentencePiece models and the joint vocabulary."""
        if source_spm is None or target_spm is None or vocabulary is None:
            raise ValueError("MarianTokenizer needs source_spm, target_spm and vocabulary.")
        self.source_spm, self.target_spm = _read(source_spm), _read(target_spm)
        if not isinstance(vocabulary, dict):
            vocabulary = json.loads(_read(vocabulary, binary=False))
        missing = [token for token in (PAD, UNK, END) if token not in vocabulary]
        if missing:
            raise ValueError(f"The Marian vocabulary has no {missing}: it is not a Marian vocab.json.")
        self.vocabulary = {str(piece): int(i) for piece, i in vocabulary.items()}
        pieces = [None] * (max(self.vocabulary.values()) + 1)
        for piece, i in self.vocabulary.items():
            if pieces[i] is None:  # the first piece of an id names it
                pieces[i] = piece
        self._pieces = pieces
        self.pad_token_id = self.vocabulary[PAD]
        self.unk_token_id = self.vocabulary[UNK]
        self.end_token_id = self.vocabulary[END]
        # Marian starts decoding from the padding id; sources get no start
        # unless `source_start_token` names one.
        self.start_token_id = self.pad_token_id
        self.source_start_token_id = None
        if self.source_start_token is not None:
            if self.source_start_token not in self.vocabulary:
                raise ValueError(
                    f"source_start_token {self.source_start_token!r} is not in the Marian vocabulary."
                )
            self.source_start_token_id = self.vocabulary[self.source_start_token]
        self.pad_token, self.end_token, self.start_token = PAD, END, PAD
        self._graph = None

    def graph_tokenizer(self):
        """A fresh `tf.Module` with `tokenize` and `detokenize` for graphs
        (what an exported SavedModel holds)."""
        self._check_vocabulary()
        skip = {self.pad_token_id, self.end_token_id, self.unk_token_id, self.source_start_token_id} - {None}
        return graph_tokenizer(self.source_spm, self.target_spm, self._pieces, self.unk_token_id, skip)

    def _check_vocabulary(self):
        if self.vocabulary is None:
            raise ValueError("No vocabulary has been set for MarianTokenizer: load it from a preset.")

    def _graph_tokenizer(self):
        if self._graph is None:
            self._graph = self.graph_tokenizer()
        return self._graph

    def save_assets(self, dir_path):
        self._check_vocabulary()
        for name, data in ((SOURCE_SPM, self.source_spm), (TARGET_SPM, self.target_spm)):
            with open(os.path.join(dir_path, name), "wb") as f:
                f.write(data)
        with open(os.path.join(dir_path, VOCABULARY_JSON), "w", encoding="utf-8") as f:
            json.dump(self.vocabulary, f, ensure_ascii=False, indent=0)

    def load_assets(self, dir_path):
        self.set_vocabulary(*(os.path.join(dir_path, name) for name in self.file_assets))

    def vocabulary_size(self):
        self._check_vocabulary()
        return len(self._pieces)

    def get_vocabulary(self):
        self._check_vocabulary()
        return [piece or "" for piece in self._pieces]

    def id_to_token(self, id):
        self._check_vocabulary()
        if not 0 <= int(id) < len(self._pieces):
            raise ValueError(f"`id` must be in range [0, {len(self._pieces) - 1}]. Received: {id}")
        return self._pieces[int(id)] or ""

    def token_to_id(self, token):
        self._check_vocabulary()
        return self.vocabulary.get(token, self.unk_token_id)

    def tokenize(self, inputs):
        """Source text to ids (no `</s>`: the preprocessor frames)."""
        return self._tokenize(inputs, target=False)

    def tokenize_target(self, inputs):
        """Target text to ids, segmented with the target SentencePiece model."""
        return self._tokenize(inputs, target=True)

    @preprocessing_function
    def _tokenize(self, inputs, target=False):
        import tensorflow as tf

        self._check_vocabulary()
        inputs = tf.convert_to_tensor(inputs)
        unbatched = inputs.shape.rank == 0
        ids = self._eagerly_safe(lambda graph: graph.tokenize(tf.reshape(inputs, [-1]), target=target))
        return ids[0] if unbatched else ids

    def _eagerly_safe(self, function):
        """`function(graph_tokenizer)`; run eagerly, it survives
        `keras.utils.set_random_seed`, which clears TensorFlow's kernel cache
        and with it tensorflow-text's SentencePiece resources: they are made
        again."""
        import tensorflow as tf

        if not tf.executing_eagerly():
            return function(self._graph_tokenizer())
        try:
            return function(self._graph_tokenizer())
        except tf.errors.NotFoundError:
            self._graph = None
            return function(self._graph_tokenizer())

    def detokenize(self, inputs):
        """Ids to text with the target SentencePiece model; padding, `</s>`
        and `<unk>` are dropped (as transformers' `skip_special_tokens`).

        Eagerly, one id list gives a string and a batch a list of strings;
        inside a `tf.function` or `tf.data`, string tensors."""
        import tensorflow as tf

        self._check_vocabulary()
        if isinstance(inputs, tf.RaggedTensor):
            ragged, unbatched = inputs, False
        else:
            if not isinstance(inputs, tf.Tensor):
                inputs = keras.ops.convert_to_numpy(inputs) if keras.ops.is_tensor(inputs) else inputs
                if isinstance(inputs, np.ndarray):
                    inputs = inputs.tolist()
                unbatched = not inputs or np.isscalar(inputs[0])
                ragged = tf.ragged.constant([inputs] if unbatched else inputs, dtype=tf.int32, ragged_rank=1)
            else:
                unbatched = inputs.shape.rank == 1
                ragged = tf.RaggedTensor.from_tensor(inputs[None] if unbatched else inputs)
        text = self._eagerly_safe(lambda graph: graph.detokenize(ragged))
        text = text[0] if unbatched else text
        if tf.executing_eagerly():
            return text.numpy().decode("utf-8") if unbatched else [t.decode("utf-8") for t in text.numpy()]
        return text

    def call(self, inputs, *args, training=None, **kwargs):
        return self.tokenize(inputs)

    def get_config(self):
        # The SentencePiece models and the vocabulary are assets, saved
        # beside the config (`save_assets`).
        return {**super().get_config(), "source_start_token": self.source_start_token}

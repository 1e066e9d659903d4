"""The tokenizer of fairseq's multilingual checkpoints (M2M100, NLLB-200).

One SentencePiece model segments sources and targets; the ids come from a
table of pieces (M2M100's `vocab.json`, NLLB's `tokenizer.json`), not from
the SentencePiece model. Language codes (`__de__`, `deu_Latn`) are tokens
of their own: a source is `[source code] text </s>`, a target `[target
code] text </s>`, and decoding starts from `</s>` with the target code
forced as the first output (`generate(target_language=...)`).

A text that starts with a language code is read as written in that
language; otherwise the tokenizer's `source_language` (sources) or
`target_language` (targets) is put first, as transformers' tokenizers do
with `src_lang` and `tgt_lang`. The Marian tokenizer's machinery does the
rest (`tf.data`, SavedModels, detokenization).
"""

import json
import os

import keras

from keras_transformer.models.transformer.marian_tokenizer import MarianTokenizer

SPM_FILE, IDS_FILE = "sentencepiece.bpe.model", "token_ids.json"
PAD, UNK, END, START = "<pad>", "<unk>", "</s>", "<s>"


def _read(path_or_bytes):
    if isinstance(path_or_bytes, bytes):
        return path_or_bytes
    with open(path_or_bytes, "rb") as f:
        return f.read()


def graph_tokenizer(proto, pieces, unk_id, skip_ids, codes, defaults):
    """A `tf.Module` that tokenizes and detokenizes in TensorFlow graphs.

    `tokenize(text, target)` takes 1-D strings and gives ragged int32 ids:
    the language code (the text's leading one, else `defaults[target]`'s
    id, else none), then the pieces; `detokenize(ids)` gives 1-D strings,
    dropping `skip_ids`. Its tables and SentencePiece model are tracked,
    so a SavedModel holding it saves them."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    class M2M100GraphTokenizer(tf.Module):
        def __init__(self):
            super().__init__(name="m2m100_tokenizer")
            self.spm = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.string)
            keys = [piece for piece in pieces if piece is not None]
            values = [i for i, piece in enumerate(pieces) if piece is not None]
            self.table = _table(tf, keys, values, unk_id)
            self.codes = _table(tf, list(codes) or [""], list(codes.values()) or [-1], -1)
            self.defaults = tf.constant(defaults, tf.int32)
            self.pieces = tf.constant([piece or "" for piece in pieces], tf.string)
            self.skip_ids = tf.constant(sorted(skip_ids), tf.int32)

        def tokenize(self, text, target=False):
            first = tf.strings.regex_replace(text, r"(?s)^\s*(\S*).*$", r"\1")
            code = self.codes.lookup(first)
            rest = tf.where(code >= 0, tf.strings.regex_replace(text, r"^\s*\S+\s*", ""), text)
            code = tf.where(code >= 0, code, self.defaults[1 if target else 0])
            codes = tf.ragged.boolean_mask(code[:, None], (code >= 0)[:, None])
            ids = tf.ragged.map_flat_values(self.table.lookup, self.spm.tokenize(rest))
            return tf.concat([codes, ids], axis=1)

        def detokenize(self, ids):
            ids = tf.cast(ids, tf.int32)
            keep = tf.reduce_all(tf.not_equal(ids.flat_values[:, None], self.skip_ids[None, :]), axis=1)
            keep &= ids.flat_values < tf.size(self.pieces)  # (ids of the model's padded vocabulary)
            ids = tf.ragged.boolean_mask(ids, ids.with_flat_values(keep))
            text = self.spm.detokenize(tf.ragged.map_flat_values(tf.gather, self.pieces, ids))
            return tf.strings.strip(tf.strings.regex_replace(text, "▁", " "))

    return M2M100GraphTokenizer()


def _table(tf, keys, values, default):
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.constant(values, tf.int32)),
        default_value=default,
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class M2M100Tokenizer(MarianTokenizer):
    """The tokenizer of M2M100 and NLLB-200 checkpoints: one SentencePiece
    model, ids from a table of pieces, language codes as tokens.

    Loaded with an imported checkpoint (`TransformerSeq2SeqLM.from_preset`
    of an `m2m_100` directory or `hf://` handle).

    Args:
        spm: the SentencePiece model (bytes or a path).
        vocabulary: piece -> id, a dict or the path of a JSON file; it
            holds `<pad>`, `<unk>`, `</s>` and the language codes.
        language_codes: the language codes, as the checkpoint names them
            (`["__en__", "__de__"]`, `["eng_Latn", "deu_Latn"]`).
        source_language: the code put before a source that starts with
            none (transformers' `src_lang`), or None.
        target_language: the code put before a target that starts with
            none (`tgt_lang`), and forced first when translating without
            `target_language`; or None.
        **kwargs: base `keras_hub.tokenizers.Tokenizer` arguments.

    Example:

    ```python
    model = TransformerSeq2SeqLM.from_preset("hf://facebook/m2m100_418M")
    tokenizer = model.preprocessor.tokenizer
    tokenizer.tokenize("__en__ A dog runs.")  # [the id of __en__, pieces...]
    model.generate("A dog runs.", source_language="en", target_language="de")
    ```
    """

    def __init__(self, spm=None, vocabulary=None, language_codes=(), source_language=None,
                 target_language=None, **kwargs):
        kwargs.setdefault("dtype", "int32")
        kwargs.pop("source_start_token", None)
        super().__init__(**kwargs)
        self.file_assets = [SPM_FILE, IDS_FILE]
        self.language_codes = list(language_codes)
        self.source_language, self.target_language = source_language, target_language
        if spm is not None or vocabulary is not None:
            self.set_vocabulary(spm, vocabulary)

    def set_vocabulary(self, spm, vocabulary, *unused):
        """Sets the SentencePiece model and the table of pieces."""
        if spm is None or vocabulary is None:
            raise ValueError("M2M100Tokenizer needs spm and vocabulary.")
        if not isinstance(vocabulary, dict):
            with open(vocabulary, encoding="utf-8") as f:
                vocabulary = json.load(f)
        missing = [token for token in (PAD, UNK, END, *self.language_codes) if token not in vocabulary]
        if missing:
            raise ValueError(f"The vocabulary has no {missing[:5]}: it does not belong to this tokenizer.")
        for language in (self.source_language, self.target_language):
            if language is not None and language not in self.language_codes:
                raise ValueError(f"{language!r} is not one of the tokenizer's language codes.")
        self.source_spm = self.target_spm = _read(spm)
        self.vocabulary = {str(piece): int(i) for piece, i in vocabulary.items()}
        pieces = [None] * (max(self.vocabulary.values()) + 1)
        for piece, i in self.vocabulary.items():
            if pieces[i] is None:
                pieces[i] = piece
        self._pieces = pieces
        self.pad_token_id, self.unk_token_id = self.vocabulary[PAD], self.vocabulary[UNK]
        # Decoding starts from `</s>` (fairseq's decoder_start_token_id).
        self.end_token_id = self.start_token_id = self.vocabulary[END]
        self.source_start_token_id = None  # the language code comes from `tokenize`
        self.pad_token, self.end_token, self.start_token = PAD, END, END
        self._graph = None

    def __setattr__(self, name, value):
        if name in ("source_language", "target_language"):
            self.__dict__["_graph"] = None  # its defaults change
        super().__setattr__(name, value)

    def language_id(self, code):
        """The token id of a language code (`"__de__"`, `"deu_Latn"`)."""
        self._check_vocabulary()
        if code not in self.language_codes:
            raise ValueError(f"{code!r} is not one of the tokenizer's language codes.")
        return self.vocabulary[code]

    def graph_tokenizer(self):
        """A fresh `tf.Module` with `tokenize` and `detokenize` for graphs."""
        self._check_vocabulary()
        codes = {code: self.vocabulary[code] for code in self.language_codes}
        defaults = [-1 if code is None else codes[code] for code in (self.source_language, self.target_language)]
        skip = {self.pad_token_id, self.end_token_id, self.unk_token_id, *codes.values()}
        skip |= {self.vocabulary[token] for token in (START, "<mask>") if token in self.vocabulary}
        return graph_tokenizer(self.source_spm, self._pieces, self.unk_token_id, skip, codes, defaults)

    def save_assets(self, dir_path):
        self._check_vocabulary()
        with open(os.path.join(dir_path, SPM_FILE), "wb") as f:
            f.write(self.source_spm)
        with open(os.path.join(dir_path, IDS_FILE), "w", encoding="utf-8") as f:
            json.dump(self.vocabulary, f, ensure_ascii=False, indent=0)

    def load_assets(self, dir_path):
        self.set_vocabulary(*(os.path.join(dir_path, name) for name in self.file_assets))

    def get_config(self):
        config = {key: value for key, value in super().get_config().items() if key != "source_start_token"}
        return {
            **config,
            "language_codes": self.language_codes,
            "source_language": self.source_language,
            "target_language": self.target_language,
        }

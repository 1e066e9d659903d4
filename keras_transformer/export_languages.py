"""The languages of a multilingual model's SavedModel (`export.py`).

The SavedModel of an M2M100 or NLLB-200 model takes the languages as
inputs beside `text`, each a 1-D string tensor of one language for every
text or one for each:

- `source_language`: the code put before each text that starts with none
  (`""`: the tokenizer's own, as `generate`);
- `target_language`: the code forced as each text's first output token
  (`""`: the tokenizer's `target_language`, an error where it has none).

(A multilingual opus-mt model reads its `>>xx<<` target token in the text,
and its SavedModel takes `text` alone, as before.)

Languages are named as `generate` takes them (`resolve_language`): the
checkpoint's codes (`deu_Latn`, `__de__`, `>>de<<`) or an ISO 639-1 /
639-3 code that names one of them (`de`, `deu`), in any case; a name the
model does not know fails the request with an error that says so.
"""

import tensorflow as tf

from keras_transformer.models.transformer.languages import language_names
from keras_transformer.models.transformer.languages import model_languages
from keras_transformer.models.transformer.languages import with_languages

INPUT_NAMES = ("source_language", "target_language")


def language_inputs(model, target_prefix=None):
    """The `LanguageInputs` of `model`'s SavedModel, or None for a model
    that forces no language code (whose signatures take `text` alone)."""
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    if not model_languages(tokenizer) or not hasattr(tokenizer, "language_id"):
        return None
    return LanguageInputs(tokenizer, model.special_token_ids.end, target_prefix)


def _table(keys, values, default):
    dtype = tf.string if isinstance(default, str) else tf.int32
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.constant(values, dtype)), default)


class LanguageInputs(tf.Module):
    """The language inputs of a SavedModel's signatures, and what they do
    to its texts and its search (see the module docstring).

    Args:
        tokenizer: the model's `M2M100Tokenizer`.
        end_id: the model's end token id (put where a blank text's forced
            code would be).
        target_prefix: the export's `target_prefix` (text or ids), forced
            after the target code.
    """

    def __init__(self, tokenizer, end_id, target_prefix=None):
        super().__init__(name="languages")
        codes = model_languages(tokenizer)
        names = language_names(codes)
        self.code_of = _table(sorted(names), [names[name] for name in sorted(names)], "")
        self.is_code = _table(codes, [1] * len(codes), 0)
        self.examples = ", ".join(codes[:4])
        self.id_of = _table(codes, [tokenizer.language_id(code) for code in codes], -1)
        target = tokenizer.target_language
        self.default_target = tf.constant(-1 if target is None else tokenizer.language_id(target), tf.int32)
        # The export's prefix: the pieces after a target code.
        self.prefix = tf.constant(with_languages(tokenizer, [], None, codes[0], target_prefix)[1][1:], tf.int32)
        self.end_id = tf.constant(end_id, tf.int32)

    @staticmethod
    def specs():
        """The signatures' language inputs, after `text`."""
        return [tf.TensorSpec([None], tf.string, name=name) for name in INPUT_NAMES]

    def _codes(self, names, shape, role):
        """The codes named by `names` (broadcast to `shape`), `""` where
        none is given; a name the model does not know is an error."""
        names = tf.strings.lower(tf.strings.strip(tf.broadcast_to(names, shape)))
        codes = self.code_of.lookup(names)
        check = tf.debugging.assert_equal(
            (names == "") | (codes != ""), True,
            message=f"The model does not know a {role} given: name its languages as it does ({self.examples}, ...) "
            "or by ISO 639-1 / 639-3 codes that name one of them (de, deu).",
        )
        with tf.control_dependencies([check]):
            return tf.identity(codes)

    def framed(self, text, empty, source_language, target_language):
        """`(text, prefixes)`: the texts with the source code put first
        (unless blank or starting with a code), and each text's forced
        first tokens (int32 `(batch, 1 + prefix length)`: the target code,
        then the export's prefix)."""
        shape = tf.shape(text)
        source = self._codes(source_language, shape, "source_language")
        target = self._codes(target_language, shape, "target_language")
        first = tf.strings.regex_replace(text, r"(?s)^\s*(\S*).*$", r"\1")
        keep = empty | (self.is_code.lookup(first) > 0)
        text = tf.where(keep | (source == ""), text, tf.strings.join([source, text], " "))
        ids = tf.where(target == "", self.default_target, self.id_of.lookup(target))
        check = tf.debugging.assert_equal(
            empty | (ids >= 0), True, message=f"Give target_language: this model translates into many languages "
            f"({self.examples}, ...) and has no default one.")
        with tf.control_dependencies([check]):
            ids = tf.where(ids >= 0, ids, self.end_id)  # (blank texts: their output is empty)
        prefixes = tf.concat([ids[:, None], tf.tile(self.prefix[None, :], [shape[0], 1])], axis=1)
        return text, prefixes

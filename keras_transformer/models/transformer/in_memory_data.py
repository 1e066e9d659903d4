"""Sentence pairs held in memory (not a dataset) that the task's `fit`,
`evaluate` and `predict` take: checked by the preprocessor first, and for
`fit` shuffled anew each epoch, with a validation split."""

import keras
import numpy as np

from keras_transformer.models.transformer.languages import with_pair_languages
from keras_transformer.models.transformer.text_checks import check_pair_texts

# Data that `fit`, `evaluate` and `predict` take as it is in memory (not a
# dataset): checked by the preprocessor first, and shuffled by `fit`.
IN_MEMORY = (dict, list, tuple, np.ndarray)


def check_in_memory(preprocessor, x, y, method, what=None, long_pairs="error"):
    """The `preprocessor`'s checks of sentence pairs held in memory, run
    before `method` (`"fit"`, `"evaluate"`, `"predict"`) rather than inside
    `tf.data` (whose traceback buries them), and the texts' checks, the
    same as `generate`'s (`text_checks.check_pair_texts`); `what` names the
    argument checked, if not the data itself.

    Returns:
        `(x, kept)`: the pairs to use (without the long ones, with
        `long_pairs="drop"`), and the indices kept (None: all).
    """
    if x is None and what is None:
        raise ValueError(f"{method}: no data: give x, a dict with 'encoder_text' and 'decoder_text' (or a dataset).")
    _check_not_empty_dataset(x, method, what)
    check_inputs = getattr(preprocessor, "check_inputs", None)
    if check_inputs is None or not isinstance(x, (*IN_MEMORY, str)):
        return x, None
    try:
        if check_inputs(x, y):  # token ids: checked by the backbone
            return x, None
        return check_pair_texts(preprocessor, x, long_pairs)
    except (ValueError, TypeError) as error:
        # Sources alone, not sentence pairs: perhaps meant for translation.
        to_translate = method != "fit" and not isinstance(x, dict) and y is None
        hint = " To translate sources, call generate(sources)." if to_translate else ""
        raise type(error)(f"{method}: {what + ': ' if what else ''}{error}{hint}") from None


def _check_not_empty_dataset(x, method, what):
    """Refuses a `tf.data.Dataset` known to hold no batch (cardinality 0;
    an unknown cardinality passes): Keras would warn that it ran out of data
    and then fail on a missing input."""
    cardinality = getattr(x, "cardinality", None)
    if callable(cardinality) and type(x).__module__.startswith("tensorflow") and int(cardinality()) == 0:
        raise ValueError(
            f"{method}: {what + ': ' if what else ''}the dataset is empty (it holds no batch): "
            "give at least one sentence pair."
        )


def fit_data(preprocessor, x, y, batch_size, sample_weight, validation_data, validation_split, shuffle, long_pairs,
             source_language=None, target_language=None):
    """`keras.Model.fit`'s data arguments (`x`, `y`, `batch_size`,
    `sample_weight`, `validation_data`, `validation_split`) for
    `TransformerSeq2SeqLM.fit`'s: pairs held in memory with their
    languages (`with_languages`), checked, and shuffled each epoch with the
    validation split (`shuffled_batches`)."""
    x, validation_data = with_languages(preprocessor, x, validation_data, source_language, target_language)
    x, kept = check_in_memory(preprocessor, x, y, "fit", long_pairs=long_pairs)
    if kept is not None and isinstance(sample_weight, (list, tuple, np.ndarray)):
        sample_weight = np.asarray(sample_weight)[kept]
    validation_data = check_validation_data(preprocessor, validation_data, long_pairs)
    if isinstance(x, IN_MEMORY) and (shuffle or validation_split):
        x, validation_data = shuffled_batches(x, y, sample_weight, batch_size, validation_split, validation_data, shuffle)
        y, sample_weight, batch_size, validation_split = None, None, None, None
    return dict(x=x, y=y, batch_size=batch_size, sample_weight=sample_weight, validation_data=validation_data,
                validation_split=validation_split)


def with_languages(preprocessor, x, validation_data, source_language, target_language):
    """`(x, validation_data)` of `fit` (or `evaluate`'s `x`, with
    `validation_data` None) with a multilingual model's language codes put
    where it reads them (`languages.with_pair_languages`)."""
    if source_language is None and target_language is None:
        return x, validation_data
    tokenizer = getattr(preprocessor, "tokenizer", None)
    x = with_pair_languages(tokenizer, x, source_language, target_language)
    if isinstance(validation_data, dict):
        validation_data = with_pair_languages(tokenizer, validation_data, source_language, target_language)
    elif isinstance(validation_data, (list, tuple)) and validation_data:
        framed = with_pair_languages(tokenizer, validation_data[0], source_language, target_language)
        validation_data = (framed, *validation_data[1:])
    return x, validation_data


def check_validation_data(preprocessor, validation_data, long_pairs="error"):
    """`fit`'s `validation_data` held in memory: a dict of sentence
    pairs, or Keras' `(x, y)` / `(x, y, sample_weight)` tuple; returned
    without its long pairs with `long_pairs="drop"`."""
    if isinstance(validation_data, bool):  # `shuffle` given fifth, where keras-hub has validation_data
        raise ValueError(
            f"fit: validation_data={validation_data}: fit takes keras-hub's order (x, y, batch_size, "
            "sample_weight, validation_data); give shuffle by name: fit(..., shuffle=False)."
        )
    if validation_data is None:
        return None
    packed = isinstance(validation_data, (list, tuple)) and 1 <= len(validation_data) <= 3  # as Keras unpacks
    if packed:
        x, y, _ = keras.utils.unpack_x_y_sample_weight(validation_data)
    else:
        x, y = validation_data, None
    x, kept = check_in_memory(preprocessor, x, y, "fit", what="validation_data", long_pairs=long_pairs)
    if kept is None:
        return validation_data
    return (x, *validation_data[1:]) if packed else x


def shuffled_batches(x, y, sample_weight, batch_size, validation_split, validation_data, shuffle):
    """`fit`'s data held in memory as a dataset of batches (of `batch_size`,
    32 if None), shuffled anew each epoch if `shuffle`, and the validation
    data: `validation_data`, or else the last `validation_split` of the
    pairs, before shuffling (Keras's `validation_split`).

    Returns:
        `(batches, validation_data)`.
    """
    import tensorflow as tf

    samples = tf.data.Dataset.from_tensor_slices(keras.utils.pack_x_y_sample_weight(x, y, sample_weight))
    batch_size = batch_size or 32
    if validation_split and validation_data is None:
        samples, validation_data = _split_off_validation(samples, validation_split, batch_size)
    if shuffle:
        samples = samples.shuffle(int(samples.cardinality()), reshuffle_each_iteration=True)
    return samples.batch(batch_size), validation_data


def _split_off_validation(samples, validation_split, batch_size):
    """The first pairs for training and the last `validation_split` of
    them, batched, for validation (Keras's `validation_split`)."""
    if not 0 < validation_split < 1:
        raise ValueError(f"validation_split must be between 0 and 1, got {validation_split}.")
    count = int(samples.cardinality())
    split_at = int(np.floor(count * (1 - validation_split)))
    if split_at in (0, count):
        raise ValueError(
            f"{count} training pairs are too few to split off validation_split={validation_split} of "
            "them for validation and keep some for training. Give more pairs or another validation_split."
        )
    return samples.take(split_at), samples.skip(split_at).batch(batch_size)

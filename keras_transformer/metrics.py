"""Translation quality with sacreBLEU, as the paper's section 6.1 reports it
(BLEU), plus chrF; and the token accuracy that training reports.

Scores are computed on detokenized output against raw references, by
sacreBLEU itself: the cased BLEU with its signature, and the lowercased one
(`lowercase=True`) that published Multi30k tables use.
"""

import keras
from keras import ops


def token_accuracy(y_true, y_pred):
    """1.0 where the label's logit is the largest of its position, else 0.0.

    `SparseCategoricalAccuracy` without its argmax: the label's logit is
    compared with the position's maximum. Where another token ties with the
    label for the maximum, the label counts as predicted.

    Example:

    >>> import numpy as np
    >>> logits = np.array([[[0.1, 2.0, 0.3], [1.0, 0.0, 0.5]]], "float32")
    >>> keras.ops.convert_to_numpy(token_accuracy(np.array([[1, 2]]), logits)).tolist()
    [[1.0, 0.0]]
    """
    labels = ops.cast(y_true, "int32")
    if len(labels.shape) == len(y_pred.shape):
        labels = ops.squeeze(labels, axis=-1)
    label_logits = ops.take_along_axis(y_pred, ops.expand_dims(labels, -1), axis=-1)
    return ops.cast(ops.squeeze(label_logits, -1) >= ops.max(y_pred, axis=-1), "float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenAccuracy(keras.metrics.MeanMetricWrapper):
    """The share of target tokens whose label has the largest logit: the
    accuracy `TransformerSeq2SeqLM.compile()` reports by default (as a
    weighted metric, so padding does not count).

    It gives what `keras.metrics.SparseCategoricalAccuracy` gives, except on
    ties, without an argmax over the vocabulary at every training step: an
    argmax over (315, 13, 8,000) logits took 41-60 ms on each backend on a
    2-core CPU, a maximum 4-6 ms, a few percent of a small model's step.

    Args:
        name: the metric's name (`"accuracy"` in logs and history).
        dtype: the dtype of the metric's result.

    Example:

    >>> import numpy as np
    >>> metric = TokenAccuracy()
    >>> logits = np.array([[[0.1, 2.0, 0.3], [1.0, 0.0, 0.5]]], "float32")
    >>> metric.update_state(np.array([[1, 2]]), logits)
    >>> float(metric.result())
    0.5
    """

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(fn=token_accuracy, name=name, dtype=dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def corpus_scores(hypotheses, references):
    """sacreBLEU scores of detokenized hypotheses against raw references.

    Args:
        hypotheses: a list of translated strings.
        references: a list of reference strings, as many.

    Returns:
        A dict: `bleu` (cased), `bleu_lowercase`, `chrf`, and the sacreBLEU
        signatures `bleu_signature`, `bleu_lowercase_signature`,
        `chrf_signature`.

    Example:

    >>> scores = corpus_scores(["Ein Hund läuft."], ["Ein Hund läuft."])
    >>> round(scores["bleu"], 2)
    100.0
    """
    import sacrebleu  # here: the models import this module for TokenAccuracy

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    if not references:
        raise ValueError("No sentences to score: give at least one hypothesis and its reference.")
    bleu = sacrebleu.metrics.BLEU()
    bleu_lowercase = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    return {
        "bleu": bleu.corpus_score(hypotheses, [references]).score,
        "bleu_lowercase": bleu_lowercase.corpus_score(hypotheses, [references]).score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase_signature": str(bleu_lowercase.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def evaluate_translation(model, sources, references, batch_size=64, verbose=1, **generate_kwargs):
    """Translates `sources` with `model` and scores against `references`.

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor.
        sources: source sentences.
        references: reference translations, one per source.
        batch_size: sentences translated together.
        verbose: 1 shows a progress bar, 0 nothing.
        **generate_kwargs: passed to `model.generate` (`sampler`...).

    Returns:
        `corpus_scores(...)`, plus the `translations` themselves.
    """
    sources, references = list(sources), list(references)
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources but {len(references)} references.")
    if not sources:
        raise ValueError("No sentences to translate and score.")
    translations = model.generate(sources, batch_size=batch_size, verbose=verbose, **generate_kwargs)
    scores = corpus_scores(translations, references)
    scores["translations"] = translations
    return scores

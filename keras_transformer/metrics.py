"""Translation quality with sacreBLEU, as the paper's section 6.1 reports it
(BLEU), plus chrF.

Scores are computed on detokenized output against raw references, by
sacreBLEU itself: the cased BLEU with its signature, and the lowercased one
(`lowercase=True`) that published Multi30k tables use.
"""

import sacrebleu


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

"""Several translation models decoded as one (an ensemble).

Models trained apart on the same vocabulary (other seeds, other
configurations) make different errors; decoding them together is a common
way to gain BLEU at inference time alone. As fairseq and Marian do, every
model reads the same source and the same output prefix, and the search ranks
the next token by the average of the models' probabilities:

    P(y | prefix, X) = 1/M * sum_m P_m(y | prefix, X)

`Ensemble` provides the decoding interface (`interface.Seq2SeqDecodingModel`)
over its models, so beam search, greedy decoding and their compiled steps
run it unchanged: the ensemble's cache is the models' caches one after the
other, and its logits are log P, already normalized.
"""

import math
import types

from keras import ops

from keras_transformer.runtime.kernels import backend_kernel


# The smallest mean probability kept: float32's normal range, so that a
# token that no model gives any probability ranks last but is not -inf.
_TINY = 1e-37


class Ensemble:
    """Translation models decoded together, averaging their probabilities.

    Args:
        models: two or more `TransformerSeq2SeqLM` (or other
            `Seq2SeqDecodingModel`s) with the same vocabulary size and special
            token ids; with tokenizers, the same vocabulary.

    Example:

    >>> from keras_transformer.models import TransformerSeq2SeqLM
    >>> model = TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de")
    >>> ensemble = Ensemble([model, model])
    >>> ensemble.backbone.vocabulary_size
    8000

    `model.generate(texts, ensemble=[other, ...])` translates with the
    ensemble of `model` and the others.
    """

    def __init__(self, models):
        models = list(models)
        if len(models) < 2:
            raise ValueError(f"An ensemble needs at least two models, got {len(models)}.")
        first = models[0]
        for i, model in enumerate(models[1:], start=1):
            _check_compatible(first, model, i)
        self.models = models
        self.special_token_ids = first.special_token_ids
        # The `backbone` attributes that decoding reads.
        self.backbone = types.SimpleNamespace(
            vocabulary_size=first.backbone.vocabulary_size,
            max_sequence_length=min(model.backbone.max_sequence_length for model in models),
        )
        # Where each model's layers start in the ensemble's cache.
        self._layer_counts = [len(model.empty_self_attention_cache(1, 1)) for model in models]

    @property
    def variables(self):
        return [variable for model in self.models for variable in model.variables]

    def encode(self, encoder_token_ids, encoder_padding_mask):
        """Each model's encoder output, as a tuple."""
        return tuple(model.encode(encoder_token_ids, encoder_padding_mask) for model in self.models)

    def cross_attention_cache(self, encoder_outputs):
        """The models' encoder-decoder keys and values, one after the other."""
        return [
            cache
            for model, output in zip(self.models, encoder_outputs)
            for cache in model.cross_attention_cache(output)
        ]

    def empty_self_attention_cache(self, batch_size, max_length, beams=None):
        """The models' empty self-attention caches, one after the other."""
        return [
            cache for model in self.models
            for cache in model.empty_self_attention_cache(batch_size, max_length, beams=beams)
        ]

    def call_decoder_with_cache(self, token_ids, index, cache, encoder_padding_mask):
        """One step of every model; returns `(log P, cache)`, with log P
        `(batch, vocabulary_size)` the log of the models' mean probability."""
        # The models' probabilities summed, then one logarithm: the
        # log-sum-exp of their log-softmaxes cost a second pass of
        # exponentials over every model's (rows, vocabulary_size) values,
        # which XLA repeats in each op it fuses them into. 256 test_2016
        # sentences, 64 at a time, the shipped en-de preset's three models,
        # 2-core CPU: JAX 25-27 -> 45-50 sentences/s, TensorFlow 34 -> 42,
        # PyTorch alike (25-34 either way); the same translations, scores
        # within 1e-6.
        grouped = _grouped_step(self, token_ids, index, cache, encoder_padding_mask)
        if grouped is not None:
            # (PyTorch, a few rows: alike models stepped as one.)
            probabilities, new_cache = grouped
            return log_mean(probabilities), new_cache
        probabilities, new_cache = [], []
        for model, model_cache in zip(self.models, self.split_cache(cache)):
            logits, model_cache = model.call_decoder_with_cache(token_ids, index, model_cache, encoder_padding_mask)
            probabilities.append(probabilities_of(logits))
            new_cache.extend(model_cache)
        return log_mean(probabilities), new_cache

    def split_cache(self, cache):
        """The ensemble's cache as each model's, in the models' order."""
        parts, start = [], 0
        for count in self._layer_counts:
            parts.append(cache[start : start + count])
            start += count
        return parts


def _grouped_step(ensemble, token_ids, index, cache, encoder_padding_mask):
    """The backend's step of alike models as one (`grouped_step`, PyTorch's
    in `runtime.torch_ensemble_step`) where it has one and it applies, else
    None."""
    grouped_step = backend_kernel("grouped_step")
    return None if grouped_step is None else grouped_step(ensemble, token_ids, index, cache, encoder_padding_mask)


def probabilities_of(logits):
    """A model's next-token probabilities, float32, from its logits."""
    return ops.softmax(ops.cast(logits, "float32"), axis=-1)


def log_mean(probabilities):
    """The log of the mean of the models' next-token probabilities
    (`probabilities_of`), at least float32's smallest normal number."""
    total = probabilities[0]
    for more in probabilities[1:]:
        total = total + more
    return ops.log(ops.maximum(total, _TINY)) - math.log(len(probabilities))


def _check_compatible(first, model, index):
    """Refuses a model whose outputs do not mean the same tokens as the first's."""
    if model.backbone.vocabulary_size != first.backbone.vocabulary_size:
        raise ValueError(
            f"Ensemble model {index} has a vocabulary of {model.backbone.vocabulary_size} tokens, model 0 "
            f"one of {first.backbone.vocabulary_size}: the models of an ensemble must share one vocabulary."
        )
    if model.special_token_ids != first.special_token_ids:
        raise ValueError(
            f"Ensemble model {index} has special token ids {model.special_token_ids}, model 0 "
            f"{first.special_token_ids}: the models of an ensemble must share one vocabulary."
        )
    first_languages, languages = _languages(first), _languages(model)
    if first_languages and languages and first_languages != languages:
        raise ValueError(
            f"Ensemble model {index} translates {languages}, model 0 {first_languages}: the models of an "
            "ensemble must translate the same languages."
        )
    first_vocabulary, vocabulary = _vocabulary(first), _vocabulary(model)
    if first_vocabulary is not None and vocabulary is not None and first_vocabulary != vocabulary:
        raise ValueError(
            f"Ensemble model {index} has another tokenizer vocabulary than model 0 (same size, other "
            "pieces): the models of an ensemble must share one vocabulary, as models trained on the same "
            "tokenizer (train --from-preset, or the same tokenizer.spm) do."
        )


def _languages(model):
    """'en-de' for a model loaded from a preset whose metadata.json names
    its languages; None when unknown."""
    languages = getattr(model, "_preset_metadata", {}).get("languages")
    if not isinstance(languages, dict) or not {"source", "target"} <= set(languages):
        return None
    return f"{languages['source']}-{languages['target']}"


def _vocabulary(model):
    tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    get_vocabulary = getattr(tokenizer, "get_vocabulary", None)
    return None if get_vocabulary is None else list(get_vocabulary())

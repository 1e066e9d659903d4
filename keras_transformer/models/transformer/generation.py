"""Translation with the task (section 6.1): `generate`'s arguments checked,
its sources framed as token ids, batched by length and searched by
`keras_transformer.decoding` (beam search, greedy decoding, sampling, or
keras-hub's samplers), and the outputs turned back into text."""

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.samplers import sample
from keras_transformer.decoding.settings import MAX_BATCH_SIZE
from keras_transformer.decoding.settings import SAMPLINGS
from keras_transformer.decoding.settings import DecodingSettings
from keras_transformer.decoding.settings import check_int
from keras_transformer.documents.document import FORMATS
from keras_transformer.documents.document import Document
from keras_transformer.documents.document import assembled
from keras_transformer.documents.document import markup_pairs
from keras_transformer.documents.document import segments_of
from keras_transformer.models.transformer.alignment import alignments
from keras_transformer.models.transformer.languages import model_languages
from keras_transformer.models.transformer.languages import with_languages
from keras_transformer.models.transformer.seq2seq_lm_preprocessor import source_texts
from keras_transformer.utils.text import is_blank


def generate(
    model,
    inputs,
    *,
    task_class,
    sampler,
    beam_size,
    alpha,
    max_length_offset,
    num_results,
    return_scores,
    batch_size,
    verbose,
    length_penalty,
    ensemble,
    target_prefix,
    top_k,
    top_p,
    temperature,
    seed,
    source_language=None,
    target_language=None,
    split_sentences=False,
    format="text",
    no_repeat_ngram_size=0,
):
    """`model.generate(inputs, ...)`: its arguments and their meaning are
    those of `TransformerSeq2SeqLM.generate`; `task_class` is the class
    whose instances may be members of the `ensemble`."""
    if split_sentences or format != "text":
        if num_results > 1 or return_scores:
            raise ValueError(
                "Documents (split_sentences=True or format='html') are translated whole: one translation a "
                "document, without scores; num_results and return_scores do not apply."
            )
        documents, single = _documents(model, inputs, split_sentences, format, source_language)
        outputs = generate(
            model, segments_of(documents), task_class=task_class, sampler=sampler, beam_size=beam_size,
            alpha=alpha, max_length_offset=max_length_offset, num_results=1, return_scores=False,
            batch_size=batch_size, verbose=verbose, length_penalty=length_penalty, ensemble=ensemble,
            target_prefix=target_prefix, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed,
            source_language=source_language, target_language=target_language,
            no_repeat_ngram_size=no_repeat_ngram_size,
        )
        sources, targets = markup_pairs(documents, outputs)
        found = markup_alignments(model, sources, targets, source_language, target_language, target_prefix)
        outputs = assembled(documents, outputs, found)
        return outputs[0] if single else outputs
    keras_hub_sampler = isinstance(sampler, keras_hub.samplers.Sampler)
    if not keras_hub_sampler and sampler not in ("beam", "greedy", *SAMPLINGS):
        raise ValueError(
            f"Unknown sampler {sampler!r}; available: 'beam', 'greedy', 'top_k', 'top_p', or a "
            "keras_hub.samplers.Sampler instance."
        )
    if ensemble is None:
        # keras-hub's samplers decode one model: an ensemble preset's first.
        ensemble = [] if keras_hub_sampler else model.ensemble_members
    ensemble = _check_ensemble(ensemble, task_class)
    if keras_hub_sampler and (num_results > 1 or return_scores or ensemble or target_prefix is not None
                              or no_repeat_ngram_size):
        raise ValueError(
            "keras-hub samplers give no scores, n-best lists or ensembles, and take no target prefix or "
            "no_repeat_ngram_size; use sampler='beam'."
        )
    check_int("batch_size", batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
    inputs, target_prefix = _with_languages(model, inputs, source_language, target_language, target_prefix)
    if sampler in ("greedy", *SAMPLINGS) and num_results > 1:
        what = "Greedy decoding" if sampler == "greedy" else "Sampling"
        raise ValueError(f"{what} gives one result; num_results={num_results} needs sampler='beam'.")
    settings = DecodingSettings(
        beam_size=beam_size, alpha=alpha, length_penalty=length_penalty, max_length_offset=max_length_offset,
        num_results=num_results, target_prefix=model.target_prefix_ids(target_prefix),
        no_repeat_ngram_size=no_repeat_ngram_size,
    )
    if sampler in ("greedy", *SAMPLINGS):
        settings = settings.replace(beam_size=1, alpha=0.0)
    if sampler in SAMPLINGS:
        settings = settings.replace(sampling=sampler, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed)
    sources, decode, single = _generate_sources(model, inputs)
    if sources:  # before any cache or beam is allocated
        searched = settings.replace(beam_size=1, num_results=1) if keras_hub_sampler else settings
        searched.check_memory(
            min(batch_size, len(sources)), model.backbone, max(map(len, sources)), models=1 + len(ensemble)
        )
    if keras_hub_sampler:
        outputs = decode(list(sample(model, sources, sampler, max_length_offset, batch_size)))
        return outputs[0] if single else outputs
    decoder = _ensemble_with(model, ensemble) if ensemble else model
    results = _search_in_batches(decoder, sources, settings, batch_size, verbose)
    if num_results > 1 or return_scores:
        # An empty source gives one empty result of score 0.
        results = [result or [([], 0.0, None)] for result in results]
        texts = iter(decode([ids for result in results for ids, _, _ in result]))
        outputs = [[(next(texts), score) for _, score, _ in result] for result in results]
    else:
        outputs = decode([result[0][0] if result else [] for result in results])
    return outputs[0] if single else outputs


def markup_alignments(model, sources, targets, source_language=None, target_language=None, target_prefix=None):
    """The word alignments of the sentences that inline HTML elements cut
    (`documents.document.markup_pairs`) and their translations
    (`alignment.alignments`; source characters those of the sentences,
    without the language code a multilingual model reads first), for
    `documents.document.assembled`."""
    if not sources:
        return []
    texts, prefix = _with_languages(model, sources, source_language, target_language, target_prefix)
    found = alignments(model, texts, targets, target_prefix=model.target_prefix_ids(prefix))
    shifts = [len(text) - len(source) if text.endswith(source) else 0 for text, source in zip(texts, sources)]
    return [
        [(ts, te, ss - shift, se - shift, ways) for ts, te, ss, se, ways in pairs if ss >= shift]
        for pairs, shift in zip(found, shifts)
    ]


def _documents(model, inputs, split_sentences, format, source_language):
    """`generate`'s input texts as `documents.Document`s, and whether one
    text was given: split into sentences where `split_sentences`, read as
    `format`, in the source language (`source_language`, else the
    model's: `document_language`), each segment no longer than the model
    reads."""
    if not isinstance(split_sentences, (bool, np.bool_)):
        raise TypeError(f"split_sentences must be True or False, got {split_sentences!r}.")
    if format not in FORMATS:
        raise ValueError(f"Unknown format {format!r}; expected one of {FORMATS}.")
    if isinstance(inputs, dict) and set(inputs) == {"encoder_text"}:
        inputs = inputs["encoder_text"]
    if isinstance(inputs, dict):
        raise ValueError("split_sentences and format='html' read text: give strings, not token ids.")
    texts, single = source_texts(inputs)
    options = document_options(model, source_language)
    documents = [Document(text, format=format, split_sentences=bool(split_sentences), **options) for text in texts]
    return documents, single


def document_options(model, source_language=None):
    """`Document`'s `language`, `max_tokens` and `tokenize` for texts that
    `model` translates, as `generate(..., split_sentences=True)` gives
    them: the source language (`document_language`), and the model's
    limit with its tokenizer's count (start and end tokens included; a
    token less for a multilingual model, whose sources start with their
    language's code).

    Example:

    ```python
    from keras_transformer.documents import Document

    document = Document(text, format="html", **document_options(model))
    translations = model.generate(document.segments)
    page = document.assemble(translations)
    ```
    """
    preprocessor = model.preprocessor
    _require_tokenizer(model)
    max_tokens = model.backbone.max_sequence_length - (1 if model_languages(preprocessor.tokenizer) else 0)

    def tokenize(text):
        return len(preprocessor.generate_preprocess([text])[0])

    return {"language": document_language(model, source_language), "max_tokens": max_tokens, "tokenize": tokenize}


def document_language(model, source_language=None):
    """The language of the documents `model` translates, for the sentence
    segmenter: `source_language` where given, else the model's source
    language (a multilingual tokenizer's, or its preset's metadata.json
    `languages`), else English."""
    if source_language is not None:
        return source_language
    code = getattr(getattr(model.preprocessor, "tokenizer", None), "source_language", None)
    languages = getattr(model, "_preset_metadata", {}).get("languages") or {}
    return code or languages.get("source") or "en"


def _with_languages(model, inputs, source_language, target_language, target_prefix):
    """`generate`'s inputs and target prefix with the chosen languages
    where the model reads them (`languages.with_languages`)."""
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    if source_language is None and target_language is None and not model_languages(tokenizer):
        return inputs, target_prefix
    if isinstance(inputs, dict) and set(inputs) == {"encoder_text"}:
        inputs = inputs["encoder_text"]
    if isinstance(inputs, dict):  # token ids: the languages are the ids'
        return inputs, with_languages(tokenizer, [], source_language, target_language, target_prefix)[1]
    texts, single = source_texts(inputs)
    texts, target_prefix = with_languages(tokenizer, texts, source_language, target_language, target_prefix)
    return (texts[0] if single else texts), target_prefix


def target_prefix_ids(preprocessor, target_prefix):
    """`generate`'s `target_prefix` as token ids: ids as they are, text
    through the `preprocessor`'s tokenizer (its pieces, no start or end
    token), None as no prefix."""
    if target_prefix is None:
        return ()
    if isinstance(target_prefix, bytes):
        target_prefix = target_prefix.decode("utf-8")
    if not isinstance(target_prefix, str):
        return target_prefix
    if preprocessor is None:
        raise ValueError("target_prefix as text needs the model's preprocessor (its tokenizer); give token ids.")
    if is_blank(target_prefix):
        raise ValueError("target_prefix is blank text; give the text (or token ids) the outputs start with.")
    return [int(token) for token in ops.convert_to_numpy(preprocessor.tokenizer(target_prefix))]


def tokenize_sources(model, texts):
    """Framed token ids of each source (see the preprocessor's
    `generate_preprocess`); [] for an empty text."""
    _require_tokenizer(model)
    return model.preprocessor.generate_preprocess(texts, model.backbone.max_sequence_length)


def _detokenize(model, id_lists):
    _require_tokenizer(model)
    return model.preprocessor.generate_postprocess(id_lists)


def _require_tokenizer(model):
    if model.preprocessor is None:
        raise ValueError(
            "This model has no preprocessor, so it cannot read text: pass "
            "token ids, or build it with a TransformerSeq2SeqLMPreprocessor."
        )
    return model.preprocessor.tokenizer


def _generate_sources(model, inputs):
    """`generate`'s inputs as `(sources, decode, single)`: token id
    lists, the function that turns outputs back (detokenizes, or keeps
    ids for ids), and whether one string was given."""
    if isinstance(inputs, dict) and set(inputs) == {"encoder_text"}:  # as `fit` takes them
        inputs = inputs["encoder_text"]
    if not isinstance(inputs, dict):
        texts, single = source_texts(inputs)
        return tokenize_sources(model, texts), (lambda id_lists: _detokenize(model, id_lists)), single
    if not {"encoder_token_ids", "encoder_padding_mask"} <= set(inputs):
        raise ValueError(
            f"generate() got a dict with keys {sorted(inputs)}; it takes `encoder_text` (sources "
            "as strings) or `encoder_token_ids` with `encoder_padding_mask`. Decoder prompts "
            "(`decoder_text`, `decoder_token_ids`) are not supported: translations start from "
            "the start token; give target_prefix to force the first tokens."
        )
    return _source_ids(inputs, model.backbone.vocabulary_size), (lambda id_lists: id_lists), False


def _ensemble_with(model, others):
    """The `Ensemble` of `model` and `others`, made again only when the
    models or their variables (quantization) change, so that its compiled
    decoding functions are reused from call to call."""
    models = [model, *others]
    key = tuple(id(variable) for member in models for variable in member.variables)
    made_for, ensemble = getattr(model, "_ensemble", (None, None))
    if made_for != key:
        ensemble = Ensemble(models)
        model._ensemble = (key, ensemble)
    return ensemble


def _search_in_batches(decoder, sources, settings, batch_size, verbose):
    """`beam_search` of `sources` (token id lists) `batch_size` at a time,
    sources of similar length together (less padding); the results in the
    order of the sources."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results = [None] * len(sources)
    progress = keras.utils.Progbar(len(sources), verbose=verbose, unit_name="sentence") if verbose else None
    for start in range(0, len(sources), batch_size):
        batch = order[start : start + batch_size]
        for i, result in zip(batch, beam_search(decoder, [sources[i] for i in batch], settings)):
            results[i] = result
        if progress is not None:
            progress.add(len(batch))
    return results


def _check_ensemble(models, task_class):
    """`generate`'s `ensemble`: a list of translation models (`task_class`)."""
    if isinstance(models, (str, bytes)) or not isinstance(models, (list, tuple)):
        raise TypeError(
            f"ensemble must be a list of TransformerSeq2SeqLM models, got {type(models).__name__}; "
            "load a preset with TransformerSeq2SeqLM.from_preset(...) and pass [model]."
        )
    for i, model in enumerate(models):
        if not isinstance(model, task_class):
            raise TypeError(
                f"ensemble[{i}] is a {type(model).__name__}, not a TransformerSeq2SeqLM; "
                "load it with TransformerSeq2SeqLM.from_preset(...)."
            )
    return list(models)


def _source_ids(inputs, vocabulary_size):
    """The unpadded token ids of each source of `generate`'s dict input,
    checked: integer ids of a (batch, length) array, inside the vocabulary,
    with a mask of the same shape."""
    ids = np.asarray(keras.ops.convert_to_numpy(inputs["encoder_token_ids"]))
    mask = np.asarray(keras.ops.convert_to_numpy(inputs["encoder_padding_mask"]))
    if ids.ndim != 2:
        raise ValueError(
            f"encoder_token_ids must have the shape (batch, length), got {ids.shape}"
            + ("; for one source, add a batch axis (ids[None])." if ids.ndim == 1 else ".")
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"encoder_token_ids must hold integers, got {ids.dtype}.")
    if mask.shape != ids.shape:
        raise ValueError(
            f"encoder_padding_mask has the shape {mask.shape}, encoder_token_ids {ids.shape}: "
            "they must have the same shape (a mask value for each id)."
        )
    mask = mask.astype(bool)
    outside = ids[mask & ((ids < 0) | (ids >= vocabulary_size))]
    if outside.size:
        raise ValueError(
            f"encoder_token_ids holds {outside[0]}, outside the vocabulary [0, {vocabulary_size}): "
            "ids must come from this model's tokenizer."
        )
    return [row[m].tolist() for row, m in zip(ids, mask)]

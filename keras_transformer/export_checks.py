"""What the SavedModel export (`keras_transformer.export`) checks before
any work, and how it loads a preset in the precision asked for."""

from keras_transformer.presets import ensembles


def check_export(model, settings, dtype, quantize, ensemble):
    """A clear error, before any work, for settings, a model or a
    precision that the export cannot hold."""
    if settings.max_length_offset < 0:
        raise ValueError(
            f"max_length_offset must be >= 0, got {settings.max_length_offset}: the SavedModel must leave "
            "every source, a blank one's start and end tokens included, an output token."
        )
    _check_exportable(model)
    _check_precision(model, dtype, quantize)
    if ensemble and not ensembles.other_members(model, strict=True):
        raise ValueError(
            "ensemble=True (--ensemble) exports an ensemble preset's models together, but this "
            "model is a single model, with no ensemble members: export it without ensemble=True (--ensemble)."
        )


def _check_exportable(model):
    """A clear error for a model the export cannot hold."""
    from keras_transformer.models import M2M100Tokenizer
    from keras_transformer.models import MarianTokenizer
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.models import TransformerTokenizer

    exportable_classes = (TransformerTokenizer, MarianTokenizer, M2M100Tokenizer)
    if isinstance(model, TransformerSeq2SeqLM):
        if model.preprocessor is None:
            raise ValueError("Export needs a model with a preprocessor (its tokenizer).")
        exportable = isinstance(model.preprocessor.tokenizer, exportable_classes)
        tokenizer = type(model.preprocessor.tokenizer).__name__
    else:
        from keras_transformer import presets
        from keras_transformer.convert import is_m2m100
        from keras_transformer.convert import is_marian

        if is_marian(model) or is_m2m100(model):
            return
        presets.check(model, ("config", "tokenizer"))
        tokenizer = presets.read_preset_file(model, presets.TOKENIZER_FILE).get("class_name")
        exportable = tokenizer in [cls.__name__ for cls in exportable_classes]
    if not exportable:
        raise ValueError(
            f"The model's tokenizer is a {tokenizer}; the SavedModel tokenizes with "
            "tensorflow-text's SentencePiece, so only models with a TransformerTokenizer "
            "(BPE or unigram, the default), a MarianTokenizer or an M2M100Tokenizer export."
        )


def _check_precision(model, dtype, quantize):
    from keras_transformer.models import TransformerSeq2SeqLM

    if dtype not in (None, "float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {dtype!r}.")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be 'int8', got {quantize!r}.")
    if (dtype or quantize) and isinstance(model, TransformerSeq2SeqLM):
        raise ValueError(
            "dtype and quantize apply to a preset, which the export loads in that precision; a model "
            "object exports in its own precision (load it with from_preset(..., dtype=...) or call "
            "model.quantize('int8') first)."
        )


def load_for_export(model, dtype=None, quantize=None, ensemble=False):
    """`model`, or the preset `model` loaded in `dtype` and quantized."""
    from keras_transformer.models import TransformerSeq2SeqLM

    if isinstance(model, TransformerSeq2SeqLM):
        return model
    model = TransformerSeq2SeqLM.from_preset(
        model, load_ensemble=ensemble, **({"dtype": dtype} if dtype else {})
    )
    if quantize:
        for each in [model, *model.ensemble_members]:
            each.quantize(quantize)
    return model

"""A preset small enough to build in a second on every backend, without the
Multi30k data: a one-layer model with random weights and a SentencePiece
vocabulary trained on the sentences of `tiny_spm.py`."""

import tiny_spm


def save_tiny_preset(directory):
    """Saves the tiny model as a preset in `directory`; returns the model."""
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
    from keras_transformer.models import TransformerTokenizer

    tokenizer = TransformerTokenizer.from_texts(tiny_spm.SOURCES + tiny_spm.TARGETS, vocabulary_size=400)
    backbone = TransformerBackbone(
        tokenizer.vocabulary_size(), num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout=0.0,
        max_sequence_length=32,
    )
    model = TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer, 16, 16))
    model.save_to_preset(directory)
    return model

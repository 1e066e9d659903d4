"""Model families. Today: the encoder-decoder Transformer of the paper."""

from keras_transformer.models.transformer import PAPER_CONFIGS
from keras_transformer.models.transformer import PAPER_TABLE3
from keras_transformer.models.transformer import PAPER_VOCABULARY_SIZE
from keras_transformer.models.transformer import TransformerBackbone

__all__ = ["PAPER_CONFIGS", "PAPER_TABLE3", "PAPER_VOCABULARY_SIZE", "TransformerBackbone"]

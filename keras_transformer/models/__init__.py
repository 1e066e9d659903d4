"""Model families. Today: the encoder-decoder Transformer of the paper."""

from keras_transformer.models.transformer import CONFIGS
from keras_transformer.models.transformer import PAPER_CONFIGS
from keras_transformer.models.transformer import PAPER_TABLE3
from keras_transformer.models.transformer import PAPER_VOCABULARY_SIZE
from keras_transformer.models.transformer import M2M100Tokenizer
from keras_transformer.models.transformer import MarianTokenizer
from keras_transformer.models.transformer import SpecialTokenIds
from keras_transformer.models.transformer import TransformerBackbone
from keras_transformer.models.transformer import TransformerSeq2SeqLM
from keras_transformer.models.transformer import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models.transformer import TransformerTokenizer
from keras_transformer.models.transformer import TransformerWordPieceTokenizer
from keras_transformer.models.transformer import special_token_ids
from keras_transformer.models.transformer import train_tokenizer

__all__ = [
    "CONFIGS",
    "PAPER_CONFIGS",
    "PAPER_TABLE3",
    "PAPER_VOCABULARY_SIZE",
    "M2M100Tokenizer",
    "MarianTokenizer",
    "SpecialTokenIds",
    "TransformerBackbone",
    "TransformerSeq2SeqLM",
    "TransformerSeq2SeqLMPreprocessor",
    "TransformerTokenizer",
    "TransformerWordPieceTokenizer",
    "special_token_ids",
    "train_tokenizer",
]

"""The Transformer's building blocks, one module per section of the paper."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.scaled_dot_product import scaled_dot_product_attention
from keras_transformer.layers.decoder import TransformerDecoderLayer
from keras_transformer.layers.embedding import SharedTokenEmbedding
from keras_transformer.layers.encoder import TransformerEncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.position import LearnedPositionEmbedding
from keras_transformer.layers.position import SinusoidalPositionEncoding

__all__ = [
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SharedTokenEmbedding",
    "SinusoidalPositionEncoding",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "scaled_dot_product_attention",
]

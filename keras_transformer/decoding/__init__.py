"""Decoding (paper section 6.1): beam search with a length penalty, and
greedy decoding, both incremental with a key/value cache."""

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.beam import length_penalty
from keras_transformer.decoding.greedy import greedy_search

__all__ = ["beam_search", "greedy_search", "length_penalty"]

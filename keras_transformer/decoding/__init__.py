"""Decoding (paper section 6.1): incremental decoding with a key/value cache."""

from keras_transformer.decoding.greedy import greedy_search

__all__ = ["greedy_search"]

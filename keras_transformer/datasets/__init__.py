"""Parallel corpora for training and evaluation."""

from keras_transformer.datasets import multi30k

__all__ = ["multi30k"]

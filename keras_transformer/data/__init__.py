"""Input pipelines: length-grouped batches under a token budget (section 5.1)."""

from keras_transformer.data.batching import TokenBudgetBatches
from keras_transformer.data.batching import token_budget_batches
from keras_transformer.data.batching import tokenize_pairs

__all__ = ["TokenBudgetBatches", "token_budget_batches", "tokenize_pairs"]

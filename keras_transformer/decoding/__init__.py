"""Decoding (paper section 6.1): beam search with a length penalty, and
greedy decoding, both incremental with a key/value cache.

`settings.py` holds a search's settings (`DecodingSettings`), `rules.py`
its rules' formulas, `transforms.py` the per-step logits transforms,
`search.py` the search's state and step, written once; `beam.py` drives it
(from the host, or as one compiled loop: `loop.py`), `greedy.py` is beam
search with one beam; `interface.py` is what decoding needs of a model
(`Seq2SeqDecodingModel`), `compiled.py` the one place that compiles per
backend, `ensemble.py` several models decoded as one, and `samplers.py`
keras-hub's samplers on the same models.
"""

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.interface import Seq2SeqDecodingModel
from keras_transformer.decoding.interface import decoding_functions
from keras_transformer.decoding.rules import length_penalty
from keras_transformer.decoding.settings import DecodingSettings

__all__ = [
    "DecodingSettings", "Ensemble", "Seq2SeqDecodingModel", "beam_search", "decoding_functions", "greedy_search",
    "length_penalty",
]

"""Decoding (paper section 6.1): beam search with a length penalty, and
greedy decoding, both incremental with a key/value cache.

`rules.py` holds the search's rules, `interface.py` what decoding needs of a
model (`Seq2SeqDecodingModel`), `beam.py` and `greedy.py` the searches on
the host, `samplers.py` keras-hub's samplers on the same models, and
`compiled.py` the one place that compiles per backend, and `ensemble.py`
several models decoded as one.
"""

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.interface import Seq2SeqDecodingModel
from keras_transformer.decoding.interface import decoding_functions
from keras_transformer.decoding.rules import length_penalty

__all__ = ["Ensemble", "Seq2SeqDecodingModel", "beam_search", "decoding_functions", "greedy_search", "length_penalty"]

"""Greedy decoding: the most probable token at each step.

It is beam search with one beam (`beam.py`), which keeps one
machinery for both: the key/value cache, the maximum length, and tokens
that are never output (padding, start).
"""

from keras_transformer.decoding.beam import beam_search


def greedy_search(model, sources, max_length_offset=50):
    """The most probable next token at each step, until the end token.

    Args:
        model: a `TransformerSeq2SeqLM`.
        sources: a list of source token id lists (start and end tokens
            included); an empty list gives an empty output.
        max_length_offset: each output has at most its source's length plus
            this many tokens (section 6.1: 50), and never more than the
            model's `max_sequence_length` allows.

    Returns:
        A list with one list of output token ids per source, without the
        start and end tokens.
    """
    results = beam_search(model, sources, beam_size=1, alpha=0.0, max_length_offset=max_length_offset)
    return [result[0][0] if result else [] for result in results]

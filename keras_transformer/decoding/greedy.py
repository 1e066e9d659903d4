"""Greedy decoding with the key/value cache.

Each step feeds one token through the decoder: the self-attention keys and
values of earlier positions come from the cache and the encoder-decoder keys
and values are computed once per source (`TransformerSeq2SeqLM.initial_cache`).
"""

import numpy as np
from keras import ops


def _special_ids(model):
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    if tokenizer is None:
        return 0, 2, 3
    return tokenizer.pad_token_id, tokenizer.start_token_id, tokenizer.end_token_id


def greedy_search(model, sources, max_length_offset=50):
    """The most probable next token at each step, until the end token.

    Args:
        model: a `TransformerSeq2SeqLM`.
        sources: a list of source token id lists (start and end tokens
            included); an empty list gives an empty output.
        max_length_offset: each output has at most its source's length plus
            this many tokens (section 6.1: 50), and never more than the
            model's `max_sequence_length`.

    Returns:
        A list with one list of output token ids per source, without the
        start and end tokens.
    """
    pad_id, start_id, end_id = _special_ids(model)
    outputs = [[] for _ in sources]
    rows = [i for i, ids in enumerate(sources) if ids]
    if not rows:
        return outputs
    # Shapes rounded up to multiples of 8 are shared by many batches, so
    # backends that compile per shape (JAX, XLA) reuse their work.
    source_length = _round_up(max(len(sources[i]) for i in rows), 8)
    encoder_ids = np.full((len(rows), source_length), pad_id, "int32")
    for row, i in enumerate(rows):
        encoder_ids[row, : len(sources[i])] = sources[i]
    encoder_mask = (encoder_ids != pad_id).astype("int32")
    limit = model.backbone.max_sequence_length
    # Output tokens allowed for each row (the start token takes a position).
    budgets = np.array([min(len(sources[i]) + max_length_offset, limit - 1) for i in rows])
    max_length = min(_round_up(int(budgets.max()) + 1, 8), limit)

    encoder_output = model.encode(encoder_ids, encoder_mask)
    cache = model.initial_cache(encoder_output, max_length)
    tokens = np.full((len(rows), 1), start_id, "int32")
    generated = np.full((len(rows), max_length - 1), pad_id, "int32")
    finished = np.zeros(len(rows), bool)
    for index in range(max_length - 1):
        logits, cache = model.call_decoder_with_cache(tokens, index, cache, encoder_mask)
        next_tokens = ops.convert_to_numpy(ops.argmax(logits, axis=-1)).astype("int32")
        next_tokens = np.where(finished, pad_id, next_tokens)
        generated[:, index] = next_tokens
        finished |= (next_tokens == end_id) | (index + 1 >= budgets)
        if finished.all():
            break
        tokens = next_tokens[:, None]
    for row, i in enumerate(rows):
        ids = generated[row].tolist()
        if end_id in ids:
            ids = ids[: ids.index(end_id)]
        outputs[i] = [t for t in ids if t != pad_id]
    return outputs


def _round_up(value, multiple):
    return -(-value // multiple) * multiple

"""keras-hub's samplers (`GreedySampler`, `TopKSampler`, `BeamSampler`...)
on this package's models.

keras-hub runs a sampler inside its compiled generate loop through the
model's `generate_step`; `keras_hub_generate_step` is that step for a
`Seq2SeqDecodingModel` (`interface.py`), and `sample` feeds it token id
sources as `generate(..., sampler=keras_hub.samplers.TopKSampler())` does.
The output budgets are those of beam search (`rules.output_budgets`); the
samplers have no length penalty and no scores.
"""

import numpy as np
from keras import ops

from keras_transformer.decoding.beam import pad_sources
from keras_transformer.decoding.beam import round_up
from keras_transformer.decoding.rules import never_output_bias
from keras_transformer.decoding.rules import output_budgets


def keras_hub_generate_step(model, inputs, stop_token_ids=None):
    """The body of `TransformerSeq2SeqLM.generate_step` (see there): the
    prompt written into the cache in one pass, then `model.sampler`
    extending it one cached step at a time."""
    encoder_ids, encoder_mask = inputs["encoder_token_ids"], inputs["encoder_padding_mask"]
    prompt, prompt_mask = inputs["decoder_token_ids"], inputs["decoder_padding_mask"]
    max_length = ops.shape(prompt)[1]
    backbone = model.backbone
    cache = model.initial_cache(model.encode(encoder_ids, encoder_mask), max_length)
    # The decoder output at every prompt position: ContrastiveSampler
    # compares each new token's with them.
    hidden_states, cache = backbone.decode(prompt, encoder_padding_mask=encoder_mask, cache=cache, cache_index=0)
    self_caches = [self_cache for self_cache, _ in cache]
    cross_caches = [cross_cache for _, cross_cache in cache]
    # As in beam search, padding and start tokens are never outputs (a
    # large negative number: keras-hub's samplers exponentiate logits).
    # (A tensor: a NumPy array after a tensor on a GPU would make NumPy
    # read the tensor.)
    never = ops.convert_to_tensor(np.maximum(never_output_bias(model), -1e9))

    def next(prompt, self_caches, index):
        # keras-hub's beam sampler runs `num_beams` consecutive rows a
        # source, which all read the source's row of the encoder's keys and
        # values (the attention layers group them).
        rows = ops.shape(prompt)[0]
        cache = list(zip(self_caches, cross_caches))
        token_ids = ops.slice(prompt, [0, index - 1], [rows, 1])
        states, cache = backbone.decode(
            token_ids, encoder_padding_mask=encoder_mask, cache=cache, cache_index=index - 1
        )
        logits = backbone.token_embedding(states[:, -1, :], reverse=True)
        logits = ops.cast(logits, "float32") + never
        return logits, states[:, -1, :], [self_cache for self_cache, _ in cache]

    prompt_mask = ops.cast(prompt_mask, "bool")
    generated = model.sampler(
        next,
        prompt,
        cache=self_caches,
        index=ops.min(ops.sum(ops.cast(prompt_mask, "int32"), axis=-1)),
        mask=prompt_mask,
        stop_token_ids=stop_token_ids,
        hidden_states=hidden_states,
        model=model,
    )
    if stop_token_ids is None:
        return {"decoder_token_ids": generated, "decoder_padding_mask": ops.ones_like(generated, "bool")}
    is_stop = ops.zeros_like(generated, "bool")
    for token_id in stop_token_ids:
        is_stop = ops.logical_or(is_stop, ops.equal(generated, token_id))
    is_stop = ops.cast(ops.logical_and(is_stop, ops.logical_not(prompt_mask)), "int32")
    # Keep every position up to and including the first stop token.
    after_stop = ops.cumsum(is_stop, axis=-1) - is_stop
    return {"decoder_token_ids": generated, "decoder_padding_mask": ops.equal(after_stop, 0)}


def sample(model, sources, sampler, max_length_offset=50, batch_size=32):
    """Decodes token id sources with a keras-hub `Sampler`, through
    keras-hub's compiled generate function and the model's `generate_step`.

    Args:
        model: a `TransformerSeq2SeqLM` (a keras-hub `Seq2SeqLM` whose
            `generate_step` is `keras_hub_generate_step`).
        sources: source token id lists (framed); `[]` gives `[]`.
        sampler: a `keras_hub.samplers.Sampler`.
        max_length_offset: as in beam search.
        batch_size: sources decoded together.

    Returns:
        One list of output ids per source, without start and end tokens.
    """
    if getattr(model, "sampler", None) is not sampler:
        model.sampler, model.generate_function = sampler, None
    generate_function = model.make_generate_function()
    special = model.special_token_ids
    limit = model.backbone.max_sequence_length
    outputs = [[] for _ in sources]
    rows = [i for i, ids in enumerate(sources) if ids]
    budgets = dict(zip(rows, output_budgets([sources[i] for i in rows], max_length_offset, limit).tolist()))
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        encoder_ids, encoder_mask = pad_sources([sources[i] for i in batch], special.pad, limit)
        # The sampler runs to the batch's longest budget; each output is
        # cut to its own below.
        max_length = min(round_up(max(budgets[i] for i in batch) + 1, 8), limit)
        prompt = np.full((len(batch), max_length), special.pad, "int32")
        prompt[:, 0] = special.start
        # The prompt is the start token (which may be the padding id).
        prompt_mask = np.zeros(prompt.shape, bool)
        prompt_mask[:, 0] = True
        inputs = {
            "encoder_token_ids": encoder_ids,
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": prompt,
            "decoder_padding_mask": prompt_mask,
        }
        generated = generate_function(inputs, stop_token_ids=(special.end,))
        ids = ops.convert_to_numpy(generated["decoder_token_ids"])
        keep = ops.convert_to_numpy(generated["decoder_padding_mask"])
        for row, i in enumerate(batch):
            output = ids[row, 1:][keep[row, 1:]].tolist()[: budgets[i]]
            outputs[i] = output[:-1] if output and output[-1] == special.end else output
    return outputs

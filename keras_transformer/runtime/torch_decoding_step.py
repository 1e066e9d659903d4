"""A decoder layer's cached decoding step, and an encoder layer as a
translation runs it, as plain PyTorch calls.

Within `direct_calls()` on PyTorch every layer of a decoding step already
runs its `call` directly, and the dense layers and LayerNorms are one
PyTorch call each. What remained, between those calls, were the Keras ops
of the decoder layer, its attention and its residual connections (reshapes,
transposes, masks, casts), each of which converts and checks its inputs:
at one sentence at a time (beam 4, the 4+4-layer presets), a decoding
step spent about three times as long in them as in arithmetic.

`decoding_step` is the decoder layer's step written with PyTorch's own
functions on the layer's weights, for the case decoding runs: one new
position a row, the self-attention's keys and values written into its
cache, the encoder-decoder attention reading keys and values computed once
per source, no dropout. The self-attention's three projections are one
product (their matrices side by side), and the encoder padding mask is
turned into an additive mask once per search, not once per step. The
decoder layer calls it from `TransformerDecoderLayer._torch_call`, and
runs its `call` for anything else (a prompt of several positions, masks
of the target, attention weights asked for, training, LoRA sub-layers,
sub-layers quantized other than to Keras' int8, mixed precision).

Sub-layers with Keras' int8 weights (`model.quantize("int8")`) multiply as
their own direct call does (`int8_products.int8_product`: the inputs
quantized a row at a time, an exact int8 product, de-scaled); the three
self-attention projections, quantized alike, are one such product, since
they quantize the same inputs the same way and each output column has its
own scale.

`encoding_step` is the encoder layer written the same way, for what a
translation runs: a whole source, its padding mask, no dropout and no
gradients (`TransformerEncoderLayer._torch_call`). One sentence at a time
the encoder (4 layers) took 7% of a translation's time with Keras' ops
between its PyTorch calls, and half that as plain calls.

Both compute what `call` computes, in the same order, rounding differently
only where a fused product does (about 1e-7 of a float32 value):
`tests/test_direct_calls.py` checks both against each other.
"""

import math

# Keras has no public accessor for the autocast scope its layer calls open.
from keras.src.backend import get_autocast_scope

from keras_transformer.runtime.direct_calls import activated
from keras_transformer.runtime.direct_calls import additive_mask
from keras_transformer.runtime.layer_calls import torch_call_of
from keras_transformer.runtime.direct_calls import torch_direct
from keras_transformer.runtime.direct_calls import unchanged_scope
from keras_transformer.runtime.direct_calls import write_position
from keras_transformer.runtime.torch_step_weights import step_weights


def additive_padding_mask(layer, padding_mask, like):
    """The `(sources, 1, 1, source_length)` additive mask of an encoder
    padding mask, in the dtype and on the device of the tensor `like`
    (`direct_calls.additive_mask`), kept on `layer` while
    the same mask comes back (a search passes one mask to every step).

    None where the mask allows every position (one source, or sources of
    one length): its additive mask is all zeros, and PyTorch's kernel
    attends without one in less time (7.4 against 8.4 us at one
    sentence's beams, 4 heads of 32).
    """
    import torch

    held = layer.__dict__.get("_torch_step_mask")
    # (A tensor made in inference mode counts no writes: it is not kept.)
    inference = isinstance(padding_mask, torch.Tensor) and padding_mask.is_inference()
    version = None if inference else getattr(padding_mask, "_version", None)
    if (
        held is not None and held[0] is padding_mask and held[1] == version
        and held[3] == like.dtype and held[4] == like.device
    ):
        return held[2]
    allowed = torch.as_tensor(padding_mask, device=like.device).to(torch.bool)
    mask = None if bool(allowed.all()) else additive_mask(allowed[:, None, None, :], like)
    held = (None if inference else padding_mask, version, mask, like.dtype, like.device)
    object.__setattr__(layer, "_torch_step_mask", held)
    return mask


def decoding_step(layer, weights, x, index, self_attention_cache, cross_attention_cache, encoder_padding_mask):
    """One position of `layer` (a `TransformerDecoderLayer`), as its
    `call` with these arguments and no dropout.

    Args:
        layer: the decoder layer.
        weights: its `step_weights`.
        x: `(rows, 1, d_model)`.
        index: the position, an int.
        self_attention_cache: `(keys, values)`, `(rows, heads, length, d)`.
        cross_attention_cache: `(keys, values)`, `(sources, heads,
            source_length, d)`, a row a source for `rows / sources`
            consecutive rows of `x`.
        encoder_padding_mask: `(sources, source_length)` or None.

    Returns:
        `(output, (keys, values))`, as `call` returns them.
    """
    from torch.nn.functional import scaled_dot_product_attention

    rows, heads = x.shape[0], weights.num_heads
    written = {}

    # The caches' dtype is the attention's (`attention_dtype`): the
    # queries go to it, the keys and values written go to it, and the
    # attended values come back to the layer's dtype.
    def self_attention(x):
        query, key, value = _heads_of_projections(weights, x)
        keys = write_position(self_attention_cache[0], index, _as(key, self_attention_cache[0].dtype))
        values = write_position(self_attention_cache[1], index, _as(value, self_attention_cache[1].dtype))
        written["cache"] = (keys, values)
        attended = attend_to_cache(_as(query, keys.dtype), keys, values, index)
        return weights.self_output(_as(attended.view(rows, 1, -1), x.dtype))

    def cross_attention(x):
        keys, values = cross_attention_cache
        sources = keys.shape[0]
        # A source's beams attend as its row's consecutive query positions.
        query = _as(weights.cross_query(x).view(sources, -1, heads, keys.shape[-1]).transpose(1, 2), keys.dtype)
        mask = None if encoder_padding_mask is None else additive_padding_mask(layer, encoder_padding_mask, keys)
        attended = scaled_dot_product_attention(query, keys, values, attn_mask=mask)
        return weights.cross_output(_as(attended.transpose(1, 2).reshape(rows, 1, -1), x.dtype))

    x = _residual(weights, x, self_attention, weights.norms[0])
    x = _residual(weights, x, cross_attention, weights.norms[1])
    x = _residual(weights, x, lambda x: _feed_forward(weights, x), weights.norms[2])
    return x, written["cache"]


def _as(x, dtype):
    """`x.to(dtype)`, without the call where `x` has that dtype already: a
    decoding step's activations and caches mostly share theirs, and each
    call that changes nothing still took about 0.7 us (six a layer)."""
    return x if x.dtype == dtype else x.to(dtype)


def attend_to_cache(query, keys, values, index):
    """Attention of one query a row over a self-attention cache's written
    positions, 0 to `index`: `(rows, heads, 1, d)` queries, `(rows, heads,
    length, d)` keys and values (the values' `d` may differ); returns the
    attended values, `(rows * heads, 1, d)`, a row's heads side by side.

    From `_MASKED_FROM_ROWS` rows (float32), the whole cache is read, its
    positions after `index` masked out (an additive mask), in two batched
    matrix products over its contiguous memory. PyTorch's fused
    `scaled_dot_product_attention` over the written positions alone (a
    strided view of the cache), where a query of one position gives its
    blocked kernel little to block, took about twice as long from 16 rows
    up (256 rows, 8 heads: 330-660 against 250-300 us a layer, 2-core CPU;
    a translation 64 sentences at a time about 2% faster), and is kept for
    fewer rows, where it was faster (one sentence at a time: 35.9 against
    34.0 sentences/s) and for other dtypes. The masked positions weigh
    exactly 0 (their softmax terms underflow); the sums over positions run
    in another order than over the written ones alone (rounding of about
    1e-7).
    """
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    rows, heads, length, depth = keys.shape
    # (The fused kernel scores and normalizes in float32 whatever the
    # inputs; the products below would round the scores to the cache's dtype.)
    if keys.dtype != torch.float32 or rows < _MASKED_FROM_ROWS:
        attended = scaled_dot_product_attention(query, keys[:, :, : index + 1], values[:, :, : index + 1])
        return attended.reshape(rows * heads, 1, -1)
    scores = torch.baddbmm(
        _future_mask(length, index, keys),
        query.reshape(rows * heads, 1, depth),
        keys.reshape(rows * heads, length, depth).transpose(1, 2),
        alpha=depth**-0.5,
    )
    return torch.bmm(torch.softmax(scores, dim=-1), values.reshape(rows * heads, length, values.shape[-1]))


# Rows from which `attend_to_cache` masks the whole cache (4 sentences' beams).
_MASKED_FROM_ROWS = 16


def attention_dtype(x):
    """The dtype in which a decoding step on PyTorch attends, for a layer
    whose activations `x`, `(rows, ...)`, have their own dtype: float32 for
    bfloat16 and float16 ones on a CPU from `_FLOAT32_ATTENTION_FROM_ROWS`
    rows up, `x`'s dtype otherwise. The caches are kept in it
    (`decoder_step`).

    PyTorch's CPU kernels attend to a cache more slowly in bfloat16 than in
    float32, while its bfloat16 matrix products run at twice the float32
    rate or more where the processor has bfloat16 instructions. 64
    sentences' beams, 4 heads of 32 (2-core AMD EPYC, avx512_bf16): the
    fused attention over 32 cached positions took 698 us in bfloat16
    against 263 in float32 (157 as `attend_to_cache`'s two products), the
    encoder-decoder attention 346 against 131. The shipped en-de preset in
    bfloat16 translated 64 sentences at a time 1.05x as fast this way
    (median of five passes each, alternating), one at a time as fast;
    attending in float32 at every row count, one at a time ran at 0.96x,
    hence the rows.
    """
    import torch

    lower = x.dtype in (torch.bfloat16, torch.float16)
    if lower and x.device.type == "cpu" and x.shape[0] >= _FLOAT32_ATTENTION_FROM_ROWS:
        return torch.float32
    return x.dtype


# Rows (a step's beams) from which `attention_dtype` is float32 for
# lower-precision activations on a CPU: 4 sentences' beams.
_FLOAT32_ATTENTION_FROM_ROWS = 16


# `_future_mask`'s tables by length, dtype and device.
_future_masks = {}


def _future_mask(length, index, like):
    """`(1, length)`: 0 at positions 0 to `index`, Keras' large negative
    (`direct_calls.additive_mask`) after them; a row of a table kept for
    the cache's length, dtype and device (a view, no new tensor a step)."""
    import torch

    key = (length, like.dtype, like.device)
    table = _future_masks.get(key)
    if table is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=like.device).tril()
        with torch.inference_mode(False), torch.no_grad():
            table = additive_mask(allowed, like)
        _future_masks[key] = table
    return table[index : index + 1]


def decoder_step(backbone, token_ids, index, cache, encoder_padding_mask):
    """`backbone.decode(token_ids, encoder_padding_mask=encoder_padding_mask,
    cache=cache, cache_index=index)` of one position, in inference, within
    a search (`direct_calls.unchanged_weights()`) on PyTorch: the
    embedding, each decoder layer's `decoding_step` and the final
    LayerNorm called one after another, with no `Layer.__call__` or
    `direct_calls` dispatch between them, and what they need of the layers
    (their `StepWeights`, their PyTorch calls) gathered once a search.

    At one sentence's beams a step's arithmetic is small: dispatching the
    embedding, the positions, the dropout and each layer, and checking
    each layer's weights, took about a tenth of a translation's time.

    Returns:
        `(decoder_output, cache)` as `decode` returns them, or None where
        this does not apply (outside a search, other backends, several
        positions, mixed precision, a layer without a plain step): then
        `decode` calls its layers.
    """
    if token_ids.shape[1] != 1 or not isinstance(index, int):
        return None
    plan = _search_plan(backbone)
    if plan is None or any(cross is None for _, cross in cache):
        return None
    embed, position, layers, norm = plan
    x = embed(token_ids)
    x = x + position(x, start_index=index)
    # The caches in the attention's dtype: converted where it changes (at
    # most a few steps of a search: the first, and where the rows cross
    # `_FLOAT32_ATTENTION_FROM_ROWS`), then returned and kept so.
    dtype = attention_dtype(x)
    new_cache = []
    for (layer, weights), (self_cache, cross_cache) in zip(layers, cache):
        if self_cache[0].dtype != dtype:
            self_cache = tuple(c.to(dtype) for c in self_cache)
        if cross_cache[0].dtype != dtype:
            cross_cache = tuple(c.to(dtype) for c in cross_cache)
        x, self_cache = decoding_step(layer, weights, x, index, self_cache, cross_cache, encoder_padding_mask)
        new_cache.append((self_cache, cross_cache))
    return (x if norm is None else norm(x)), new_cache


def cross_attention_cache(backbone, encoder_output):
    """`backbone.cross_attention_cache(encoder_output)` within a search on
    PyTorch: each decoder layer's encoder-decoder keys and values from one
    product (its key and value projections side by side), as plain PyTorch
    calls; None where `decoder_step` does not apply (then the layers'
    `project_key_value` computes them). One sentence at a time, the eight
    projections of the 4-layer presets through their layer calls took
    about a third of the encoder's time."""
    plan = _search_plan(backbone)
    if plan is None:
        return None
    return [
        _heads(weights.cross_key_value(encoder_output), weights.cross_sizes, weights.cross_heads)
        for _, weights in plan[2]
    ]


def _search_plan(backbone):
    """The backbone's `decoder_plan`, made once a search (within
    `direct_calls.unchanged_weights()` and direct calls on PyTorch), or
    None."""
    scope = unchanged_scope()
    if scope is None or not torch_direct():
        return None
    held = backbone.__dict__.get("_torch_decoder_plan")
    if held is None or held[0] is not scope:
        held = (scope, decoder_plan(backbone))
        object.__setattr__(backbone, "_torch_decoder_plan", held)
    return held[1]


def decoder_plan(backbone):
    """`(embed, position, [(layer, step_weights)], norm)` for
    `decoder_step`: the calls `direct_calls` would make, or None where a
    layer computes in another dtype than its weights (mixed precision) or
    has no plain step."""
    norm = backbone.decoder_norm
    layers = [backbone.token_embedding, backbone.decoder_position, *backbone.decoder_layers]
    layers += [] if norm is None else [norm]
    if get_autocast_scope() is not None or any(
        not layer.built or layer.compute_dtype != layer.variable_dtype for layer in layers
    ):
        return None
    embed = torch_call_of(backbone.token_embedding)
    weights = [step_weights(layer) for layer in backbone.decoder_layers]
    if embed is None or any(w is None for w in weights):
        return None
    # (A layer without a PyTorch call of its own is called as `direct_calls` calls it.)
    position = torch_call_of(backbone.decoder_position) or backbone.decoder_position
    norm = None if norm is None else (torch_call_of(norm) or norm)
    return embed, position, list(zip(backbone.decoder_layers, weights)), norm


def encoding_step(layer, weights, x, padding_mask):
    """`layer` (a `TransformerEncoderLayer`) over a whole source, as its
    `call` with these arguments and no dropout.

    Args:
        layer: the encoder layer.
        weights: its `step_weights`.
        x: `(sources, source_length, d_model)`.
        padding_mask: `(sources, source_length)`, true at tokens, or None.

    Returns:
        `(sources, source_length, d_model)`.
    """
    from torch.nn.functional import scaled_dot_product_attention

    rows, length = x.shape[0], x.shape[1]

    def self_attention(x):
        query, key, value = _heads_of_projections(weights, x)
        mask = None if padding_mask is None else additive_padding_mask(layer, padding_mask, x)
        attended = scaled_dot_product_attention(query, key, value, attn_mask=mask)
        return weights.self_output(attended.transpose(1, 2).reshape(rows, length, -1))

    x = _residual(weights, x, self_attention, weights.norms[0])
    return _residual(weights, x, lambda x: _feed_forward(weights, x), weights.norms[1])


def _heads_of_projections(weights, x):
    """The self-attention's queries, keys and values of `x`, `(rows,
    length, d_model)`, from its joined projection: each `(rows, heads,
    length, d)`."""
    return _heads(weights.self_projection(x), weights.sizes, weights.num_heads)


def _heads(projected, sizes, heads):
    """Projections side by side, `(rows, length, sum(sizes))`, as each
    projection's `(rows, heads, length, d)`."""
    rows, length = projected.shape[0], projected.shape[1]
    if len(set(sizes)) == 1:  # (the same views in three calls instead of seven)
        return projected.view(rows, length, len(sizes), heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    return tuple(part.view(rows, length, heads, -1).transpose(1, 2) for part in projected.split(sizes, -1))


def _feed_forward(weights, x):
    return weights.outer(activated(weights.inner_dense, weights.inner(x)))


def _residual(weights, x, sublayer, norm):
    """The residual connection around `sublayer`, post-norm or pre-norm as
    the layer's `normalize_first` says."""
    import torch

    # (`torch.layer_norm`: `torch.nn.functional.layer_norm` less its Python
    # checks, a microsecond of each of a step's dozen LayerNorms.)
    gamma, beta, epsilon = norm
    if weights.normalize_first:
        return x + sublayer(torch.layer_norm(x, gamma.shape, gamma, beta, epsilon))
    return torch.layer_norm(x + sublayer(x), gamma.shape, gamma, beta, epsilon)


def sinusoid_table(layer, length, like):
    """Positions 0 to at least `length - 1` of a sinusoidal encoding layer
    (`keras_hub.layers.SinePositionEncoding`), `(positions, d_model)` with
    the last axis, dtype and device of the tensor `like`: computed by its
    `call` once and kept on the layer, since they depend on nothing else
    (keras-hub computes each position's row from the position alone, so a
    row of the table is the row a call at that position gives).
    """
    held = layer.__dict__.get("_torch_table")
    d_model = like.shape[-1]
    if (
        held is None or held.shape[0] < length or held.shape[1] != d_model
        or held.dtype != like.dtype or held.device != like.device
    ):
        import torch

        size = max(64, 2 ** math.ceil(math.log2(max(length, 1))))
        # A plain tensor even when first asked for in inference mode
        # (decoding's): training adds it to tensors that record gradients.
        with torch.inference_mode(False), torch.no_grad():
            held = layer.call(torch.zeros((1, size, d_model), dtype=like.dtype, device=like.device))[0]
        object.__setattr__(layer, "_torch_table", held)
    return held

"""An ensemble's alike models stepped as one, on PyTorch, for a few rows.

The shipped ensemble presets hold models built alike (three 4+4-layer,
d_model-128 models and two 3+3-layer, d_model-256 ones). Decoding one
sentence at a time, a model's step is some fifty small PyTorch calls whose
cost is the call, not the arithmetic, and an ensemble makes them once per
model. Here the models of a group built alike run as one: each projection
is one batched product over the group's stacked weights (`torch.baddbmm`),
and each attention one call with the models' heads side by side, so that
a group costs about one model's calls. The shipped en-de ensemble preset
(five models), test_2016_flickr, beam 4, 2-core CPU: one sentence at a
time 7.61 against 5.83 sentences/s, three at a time 13.29 against 11.39,
the same translations; eight at a time (32 rows) 18.52 against 16.01.
From 128 rows up the batched products stop paying (32 sentences at a
time: 31.93 against 33.01 sentences/s; 64: 33.68 against 35.08), hence
`FEW_ROWS`: steps of fewer rows (a batch's last sources too) run as
groups. Against a threshold of 16 rows: 19.90 against 18.57 sentences/s
eight at a time, and within 1% sixteen and 64 at a time.

The stacked weights are a copy, held on the ensemble until a member's
weights change (56 MB for the shipped preset's two groups; on AMD
processors each model's prepacked output projection too, 28 MB more).

Each model keeps its own cache entries: the group's are joined along the
heads' axis at each step (a copy of a few kilobytes at these row counts)
and handed back as views, which the search's next reorder copies anyway.

`grouped_step` applies within a search (`direct_calls.unchanged_weights`)
on PyTorch, to one new position of fewer than `FEW_ROWS` rows, for groups
of two or more models whose decoders have plain steps
(`torch_decoding_step`), float weights computing in their own dtype,
sinusoidal positions, and an output projection tied to the embeddings
without a bias; models outside a group take their own step. It computes
what each model's `call_decoder_with_cache` and `probabilities_of` compute,
rounding differently where a batched product or a LayerNorm followed by
its scale (about 1e-7 of a float32 value) does.
"""

import math

import numpy as np

from keras_transformer.runtime.compiled import structure_key
from keras_transformer.runtime.direct_calls import activated
from keras_transformer.runtime.direct_calls import torch_direct
from keras_transformer.runtime.direct_calls import unchanged_scope
from keras_transformer.runtime.int8_products import prepacked_product
from keras_transformer.runtime.layer_calls import registered_as
from keras_transformer.runtime.torch_decoding_step import additive_padding_mask
from keras_transformer.runtime.torch_decoding_step import decoder_plan
from keras_transformer.runtime.torch_decoding_step import sinusoid_table
from keras_transformer.runtime.torch_step_weights import norms_of

# Rows below which alike models step as one (16 sentences' beams): the
# batched products pay off where a step's calls, not its arithmetic, cost.
FEW_ROWS = 64


def grouped_step(ensemble, token_ids, index, cache, encoder_padding_mask):
    """Each model's next-token probabilities and new cache entries, with
    the ensemble's alike models stepped as one; None where this does not
    apply (see the module's docstring), for the ensemble's own step.

    Returns:
        `(probabilities, cache)`: a list of each model's `(rows,
        vocabulary_size)` float32 probabilities, in the models' order, and
        the ensemble's new cache.
    """
    rows = token_ids.shape[0]
    scope = unchanged_scope()
    if (
        scope is None or not torch_direct() or rows >= FEW_ROWS
        or token_ids.shape[1] != 1 or not isinstance(index, int)
    ):
        return None
    held = ensemble.__dict__.get("_torch_grouped_plan")  # (scope, what the weights were made of, groups)
    if held is None or held[0] is not scope:
        plans = [_model_plan(model) for model in ensemble.models]
        sources = _weight_sources(ensemble.models, plans)
        same = held is not None and _same_sources(held[1], sources)
        held = (scope, sources, held[2] if same else _groups(ensemble, plans))
        ensemble.__dict__["_torch_grouped_plan"] = held
    groups = held[2]
    if groups is None:
        return None
    import torch

    parts = ensemble.split_cache(cache)
    probabilities, new_parts = [None] * len(parts), list(parts)
    tokens = torch.as_tensor(np.asarray(token_ids)[:, 0], dtype=torch.int64)
    for members, weights in groups:
        if weights is None:  # a model alone: its own step
            (member,) = members
            logits, new_parts[member] = ensemble.models[member].call_decoder_with_cache(
                token_ids, index, parts[member], encoder_padding_mask
            )
            # (`ensemble.probabilities_of`, in PyTorch's own call.)
            probabilities[member] = torch.softmax(logits.float(), dim=-1)
            continue
        group_probabilities, group_caches = _group_step(
            weights, tokens, index, [parts[m] for m in members], encoder_padding_mask
        )
        for member, p, part in zip(members, group_probabilities, group_caches):
            probabilities[member], new_parts[member] = p, part
    return probabilities, [entry for part in new_parts for entry in part]


class _GroupWeights:
    """A group's weights stacked along a first axis, one row a model, as
    `_group_step` multiplies them: each projection `(models, inputs,
    outputs)` with its bias `(models, 1, outputs)` (or None), each
    LayerNorm's scale and offset `(models, 1, d_model)`, and the
    embeddings transposed, `(models, d_model, vocabulary)`."""

    def __init__(self, models):
        import torch

        first = models[0].backbone
        self.d_model, self.heads = first.d_model, first.decoder_layers[0].self_attention.num_heads
        self.scale = math.sqrt(self.d_model) if first.token_embedding.scale_embeddings else None
        self.position = first.decoder_position
        self.mask_layer = first.decoder_layers[0]
        self.normalize_first = first.decoder_layers[0].normalize_first
        self.inner_dense = first.decoder_layers[0].feed_forward.inner_dense  # its activation
        with torch.no_grad():
            self.embeddings = torch.stack(
                [model.backbone.token_embedding.embeddings.value.detach().t() for model in models]
            ).contiguous()
            # Where float32 products are prepacked for oneDNN (AMD
            # processors: `int8_products.prepacked_product`), each model's
            # output projection is its own prepacked product instead of one
            # batched product: on a 2-core AMD EPYC, 4 rows of 3 d_model-128
            # models by 8,000 tokens took 317 us against 567 (16 rows: 682
            # against 1,446), 4 rows of 2 d_model-256 models 291 against 544;
            # the shipped five-model preset translated 1.11-1.13x as fast
            # one sentence at a time and 1.03-1.06x 16 at a time (passes
            # alternating, the same translations).
            self.projections = None
            if self.embeddings.dtype == torch.float32:
                projections = [
                    prepacked_product(model.backbone.token_embedding.embeddings.value) for model in models
                ]
                self.projections = None if None in projections else projections
            self.layers = [_stacked_layer(layers) for layers in zip(*(m.backbone.decoder_layers for m in models))]
            norms = [model.backbone.decoder_norm for model in models]
            self.final_norm = None if norms[0] is None else _stacked_norm(norms)


def _stacked_layer(layers):
    """One decoder layer of each model, stacked."""
    attention = [layer.self_attention for layer in layers]
    cross = [layer.cross_attention for layer in layers]
    feed_forward = [layer.feed_forward for layer in layers]
    first = attention[0]
    return {
        "sizes": [dense._kernel_matrix().shape[1] for dense in (first.query_dense, first.key_dense, first.value_dense)],
        "self": _stacked_product([[a.query_dense, a.key_dense, a.value_dense] for a in attention]),
        "self_output": _stacked_product([[a.output_dense] for a in attention]),
        "cross_query": _stacked_product([[c.query_dense] for c in cross]),
        "cross_output": _stacked_product([[c.output_dense] for c in cross]),
        "inner": _stacked_product([[f.inner_dense] for f in feed_forward]),
        "outer": _stacked_product([[f.output_dense] for f in feed_forward]),
        "norms": [_stacked_norm(norms) for norms in zip(*(norms_of(layer) for layer in layers))],
    }


def _stacked_product(denses_per_model):
    """`(kernel, bias)`: each model's projections side by side, stacked:
    `(models, inputs, outputs)` and `(models, 1, outputs)` or None."""
    import torch

    kernel = torch.stack([torch.cat([d._kernel_matrix() for d in denses], dim=1) for denses in denses_per_model])
    if denses_per_model[0][0].bias is None:
        return kernel, None
    bias = torch.stack([torch.cat([d.bias.value.flatten() for d in denses]) for denses in denses_per_model])
    return kernel, bias[:, None, :]


def _stacked_norm(norms):
    """`(gamma, beta, epsilon)` of one LayerNorm of each model, stacked."""
    import torch

    gamma = torch.stack([norm.gamma.value for norm in norms])[:, None, :]
    beta = torch.stack([norm.beta.value for norm in norms])[:, None, :]
    return gamma, beta, norms[0].epsilon


def _groups(ensemble, plans):
    """`[(member indices, _GroupWeights or None)]`, alike models grouped in
    the order of their first member; None where no two models group."""
    groups = {}
    for i, (model, plan) in enumerate(zip(ensemble.models, plans)):
        key = structure_key(model) if plan is not None else None
        groups.setdefault(("alone", i) if key is None else key, []).append(i)
    if all(len(members) == 1 for members in groups.values()):
        return None
    return [
        (members, None if len(members) == 1 else _GroupWeights([ensemble.models[i] for i in members]))
        for members in groups.values()
    ]


def _weight_sources(models, plans):
    """What a group's stacked weights are copied from, to tell when they
    must be made again: each decoder layer's `StepWeights` (made again when
    a weight of the layer is replaced or written), and each embedding's and
    final LayerNorm's tensors with their counts of in-place writes."""
    sources = []
    for model, plan in zip(models, plans):
        if plan is None:
            sources.append(None)
            continue
        sources.extend(weights for _, weights in plan[2])
        norm = model.backbone.decoder_norm
        variables = [model.backbone.token_embedding.embeddings] + ([] if norm is None else [norm.gamma, norm.beta])
        sources.extend((v.value, v.value._version) for v in variables)
    return sources


def _same_sources(held, sources):
    """Whether two `_weight_sources` lists name the same weights, unwritten."""
    return len(held) == len(sources) and all(
        a is b or (isinstance(a, tuple) and isinstance(b, tuple) and a[0] is b[0] and a[1] == b[1])
        for a, b in zip(held, sources)
    )


def _model_plan(model):
    """The model's decoder plan (`torch_decoding_step.decoder_plan`) where
    its step can join a group's, else None."""
    backbone = getattr(model, "backbone", None)
    layers = getattr(backbone, "decoder_layers", None)
    if layers is None or not all(hasattr(layer, "cross_attention") for layer in layers):
        return None
    embedding = backbone.token_embedding
    if (
        not registered_as(backbone.decoder_position, "keras_transformer>SinusoidalPositionEncoding")
        or not embedding.tie_weights or embedding.logits_bias is not None
        or getattr(embedding, "reverse_dtype", None) is not None
        or any(layer.quantization_mode is not None for layer in backbone._flatten_layers())
    ):
        return None
    return decoder_plan(backbone)


def _group_step(weights, tokens, index, caches, encoder_padding_mask):
    """One position of a group's models: their float32 probabilities and
    their new cache entries, each as the models' own steps give them."""
    import torch

    models = weights.embeddings.shape[0]
    x = weights.embeddings[:, :, tokens].transpose(1, 2)  # (models, rows, d_model)
    if weights.scale is not None:
        x = x * weights.scale
    x = x + sinusoid_table(weights.position, index + 1, x)[index]
    new_caches = [[] for _ in range(models)]
    for layer_weights, entries in zip(weights.layers, zip(*caches)):
        self_caches, cross_caches = [e[0] for e in entries], [e[1] for e in entries]
        x, keys, values = _group_layer(weights, layer_weights, x, index, self_caches, cross_caches,
                                       encoder_padding_mask)
        for m, (k, v) in enumerate(zip(keys.split(weights.heads, 1), values.split(weights.heads, 1))):
            new_caches[m].append(((k, v), cross_caches[m]))
    if weights.final_norm is not None:
        x = _norm(x, weights.final_norm)
    if weights.projections is None:
        logits = torch.bmm(x, weights.embeddings)
    else:
        logits = torch.stack([project(x[m]) for m, project in enumerate(weights.projections)])
    probabilities = torch.softmax(logits.float(), dim=-1)
    return probabilities.unbind(0), new_caches


def _group_layer(weights, layer, x, index, self_caches, cross_caches, encoder_padding_mask):
    """One decoder layer of the group's models: `(x, keys, values)`, the
    keys and values being the joined self-attention caches, written."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    models, rows, _ = x.shape
    heads = weights.heads
    written = {}

    def heads_of(t):  # (models, rows, heads * depth) -> (rows, models * heads, 1, depth)
        return t.view(models, rows, heads, -1).permute(1, 0, 2, 3).reshape(rows, models * heads, 1, -1)

    def from_heads(t):  # (rows', models * heads, length, depth) -> (models, rows' * length, heads * depth)
        return t.view(t.shape[0], models, heads, t.shape[2], -1).permute(1, 0, 3, 2, 4).reshape(models, rows, -1)

    def self_attention(x):
        query, key, value = _product(layer["self"], x).split(layer["sizes"], -1)
        keys = torch.cat([c[0] for c in self_caches], dim=1)
        values = torch.cat([c[1] for c in self_caches], dim=1)
        keys[:, :, index : index + 1] = heads_of(key)
        values[:, :, index : index + 1] = heads_of(value)
        written["cache"] = (keys, values)
        # (In the caches' dtype, `torch_decoding_step.attention_dtype`.)
        attended = scaled_dot_product_attention(
            heads_of(query).to(keys.dtype), keys[:, :, : index + 1], values[:, :, : index + 1]
        )
        return _product(layer["self_output"], from_heads(attended).to(x.dtype))

    def cross_attention(x):
        keys = torch.cat([c[0] for c in cross_caches], dim=1)  # (sources, models * heads, length, depth)
        values = torch.cat([c[1] for c in cross_caches], dim=1)
        sources, depth = keys.shape[0], keys.shape[-1]
        beams = rows // sources
        # A source's beams attend as its row's consecutive query positions.
        query = _product(layer["cross_query"], x).view(models, sources, beams, heads, depth)
        query = query.permute(1, 0, 3, 2, 4).reshape(sources, models * heads, beams, depth).to(keys.dtype)
        mask = None
        if encoder_padding_mask is not None:
            mask = additive_padding_mask(weights.mask_layer, encoder_padding_mask, keys)
        attended = scaled_dot_product_attention(query, keys, values, attn_mask=mask)
        return _product(layer["cross_output"], from_heads(attended).to(x.dtype))

    def feed_forward(x):
        return _product(layer["outer"], activated(weights.inner_dense, _product(layer["inner"], x)))

    for sublayer, norm in zip((self_attention, cross_attention, feed_forward), layer["norms"]):
        if weights.normalize_first:
            x = x + sublayer(_norm(x, norm))
        else:
            x = _norm(x + sublayer(x), norm)
    return (x, *written["cache"])


def _product(stacked, x):
    import torch

    kernel, bias = stacked
    return torch.bmm(x, kernel) if bias is None else torch.baddbmm(bias, x, kernel)


def _norm(x, stacked):
    """A LayerNorm of each model: normalized, then scaled and offset by
    that model's weights."""
    import torch
    from torch.nn.functional import layer_norm

    gamma, beta, epsilon = stacked
    return torch.addcmul(beta, layer_norm(x, x.shape[-1:], eps=epsilon), gamma)

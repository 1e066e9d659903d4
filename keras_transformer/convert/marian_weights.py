"""Marian (opus-mt) weights <-> this package's backbone variables.

Marian puts the sinusoids' sines in the first half of d_model and the
cosines in the second; this package interleaves them (section 3.5). The
residual stream is permuted instead: every weight's d_model axis is
reordered on the way in (`marian_to_backbone_weights`) and back on the way
out (`backbone_to_marian_weights`). LayerNorm and attention do not depend on
the order of that axis, so the logits are the same.
"""

import numpy as np

from keras_transformer.presets import PresetError


# === The d_model permutation ===


def position_permutation(d_model):
    """`perm` with `ours = marian[..., perm]` along a d_model axis: this
    package's dimension 2i is Marian's i (a sine), 2i+1 is Marian's
    d_model/2 + i (the cosine of the same frequency)."""
    half = d_model // 2
    perm = np.empty(d_model, "int64")
    perm[0::2] = np.arange(half)
    perm[1::2] = half + np.arange(half)
    return perm


def marian_positions(length, d_model):
    """Marian's sinusoid table `(length, d_model)`: the sines of section
    3.5 in the first half of d_model, the cosines in the second."""
    angles = np.arange(length)[:, None] / np.power(10000.0, 2 * np.arange(d_model // 2) / d_model)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype("float32")


def first_decoder_input_shift(state, d_model):
    """What the checkpoint's decoder position table adds to the first
    decoder input beyond the sinusoid (zero for opus-mt; the start token's
    embedding for models written out by `export_marian`). Tables that are
    not sinusoids otherwise are refused."""
    shift = np.zeros(d_model, "float32")
    for part in ("encoder", "decoder"):
        table = state.get(f"{part}.embed_positions.weight")
        if table is None:
            continue
        expected = marian_positions(table.shape[0], d_model)
        rows = slice(1, None) if part == "decoder" else slice(None)
        if table.shape[1] != d_model or not np.allclose(table[rows], expected[rows], atol=1e-3):
            raise PresetError(
                f"The Marian checkpoint's {part}.embed_positions.weight is not the sinusoid table "
                "Marian computes: learned or altered positions are not supported."
            )
        if part == "decoder":
            shift = table[0] - expected[0]
    return shift


# === Weights: Marian names <-> backbone variables ===


def layer_names(prefix, index, decoder):
    """(Marian module, package layer path) pairs of one layer's parts."""
    ours = f"{'decoder' if decoder else 'encoder'}_layer_{index}"
    theirs = f"{'decoder' if decoder else 'encoder'}.layers.{index}"
    pairs = [
        (f"{theirs}.self_attn", f"{ours}/self_attention", "attention"),
        (f"{theirs}.self_attn_layer_norm", f"{ours}/self_attention_norm", "norm"),
        (f"{theirs}.fc1", f"{ours}/feed_forward/inner", "inner"),
        (f"{theirs}.fc2", f"{ours}/feed_forward/output", "outer"),
        (f"{theirs}.final_layer_norm", f"{ours}/feed_forward_norm", "norm"),
    ]
    if decoder:
        pairs += [
            (f"{theirs}.encoder_attn", f"{ours}/cross_attention", "attention"),
            (f"{theirs}.encoder_attn_layer_norm", f"{ours}/cross_attention_norm", "norm"),
        ]
    return pairs


def marian_to_backbone_weights(state, backbone, decoder_start_id=None):
    """{variable path: array} for `backbone` from a Marian state dict.

    A decoder position table whose first row is shifted (see
    `first_decoder_input_shift`) moves the shift into the embedding of
    `decoder_start_id`, the first decoder input (padding, never an output,
    masked wherever else it is read)."""
    d, h = backbone.d_model, backbone.num_heads
    perm = position_permutation(d)
    embeddings = state.get("shared.weight", state.get("encoder.embed_tokens.weight"))
    if embeddings is None:
        raise PresetError("The Marian checkpoint has no shared embedding (model.shared.weight).")
    for tied in ("decoder.embed_tokens.weight", "lm_head.weight"):
        if tied in state and not np.array_equal(state[tied], embeddings):
            raise PresetError(f"The Marian checkpoint's {tied} differs from the shared embedding: not supported.")
    shift = first_decoder_input_shift(state, d)
    if np.any(shift) and decoder_start_id is not None:
        scale = np.sqrt(d) if backbone.scale_embeddings else 1.0
        embeddings = embeddings.copy()
        embeddings[decoder_start_id] += shift / scale
    weights = {"token_embedding/embeddings": embeddings[:, perm]}
    bias = state.get("final_logits_bias", np.zeros((1, embeddings.shape[0]), "float32"))
    weights["token_embedding/logits_bias"] = bias.reshape(-1)
    for decoder in (False, True):
        for i in range(backbone.num_layers):
            for theirs, ours, kind in layer_names("", i, decoder):
                weights.update(to_ours(state, theirs, ours, kind, perm, h))
    return weights


def to_ours(state, theirs, ours, kind, perm, h):
    def take(name):
        key = f"{theirs}.{name}"
        if key not in state:
            raise PresetError(f"The checkpoint has no {key}: it is incomplete, or not of the model type its config.json names.")
        return state[key]

    if kind == "norm":
        return {f"{ours}/gamma": take("weight")[perm], f"{ours}/beta": take("bias")[perm]}
    if kind == "inner":
        return {f"{ours}/kernel": take("weight").T[perm], f"{ours}/bias": take("bias")}
    if kind == "outer":
        return {f"{ours}/kernel": take("weight").T[:, perm], f"{ours}/bias": take("bias")[perm]}
    out = {}
    for name, dense in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
        kernel, bias = take(f"{name}.weight"), take(f"{name}.bias")
        out[f"{ours}/{dense}/kernel"] = kernel.T[perm].reshape(len(perm), h, -1)
        out[f"{ours}/{dense}/bias"] = bias.reshape(h, -1)
    kernel = take("out_proj.weight")
    out[f"{ours}/attention_output/kernel"] = kernel.T.reshape(h, -1, len(perm))[..., perm]
    out[f"{ours}/attention_output/bias"] = take("out_proj.bias")[perm]
    return out


def backbone_values(backbone):
    """{variable path: float32 NumPy array} of `backbone`'s weights."""
    return {v.path: np.asarray(v.numpy() if hasattr(v, "numpy") else v, "float32") for v in backbone.weights}


def checkpoint_layers(values, num_layers, inverse):
    """The encoder and decoder layers of a transformers state dict
    (`model.encoder.layers.0.self_attn.q_proj.weight`...) from a backbone's
    `values`, the d_model axis ordered by `inverse` (Marian's order; the
    identity for fairseq's models)."""
    state = {}
    for decoder in (False, True):
        for i in range(num_layers):
            for theirs, ours, kind in layer_names("", i, decoder):
                state.update(to_theirs(values, f"model.{theirs}", ours, kind, inverse))
    return state


def backbone_to_marian_weights(backbone):
    """A Marian state dict (NumPy arrays, transformers' names) of `backbone`."""
    values = backbone_values(backbone)
    inverse = np.argsort(position_permutation(backbone.d_model))
    embeddings = values["token_embedding/embeddings"][:, inverse]
    bias = values.get("token_embedding/logits_bias", np.zeros(embeddings.shape[0], "float32"))
    state = {
        "model.shared.weight": embeddings,
        "model.encoder.embed_tokens.weight": embeddings,
        "model.decoder.embed_tokens.weight": embeddings,
        "lm_head.weight": embeddings,
        "final_logits_bias": bias.reshape(1, -1),
        **checkpoint_layers(values, backbone.num_layers, inverse),
    }
    return {name: np.ascontiguousarray(value, "float32") for name, value in state.items()}


def to_theirs(values, theirs, ours, kind, inverse):
    """The tensors of transformers' module `theirs` (a LayerNorm, a
    feed-forward half or an attention block: `kind`) from the backbone
    variables under `ours`, the d_model axis ordered by `inverse`."""
    if kind == "norm":
        return {f"{theirs}.weight": values[f"{ours}/gamma"][inverse], f"{theirs}.bias": values[f"{ours}/beta"][inverse]}
    if kind == "inner":
        return {f"{theirs}.weight": values[f"{ours}/kernel"][inverse].T, f"{theirs}.bias": values[f"{ours}/bias"]}
    if kind == "outer":
        return {
            f"{theirs}.weight": values[f"{ours}/kernel"][:, inverse].T,
            f"{theirs}.bias": values[f"{ours}/bias"][inverse],
        }
    out = {}
    d = len(inverse)
    for name, dense in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
        kernel = values[f"{ours}/{dense}/kernel"].reshape(d, -1)
        out[f"{theirs}.{name}.weight"] = kernel[inverse].T
        out[f"{theirs}.{name}.bias"] = values[f"{ours}/{dense}/bias"].reshape(-1)
    kernel = values[f"{ours}/attention_output/kernel"]
    out[f"{theirs}.out_proj.weight"] = kernel.reshape(-1, d)[:, inverse].T
    out[f"{theirs}.out_proj.bias"] = values[f"{ours}/attention_output/bias"][inverse]
    return out


def refuse_reshaped(checkpoint, reshaped, theirs):
    """The error for shape arguments `reshaped` (name -> value given) that
    differ from the checkpoint's `theirs` (name -> value): its weights
    would not fit. `checkpoint` names it ("The Marian checkpoint")."""
    given = ", ".join(f"{name}={value!r}" for name, value in sorted(reshaped.items()))
    config = ", ".join(f"{name}={theirs[name]!r}" for name in sorted(reshaped))
    raise PresetError(
        f"{checkpoint}'s weights do not fit {given}: its config.json gives {config}. Leave "
        "these out, or give load_weights=False for a new model of that shape."
    )


def assign_checkpoint_weights(checkpoint, backbone, weights):
    """Every variable of `backbone` assigned its value in `weights` (by
    variable path), or an error naming the first one the checkpoint (named
    by `checkpoint`) lacks or gives in another shape."""
    for variable in backbone.weights:
        value = weights.get(variable.path)
        if value is None or tuple(value.shape) != tuple(variable.shape):
            found = None if value is None else tuple(value.shape)
            raise PresetError(
                f"{checkpoint} does not fit its config.json: {variable.path} should have shape "
                f"{tuple(variable.shape)}, the checkpoint gives {found}."
            )
        variable.assign(value)

"""Marian (opus-mt) weights <-> this package's backbone variables.

Marian puts the sinusoids' sines in the first half of d_model and the
cosines in the second; this package interleaves them (section 3.5). The
residual stream is permuted instead: every weight's d_model axis is
reordered on the way in (`marian_to_backbone_weights`) and back on the way
out (`backbone_to_marian_weights`). LayerNorm and attention do not depend on
the order of that axis, so the logits are the same.
"""

import numpy as np

from keras_transformer.convert.checkpoint_tensors import RowBlocks
from keras_transformer.convert.checkpoint_tensors import tensors_equal
from keras_transformer.presets import PresetError
from keras_transformer.runtime.variable_rows import assign_rows
from keras_transformer.utils.memory import give_back_freed_memory


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
    """{variable path: array} parts for `backbone` from a Marian state
    dict (or `CheckpointTensors`), a module at a time: the embeddings
    first, then each layer's parts (`assign_checkpoint_weights` assigns
    them as they come, so that one module's arrays are held at a time).

    A decoder position table whose first row is shifted (see
    `first_decoder_input_shift`) moves the shift into the embedding of
    `decoder_start_id`, the first decoder input (padding, never an output,
    masked wherever else it is read)."""
    d, h = backbone.d_model, backbone.num_heads
    perm = position_permutation(d)
    name = "shared.weight" if "shared.weight" in state else "encoder.embed_tokens.weight"
    if name not in state:
        raise PresetError("The Marian checkpoint has no shared embedding (model.shared.weight).")
    for tied in ("decoder.embed_tokens.weight", "lm_head.weight"):
        if tied in state and not tensors_equal(state, tied, name):
            raise PresetError(f"The Marian checkpoint's {tied} differs from the shared embedding: not supported.")
    shift = first_decoder_input_shift(state, d)
    shifted = np.any(shift) and decoder_start_id is not None
    scale = np.sqrt(d) if backbone.scale_embeddings else 1.0

    def to_our_order(start, rows):
        if shifted and start <= decoder_start_id < start + len(rows):
            rows[decoder_start_id - start] += shift / scale
        return rows[:, perm]

    yield {"token_embedding/embeddings": RowBlocks(state, name, to_our_order)}
    bias = state["final_logits_bias"] if "final_logits_bias" in state else np.zeros((1, len(perm)), "float32")
    yield {"token_embedding/logits_bias": bias.reshape(-1)}
    for decoder in (False, True):
        for i in range(backbone.num_layers):
            for theirs, ours, kind in layer_names("", i, decoder):
                yield to_ours(state, theirs, ours, kind, perm, h)


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


def assign_checkpoint_weights(checkpoint, backbone, parts):
    """Every variable of `backbone` assigned its value from `parts` (an
    iterable of {variable path: array} dicts, or one such dict), a part at
    a time, each dropped once assigned; an error naming the first variable
    that the checkpoint (named by `checkpoint`) gives in another shape, or
    lacks."""
    variables = {variable.path: variable for variable in backbone.weights}
    assigned = set()
    for part in [parts] if isinstance(parts, dict) else parts:
        for path, value in part.items():
            variable = variables.get(path)
            if variable is None:
                continue
            if tuple(value.shape) != tuple(variable.shape):
                raise _does_not_fit(checkpoint, variable, tuple(value.shape))
            if isinstance(value, RowBlocks):  # (an embedding matrix: no second copy of it)
                assign_rows(variable, value)
            else:
                variable.assign(value)
            assigned.add(path)
        del part
        give_back_freed_memory()  # (the replaced initial values' holes)
    for variable in backbone.weights:
        if variable.path not in assigned:
            raise _does_not_fit(checkpoint, variable, None)


def _does_not_fit(checkpoint, variable, found):
    return PresetError(
        f"{checkpoint} does not fit its config.json: {variable.path} should have shape "
        f"{tuple(variable.shape)}, the checkpoint gives {found}."
    )

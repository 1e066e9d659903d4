"""What `TransformerBackbone` takes: its input names, checked with clear
errors, and the keras-hub argument names it answers with its own."""

import keras

# keras-hub's encoder-decoder backbones (BART, T5) name some of the
# arguments otherwise; a model built with one of their names is refused
# with this package's name for it.
KERAS_HUB_NAMES = {
    "hidden_dim": "d_model",
    "intermediate_dim": "d_ff",
    "num_encoder_layers": "num_layers",
    "num_decoder_layers": "num_layers",
    "key_value_dim": "key_dim",
    "dropout_rate": "dropout",
}


INPUT_NAMES = (
    "encoder_token_ids",
    "encoder_padding_mask",
    "decoder_token_ids",
    "decoder_padding_mask",
)


def check_inputs(inputs):
    """Clear errors for the mistakes the functional model would hide or
    report far from their cause: a missing key, float ids, a wrong rank."""
    if not isinstance(inputs, dict):
        raise TypeError(
            f"TransformerBackbone takes a dict with keys {INPUT_NAMES}, "
            f"got {type(inputs).__name__}."
        )
    missing = [name for name in INPUT_NAMES if name not in inputs]
    if missing:
        raise KeyError(
            f"TransformerBackbone inputs lack {missing}; expected the keys {INPUT_NAMES}."
        )
    for name in INPUT_NAMES:
        value = inputs[name]
        shape = tuple(value.shape)
        if len(shape) != 2:
            raise ValueError(
                f"`{name}` must have rank 2, (batch, length); got shape {shape}."
            )
        dtype = keras.backend.standardize_dtype(value.dtype)
        if name.endswith("token_ids") and "int" not in dtype:
            raise TypeError(
                f"`{name}` must hold integer token ids, got dtype {dtype}. "
                "Tokenize the text and pass int32 or int64 ids."
            )
    for side in ("encoder", "decoder"):
        ids, mask = inputs[f"{side}_token_ids"], inputs[f"{side}_padding_mask"]
        if None not in ids.shape and None not in mask.shape and tuple(ids.shape) != tuple(mask.shape):
            raise ValueError(
                f"`{side}_padding_mask` has shape {tuple(mask.shape)} but "
                f"`{side}_token_ids` has shape {tuple(ids.shape)}; they must match."
            )

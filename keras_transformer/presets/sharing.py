"""Sharing a preset on Kaggle or the Hugging Face hub: keras-hub's own
`upload_preset`, after this package's checks and keras-hub's on every
model of the preset.

Every preset that this version saves (float, bfloat16, int8 storage,
Keras' int8 computation, ensembles) has its weights in `model.weights.h5`
and `keras_hub.upload_preset(handle, directory)` uploads it as it is.
`upload_preset` here (and `keras-transformer upload --preset DIR HANDLE`)
adds what keras-hub does not do:

- presets whose int8 weights earlier versions kept in
  `model.weights.int8.npz` (the shipped presets among them) have no
  `model.weights.h5`, and keras-hub refuses them ("The weights file is
  missing"): they are written again into a temporary copy
  (`store_int8`: the same int8 values, in `model.weights.h5`), which is
  what goes up, the preset itself left as it is;
- keras-hub checks the top directory alone: its check (a `config.json`
  that parses, weights in `model.weights.h5` or its shards) runs here on
  each model of an ensemble preset (`ensemble/1`, ...) too, and this
  package's checks (`keras_transformer.presets.check`: the files read, the
  weights' SHA-256 are those recorded when they were saved) on all, before
  anything leaves the machine.
"""

import os
import tempfile

from keras_transformer.presets import int8
from keras_transformer.presets.checks import check
from keras_transformer.presets.ensembles import member_locations
from keras_transformer.presets.int8_conversion import store_int8
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import resolve

HUB_PREFIXES = ("kaggle://", "hf://")


def upload_preset(handle, preset):
    """Uploads a preset to Kaggle or the Hugging Face hub, as
    `keras_hub.upload_preset` does, after the checks of the module's
    docstring; anyone then loads it by `handle`.

    Args:
        handle: `kaggle://OWNER/MODEL/keras/VARIANT` or `hf://OWNER/MODEL`
            (keras-hub's forms).
        preset: a preset directory, or the name of a shipped preset.

    Raises:
        PresetError: `handle` is not a hub handle, or a model of the preset
            fails a check (nothing is uploaded).

    Example:

    ```python
    from keras_transformer import presets
    from keras_transformer.models import TransformerSeq2SeqLM

    presets.upload_preset("hf://OWNER/my-en-de", "my-en-de")
    presets.upload_preset("kaggle://OWNER/transformer/keras/en_de", "transformer_multi30k_en_de")
    TransformerSeq2SeqLM.from_preset("hf://OWNER/my-en-de")  # anywhere
    ```
    """
    import keras_hub

    if not isinstance(handle, str) or not handle.startswith(HUB_PREFIXES):
        raise PresetError(
            f"Cannot upload to {handle!r}: give a Kaggle handle (kaggle://OWNER/MODEL/keras/VARIANT) or a "
            "Hugging Face one (hf://OWNER/MODEL)."
        )
    check(preset)
    directory = os.path.abspath(resolve(os.fspath(preset)))
    members = [path for path, _ in member_locations(directory)]
    for path in members:
        check(os.path.join(directory, path))
    with tempfile.TemporaryDirectory(prefix="keras-transformer-upload-") as staging:
        if any(int8.storage(os.path.join(directory, path)) == "npz" for path in ["", *members]):
            directory = store_int8(directory, os.path.join(staging, os.path.basename(directory)))
        check_shareable(directory, members)
        keras_hub.upload_preset(handle, directory)


def check_shareable(directory, members=()):
    """keras-hub's own check before an upload (`keras_hub.upload_preset`),
    on the preset in `directory` and on each of its ensemble models
    `members` (paths inside it)."""
    from keras_transformer.utils.keras_hub_internals import validate_backbone

    for path in ["", *members]:
        try:
            validate_backbone(os.path.join(directory, path))
        except (OSError, ValueError) as error:
            raise PresetError(f"keras-hub would not upload the preset {directory!r}: {error}") from error

"""Ensemble presets: a preset that decodes with several models.

An ensemble preset is the preset of its first model (the task, its
tokenizer and weights, as any preset) with the other models' backbones in
`ensemble/1`, `ensemble/2`, ... (each a backbone preset: `config.json`,
`model.weights.h5` (or, saved by earlier versions in int8,
`model.weights.int8.npz`: presets/int8_legacy.py), `metadata.json`),
listed in order under `"ensemble"` in the top `metadata.json`.
`TransformerSeq2SeqLM.from_preset` loads them into `model.ensemble_members`
(models/transformer/ensemble_members.py), and `generate` averages the
probabilities of all the models at each step, as fairseq's and Marian's
ensembles do. From a hub handle, each model's files are downloaded as
keras-hub downloads the first's (`get_file`, into its cache);
keras-hub's own loaders (`keras_hub.models.Seq2SeqLM.from_preset`) know
nothing of ensembles and load the first model alone.

The members share the first model's tokenizer: they must have been trained
on its vocabulary. They may differ in depth and width.
"""

import os
import posixpath
import warnings

from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import ENSEMBLE_DIR
from keras_transformer.presets.layout import ENSEMBLE_KEY
from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import METADATA_FILE
from keras_transformer.presets.layout import SHARDED_WEIGHTS_INDEX
from keras_transformer.presets.layout import WEIGHTS_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import preset_metadata
from keras_transformer.presets.registry import resolve


def member_paths(preset):
    """The paths (relative to the preset) of the members an ensemble preset
    lists; [] for a preset of one model."""
    members = preset_metadata(preset).get(ENSEMBLE_KEY) or []
    if not isinstance(members, list) or not all(isinstance(path, str) for path in members):
        raise PresetError(
            f"The preset {os.fspath(preset)!r} lists its ensemble's models as {members!r} in metadata.json; "
            f"expected a list of directories inside the preset, such as [\"{ENSEMBLE_DIR}/1\"]."
        )
    return members


def member_locations(preset):
    """The further models of an ensemble preset, as `(path, directory)`
    pairs in the order metadata.json lists them (`path` as listed there,
    `directory` where it is); [] for a preset of one model.

    Raises:
        PresetError: the preset is not a directory, or lists a model
            outside it, itself, or one it does not hold.
    """
    paths = member_paths(preset)
    if not paths:
        return []
    directory = resolve(os.fspath(preset))
    if "://" in directory:
        return [(path, _downloaded(directory, path)) for path in paths]
    if not os.path.isdir(directory):
        raise PresetError(
            f"The preset {os.fspath(preset)!r} is an ensemble of {1 + len(paths)} models, which load from a "
            "directory or a hub handle: download the preset's directory and give its path."
        )
    locations = []
    root = os.path.abspath(directory)
    for path in paths:
        location = os.path.normpath(os.path.join(root, path))
        if os.path.commonpath([location, root]) != root:
            raise PresetError(f"The preset {directory!r} lists an ensemble model outside it: {path!r}.")
        if location == root:
            raise PresetError(
                f"The preset {directory!r} lists itself ({path!r}) as one of its ensemble's other models: "
                f"metadata.json must list the directories of the others, such as \"{ENSEMBLE_DIR}/1\"."
            )
        if not os.path.isdir(location):
            raise PresetError(
                f"The preset {directory!r} lists the ensemble model {path!r}, which it does not hold: the "
                "preset is incomplete; copy or download it again."
            )
        locations.append((path, location))
    return locations


def _downloaded(handle, path):
    """The local directory of the ensemble model `path` of the hub preset
    `handle`, its files downloaded as keras-hub downloads a preset's
    (`get_file`: into the hub client's cache, where `path` keeps its place
    beside the first model's files)."""
    from keras_transformer.presets.hub import reading
    from keras_transformer.utils.keras_hub_internals import get_file

    inside = posixpath.normpath(path)
    if inside in (".", "..") or inside.startswith(("../", "/")):
        raise PresetError(f"The preset {handle!r} lists an ensemble model outside it or itself: {path!r}.")
    try:
        with reading(handle):  # without a network, a PresetError within seconds
            files = [get_file(handle, f"{inside}/{CONFIG_FILE}")]
            files += _optional_files(handle, inside, (METADATA_FILE,))
            # Its weights; or those of an int8 preset of earlier versions.
            files += _optional_files(handle, inside, (WEIGHTS_FILE,)) or _optional_files(
                handle, inside, (SHARDED_WEIGHTS_INDEX, INT8_WEIGHTS_FILE)
            )
    except FileNotFoundError as error:
        raise PresetError(
            f"The preset {handle!r} lists the ensemble model {path!r}, which it does not hold ({error}): the "
            "preset is incomplete; upload it again."
        ) from error
    directory = os.path.dirname(files[0])
    if any(os.path.dirname(file) != directory for file in files):
        raise PresetError(
            f"The files of the ensemble model {path!r} of {handle!r} did not download into one directory."
        )
    return directory


def _optional_files(handle, inside, names):
    """The local paths of the files `names` of the model `inside` the hub
    preset `handle`, downloaded; [] if one of them is not there."""
    from keras_transformer.utils.keras_hub_internals import get_file

    try:
        return [get_file(handle, f"{inside}/{name}") for name in names]
    except FileNotFoundError:
        return []


def member_directories(count):
    """Where an ensemble preset keeps its other `count` models, as
    metadata.json lists them."""
    return [f"{ENSEMBLE_DIR}/{i}" for i in range(1, count + 1)]


def save_members(members, directory, weights_storage="float"):
    """Writes each member's backbone into `directory/ensemble/<i>`, inside
    the save of the whole preset (`keras_transformer.presets.saving`),
    its weights stored as `weights_storage` says."""
    for path, member in zip(member_directories(len(members)), members):
        member.backbone.save_to_preset(os.path.join(directory, path), weights_storage=weights_storage)


def other_members(model, strict=False):
    """How many models a model (or preset) holds beside its first: its
    ensemble members. Where a preset's list of them cannot be read: 0
    (its loading reports that), or with `strict` the `PresetError` or
    `OSError` itself."""
    if isinstance(model, (str, os.PathLike)):
        try:
            return len(member_paths(model))
        except (PresetError, OSError):
            if strict:
                raise
            return 0
    return len(getattr(model, "ensemble_members", ()))


def warn_first_model_only(model, what, remedy=None):
    """Warns that `what` (an export) holds an ensemble's first model only,
    for a model (or preset) with ensemble members; `remedy` says how to
    hold them all, where the format can."""
    others = other_members(model)
    if others:
        warnings.warn(
            f"{what} holds the first of the ensemble's {1 + others} models only, which translates less well "
            "than the ensemble (the preset's metadata.json gives the ensemble's scores, and each model's in "
            "`training`)" + (f": {remedy}." if remedy else "."),
            stacklevel=3,
        )

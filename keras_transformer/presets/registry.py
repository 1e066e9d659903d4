"""The presets shipped inside the package, by name, and reading a preset's
JSON files by name, directory or handle."""

import json
import os
import warnings

from keras_transformer.presets.hub import reading
from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import ENSEMBLE_KEY
from keras_transformer.presets.layout import METADATA_FILE
from keras_transformer.presets.layout import PRESETS_DIR
from keras_transformer.presets.layout import TOKENIZER_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.utils.reading import UnreadableFileError
from keras_transformer.utils.reading import read_json


def shipped_directories():
    if not os.path.isdir(PRESETS_DIR):
        return {}
    return {
        name: os.path.join(PRESETS_DIR, name)
        for name in sorted(os.listdir(PRESETS_DIR))
        if os.path.isfile(os.path.join(PRESETS_DIR, name, CONFIG_FILE))
    }


def read_json_object(path, what="preset file", fix=None):
    """The JSON object (a dict) in the file `path`, read within
    `utils.reading`'s bounds; a `PresetError` that names the file when it
    cannot be read so, is not valid JSON, or holds another type (a list, a
    string), saying what the file is (`what`) and what to do (`fix`; by
    default, for a preset's file, copy or save it again).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "metadata.json")
    >>> _ = open(path, "w").write("[1, 2]")
    >>> read_json_object(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_transformer.presets.layout.PresetError: The preset file '...metadata.json' holds a JSON list, not ...
    """
    fix = fix or "Copy the preset again, or save the model again with `save_to_preset`."
    try:
        content = read_json(path)
    except UnreadableFileError as error:
        raise PresetError(str(error)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PresetError(f"The {what} {path!r} is corrupt (not valid JSON: {error}). {fix}") from error
    if not isinstance(content, dict):
        kind = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(content), "null")
        raise PresetError(
            f"The {what} {path!r} holds a JSON {kind}, not the object (the {{...}} of keys and values) it "
            f"must be: it was edited or made by hand. {fix}"
        )
    return content


def read_metadata(directory):
    """The `metadata.json` of a preset directory as a dict (empty if absent)."""
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path):
        return {}
    return read_json_object(path)


def preset_metadata(preset):
    """The `metadata.json` of a preset given by name, directory or handle,
    as a dict (empty if it has none or it cannot be read)."""
    try:
        return read_preset_file(preset, METADATA_FILE)
    except FileNotFoundError:  # absent, or not reachable: the caller goes without.
        return {}


def read_preset_file(preset, name):
    """One JSON file of a preset given by name, directory or handle, as a
    dict; `FileNotFoundError` if the preset has no such file."""
    directory = resolve(preset)
    if os.path.isdir(directory):
        path = os.path.join(directory, name)
    elif "://" in str(preset):
        # keras-hub has no public call that reads one file of a preset; its
        # `get_file` downloads it into keras-hub's cache like the other files.
        from keras_transformer.utils.keras_hub_internals import get_file

        try:
            with reading(preset):  # without a network, a PresetError within seconds
                path = get_file(preset, name)
        except PresetError:
            raise
        except Exception as error:
            raise FileNotFoundError(f"Could not read {name} of preset {preset!r}: {error}") from error
    else:
        raise FileNotFoundError(f"{preset!r} is neither a preset directory, a shipped preset nor a handle.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Preset {preset!r} has no {name}.")
    return read_json_object(path)


def sentencepiece_presets(presets):
    """Whether every preset (a shipped name or a directory) has a
    `TransformerTokenizer`, which translates without tensorflow-text
    (`keras_transformer.utils.tensorflow_free`); hub handles and unreadable
    presets count as not.

    Example:

    >>> sentencepiece_presets(["transformer_multi30k_en_de", "transformer_multi30k_de_en"])
    True
    """
    for preset in presets:
        if "://" in str(preset):
            return False
        try:
            config = read_preset_file(preset, TOKENIZER_FILE)
        except (OSError, ValueError):
            return False
        if config.get("class_name") != "TransformerTokenizer":
            return False
    return True


def _size_on_disk(directory):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
    )


def list_presets():
    """The presets shipped with the package, by name.

    Returns:
        A dict from preset name to its metadata (`description`,
        `parameter_count` (of all the models of an ensemble preset),
        `scores` per test set, `decoding`, `training`, `data`,
        `languages`, `ensemble`...), plus `size_bytes` (on disk) and
        `path`.

    Example:

    >>> from keras_transformer import presets
    >>> for name, info in presets.list_presets().items():
    ...     print(name, info["languages"])  # doctest: +SKIP
    transformer_multi30k_de_en {'source': 'de', 'target': 'en'}
    transformer_multi30k_en_de {'source': 'en', 'target': 'de'}
    """
    presets = {}
    for name, directory in shipped_directories().items():
        info = read_metadata(directory)
        if "parameter_count" in info:
            info["parameter_count"] = _parameter_count(directory, info)
        info["size_bytes"] = _size_on_disk(directory)
        info["path"] = directory
        presets[name] = info
    return presets


def _parameter_count(directory, metadata):
    """The parameters of a preset's model, and of an ensemble preset's
    further models (presets/ensembles.py) with them; None if unrecorded."""
    if "parameter_count" not in metadata:
        return None
    members = [read_metadata(os.path.join(directory, path)) for path in metadata.get(ENSEMBLE_KEY) or ()]
    return metadata["parameter_count"] + sum(member.get("parameter_count", 0) for member in members)


def keras_hub_registry():
    """The shipped presets in the form of keras-hub's `backbone_presets`.

    The `kaggle_handle` of each is its directory inside the package, so that
    keras-hub resolves the name with no network.
    """
    registry = {}
    for name, directory in shipped_directories().items():
        info = read_metadata(directory)
        registry[name] = {
            "metadata": {
                "description": info.get("description", ""),
                "params": _parameter_count(directory, info),
                "path": "transformer",
            },
            "kaggle_handle": directory,
        }
    return registry


def resolve(preset):
    """The local directory of a shipped preset name, or `preset` (a leading
    `~` expanded to the home directory)."""
    shipped = shipped_directories()
    if preset in shipped:
        if os.path.isdir(preset) and preset not in _warned_shadowed:
            _warned_shadowed.add(preset)
            warnings.warn(
                f"{preset!r} names a preset shipped with keras_transformer, which is the one that loads, "
                f"not the directory {preset!r} here: pass {os.path.join('.', preset)!r} to load the "
                "directory.",
                stacklevel=3,
            )
        return shipped[preset]
    if isinstance(preset, str) and preset.startswith("~"):
        return os.path.expanduser(preset)
    return preset


_warned_shadowed = set()



"""Checks of a preset directory before keras-hub reads it, with errors that
name the file and the fix."""

import glob
import os
import re
import warnings

from keras_transformer.presets import int8
from keras_transformer.presets import int8_legacy
from keras_transformer.presets.classes import PACKAGE_PREFIX
from keras_transformer.presets.classes import registered_names
from keras_transformer.presets.layout import ASSETS_DIR
from keras_transformer.presets.layout import CHECKSUMS_KEY
from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import ENSEMBLE_DIR
from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import METADATA_FILE
from keras_transformer.presets.layout import PREPROCESSOR_FILE
from keras_transformer.presets.layout import SHARDED_WEIGHTS_INDEX
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import TASK_FILE
from keras_transformer.presets.layout import TOKENIZER_FILE
from keras_transformer.presets.layout import WEIGHTS_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.layout import weights_do_not_fit
from keras_transformer.presets.registry import shipped_directories
from keras_transformer.presets.registry import read_json_object
from keras_transformer.presets.registry import resolve
from keras_transformer.utils.files import sha256
from keras_transformer.utils.reading import VOCABULARY_LIMIT
from keras_transformer.utils.reading import WEIGHTS_LIMIT
from keras_transformer.utils.reading import UnreadableFileError
from keras_transformer.utils.reading import check_regular_file
from keras_transformer.utils.reading import read_bytes
from keras_transformer.utils.reading import read_text

# Tokenizer arguments that would read a file: presets keep it in assets.
TOKENIZER_FILE_KEYS = ("proto", "vocabulary", "merges", "source_spm", "target_spm")


def check(preset, needs=("config",), load_weights=True):
    """Checks a preset before it is loaded, with errors that name the problem.

    Remote handles (`kaggle://`, `hf://`, ...) are left to keras-hub.

    Args:
        preset: a shipped preset name, a local directory or a handle.
        needs: what the caller loads: any of `"config"` (a backbone or
            task), `"tokenizer"`, `"preprocessor"`.
        load_weights: whether the weights will be read.

    Raises:
        PresetError: an unknown name, or a missing or corrupt file (named).
        TypeError: `preset` is not a string or path.
    """
    if isinstance(preset, os.PathLike):
        preset = os.fspath(preset)
    if not isinstance(preset, str):
        raise TypeError(f"A preset is a name, a directory or a handle (a string); got {type(preset).__name__}.")
    if "://" in preset:
        return
    directory = resolve(preset)
    if not os.path.exists(directory):
        shipped = ", ".join(shipped_directories()) or "none are installed"
        raise PresetError(
            f"Unknown preset {preset!r}: it is neither a preset shipped with "
            f"keras_transformer ({shipped}) nor an existing directory. Use one of "
            "those names, the directory you gave to `save_to_preset`, or a "
            "kaggle:// or hf:// handle. `keras-transformer presets` lists the "
            "shipped presets."
        )
    if not os.path.isdir(directory):
        raise PresetError(f"Preset {preset!r} is a file; a preset is a directory written by `save_to_preset`.")
    _check_directory(directory, needs, load_weights)


def _check_directory(directory, needs, load_weights):
    def path(name):
        return os.path.join(directory, name)

    required = []
    if "config" in needs:
        required.append(CONFIG_FILE)
    if "tokenizer" in needs or "preprocessor" in needs:
        required.append(TOKENIZER_FILE)
    for name in required:
        if not os.path.exists(path(name)):
            if os.path.isfile(os.path.join(directory, "model", CONFIG_FILE)):  # a training run's directory
                raise PresetError(
                    f"{directory!r} is not a preset but holds one in model/: load "
                    f"{os.path.join(directory, 'model')!r} (a training run saves its model there)."
                )
            raise PresetError(
                f"The preset directory {directory!r} has no {name}: it is incomplete. "
                "Save the model again with `save_to_preset`, or copy the whole directory."
            )
    configs = {}
    for name in (CONFIG_FILE, TASK_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE, METADATA_FILE):
        if os.path.exists(path(name)):
            configs[name] = read_json_object(path(name))
    if METADATA_FILE not in configs and os.path.isdir(path(ENSEMBLE_DIR)):
        raise PresetError(
            f"The preset directory {directory!r} has an {ENSEMBLE_DIR}/ folder but no {METADATA_FILE}, "
            "which lists the ensemble's models: it is incomplete. Copy the preset again, or save the "
            "model again."
        )
    if PREPROCESSOR_FILE in configs and TOKENIZER_FILE not in configs:
        raise PresetError(
            f"The preset directory {directory!r} has a {PREPROCESSOR_FILE} but no "
            f"{TOKENIZER_FILE}: it is incomplete. Save the model again with `save_to_preset`."
        )
    for name in (CONFIG_FILE, TASK_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE):
        if name in configs:
            _check_classes(path(name), configs[name])
    _check_task_agrees(directory, configs)
    if TOKENIZER_FILE in configs:
        _check_tokenizer_config(path(TOKENIZER_FILE), configs[TOKENIZER_FILE])
        vocabulary = _check_tokenizer_assets(directory, configs[TOKENIZER_FILE])
        if CONFIG_FILE in configs and vocabulary is not None:
            _check_vocabulary_size(directory, configs[CONFIG_FILE], *vocabulary)
    if load_weights and "config" in needs:
        metadata = configs.get(METADATA_FILE)
        _check_weights(directory, _checksums(directory, metadata), metadata or {})


def _check_task_agrees(directory, configs):
    """A task loads from task.json, which holds its backbone's and its
    preprocessor's configs again: they must be those of config.json and
    preprocessor.json, or an edit of one file would be read by some
    loaders (and checks) and not by others. The error names both files and
    the setting they differ in."""
    task = configs.get(TASK_FILE, {}).get("config")
    for name, key in ((CONFIG_FILE, "backbone"), (PREPROCESSOR_FILE, "preprocessor")):
        inner = (task or {}).get(key) if isinstance(task, dict) else None
        inner = inner.get("config") if isinstance(inner, dict) else None
        outer = configs.get(name, {}).get("config")
        if not isinstance(inner, dict) or not isinstance(outer, dict):
            continue
        # (The tokenizer's config is tokenizer.json's, checked with its vocabulary.)
        differ = sorted(k for k in {*inner, *outer} - {"tokenizer"} if inner.get(k, _ABSENT) != outer.get(k, _ABSENT))
        if differ:
            shown = lambda config: "absent" if differ[0] not in config else repr(config[differ[0]])  # noqa: E731
            raise PresetError(
                f"The preset directory {directory!r} describes its model twice, in {TASK_FILE} and in {name}, "
                f"and they differ: {differ[0]} is {shown(inner)} in {TASK_FILE} but {shown(outer)} in {name}"
                + (f" (and {len(differ) - 1} more settings differ)" if len(differ) > 1 else "")
                + ". One of the files was edited: make them agree (restore the edited file, or copy the "
                "preset again), or save the model again."
            )


_ABSENT = object()


def _check_classes(path, config):
    """Every object of a config that names a class of this package names
    one that exists, under its own name. (Keras' safe mode refuses code in
    configs, such as a `Lambda`; this names the file before it gets there.)"""
    known = registered_names()
    for item in _objects(config):
        registered = item.get("registered_name")
        if not isinstance(registered, str) or not registered.startswith(PACKAGE_PREFIX):
            continue
        if registered not in known or registered != PACKAGE_PREFIX + str(item.get("class_name")):
            raise PresetError(
                f"The preset file {path!r} names {item.get('class_name')!r} as {registered!r}, which is not "
                "a class of keras_transformer: the file was edited or made by hand. Save the model again "
                "with `save_to_preset`."
            )


def _objects(config):
    """The serialized objects (dicts with a `class_name`) inside a config."""
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for value in config.values():
            yield from _objects(value)
    elif isinstance(config, list):
        for value in config:
            yield from _objects(value)


def _check_tokenizer_config(path, tokenizer_config):
    """A tokenizer's vocabulary comes from the preset's assets, never from a
    path in its config (which would read any file on the machine)."""
    config = tokenizer_config.get("config", {})
    for key in TOKENIZER_FILE_KEYS:
        if isinstance(config, dict) and config.get(key) is not None:
            raise PresetError(
                f"The preset file {path!r} gives the tokenizer's {key!r} ({str(config[key])[:60]!r}); a "
                f"preset's vocabulary is read from {ASSETS_DIR}/tokenizer/ only. Remove the key, or save "
                "the model again with `save_to_preset`."
            )


def _checksums(directory, metadata):
    """The weights' SHA-256 sums recorded in metadata.json; a malformed
    record is an error, no record a warning (once per directory)."""
    if metadata is None or CHECKSUMS_KEY not in metadata:
        if directory not in _warned_unchecked:
            _warned_unchecked.add(directory)
            warnings.warn(
                f"The preset {directory!r} records no SHA-256 of its weights ({CHECKSUMS_KEY!r} in "
                f"{METADATA_FILE}), so damaged weights could load without an error. Save it again with "
                "`save_to_preset` to record them.",
                stacklevel=4,
            )
        return {}
    checksums = metadata[CHECKSUMS_KEY]
    malformed = not isinstance(checksums, dict) or not all(
        isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) for value in checksums.values()
    )
    if malformed:
        raise PresetError(
            f"{os.path.join(directory, METADATA_FILE)!r} has a malformed {CHECKSUMS_KEY!r} (it must map "
            "each weights file to its 64-digit hex SHA-256). Copy the preset again, or save the model again; "
            f"to load weights replaced by hand on purpose, delete {CHECKSUMS_KEY!r}."
        )
    return checksums


_warned_unchecked = set()


def _check_weights(directory, checksums, metadata):
    """Each weights file exists, matches the SHA-256 recorded in the
    metadata (every save of this package records it: HDF5 reads a file with
    damaged bytes inside a tensor without error), and is readable HDF5 (or,
    for weights stored in int8 by earlier versions, a readable archive:
    presets/int8_legacy.py)."""
    import h5py

    index = os.path.join(directory, SHARDED_WEIGHTS_INDEX)
    archive = int8.storage(directory, metadata) == "npz"
    if archive:
        _check_int8_index(index)
        files = [os.path.join(directory, INT8_WEIGHTS_FILE)]
    elif os.path.exists(index):
        files = sorted(set(_flatten(read_json_object(index).get("weight_map", {}).values())))
        files = [os.path.join(directory, name) for name in files]
    else:
        files = [os.path.join(directory, WEIGHTS_FILE)]
    for weights in files:
        if not os.path.exists(weights):
            raise PresetError(
                f"The preset directory {directory!r} has no weights file "
                f"{os.path.basename(weights)}. Load it with `load_weights=False` for "
                "random weights, or save the model again."
            )
        _check_regular(weights, WEIGHTS_LIMIT)
    for name, expected in checksums.items():
        weights = os.path.join(directory, name)
        if os.path.isfile(weights) and sha256(weights) != expected:
            raise PresetError(
                f"The weights file {weights!r} is corrupt: its SHA-256 is not the "
                f"one recorded in {METADATA_FILE} when it was saved. Copy the preset "
                "again or save the model again. (Weights replaced by hand on "
                f"purpose: delete {CHECKSUMS_KEY!r} from {METADATA_FILE}.)"
            )
    if archive:
        int8_legacy.check_file(files[0])
        return
    for weights in files:
        try:
            with h5py.File(weights, "r") as f:
                f.visit(lambda name: None)
        except Exception as error:  # h5py raises OSError, RuntimeError, KeyError...
            raise PresetError(
                f"The weights file {weights!r} is corrupt or truncated ({type(error).__name__}: {error}). "
                "Copy the preset again or save the model again."
            ) from error


def _check_int8_index(index):
    """The index through which keras-hub hands weights stored in int8 by
    earlier versions to `TransformerBackbone.load_weights`
    (presets/int8_legacy.py) is there and says so."""
    if not os.path.isfile(index):
        raise PresetError(
            f"The preset directory {os.path.dirname(index)!r} stores its weights in int8 but has no "
            f"{SHARDED_WEIGHTS_INDEX} (the index they load by): it is incomplete. Copy the preset "
            "again, or save the model again."
        )
    storage = read_json_object(index).get(STORAGE_KEY)
    if storage != "int8":
        raise PresetError(
            f"The preset file {index!r} is corrupt: it gives {STORAGE_KEY}={storage!r} for weights "
            f"stored in int8 ({INT8_WEIGHTS_FILE}). Copy the preset again, or save the model again."
        )


def _check_regular(path, limit):
    """`path` is a regular file of at most `limit` bytes (a link to a
    device or a FIFO would make its reader hang or fill the memory)."""
    try:
        check_regular_file(path, limit)
    except UnreadableFileError as error:
        raise PresetError(str(error)) from None


def weights_count(directory):
    """How many variables the weights files of a preset directory hold."""
    import h5py

    index = os.path.join(directory, SHARDED_WEIGHTS_INDEX)
    if os.path.exists(index):
        names = sorted(set(_flatten(read_json_object(index).get("weight_map", {}).values())))
    else:
        names = [WEIGHTS_FILE]
    count = 0
    for name in names:
        with h5py.File(os.path.join(directory, name), "r") as f:
            datasets = []
            f.visititems(lambda key, item: datasets.append(key) if isinstance(item, h5py.Dataset) else None)
            count += len(datasets)
    return count


def check_loaded(directory, backbone):
    """After loading: the weights files held exactly the backbone's
    variables. Keras loads layers by name and skips the ones a smaller model
    lacks without a word, so a config edited to fewer layers would load.
    (Weights stored in int8 were counted or matched variable by variable as
    they loaded: `int8.load_weights`, `int8_legacy.load_weights`.)"""
    if int8.stored_in_int8(directory):
        return
    expected, found = len(backbone.weights), weights_count(directory)
    if found != expected:
        raise weights_do_not_fit(
            directory,
            f"they hold {found} variables, the model built from the config has {expected} "
            f"(num_layers: {getattr(backbone, 'num_layers', '?')})",
        )


def _flatten(values):
    for value in values:
        if isinstance(value, list):
            yield from value
        else:
            yield value


def _check_tokenizer_assets(directory, tokenizer_config):
    """The vocabulary files exist and read; returns `(file, size)` of the
    vocabulary, or None when its size is not known here."""
    assets = os.path.join(directory, ASSETS_DIR, TOKENIZER_FILE.split(".")[0])
    files = sorted(glob.glob(os.path.join(assets, "*")))
    if not files:
        raise PresetError(
            f"The preset directory {directory!r} has a {TOKENIZER_FILE} but no "
            f"vocabulary in {os.path.join(ASSETS_DIR, 'tokenizer')}/: it is incomplete. "
            "Save the model again with `save_to_preset`."
        )
    class_name = tokenizer_config.get("class_name", "")
    size = None
    for file in files:
        _check_regular(file, VOCABULARY_LIMIT)
        if os.path.basename(file) == "vocab.json":  # a Marian tokenizer's ids
            vocabulary = read_json_object(file)
            size = (file, max(map(int, vocabulary.values()), default=-1) + 1)
        elif file.endswith(".spm") and "WordPiece" not in class_name:
            pieces = _check_sentencepiece(file)
            if "Marian" not in class_name:
                size = (file, pieces)
        elif "WordPiece" in class_name and file.endswith(".txt"):
            size = (file, len(read_text(file, VOCABULARY_LIMIT).splitlines()))
    return size


def _check_vocabulary_size(directory, backbone_config, file, size):
    expected = backbone_config.get("config", {}).get("vocabulary_size")
    if isinstance(expected, int) and expected != size:
        raise PresetError(
            f"The vocabulary {file!r} has {size} pieces, but the model in "
            f"{os.path.join(directory, CONFIG_FILE)!r} has vocabulary_size {expected}: the vocabulary "
            "belongs to another model. Copy the preset's own assets/tokenizer/ again, or save the model again."
        )


def _check_sentencepiece(file):
    """The number of pieces of a SentencePiece model file; an error if it
    does not read."""
    import sentencepiece

    proto = read_bytes(file, VOCABULARY_LIMIT)
    sentencepiece.set_min_log_level(2)  # no INFO lines on stderr
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size()
    except RuntimeError as error:
        raise PresetError(
            f"The vocabulary file {file!r} is corrupt (SentencePiece cannot read "
            f"it: {error}). Copy the preset again or save the model again."
        ) from error

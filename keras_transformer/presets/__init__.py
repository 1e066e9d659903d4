"""Presets: models saved by name or directory, and the ones this package ships.

A preset is a directory as keras-hub writes it (`config.json`,
`model.weights.h5`, `task.json`, `preprocessor.json`, `tokenizer.json`,
`assets/tokenizer/vocabulary.spm`, `metadata.json`). Every `from_preset` of
this package takes:

- the name of a preset shipped inside the package (no network needed):
  `TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de")`;
- a local directory written by `save_to_preset`;
- any handle keras-hub understands: `kaggle://owner/model/keras/variant`,
  `hf://owner/model`, `gs://...` (upload one with `keras_hub.upload_preset`);
- a Marian (opus-mt) checkpoint as transformers saves it, in a directory or
  as an `hf://` handle such as `hf://Helsinki-NLP/opus-mt-en-de`, converted
  on loading (`keras_transformer.convert.marian`).

`list_presets()` returns the shipped presets with their description, size and
scores; `keras-transformer presets` prints them.

This module also checks a preset before keras-hub reads it (an unknown name
lists the shipped ones; a missing or corrupt file is named) and saves presets
so that a save that fails halfway leaves the directory as it was.
"""

import contextlib
import fnmatch
import glob
import json
import os
import shutil
import tempfile
import threading

from keras_transformer.utils.files import sha256

PRESETS_DIR = os.path.dirname(os.path.abspath(__file__))

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "model.weights.h5"
SHARDED_WEIGHTS_INDEX = "model.weights.json"
SHARDED_WEIGHTS_FILES = "model_*.weights.h5"  # the shards the index names
# A backbone's weights, whole or sharded: a save of either replaces both,
# since keras-hub reads a whole `model.weights.h5` before an index.
WEIGHTS_ENTRIES = (WEIGHTS_FILE, SHARDED_WEIGHTS_INDEX, SHARDED_WEIGHTS_FILES)
TASK_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
PREPROCESSOR_FILE = "preprocessor.json"
TOKENIZER_FILE = "tokenizer.json"
ASSETS_DIR = "assets"
# metadata.json records the SHA-256 of each weights file a save writes.
CHECKSUMS_KEY = "weights_sha256"
# Everything a save writes: what an earlier save left and a new one does not
# write again is removed, so that a directory never mixes two presets.
PRESET_ENTRIES = (
    CONFIG_FILE, METADATA_FILE, *WEIGHTS_ENTRIES, TASK_FILE,
    TASK_WEIGHTS_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE, ASSETS_DIR,
)


class PresetError(ValueError):
    """A preset that cannot be found or read; the message says which file."""


def _shipped_directories():
    if not os.path.isdir(PRESETS_DIR):
        return {}
    return {
        name: os.path.join(PRESETS_DIR, name)
        for name in sorted(os.listdir(PRESETS_DIR))
        if os.path.isfile(os.path.join(PRESETS_DIR, name, CONFIG_FILE))
    }


def read_metadata(directory):
    """The `metadata.json` of a preset directory as a dict (empty if absent)."""
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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
        from keras_hub.src.utils.preset_utils import get_file

        try:
            path = get_file(preset, name)
        except Exception as error:
            raise FileNotFoundError(f"Could not read {name} of preset {preset!r}: {error}") from error
    else:
        raise FileNotFoundError(f"{preset!r} is neither a preset directory, a shipped preset nor a handle.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Preset {preset!r} has no {name}.")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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
        `parameter_count`, `scores` per test set, `decoding`, `training`,
        `data`, `languages`...), plus `size_bytes` (on disk) and `path`.

    Example:

    >>> from keras_transformer import presets
    >>> for name, info in presets.list_presets().items():
    ...     print(name, info["languages"])  # doctest: +SKIP
    transformer_multi30k_de_en {'source': 'de', 'target': 'en'}
    transformer_multi30k_en_de {'source': 'en', 'target': 'de'}
    """
    presets = {}
    for name, directory in _shipped_directories().items():
        info = read_metadata(directory)
        info["size_bytes"] = _size_on_disk(directory)
        info["path"] = directory
        presets[name] = info
    return presets


def keras_hub_registry():
    """The shipped presets in the form of keras-hub's `backbone_presets`.

    The `kaggle_handle` of each is its directory inside the package, so that
    keras-hub resolves the name with no network.
    """
    registry = {}
    for name, directory in _shipped_directories().items():
        info = read_metadata(directory)
        registry[name] = {
            "metadata": {
                "description": info.get("description", ""),
                "params": info.get("parameter_count"),
                "path": "transformer",
            },
            "kaggle_handle": directory,
        }
    return registry


def resolve(preset):
    """The local directory of a shipped preset name, or `preset` unchanged."""
    return _shipped_directories().get(preset, preset)


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
        shipped = ", ".join(_shipped_directories()) or "none are installed"
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
            configs[name] = _read_json(path(name))
    if PREPROCESSOR_FILE in configs and TOKENIZER_FILE not in configs:
        raise PresetError(
            f"The preset directory {directory!r} has a {PREPROCESSOR_FILE} but no "
            f"{TOKENIZER_FILE}: it is incomplete. Save the model again with `save_to_preset`."
        )
    if TOKENIZER_FILE in configs:
        _check_tokenizer_assets(directory, configs[TOKENIZER_FILE])
    if load_weights and "config" in needs:
        _check_weights(directory, configs.get(METADATA_FILE, {}).get(CHECKSUMS_KEY, {}))


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PresetError(
            f"The preset file {path!r} is corrupt (not valid JSON: {error}). "
            "Save the model again with `save_to_preset`, or copy the file again."
        ) from error
    if not isinstance(config, dict):
        raise PresetError(f"The preset file {path!r} is corrupt: it holds no JSON object.")
    return config


def _check_weights(directory, checksums):
    """Each weights file exists, is readable HDF5 and, where the metadata
    records its SHA-256 (every save of this package does), matches it: HDF5
    would read a file with damaged bytes inside a tensor without error."""
    import h5py

    index = os.path.join(directory, SHARDED_WEIGHTS_INDEX)
    if os.path.exists(index):
        files = sorted(set(_flatten(_read_json(index).get("weight_map", {}).values())))
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
        try:
            with h5py.File(weights, "r") as f:
                f.visit(lambda name: None)
        except OSError as error:
            raise PresetError(
                f"The weights file {weights!r} is corrupt or truncated ({error}). "
                "Copy the preset again or save the model again."
            ) from error
    for name, expected in (checksums if isinstance(checksums, dict) else {}).items():
        weights = os.path.join(directory, name)
        if os.path.isfile(weights) and sha256(weights) != expected:
            raise PresetError(
                f"The weights file {weights!r} is corrupt: its SHA-256 is not the "
                f"one recorded in {METADATA_FILE} when it was saved. Copy the preset "
                "again or save the model again. (Weights replaced by hand on "
                f"purpose: delete {CHECKSUMS_KEY!r} from {METADATA_FILE}.)"
            )


def _matching(directory, patterns):
    """The names in `directory` that match any of `patterns` (names or glob
    patterns such as `SHARDED_WEIGHTS_FILES`)."""
    return {name for name in os.listdir(directory) if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


def _flatten(values):
    for value in values:
        if isinstance(value, list):
            yield from value
        else:
            yield value


def _check_tokenizer_assets(directory, tokenizer_config):
    assets = os.path.join(directory, ASSETS_DIR, TOKENIZER_FILE.split(".")[0])
    files = glob.glob(os.path.join(assets, "*"))
    if not files:
        raise PresetError(
            f"The preset directory {directory!r} has a {TOKENIZER_FILE} but no "
            f"vocabulary in {os.path.join(ASSETS_DIR, 'tokenizer')}/: it is incomplete. "
            "Save the model again with `save_to_preset`."
        )
    class_name = tokenizer_config.get("class_name", "")
    for file in files:
        if file.endswith(".spm") and "WordPiece" not in class_name:
            _check_sentencepiece(file)


def _check_sentencepiece(file):
    import sentencepiece

    with open(file, "rb") as f:
        proto = f.read()
    sentencepiece.set_min_log_level(2)  # no INFO lines on stderr
    try:
        sentencepiece.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as error:
        raise PresetError(
            f"The vocabulary file {file!r} is corrupt (SentencePiece cannot read "
            f"it: {error}). Copy the preset again or save the model again."
        ) from error


_saving = threading.local()


@contextlib.contextmanager
def saving(preset_dir, metadata=None, replaces=PRESET_ENTRIES):
    """Writes a preset into a fresh directory, then moves it into place.

    Yields the directory to write into. On success the written files replace
    those of a preset already in `preset_dir`; if writing fails,
    `preset_dir` is left exactly as it was and the partial files are
    deleted. Nested saves (a task saving its backbone) write into the outer
    save's directory.

    Args:
        preset_dir: where the preset goes.
        metadata: a dict merged into `metadata.json` after the save (into
            the one already in `preset_dir` if the save writes none).
        replaces: the files of an older preset in `preset_dir` (names or
            glob patterns) that go even if this save does not write them.
            A whole preset (a
            task's) replaces all preset files, so that none of an older
            model is left; a part saved beside the others, as keras-hub
            assembles a preset (a backbone, then its tokenizer), replaces
            fewer. Files that are not preset files always stay.
    """
    if getattr(_saving, "active", False):
        yield preset_dir
        return
    preset_dir = os.path.abspath(os.fspath(preset_dir))
    if os.path.exists(preset_dir) and not os.path.isdir(preset_dir):
        raise PresetError(f"Cannot save a preset to {preset_dir!r}: it is a file, not a directory.")
    parent = os.path.dirname(preset_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(preset_dir)}.saving-", dir=parent)
    _saving.active = True
    try:
        yield staging
        weights = sorted(_matching(staging, (WEIGHTS_FILE, SHARDED_WEIGHTS_FILES, TASK_WEIGHTS_FILE)))
        if weights:  # written with the metadata.json they are recorded in
            checksums = {CHECKSUMS_KEY: {name: sha256(os.path.join(staging, name)) for name in weights}}
            metadata = {**(metadata or {}), **checksums}
        if metadata:
            _merge_metadata(staging, metadata, preset_dir)
        _move_into_place(staging, preset_dir, replaces)
    finally:
        _saving.active = False
        shutil.rmtree(staging, ignore_errors=True)


def _merge_metadata(directory, metadata, previous_dir):
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path) and os.path.isfile(os.path.join(previous_dir, METADATA_FILE)):
        shutil.copyfile(os.path.join(previous_dir, METADATA_FILE), path)
    current = read_metadata(directory)
    current.update(metadata)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(current, f, indent=4, ensure_ascii=False)


def _move_into_place(staging, preset_dir, replaces):
    os.makedirs(preset_dir, exist_ok=True)
    written = set(os.listdir(staging))
    replaced = written | _matching(preset_dir, replaces)
    # Set the old preset's entries aside first, so that a failure while
    # moving can put them back.
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(preset_dir)}.previous-", dir=os.path.dirname(preset_dir))
    moved_aside, moved_in = [], []
    try:
        for name in sorted(replaced):
            if os.path.lexists(os.path.join(preset_dir, name)):
                os.replace(os.path.join(preset_dir, name), os.path.join(aside, name))
                moved_aside.append(name)
        for name in sorted(written):
            os.replace(os.path.join(staging, name), os.path.join(preset_dir, name))
            moved_in.append(name)
    except BaseException:
        for name in moved_in:
            os.replace(os.path.join(preset_dir, name), os.path.join(staging, name))
        for name in moved_aside:
            os.replace(os.path.join(aside, name), os.path.join(preset_dir, name))
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


class PresetIO:
    """`from_preset` and `save_to_preset` with the checks of this module.

    Mixed into the backbone, tokenizer, preprocessor and task classes in
    front of their keras-hub base: loading checks the preset first (see
    `check`), saving goes through `saving`, and `save_to_preset` takes a
    `metadata` dict to record in `metadata.json`.
    """

    preset_needs = ("config",)

    @classmethod
    def from_preset(cls, preset, *args, **kwargs):
        # keras-hub's loader has no public hook for another checkpoint
        # format (it raises "no converter" for Marian), so Marian
        # directories and hf:// handles are converted here.
        from keras_transformer.convert import marian

        if not args and marian.is_marian(preset):
            return marian.from_preset(cls, os.fspath(preset), **kwargs)
        check(preset, cls.preset_needs, kwargs.get("load_weights", True))
        loaded = super().from_preset(resolve(os.fspath(preset)), *args, **kwargs)
        if getattr(loaded, "_compile_defaults_after_loading", False):
            # keras-hub compiles a task when it builds it, before it loads
            # the tokenizer's vocabulary: the default loss must ignore the
            # vocabulary's padding id, known only now.
            loaded.compile()
        return loaded

    def save_to_preset(self, preset_dir, *args, metadata=None, **kwargs):
        import keras_hub

        backbone = getattr(self, "backbone", self)
        if isinstance(backbone, keras_hub.models.Backbone):  # it writes metadata.json
            metadata = {"tasks": _task_names(type(backbone)), **(metadata or {})}
        # A task writes a whole preset. A backbone, tokenizer or
        # preprocessor writes one part beside the others; a new backbone
        # makes an older task's files (which hold its config) wrong.
        if isinstance(self, keras_hub.models.Task):
            replaces = PRESET_ENTRIES
        elif isinstance(self, keras_hub.models.Backbone):
            replaces = (TASK_FILE, TASK_WEIGHTS_FILE, *WEIGHTS_ENTRIES)
        else:
            replaces = ()
        with saving(preset_dir, metadata, replaces) as directory:
            super().save_to_preset(directory, *args, **kwargs)


def _task_names(backbone_cls):
    # keras-hub lists the tasks of a backbone by each task class's first
    # base, which is `PresetIO` here: name the keras-hub bases instead.
    from keras_hub.src.models.task import Task
    from keras_hub.src.utils.preset_utils import list_subclasses

    return sorted({
        base.__name__
        for task in list_subclasses(Task) if getattr(task, "backbone_cls", None) is backbone_cls
        for base in task.__bases__ if base is not PresetIO
    })

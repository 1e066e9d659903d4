"""Saving a preset so that a save that fails halfway leaves the directory as
it was."""

import contextlib
import json
import os
import shutil
import threading

from keras_transformer.presets.layout import CHECKSUMS_KEY
from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import METADATA_FILE
from keras_transformer.presets.layout import PRESET_ENTRIES
from keras_transformer.presets.layout import PREPROCESSOR_FILE
from keras_transformer.presets.layout import SHARDED_WEIGHTS_FILES
from keras_transformer.presets.layout import TASK_FILE
from keras_transformer.presets.layout import TASK_WEIGHTS_FILE
from keras_transformer.presets.layout import TOKENIZER_FILE
from keras_transformer.presets.layout import WEIGHTS_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import read_metadata
from keras_transformer.utils.files import matching
from keras_transformer.utils.files import move_into_place
from keras_transformer.utils.files import reporting_full_disk
from keras_transformer.utils.files import sha256
from keras_transformer.utils.files import staging_directory
from keras_transformer.utils.locks import locked

_saving = threading.local()


@contextlib.contextmanager
def saving(preset_dir, metadata=None, replaces=PRESET_ENTRIES):
    """Writes a preset into a fresh directory, then moves it into place.

    Yields the directory to write into. On success the written files replace
    those of a preset already in `preset_dir`; if writing fails,
    `preset_dir` is left exactly as it was and the partial files are
    deleted. Nested saves (a task saving its backbone) write into the outer
    save's directory, merging their `metadata` into the metadata.json there.
    The save holds `preset_dir`'s lock (`keras_transformer.utils.locks`):
    a save into a directory that another writer holds is a
    `DirectoryInUseError`.

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
        if metadata:  # also an ensemble member's own metadata.json (presets/ensembles.py)
            _record(preset_dir, metadata, preset_dir)
        return
    if not isinstance(preset_dir, (str, os.PathLike)) or not os.fspath(preset_dir):
        raise PresetError(f"Cannot save a preset to {preset_dir!r}: give the path of a directory.")
    preset_dir = os.path.abspath(os.path.expanduser(os.fspath(preset_dir)))
    if os.path.exists(preset_dir) and not os.path.isdir(preset_dir):
        raise PresetError(f"Cannot save a preset to {preset_dir!r}: it is a file, not a directory.")
    # One writer at a time (utils/locks.py): a second save into the
    # directory fails at once rather than mixing its files with the first's.
    with locked(preset_dir, "save_to_preset"):
        _check_replaceable(preset_dir)
        _saving.active = True
        try:
            with reporting_full_disk("saving the preset to", preset_dir), staging_directory(preset_dir, "saving") as staging:
                yield staging
                _record(staging, metadata, preset_dir)
                move_into_place(staging, preset_dir, replaces)
        finally:
            _saving.active = False


def _check_replaceable(preset_dir):
    """Refuses to save into a directory that holds files with a preset
    file's name (a config.json, an assets/ folder) but no preset: they are
    the user's own, not an earlier save's, and a save would replace them."""
    if not os.path.isdir(preset_dir):
        return
    replaced = sorted(matching(preset_dir, PRESET_ENTRIES))
    if not replaced or any(_written_by_keras(os.path.join(preset_dir, name)) for name in _KERAS_FILES):
        return
    raise PresetError(
        f"Cannot save a preset to {preset_dir!r}: it holds {', '.join(replaced)}, which a save "
        "would replace, but no preset of an earlier save. Choose a new or empty directory, "
        "or move those files away first."
    )


# Files that mark a directory as a preset: a Keras object's config, or the
# metadata.json that keras-hub writes with its Keras version.
_KERAS_FILES = (CONFIG_FILE, TASK_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE, METADATA_FILE)


def _written_by_keras(path):
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and ("class_name" in content or "keras_version" in content)


def record(directory, metadata=None):
    """Merges `metadata` and the SHA-256 of each weights file in
    `directory` into its metadata.json (for files changed inside a
    `saving` block, such as an ensemble member's weights stored anew)."""
    _record(directory, metadata, directory)


def _record(directory, metadata, previous_dir):
    """Merges `metadata` and the SHA-256 of the weights written into
    `directory` into its metadata.json."""
    names = (WEIGHTS_FILE, SHARDED_WEIGHTS_FILES, INT8_WEIGHTS_FILE, TASK_WEIGHTS_FILE)
    weights = sorted(matching(directory, names))
    if weights:  # written with the metadata.json they are recorded in
        checksums = {CHECKSUMS_KEY: {name: sha256(os.path.join(directory, name)) for name in weights}}
        metadata = {**(metadata or {}), **checksums}
    if metadata:
        _merge_metadata(directory, metadata, previous_dir)


def _merge_metadata(directory, metadata, previous_dir):
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path) and os.path.isfile(os.path.join(previous_dir, METADATA_FILE)):
        shutil.copyfile(os.path.join(previous_dir, METADATA_FILE), path)
    current = read_metadata(directory)
    current.update(metadata)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(current, f, indent=4, ensure_ascii=False)



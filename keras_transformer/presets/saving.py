"""Saving a preset so that a save that fails halfway leaves the directory as
it was."""

import contextlib
import json
import os
import shutil
import threading

from keras_transformer.presets.layout import CHECKSUMS_KEY
from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import METADATA_FILE
from keras_transformer.presets.layout import PRESET_ENTRIES
from keras_transformer.presets.layout import SHARDED_WEIGHTS_FILES
from keras_transformer.presets.layout import TASK_WEIGHTS_FILE
from keras_transformer.presets.layout import WEIGHTS_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import read_metadata
from keras_transformer.utils.files import matching
from keras_transformer.utils.files import move_into_place
from keras_transformer.utils.files import reporting_full_disk
from keras_transformer.utils.files import sha256
from keras_transformer.utils.files import staging_directory

_saving = threading.local()


@contextlib.contextmanager
def saving(preset_dir, metadata=None, replaces=PRESET_ENTRIES):
    """Writes a preset into a fresh directory, then moves it into place.

    Yields the directory to write into. On success the written files replace
    those of a preset already in `preset_dir`; if writing fails,
    `preset_dir` is left exactly as it was and the partial files are
    deleted. Nested saves (a task saving its backbone) write into the outer
    save's directory, merging their `metadata` into the metadata.json there.

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
    preset_dir = os.path.abspath(os.fspath(preset_dir))
    if os.path.exists(preset_dir) and not os.path.isdir(preset_dir):
        raise PresetError(f"Cannot save a preset to {preset_dir!r}: it is a file, not a directory.")
    _saving.active = True
    try:
        with reporting_full_disk("saving the preset to", preset_dir), staging_directory(preset_dir, "saving") as staging:
            yield staging
            _record(staging, metadata, preset_dir)
            move_into_place(staging, preset_dir, replaces)
    finally:
        _saving.active = False


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



"""A training run's directory, which makes the run resumable after a kill
(section 5): its `run.json` (read back, and written with the run's
settings), the checks that a run started again keeps its settings and its
start, its epochs and random seeds, and its tokenizer (trained for the run,
or a preset's), kept so that a resumed run reads the same vocabulary.

`keras_transformer.training.train_multi30k` trains with them.
"""

import contextlib
import json
import math
import os
import shutil
import warnings

import keras
import numpy as np

from keras_transformer.models import TransformerTokenizer
from keras_transformer.models import train_tokenizer
from keras_transformer.models.transformer.backbone import check_heads
from keras_transformer.presets import CONFIG_FILE
from keras_transformer.presets import preset_metadata
from keras_transformer.presets import read_preset_file
from keras_transformer.train_config import PRESET_OVERRIDES
from keras_transformer.train_config import fixed_setting_names
from keras_transformer.utils.files import written_atomically

TOKENIZER_FILE = "tokenizer.spm"
# Where a run keeps a tokenizer that is not a SentencePiece model of its own.
TOKENIZER_DIR = "tokenizer"


def read_run(output_dir):
    """The `run.json` of a run that started before (empty if none)."""
    run_file = os.path.join(output_dir, "run.json")
    if not os.path.exists(run_file):
        return {}
    try:
        with open(run_file, encoding="utf-8") as f:
            run = json.load(f)
        problem = None if isinstance(run, dict) else "not a JSON object"
    except ValueError as error:  # JSON's errors and UnicodeDecodeError
        problem = str(error)
    if problem is not None:
        raise ValueError(
            f"{run_file} is damaged ({problem}): it records how the run in that directory started, so the "
            "run cannot be resumed without it. Restore the file, or choose a new output directory (the "
            "directory's checkpoints are left as they are)."
        )
    return run


def check_run_start(output_dir, run, initial_preset):
    """Refuses to resume the run in `output_dir` (its run.json: `run`) with
    another start than it had: a run from a preset must be resumed from that
    preset, a run from scratch from scratch (their vocabularies and steps
    differ)."""
    if not run:
        return
    started_from = run.get("initial_preset")
    if _same_preset(started_from, initial_preset):
        return
    if started_from:
        raise ValueError(
            f"{output_dir} holds a run that started from preset {started_from!r}; resume it with "
            f"initial_preset={started_from!r} (--from-preset {started_from}), or choose a new output directory."
        )
    raise ValueError(
        f"{output_dir} holds a run trained from scratch; it cannot go on from preset {initial_preset!r}. "
        "Choose a new output directory to start from the preset."
    )


def _same_preset(a, b):
    if a == b:
        return True
    return bool(a and b and os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b))


# Settings a resumed run must keep: they make its vocabulary, weights,
# batches (hence epochs) and schedule (`TrainConfig`'s fixed fields).
RUN_FIXED = fixed_setting_names()


def check_same_settings(output_dir, run, settings, backbone_config):
    """Refuses to resume the run in `output_dir` (its run.json: `run`) with
    settings that differ from those it started with, before any work and
    before run.json changes."""
    if not run:
        return
    changed = [key for key in RUN_FIXED if key in run and key in settings and run[key] != settings[key]]
    if backbone_config is not None and _architecture(run.get("backbone")) != _architecture(backbone_config):
        changed.append("the architecture")
    if changed:
        was = ", ".join(f"{key}={run[key]!r}" for key in changed if key in run)
        raise ValueError(
            f"{output_dir} holds a run started with other settings (changed: {', '.join(changed)}"
            + (f"; the run has {was}" if was else "")
            + "). Resume it with its own settings, or choose a new output directory."
        )


def _architecture(backbone_config):
    return {key: value for key, value in (backbone_config or {}).items() if key not in PRESET_OVERRIDES}


def check_arguments(config, scratch_backbone):
    """Refuses settings that would fail later, before the run writes
    anything: each setting in its range, and heads that divide d_model."""
    config.check()
    if not config.initial_preset and (config.source_language or config.target_language):
        raise ValueError(
            "source_language and target_language (--source-language, --target-language) are for runs from a "
            "preset of a multilingual model (--from-preset); a run from scratch translates --source to --target."
        )
    if scratch_backbone is not None:
        check_heads(scratch_backbone["d_model"], scratch_backbone["num_heads"], scratch_backbone.get("key_dim"))


@contextlib.contextmanager
def removed_on_failure(output_dir):
    """Removes what a run's start created in `output_dir` (the directory
    itself, if it was not there) if the start fails, and nothing that was
    there before: a failed start leaves the directory as it found it."""
    existed = os.path.isdir(output_dir)
    before = set(os.listdir(output_dir)) if existed else set()
    try:
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(output_dir, ignore_errors=True)
        elif os.path.isdir(output_dir):
            for name in set(os.listdir(output_dir)) - before:
                path = os.path.join(output_dir, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.remove(path)
        raise


def epoch_plan(num_batches, epochs, steps, previous_run):
    """`(epochs, steps_per_epoch)` of a run of `epochs` passes over
    `num_batches` batches, or of `steps` steps if given: epochs of at most one
    pass, as many as `steps` needs (rounded up to whole epochs). A run that
    started before keeps its epoch length, so that its checkpoints' steps map
    to the same epochs and a rerun with a larger `steps` trains on to that
    total."""
    if not steps:
        return epochs, num_batches
    steps_per_epoch = min(num_batches, previous_run.get("steps_per_epoch") or steps)
    return math.ceil(steps / steps_per_epoch), steps_per_epoch


def seed_at(seed, step):
    """The random seed of a run started again at `step`: another one for
    each step, so that dropout does not draw the masks it drew before."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def run_tokenizer(config, output_dir, previous_run, data, save):
    """The run's tokenizer and, for a run from a preset, the preset's
    training record; sets `config.initial_step` (and, from a preset, its
    `max_sequence_length`)."""
    initial_training = None
    if config.initial_preset:
        tokenizer, preset_step, initial_training = _initial_preset(
            config.initial_preset, output_dir, previous_run, config, save=save
        )
        if config.initial_step is None and preset_step is None:
            warnings.warn(
                f"The metadata of preset {config.initial_preset!r} does not say how many steps it was "
                "trained for, so the learning-rate schedule starts again from step 0 (warming up again); "
                "pass initial_step (--initial-step) to go on from another step.",
                stacklevel=3,
            )
        if config.initial_step is None:
            config.initial_step = preset_step
        preset_config = read_preset_file(config.initial_preset, CONFIG_FILE)["config"]
        config.max_sequence_length = preset_config["max_sequence_length"]
    else:
        sources, targets = data[:2]
        tokenizer = load_or_train_tokenizer(
            output_dir, previous_run, sources + targets, config.vocabulary_size, config.tokenizer_algorithm,
            save=save,
        )
    config.initial_step = config.initial_step or 0
    return tokenizer, initial_training


def pair_languages(tokenizer, config):
    """Sets a multilingual preset's tokenizer (M2M100, NLLB-200) to frame
    the run's pairs with their codes (`source_language` and
    `target_language`, else the model's codes for `source` and `target`):
    sources `[source code] text </s>`, targets `[target code] text </s>`,
    as the checkpoint was trained, and the saved model translates the pair
    by default. Languages for another model are refused."""
    from keras_transformer.models.transformer.languages import model_languages
    from keras_transformer.models.transformer.languages import resolve_language

    codes = model_languages(tokenizer)
    if not codes or not hasattr(tokenizer, "language_id"):
        given = [f"{name}={value!r}" for name, value in
                 (("source_language", config.source_language), ("target_language", config.target_language)) if value]
        if given:
            raise ValueError(
                f"{', '.join(given)}: the languages of a run are for presets of multilingual models (M2M100, "
                "NLLB-200, converted with `keras-transformer convert`); this run's model has none."
            )
        return
    tokenizer.source_language = resolve_language(config.source_language or config.source, codes, "source_language")
    tokenizer.target_language = resolve_language(config.target_language or config.target, codes, "target_language")


def save_run_tokenizer(tokenizer, output_dir):
    """Keeps the run's tokenizer in `output_dir`, as `load_run_tokenizer`
    reads it: a SentencePiece model (`tokenizer.spm`), or another
    tokenizer's config and files (`tokenizer/`: an imported model's)."""
    if isinstance(tokenizer, TransformerTokenizer):
        with written_atomically(os.path.join(output_dir, TOKENIZER_FILE)) as partial, open(partial, "wb") as f:
            f.write(tokenizer.proto)
        return
    directory = os.path.join(output_dir, TOKENIZER_DIR)
    shutil.rmtree(directory, ignore_errors=True)  # (left by a start that failed)
    with written_atomically(directory) as partial:
        os.makedirs(partial)
        tokenizer.save_assets(partial)
        with open(os.path.join(partial, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(keras.saving.serialize_keras_object(tokenizer), f)


def load_run_tokenizer(output_dir):
    """The tokenizer that `save_run_tokenizer` kept in `output_dir`, or
    None if it kept none."""
    if os.path.exists(os.path.join(output_dir, TOKENIZER_FILE)):
        return TransformerTokenizer(proto=os.path.join(output_dir, TOKENIZER_FILE))
    directory = os.path.join(output_dir, TOKENIZER_DIR)
    if not os.path.isdir(directory):
        return None
    with open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as f:
        tokenizer = keras.saving.deserialize_keras_object(json.load(f))
    tokenizer.load_assets(directory)
    return tokenizer


def load_or_train_tokenizer(output_dir, run, texts, vocabulary_size, algorithm, save=True):
    """Loads the tokenizer of the run that started in `output_dir` (its
    run.json: `run`), or trains (and with `save`, saves) it on the first
    start, so that a resumed run keeps the same vocabulary. A tokenizer file
    without run.json is left by a start that failed (a preset's, or one of
    other settings) and is replaced."""
    path = os.path.join(output_dir, TOKENIZER_FILE)
    if run and os.path.exists(path):
        return TransformerTokenizer(proto=path)
    if algorithm == "wordpiece":
        raise ValueError("train_multi30k supports the SentencePiece algorithms 'bpe' and 'unigram'.")
    tokenizer = train_tokenizer(texts, vocabulary_size, algorithm)
    if not save:
        return tokenizer
    with written_atomically(path) as partial, open(partial, "wb") as f:
        f.write(tokenizer.proto)
    return tokenizer


def _initial_preset(preset, output_dir, run, config, save=True):
    """The tokenizer, training step and training record of a preset that a
    run starts from (`run`: the run.json of the run in `output_dir`, empty
    for a new run).

    The run keeps the preset's vocabulary (its embeddings are indexed by
    it), saved as the run's own tokenizer so that a resumed run reads the
    same one. The step is the number of steps the preset was trained for
    (see `preset_steps`), so that the learning-rate schedule goes on from
    where the preset's training left it rather than warming up again. The
    record is the preset's metadata `training` block, kept in the run's
    `run.json` (as `initial_training`) to describe the whole training later.
    """
    kept = load_run_tokenizer(output_dir) if run else None
    if kept is not None:
        # A run that started before: its own vocabulary, first step and
        # record, even if the preset has changed since (a newer version of a
        # shipped one).
        return kept, int(run.get("initial_step") or 0), run.get("initial_training")
    tokenizer = TransformerTokenizer.from_preset(preset)
    pair_languages(tokenizer, config)
    source, target = config.source, config.target
    metadata = preset_metadata(preset)
    languages = metadata.get("languages", {})
    if languages and (languages.get("source"), languages.get("target")) != (source, target):
        warnings.warn(
            f"Preset {preset!r} translates {languages.get('source')}-{languages.get('target')}; "
            f"training it on {source}-{target} keeps its vocabulary, which may cover "
            f"{source} or {target} poorly.",
            stacklevel=3,
        )
    training = metadata.get("training") or None
    steps = preset_steps(preset, training or {})
    if save:  # after the checks that may refuse the preset: nothing left behind
        save_run_tokenizer(tokenizer, output_dir)
    return tokenizer, steps, training


def preset_steps(preset, training):
    """The steps a preset was trained for, from its metadata's `training`
    block: `steps`, else its `initial_step` plus `epochs` times
    `steps_per_epoch`; None if the metadata does not say. Of an ensemble
    preset, whose `steps` lists each model's, the first model's: the one
    a run starts from."""
    steps = training.get("steps")
    if isinstance(steps, list):
        steps = steps[0] if steps else None
    if steps is not None:
        return int(steps)
    settings = training.get("settings", training)
    if settings.get("epochs") and settings.get("steps_per_epoch"):
        return int(settings.get("initial_step") or 0) + settings["epochs"] * settings["steps_per_epoch"]
    return None


def run_record(config, model, scratch_backbone, initial_training, train_batches, epochs, steps_per_epoch):
    """The run's `run.json`: its settings and what they made."""
    backbone_config = scratch_backbone
    if config.initial_preset:
        skip = ("name", "trainable", "dtype", "vocabulary_size")
        backbone_config = {key: value for key, value in model.backbone.get_config().items() if key not in skip}
    return {
        "data": f"Multi30k task 1 train, {config.source}-{config.target}",
        **config.fixed_settings(),
        "initial_preset": config.initial_preset,
        "initial_step": config.initial_step,
        "initial_training": initial_training,
        "backbone": backbone_config,
        "vocabulary_size": model.backbone.vocabulary_size,
        "epochs": epochs,
        "steps_per_epoch": steps_per_epoch,
        "steps": config.steps,  # asked for (None: `epochs` whole passes); not kept across reruns
        "keep_checkpoints": config.keep_checkpoints,
        "padding_fraction": round(train_batches.padding_fraction(), 4),
        "backend": keras.config.backend(),
        "dtype": config.dtype,
    }

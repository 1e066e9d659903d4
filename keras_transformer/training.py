"""Training a translation model on Multi30k with the paper's recipe
(section 5), resumable after a kill, ending in an averaged model (6.1).

`keras-transformer train` is a thin command line around `train_multi30k`;
`examples/train_multi30k.py` spells out the same steps.
"""

import contextlib
import json
import math
import os
import shutil
import warnings

import keras
import numpy as np

from keras_transformer.callbacks import BleuEvaluation
from keras_transformer.callbacks import KeepLastCheckpoints
from keras_transformer.callbacks import average_checkpoints
from keras_transformer.callbacks import checkpoint_step
from keras_transformer.callbacks import list_checkpoints
from keras_transformer.data import token_budget_batches
from keras_transformer.datasets import multi30k
from keras_transformer.models import CONFIGS
from keras_transformer.models import PAPER_TABLE3
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models import TransformerTokenizer
from keras_transformer.models import train_tokenizer
from keras_transformer.presets import CONFIG_FILE
from keras_transformer.presets import read_preset_file
from keras_transformer.schedules import paper_optimizer

TOKENIZER_FILE = "tokenizer.spm"


def _tokenizer(output_dir, run, texts, vocabulary_size, algorithm, save=True):
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
    with open(path + ".partial", "wb") as f:
        f.write(tokenizer.proto)
    os.replace(path + ".partial", path)
    return tokenizer


def _continue_from_checkpoint(backup_dir, checkpoint_dir, steps_per_epoch, initial_step=0):
    """Lets a finished run train longer.

    `keras.callbacks.BackupAndRestore` deletes its backup when `fit` ends, so
    a finished run rerun with a larger `epochs` would start again from
    scratch. Its newest checkpoint holds the model's and the optimizer's
    state (Adam's moments and step, hence the learning-rate schedule's
    position), so it becomes the backup, and `fit` goes on from the epoch
    after it.
    """
    checkpoints = list_checkpoints(checkpoint_dir)
    if os.path.exists(backup_dir) or not checkpoints:
        return
    newest = checkpoints[-1]
    step = checkpoint_step(newest)
    epoch = (step - initial_step) // steps_per_epoch
    # Written beside and moved into place, so that a kill halfway leaves no
    # empty backup (which would restart the run from its first epoch).
    partial = backup_dir + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    shutil.copyfile(newest, os.path.join(partial, "latest.weights.h5"))
    with open(os.path.join(partial, "training_metadata.json"), "w") as f:
        json.dump({"epoch": epoch, "batch": 0}, f)
    os.replace(partial, backup_dir)
    print(f"Continuing from {newest} (step {step}, after epoch {epoch}).")


def _finished_epochs(backup_dir):
    """Epochs a run's `BackupAndRestore` backup has finished (0 if none)."""
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f)["epoch"])


def _seed_at(seed, step):
    """The random seed of a run started again at `step`: another one for
    each step, so that dropout does not draw the masks it drew before."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


# Backbone arguments a run from a preset may change: the others shape its
# weights.
PRESET_OVERRIDES = ("dropout", "attention_dropout")


def _same_preset(a, b):
    if a == b:
        return True
    return bool(a and b and os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b))


def _read_run(output_dir):
    """The `run.json` of a run that started before (empty if none)."""
    run_file = os.path.join(output_dir, "run.json")
    if not os.path.exists(run_file):
        return {}
    with open(run_file) as f:
        return json.load(f)


def _epoch_plan(num_batches, epochs, steps, previous_run):
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


# Settings a resumed run must keep: they make its vocabulary, weights,
# batches (hence epochs) and schedule. Others (epochs, steps, dropout,
# keep_checkpoints, bleu_sentences) may change from one call to the next.
RUN_FIXED = (
    "source", "target", "config", "tokenizer_algorithm", "max_tokens", "pad_to_multiple_of", "limit",
    "seed", "warmup_steps", "learning_rate_scale", "label_smoothing", "initial_step", "vocabulary_size",
)


def _architecture(backbone_config):
    return {key: value for key, value in (backbone_config or {}).items() if key not in PRESET_OVERRIDES}


def _check_same_settings(output_dir, run, settings, backbone_config):
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


def _check_run_start(output_dir, run, initial_preset):
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


def _preset_steps(preset, training):
    """The steps a preset was trained for, from its metadata's `training`
    block: `steps`, else its `initial_step` plus `epochs` times
    `steps_per_epoch`; None if the metadata does not say."""
    if training.get("steps") is not None:
        return int(training["steps"])
    settings = training.get("settings", training)
    if settings.get("epochs") and settings.get("steps_per_epoch"):
        return int(settings.get("initial_step") or 0) + settings["epochs"] * settings["steps_per_epoch"]
    return None


def _initial_preset(preset, output_dir, run, source, target, save=True):
    """The tokenizer, training step and training record of a preset that a
    run starts from (`run`: the run.json of the run in `output_dir`, empty
    for a new run).

    The run keeps the preset's vocabulary (its embeddings are indexed by
    it), saved as the run's own tokenizer so that a resumed run reads the
    same one. The step is the number of steps the preset was trained for
    (see `_preset_steps`), so that the learning-rate schedule goes on from
    where the preset's training left it rather than warming up again. The
    record is the preset's metadata `training` block, kept in the run's
    `run.json` (as `initial_training`) to describe the whole training later.
    """
    from keras_transformer.presets import preset_metadata

    path = os.path.join(output_dir, TOKENIZER_FILE)
    if os.path.exists(path) and run:
        # A run that started before: its own vocabulary, first step and
        # record, even if the preset has changed since (a newer version of a
        # shipped one).
        return TransformerTokenizer(proto=path), int(run.get("initial_step") or 0), run.get("initial_training")
    tokenizer = TransformerTokenizer.from_preset(preset)
    if save:
        with open(path + ".partial", "wb") as f:
            f.write(tokenizer.proto)
        os.replace(path + ".partial", path)
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
    return tokenizer, _preset_steps(preset, training or {}), training


def train_multi30k(
    output_dir,
    source="en",
    target="de",
    data_dir=None,
    config="small",
    vocabulary_size=8000,
    tokenizer_algorithm="bpe",
    max_tokens=4096,
    pad_to_multiple_of=1,
    epochs=20,
    steps=None,
    warmup_steps=4000,
    learning_rate_scale=1.0,
    label_smoothing=None,
    max_sequence_length=256,
    keep_checkpoints=5,
    bleu_sentences=200,
    limit=None,
    validation_limit=None,
    seed=0,
    verbose="auto",
    extra_callbacks=(),
    strategy=None,
    initial_preset=None,
    initial_step=None,
    **config_overrides,
):
    """Trains a `TransformerSeq2SeqLM` on Multi30k and saves it as a preset.

    The run lives in `output_dir`: the tokenizer, TensorBoard logs in
    `logs/`, the state for resuming in `backup/`, the last
    `keep_checkpoints` checkpoints in `checkpoints/`, and at the end the
    model with averaged weights as a keras-hub preset in `model/`. Calling
    it again with the same `output_dir` after a kill resumes from the last
    finished epoch; calling it again after it finished, with a larger
    `epochs`, trains on from its newest checkpoint (optimizer state and
    learning-rate schedule included).

    Args:
        output_dir: the run's directory.
        source: source language.
        target: target language.
        data_dir: local Multi30k directory (see `datasets.multi30k`).
        config: a name from `keras_transformer.models.CONFIGS`.
        vocabulary_size: size of the shared subword vocabulary.
        tokenizer_algorithm: `"bpe"` or `"unigram"`.
        max_tokens: token budget per batch (source and target each).
        pad_to_multiple_of: round batch lengths up to a multiple of this;
            larger values mean fewer distinct shapes to compile (JAX) at the
            cost of more padding.
        epochs: passes over the training data.
        steps: if given, train this many steps instead of `epochs` passes
            (rounded up to whole epochs of at most one pass each; rerun with
            a larger `steps`, a run trains on to the new total).
        warmup_steps: warm-up steps of the learning-rate schedule.
        learning_rate_scale: factor on the schedule.
        label_smoothing: eps_ls; default: the config's Table 3 value
            (0.0 for `D3`, 0.2 for `D4`, else the paper's 0.1).
        max_sequence_length: the model's longest sequence; longer training
            pairs are dropped.
        keep_checkpoints: checkpoints kept and averaged at the end (1: no
            averaging).
        bleu_sentences: validation sentences translated (greedily) for BLEU
            after each epoch (0: none).
        limit: use only the first `limit` training pairs.
        validation_limit: use only the first `validation_limit` validation
            pairs for the validation loss.
        seed: random seed.
        verbose: Keras `fit` verbosity.
        extra_callbacks: more Keras callbacks.
        strategy: a `keras_transformer.distribution` strategy to train on
            several devices or processes. `max_tokens` is then per device;
            only process 0 writes checkpoints, logs and the model.
        initial_preset: a preset name or directory to start from instead of
            from scratch, to fine-tune it or to train it longer: its weights,
            architecture and vocabulary are kept (`config` and
            `vocabulary_size` are then unused; `config_overrides` such as
            `dropout` still apply).
        initial_step: the learning-rate schedule's step to start from
            (default: 0 from scratch; with `initial_preset`, the steps the
            preset was trained for, from its metadata).
        **config_overrides: backbone arguments that replace the config's.

    Returns:
        `(model, history)`.
    """
    if config not in CONFIGS:
        raise ValueError(f"Unknown config {config!r}; choose one of {sorted(CONFIGS)}.")
    if label_smoothing is None:
        label_smoothing = PAPER_TABLE3.get(config, {}).get("label_smoothing", 0.1)
    if initial_step is not None and initial_step < 0:
        raise ValueError(f"initial_step must be 0 or more; got {initial_step}.")
    fixed = sorted(key for key in config_overrides if key not in PRESET_OVERRIDES)
    if initial_preset and fixed:
        raise ValueError(
            f"A run from a preset keeps the preset's architecture: {', '.join(fixed)} cannot change "
            f"(only {', '.join(PRESET_OVERRIDES)} can). Train from scratch with `config` to change it."
        )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise FileExistsError(f"The output directory {output_dir!r} is a file; give a directory for the run.")
    previous_run = _read_run(output_dir)
    _check_run_start(output_dir, previous_run, initial_preset)
    if initial_step is None and not initial_preset:
        initial_step = previous_run.get("initial_step")
    # The backbone of a run from scratch (a run from a preset has the preset's).
    scratch_backbone = None if initial_preset else {
        **CONFIGS[config], **config_overrides, "max_sequence_length": max_sequence_length
    }
    settings = dict(
        source=source, target=target, config=None if initial_preset else config,
        tokenizer_algorithm=None if initial_preset else tokenizer_algorithm, max_tokens=max_tokens,
        pad_to_multiple_of=pad_to_multiple_of, limit=limit, seed=seed, warmup_steps=warmup_steps,
        learning_rate_scale=learning_rate_scale, label_smoothing=label_smoothing,
    )
    if initial_step is not None:
        settings["initial_step"] = initial_step
    if not initial_preset:  # a run from a preset has the preset's vocabulary
        settings["vocabulary_size"] = vocabulary_size
    _check_same_settings(output_dir, previous_run, settings, scratch_backbone)
    # The data is read before the run's directory is made: a wrong
    # data_dir leaves nothing behind.
    sources, targets = multi30k.load("train", source, target, data_dir)
    if limit:
        sources, targets = sources[:limit], targets[:limit]
    val_sources, val_targets = multi30k.load("val", source, target, data_dir)
    if validation_limit:
        val_sources, val_targets = val_sources[:validation_limit], val_targets[:validation_limit]
    os.makedirs(output_dir, exist_ok=True)
    keras.utils.set_random_seed(seed)

    # Several processes: process 0 writes the run's files; the others train
    # the same tokenizer (SentencePiece is deterministic) and keep their own
    # backup for resuming.
    chief = strategy is None or strategy.process_index == 0
    batching = {} if strategy is None else strategy.batching()
    initial_training = None
    if initial_preset:
        tokenizer, preset_step, initial_training = _initial_preset(
            initial_preset, output_dir, previous_run, source, target, save=chief
        )
        if initial_step is None and preset_step is None:
            warnings.warn(
                f"The metadata of preset {initial_preset!r} does not say how many steps it was trained "
                "for, so the learning-rate schedule starts again from step 0 (warming up again); pass "
                "initial_step (--initial-step) to go on from another step.",
                stacklevel=2,
            )
        initial_step = preset_step if initial_step is None else initial_step
    else:
        tokenizer = _tokenizer(
            output_dir, previous_run, sources + targets, vocabulary_size, tokenizer_algorithm, save=chief
        )
    initial_step = initial_step or 0
    if initial_preset:
        max_sequence_length = read_preset_file(initial_preset, CONFIG_FILE)["config"]["max_sequence_length"]
    train_batches = token_budget_batches(
        sources, targets, tokenizer, max_tokens=max_tokens, max_length=max_sequence_length,
        pad_to_multiple_of=pad_to_multiple_of, seed=seed, **batching,
    )
    val_batches = token_budget_batches(
        val_sources, val_targets, tokenizer, max_tokens=max_tokens, max_length=max_sequence_length,
        pad_to_multiple_of=pad_to_multiple_of, shuffle=False, **batching,
    )
    epochs, steps_per_epoch = _epoch_plan(len(train_batches), epochs, steps, previous_run)
    backup = os.path.join(output_dir, "backup" if chief else f"backup-process-{strategy.process_index}")
    _continue_from_checkpoint(backup, os.path.join(output_dir, "checkpoints"), steps_per_epoch, initial_step)
    # Where this call starts in the run's stream of batches and of dropout
    # masks: a resumed run goes on with new ones instead of replaying the
    # first epoch's (which it would learn by heart over many restarts).
    position = initial_step + _finished_epochs(backup) * steps_per_epoch
    if position:
        keras.utils.set_random_seed(_seed_at(seed, position))
    with strategy.scope() if strategy else contextlib.nullcontext():
        if initial_preset:
            backbone = TransformerBackbone.from_preset(initial_preset, **config_overrides)
        else:
            backbone = TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **scratch_backbone)
        preprocessor = TransformerSeq2SeqLMPreprocessor(
            tokenizer, encoder_sequence_length=max_sequence_length, decoder_sequence_length=max_sequence_length
        )
        model = TransformerSeq2SeqLM(backbone, preprocessor)
        model.compile(
            optimizer=paper_optimizer(backbone.d_model, warmup_steps, learning_rate_scale),
            label_smoothing=label_smoothing,
        )
        # A resumed run's backup restores the step it reached.
        model.optimizer.iterations.assign(initial_step)
    if initial_preset:
        skip = ("name", "trainable", "dtype", "vocabulary_size")
        backbone_config = {key: value for key, value in backbone.get_config().items() if key not in skip}
    else:
        backbone_config = scratch_backbone

    run_info = {
        "data": f"Multi30k task 1 train, {source}-{target}",
        "source": source,
        "target": target,
        "config": None if initial_preset else config,
        "initial_preset": initial_preset,
        "initial_step": initial_step,
        "initial_training": initial_training,
        "backbone": backbone_config,
        "vocabulary_size": tokenizer.vocabulary_size(),
        "tokenizer_algorithm": None if initial_preset else tokenizer_algorithm,
        "max_tokens": max_tokens,
        "pad_to_multiple_of": pad_to_multiple_of,
        "epochs": epochs,
        "steps_per_epoch": steps_per_epoch,
        "warmup_steps": warmup_steps,
        "learning_rate_scale": learning_rate_scale,
        "label_smoothing": label_smoothing,
        "keep_checkpoints": keep_checkpoints,
        "limit": limit,
        "seed": seed,
        "padding_fraction": round(train_batches.padding_fraction(), 4),
        "backend": keras.config.backend(),
    }
    if strategy is not None:
        run_info["devices"] = strategy.num_replicas
    if chief:
        with open(os.path.join(output_dir, "run.json"), "w") as f:
            json.dump(run_info, f, indent=2)

    callbacks = [keras.callbacks.BackupAndRestore(backup)]
    if chief:
        callbacks.append(KeepLastCheckpoints(os.path.join(output_dir, "checkpoints"), keep=keep_checkpoints))
    if bleu_sentences and chief:
        callbacks.append(
            BleuEvaluation(val_sources[:bleu_sentences], val_targets[:bleu_sentences], sampler="greedy")
        )
    if chief:
        callbacks += [
            keras.callbacks.TensorBoard(os.path.join(output_dir, "logs")),
            keras.callbacks.CSVLogger(os.path.join(output_dir, "history.csv"), append=True),
        ]
    callbacks += list(extra_callbacks)
    history = model.fit(
        train_batches.dataset(repeat=True, start=position),
        validation_data=val_batches.dataset(),
        shuffle=False,  # The batches shuffle themselves each pass.
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=verbose,
    )
    if not chief:
        return model, history
    checkpoints = list_checkpoints(os.path.join(output_dir, "checkpoints"))
    if len(checkpoints) > 1:
        average_checkpoints(model, checkpoints)
    model.save_to_preset(
        os.path.join(output_dir, "model"),
        metadata={
            "languages": {"source": source, "target": target},
            "data": run_info["data"],
            "training": {
                **run_info,
                "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
                "averaged_checkpoints": len(checkpoints),
            },
        },
    )
    return model, history

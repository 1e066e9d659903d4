"""Training a translation model on Multi30k with the paper's recipe
(section 5), resumable after a kill, ending in an averaged model (6.1).

`keras-transformer train` is a thin command line around `train_multi30k`;
`examples/train_multi30k.py` spells out the same steps.
"""

import contextlib
import json
import math
import os
import warnings

import keras
import numpy as np

from keras_transformer.callbacks import BleuEvaluation
from keras_transformer.callbacks import KeepLastCheckpoints
from keras_transformer.callbacks import average_checkpoints
from keras_transformer.callbacks import continue_from_checkpoint
from keras_transformer.callbacks import finished_epochs
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
from keras_transformer.train_config import PRESET_OVERRIDES
from keras_transformer.train_config import TrainConfig
from keras_transformer.train_config import fixed_setting_names
from keras_transformer.utils.files import written_atomically
from keras_transformer.utils.memory import reuse_freed_memory

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
    with written_atomically(path) as partial, open(partial, "wb") as f:
        f.write(tokenizer.proto)
    return tokenizer


def _seed_at(seed, step):
    """The random seed of a run started again at `step`: another one for
    each step, so that dropout does not draw the masks it drew before."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])




def _same_preset(a, b):
    if a == b:
        return True
    return bool(a and b and os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b))


def _read_run(output_dir):
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
# batches (hence epochs) and schedule (`TrainConfig`'s fixed fields).
RUN_FIXED = fixed_setting_names()


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
    steps = _preset_steps(preset, training or {})
    if save:  # after the checks that may refuse the preset: nothing left behind
        with written_atomically(path) as partial, open(partial, "wb") as f:
            f.write(tokenizer.proto)
    return tokenizer, steps, training


def train_multi30k(output_dir, strategy=None, extra_callbacks=(), verbose="auto", **settings):
    """Trains a `TransformerSeq2SeqLM` on Multi30k and saves it as a preset.

    The run lives in `output_dir`: the tokenizer, TensorBoard logs in
    `logs/`, the state for resuming in `backup/`, the last
    `keep_checkpoints` checkpoints in `checkpoints/`, and at the end the
    model with averaged weights as a keras-hub preset in `model/`. Calling
    it again with the same `output_dir` after a kill resumes from the last
    finished epoch; calling it again after it finished, with a larger
    `epochs` (or `steps`), trains on from its newest checkpoint (optimizer
    state and learning-rate schedule included). A resumed run must keep the
    settings that made its vocabulary, weights, batches and schedule.

    With `initial_preset` it starts from that preset instead of from
    scratch, to fine-tune it or to train it longer: the preset's weights,
    architecture and vocabulary are kept (`config` and `vocabulary_size` are
    then unused; only `dropout` and `attention_dropout` may change), and the
    learning-rate schedule goes on from the steps the preset was trained for
    (its metadata's), unless `initial_step` says otherwise.

    Args:
        output_dir: the run's directory.
        strategy: a `keras_transformer.distribution` strategy to train on
            several devices or processes. `max_tokens` is then per device;
            only process 0 writes checkpoints, logs and the model.
        extra_callbacks: more Keras callbacks.
        verbose: Keras `fit` verbosity.
        **settings: the fields of `keras_transformer.train_config.TrainConfig`
            (`source`, `target`, `config`, `epochs`...; their defaults and
            meaning are there), and backbone arguments that replace the
            config's (`num_layers=2`, `dropout=0.3`...).

    Returns:
        `(model, history)`.
    """
    # Each step frees and allocates the same large buffers (the logits and
    # their gradient, XLA's workspace): keep them in the process, set before
    # the model is built, which may start the backend's threads (they keep
    # the heaps they start with; see utils/memory.py).
    reuse_freed_memory()
    config, overrides = TrainConfig.split(settings)
    if config.config not in CONFIGS:
        raise ValueError(f"Unknown config {config.config!r}; choose one of {sorted(CONFIGS)}.")
    if config.label_smoothing is None:
        config.label_smoothing = PAPER_TABLE3.get(config.config, {}).get("label_smoothing", 0.1)
    if config.initial_step is not None and config.initial_step < 0:
        raise ValueError(f"initial_step must be 0 or more; got {config.initial_step}.")
    fixed = sorted(key for key in overrides if key not in PRESET_OVERRIDES)
    if config.initial_preset and fixed:
        raise ValueError(
            f"A run from a preset keeps the preset's architecture: {', '.join(fixed)} cannot change "
            f"(only {', '.join(PRESET_OVERRIDES)} can). Train from scratch with `config` to change it."
        )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise FileExistsError(f"The output directory {output_dir!r} is a file; give a directory for the run.")
    previous_run = _read_run(output_dir)
    _check_run_start(output_dir, previous_run, config.initial_preset)
    if config.initial_step is None and not config.initial_preset:
        config.initial_step = previous_run.get("initial_step")
    # The backbone of a run from scratch (a run from a preset has the preset's).
    scratch_backbone = None if config.initial_preset else {
        **CONFIGS[config.config], **overrides, "max_sequence_length": config.max_sequence_length
    }
    _check_same_settings(output_dir, previous_run, config.fixed_settings(), scratch_backbone)
    # The data and the preset are read before the run's directory is made:
    # a wrong data_dir or preset leaves nothing behind.
    data = _read_data(config)
    if config.initial_preset:
        from keras_transformer.presets import check

        check(config.initial_preset, ("config", "tokenizer"))
    os.makedirs(output_dir, exist_ok=True)
    keras.utils.set_random_seed(config.seed)

    # Several processes: process 0 writes the run's files; the others train
    # the same tokenizer (SentencePiece is deterministic) and keep their own
    # backup for resuming.
    chief = strategy is None or strategy.process_index == 0
    tokenizer, initial_training = _run_tokenizer(config, output_dir, previous_run, data, chief)
    train_batches, val_batches = _batches(config, tokenizer, data, strategy)
    epochs, steps_per_epoch = _epoch_plan(len(train_batches), config.epochs, config.steps, previous_run)
    backup = os.path.join(output_dir, "backup" if chief else f"backup-process-{strategy.process_index}")
    continue_from_checkpoint(backup, os.path.join(output_dir, "checkpoints"), steps_per_epoch, config.initial_step)
    # Where this call starts in the run's stream of batches and of dropout
    # masks: a resumed run goes on with new ones instead of replaying the
    # first epoch's (which it would learn by heart over many restarts).
    position = config.initial_step + finished_epochs(backup) * steps_per_epoch
    if position:
        keras.utils.set_random_seed(_seed_at(config.seed, position))
    model = _build_model(config, tokenizer, scratch_backbone, overrides, strategy)
    run_info = _run_record(config, model, scratch_backbone, initial_training, train_batches, epochs, steps_per_epoch)
    if strategy is not None:
        run_info["devices"] = strategy.num_replicas
    if chief:
        # Written aside and moved into place: a kill mid-write must not
        # leave a truncated run.json.
        with written_atomically(os.path.join(output_dir, "run.json")) as partial, open(partial, "w") as f:
            json.dump(run_info, f, indent=2)
    callbacks = [keras.callbacks.BackupAndRestore(backup)]
    if chief:
        callbacks += _chief_callbacks(config, output_dir, data)
    history = model.fit(
        train_batches.dataset(repeat=True, start=position),
        validation_data=val_batches.dataset(),
        shuffle=False,  # The batches shuffle themselves each pass.
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks + list(extra_callbacks),
        verbose=verbose,
    )
    if chief:
        _save_averaged_model(model, output_dir, config, run_info)
    return model, history


def _read_data(config):
    """The run's training and validation pairs: `(sources, targets,
    val_sources, val_targets)`."""
    sources, targets = multi30k.load("train", config.source, config.target, config.data_dir)
    if config.limit:
        sources, targets = sources[: config.limit], targets[: config.limit]
    val_sources, val_targets = multi30k.load("val", config.source, config.target, config.data_dir)
    if config.validation_limit:
        val_sources, val_targets = val_sources[: config.validation_limit], val_targets[: config.validation_limit]
    return sources, targets, val_sources, val_targets


def _run_tokenizer(config, output_dir, previous_run, data, save):
    """The run's tokenizer and, for a run from a preset, the preset's
    training record; sets `config.initial_step` (and, from a preset, its
    `max_sequence_length`)."""
    initial_training = None
    if config.initial_preset:
        tokenizer, preset_step, initial_training = _initial_preset(
            config.initial_preset, output_dir, previous_run, config.source, config.target, save=save
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
        tokenizer = _tokenizer(
            output_dir, previous_run, sources + targets, config.vocabulary_size, config.tokenizer_algorithm,
            save=save,
        )
    config.initial_step = config.initial_step or 0
    return tokenizer, initial_training


def _batches(config, tokenizer, data, strategy):
    """Training and validation batches grouped by length under the token
    budget (per device with a strategy)."""
    sources, targets, val_sources, val_targets = data
    batching = {} if strategy is None else strategy.batching()
    common = dict(
        tokenizer=tokenizer, max_tokens=config.max_tokens, max_length=config.max_sequence_length,
        pad_to_multiple_of=config.pad_to_multiple_of, **batching,
    )
    return (
        token_budget_batches(sources, targets, seed=config.seed, **common),
        token_budget_batches(val_sources, val_targets, shuffle=False, **common),
    )


def _build_model(config, tokenizer, scratch_backbone, overrides, strategy):
    """The model (under the strategy's scope), compiled with the paper's
    recipe, its step at the run's first step."""
    with strategy.scope() if strategy else contextlib.nullcontext():
        if config.initial_preset:
            backbone = TransformerBackbone.from_preset(config.initial_preset, dtype=config.dtype, **overrides)
        else:
            backbone = TransformerBackbone(
                vocabulary_size=tokenizer.vocabulary_size(), dtype=config.dtype, **scratch_backbone
            )
        preprocessor = TransformerSeq2SeqLMPreprocessor(
            tokenizer,
            encoder_sequence_length=config.max_sequence_length,
            decoder_sequence_length=config.max_sequence_length,
        )
        model = TransformerSeq2SeqLM(backbone, preprocessor)
        model.compile(
            optimizer=paper_optimizer(backbone.d_model, config.warmup_steps, config.learning_rate_scale),
            label_smoothing=config.label_smoothing,
        )
        # A resumed run's backup restores the step it reached.
        model.optimizer.iterations.assign(config.initial_step)
    return model


def _run_record(config, model, scratch_backbone, initial_training, train_batches, epochs, steps_per_epoch):
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


def _chief_callbacks(config, output_dir, data):
    """Checkpoints, BLEU, TensorBoard and CSV logs: process 0 writes them."""
    val_sources, val_targets = data[2:]
    callbacks = [KeepLastCheckpoints(os.path.join(output_dir, "checkpoints"), keep=config.keep_checkpoints)]
    if config.bleu_sentences:
        n = config.bleu_sentences
        callbacks.append(BleuEvaluation(val_sources[:n], val_targets[:n], sampler="greedy"))
    return callbacks + [
        keras.callbacks.TensorBoard(os.path.join(output_dir, "logs")),
        keras.callbacks.CSVLogger(os.path.join(output_dir, "history.csv"), append=True),
    ]


def _save_averaged_model(model, output_dir, config, run_info):
    """The model with the last checkpoints averaged, as the preset `model/`."""
    checkpoints = list_checkpoints(os.path.join(output_dir, "checkpoints"))
    if len(checkpoints) > 1:
        average_checkpoints(model, checkpoints)
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    _computing_in_float32(model).save_to_preset(
        os.path.join(output_dir, "model"),
        metadata={
            "languages": {"source": config.source, "target": config.target},
            "data": run_info["data"],
            "training": {
                **run_info,
                "steps": steps,
                "averaged_checkpoints": len(checkpoints),
            },
        },
    )


def _computing_in_float32(model):
    """`model`, or after mixed-precision training the same weights (float32
    already) in a model that computes in float32: a saved preset loads in
    float32 unless `from_preset(dtype=...)` asks for another precision."""
    if model.backbone.dtype_policy.name == "float32":
        return model
    backbone = TransformerBackbone.from_config({**model.backbone.get_config(), "dtype": "float32"})
    backbone.set_weights(model.backbone.get_weights())
    return TransformerSeq2SeqLM(backbone, model.preprocessor)

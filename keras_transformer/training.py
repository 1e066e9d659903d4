"""Training a translation model on Multi30k with the paper's recipe
(section 5), resumable after a kill, ending in an averaged model (6.1).

`keras-transformer train` is a thin command line around `train_multi30k`;
`examples/train_multi30k.py` spells out the same steps.
"""

import contextlib
import json
import os

import keras

from keras_transformer.callbacks import BleuEvaluation
from keras_transformer.callbacks import FlushedTensorBoard
from keras_transformer.callbacks import KeepLastCheckpoints
from keras_transformer.callbacks import average_checkpoints
from keras_transformer.callbacks import continue_from_checkpoint
from keras_transformer.callbacks import finished_epochs
from keras_transformer.callbacks import list_checkpoints
from keras_transformer.callbacks import trim_history
from keras_transformer.data import token_budget_batches
from keras_transformer.datasets import multi30k
from keras_transformer.models import CONFIGS
from keras_transformer.models import PAPER_TABLE3
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.schedules import paper_optimizer
from keras_transformer.train_config import PRESET_OVERRIDES
from keras_transformer.train_config import TrainConfig
from keras_transformer.train_run import check_arguments
from keras_transformer.train_run import check_run_start
from keras_transformer.train_run import check_same_settings
from keras_transformer.train_run import epoch_plan
from keras_transformer.train_run import read_run
from keras_transformer.train_run import removed_on_failure
from keras_transformer.train_run import run_record
from keras_transformer.train_run import run_tokenizer
from keras_transformer.train_run import seed_at
from keras_transformer.utils.files import written_atomically
from keras_transformer.utils.memory import reuse_freed_memory


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
    previous_run = read_run(output_dir)
    check_run_start(output_dir, previous_run, config.initial_preset)
    if config.initial_step is None and not config.initial_preset:
        config.initial_step = previous_run.get("initial_step")
    # The backbone of a run from scratch (a run from a preset has the preset's).
    scratch_backbone = None if config.initial_preset else {
        **CONFIGS[config.config], **overrides, "max_sequence_length": config.max_sequence_length
    }
    check_arguments(config, scratch_backbone)
    check_same_settings(output_dir, previous_run, config.fixed_settings(), scratch_backbone)
    # The data and the preset are read before the run's directory is made:
    # a wrong data_dir or preset leaves nothing behind.
    data = _read_data(config)
    if config.initial_preset:
        from keras_transformer.presets import check

        check(config.initial_preset, ("config", "tokenizer"))
    # A start that fails removes what it wrote (never what was there).
    with removed_on_failure(output_dir):
        os.makedirs(output_dir, exist_ok=True)
        keras.utils.set_random_seed(config.seed)

        # Several processes: process 0 writes the run's files; the others train
        # the same tokenizer (SentencePiece is deterministic) and keep their own
        # backup for resuming.
        chief = strategy is None or strategy.process_index == 0
        tokenizer, initial_training = run_tokenizer(config, output_dir, previous_run, data, chief)
        train_batches, val_batches = _batches(config, tokenizer, data, strategy)
        epochs, steps_per_epoch = epoch_plan(len(train_batches), config.epochs, config.steps, previous_run)
        backup = os.path.join(output_dir, "backup" if chief else f"backup-process-{strategy.process_index}")
        continue_from_checkpoint(backup, os.path.join(output_dir, "checkpoints"), steps_per_epoch, config.initial_step)
        # Where this call starts in the run's stream of batches and of dropout
        # masks: a resumed run goes on with new ones instead of replaying the
        # first epoch's (which it would learn by heart over many restarts).
        done = finished_epochs(backup)
        position = config.initial_step + done * steps_per_epoch
        if position:
            keras.utils.set_random_seed(seed_at(config.seed, position))
        model = _build_model(config, tokenizer, scratch_backbone, overrides, strategy)
        run_info = run_record(config, model, scratch_backbone, initial_training, train_batches, epochs, steps_per_epoch)
        if strategy is not None:
            run_info["devices"] = strategy.num_replicas
        if chief:
            # Written aside and moved into place: a kill mid-write must not
            # leave a truncated run.json.
            with written_atomically(os.path.join(output_dir, "run.json")) as partial, open(partial, "w") as f:
                json.dump(run_info, f, indent=2)
    callbacks = _callbacks(config, output_dir, data, backup, done) if chief else [
        keras.callbacks.BackupAndRestore(backup)
    ]
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
    for split, pairs in (("training", sources), ("validation", val_sources)):
        if not pairs:
            raise ValueError(f"The {split} data of {config.data_dir or 'Multi30k'} holds no sentence pairs: "
                             "give a data_dir whose files hold them.")
    return sources, targets, val_sources, val_targets


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


def _callbacks(config, output_dir, data, backup, done):
    """The callbacks of process 0, in order: an epoch's logs are written
    before its backup, which marks it done, and its checkpoint after, so
    that a kill at any point leaves the logs of every epoch the rerun does
    not train again (the `done` first ones), and no more."""
    trim_history(os.path.join(output_dir, "history.csv"), done)
    checkpoints = KeepLastCheckpoints(os.path.join(output_dir, "checkpoints"), keep=config.keep_checkpoints)
    return _log_callbacks(config, output_dir, data) + [keras.callbacks.BackupAndRestore(backup), checkpoints]


def _log_callbacks(config, output_dir, data):
    """BLEU, TensorBoard and CSV logs: process 0 writes them."""
    val_sources, val_targets = data[2:]
    callbacks = []
    if config.bleu_sentences:
        n = config.bleu_sentences
        callbacks.append(BleuEvaluation(val_sources[:n], val_targets[:n], sampler="greedy"))
    return callbacks + [
        FlushedTensorBoard(os.path.join(output_dir, "logs")),
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

"""Training callbacks: checkpoint averaging (paper section 6.1) and BLEU on a
validation set.

"For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals."

`KeepLastCheckpoints` writes the model's weights every `save_every` steps (or
every epoch) and keeps the newest `keep`; `average_checkpoints` loads them
into one model whose weights are their mean.
"""

import csv
import glob
import json
import os
import re
import shutil
import warnings

import keras
import numpy as np

from keras_transformer.utils.files import written_atomically

_PATTERN = "step-{step:09d}.weights.h5"
_STEP = re.compile(r"step-(\d+)\.weights\.h5")
# Where a checkpoint is written before it takes its name: a kill mid-write
# leaves a file that no glob for checkpoints matches.
_PARTIAL = ".partial-{name}"


def checkpoint_step(path):
    """The training step a `step-NNNNNNNNN.weights.h5` file was written at."""
    match = _STEP.fullmatch(os.path.basename(path))
    if not match:
        raise ValueError(f"{path!r} is not a checkpoint: its name is not step-NNNNNNNNN.weights.h5.")
    return int(match.group(1))


def list_checkpoints(directory):
    """The checkpoint files in `directory`, oldest first (other files there
    are left out)."""
    paths = glob.glob(os.path.join(directory, "step-*.weights.h5"))
    return sorted((p for p in paths if _STEP.fullmatch(os.path.basename(p))), key=checkpoint_step)


class KeepLastCheckpoints(keras.callbacks.Callback):
    """Saves the weights regularly and keeps the last `keep` files.

    The directory belongs to one run. A checkpoint there of a later step
    than the one being written is from another run, or from before the
    point this run was resumed at: it is removed, with a warning, so that
    the newest `keep` are this run's own.

    Args:
        directory: where the `step-NNNNNNNNN.weights.h5` files go.
        keep: how many of the newest checkpoints to keep (the paper
            averages 5).
        save_every: save each time the step count passes a multiple of
            this (also with `steps_per_execution` > 1); None saves at the
            end of every epoch.

    Example:

    ```python
    model.fit(data, epochs=20, callbacks=[KeepLastCheckpoints("ckpt", keep=5)])
    average_checkpoints(model, list_checkpoints("ckpt"))
    ```
    """

    def __init__(self, directory, keep=5, save_every=None):
        super().__init__()
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}.")
        if save_every is not None and save_every < 1:
            raise ValueError(f"save_every must be at least 1 (or None: every epoch), got {save_every}.")
        self.directory = directory
        self.keep = int(keep)
        self.save_every = save_every

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _save(self):
        os.makedirs(self.directory, exist_ok=True)
        step = self._step()
        path = os.path.join(self.directory, _PATTERN.format(step=step))
        # A kill mid-write leaves no truncated checkpoint under a real name.
        with written_atomically(path) as partial:
            self.model.save_weights(partial, overwrite=True)
        checkpoints = list_checkpoints(self.directory)
        later = [p for p in checkpoints if checkpoint_step(p) > step]
        if later:
            warnings.warn(
                f"Removed checkpoints of later steps than this run's {step} from {self.directory!r} "
                f"({', '.join(os.path.basename(p) for p in later)}): they are another run's, or from "
                "before this run was resumed. Give each run its own directory.",
                stacklevel=2,
            )
        ours = checkpoints[: len(checkpoints) - len(later)]
        for old in ours[: max(0, len(ours) - self.keep)] + later:
            os.remove(old)
        for left in glob.glob(os.path.join(self.directory, _PARTIAL.format(name="*"))):
            os.remove(left)  # from a run killed mid-write

    def on_train_batch_begin(self, batch, logs=None):
        if self.save_every:
            self._step_before = self._step()

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1 the count moves several steps at a
        # time, past multiples of save_every rather than onto them.
        if self.save_every and self._step() // self.save_every > self._step_before // self.save_every:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if not self.save_every:
            self._save()


class BleuEvaluation(keras.callbacks.Callback):
    """Translates validation sentences at the end of each epoch and logs
    sacreBLEU as `val_bleu` and `val_bleu_lowercase` (so that TensorBoard,
    the progress bar and `History` show them).

    Place it before the callbacks that read the logs (TensorBoard,
    CSVLogger).

    Args:
        sources: validation source sentences.
        references: their reference translations.
        every: evaluate every this many epochs.
        batch_size: sentences translated together.
        **generate_kwargs: passed to `model.generate`.
    """

    def __init__(self, sources, references, every=1, batch_size=64, **generate_kwargs):
        super().__init__()
        self.sources, self.references = list(sources), list(references)
        if len(self.sources) != len(self.references) or not self.sources:
            raise ValueError(
                f"BleuEvaluation needs as many references as sources, at least one; got "
                f"{len(self.sources)} sources and {len(self.references)} references."
            )
        if every < 1:
            raise ValueError(f"every must be at least 1 (epochs), got {every}.")
        self.every = int(every)
        self.batch_size = batch_size
        self.generate_kwargs = generate_kwargs

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        from keras_transformer.metrics import evaluate_translation

        scores = evaluate_translation(
            self.model, self.sources, self.references, batch_size=self.batch_size,
            verbose=0, **self.generate_kwargs,
        )
        if logs is not None:
            logs["val_bleu"] = scores["bleu"]
            logs["val_bleu_lowercase"] = scores["bleu_lowercase"]
        print(f"\nEpoch {epoch + 1}: val BLEU {scores['bleu']:.2f} (lowercased {scores['bleu_lowercase']:.2f})")


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the mean of the checkpoints in `paths`.

    Floating-point variables are averaged; others (random seed states,
    counters) are taken from the last checkpoint.

    Args:
        model: a built model whose weights the checkpoints hold.
        paths: `.weights.h5` files, such as `list_checkpoints(directory)`.

    Returns:
        `model`, with the averaged weights.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("No checkpoints to average.")
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"Checkpoints not found: {missing}")
    sums = None
    for path in paths:
        model.load_weights(path)
        weights = model.get_weights()
        if sums is None:
            sums = [np.array(w, dtype="float64") if _is_float(w) else None for w in weights]
        else:
            for total, w in zip(sums, weights):
                if total is not None:
                    total += w
    # `weights` now holds the last checkpoint.
    averaged = [
        (total / len(paths)).astype(w.dtype) if total is not None else w
        for total, w in zip(sums, weights)
    ]
    model.set_weights(averaged)
    return model


def _is_float(array):
    return np.issubdtype(np.asarray(array).dtype, np.floating)


def continue_from_checkpoint(backup_dir, checkpoint_dir, steps_per_epoch, initial_step=0):
    """Lets a finished run train longer (and says where a killed one resumes).

    `keras.callbacks.BackupAndRestore` deletes its backup when `fit` ends, so
    a finished run rerun with a larger `epochs` would start again from
    scratch. Its newest checkpoint holds the model's and the optimizer's
    state (Adam's moments and step, hence the learning-rate schedule's
    position), so it becomes the backup, and `fit` goes on from the epoch
    after it.
    """
    if os.path.exists(backup_dir):  # a run killed before its end: `fit` resumes from its backup
        _check_backup(backup_dir)
        print(f"Resuming the unfinished run from {backup_dir} (after epoch {finished_epochs(backup_dir)}).")
        return
    checkpoints = list_checkpoints(checkpoint_dir)
    if not checkpoints:
        return
    newest = checkpoints[-1]
    step = checkpoint_step(newest)
    epoch = (step - initial_step) // steps_per_epoch
    # A kill halfway leaves no empty backup (which would restart the run
    # from its first epoch).
    with written_atomically(backup_dir) as partial:
        os.makedirs(partial)
        shutil.copyfile(newest, os.path.join(partial, "latest.weights.h5"))
        with open(os.path.join(partial, "training_metadata.json"), "w") as f:
            json.dump({"epoch": epoch, "batch": 0}, f)
    print(f"Continuing from {newest} (step {step}, after epoch {epoch}).")


def _check_backup(backup_dir):
    """Refuses a backup that a kill mid-write left damaged (Keras overwrites
    it where it lies), naming the way on: the newest checkpoint."""
    import h5py

    try:
        epochs = finished_epochs(backup_dir)
        with h5py.File(os.path.join(backup_dir, "latest.weights.h5"), "r"):
            pass
        problem = None if epochs >= 0 else f"epoch {epochs}"
    except Exception as error:  # h5py raises OSError, json ValueError or KeyError...
        problem = f"{type(error).__name__}: {error}"
    if problem is None:
        return
    # A run of several processes keeps one backup each: all of them go, so
    # that every process goes on from the same checkpoint.
    parent = os.path.dirname(os.path.abspath(backup_dir))
    names = [name for name in os.listdir(parent) if name == "backup" or name.startswith("backup-process-")]
    # By process index: backup-process-2 before backup-process-10.
    names.sort(key=lambda name: (name != "backup", len(name), name))
    backups = [os.path.join(parent, name) for name in names]
    if os.path.abspath(backup_dir) not in backups:
        backups = [backup_dir]
    raise ValueError(
        f"The backup of the unfinished run, {backup_dir}, is damaged ({problem}). Delete "
        + (f"the run's backups ({', '.join(backups)})" if len(backups) > 1 else "that directory")
        + " to go on from the run's newest checkpoint instead (the epochs since it are trained again)."
    )


def finished_epochs(backup_dir):
    """Epochs a run's `BackupAndRestore` backup has finished (0 if none)."""
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f)["epoch"])


class FlushedTensorBoard(keras.callbacks.TensorBoard):
    """Keras' `TensorBoard` whose epoch summaries are on disk when the
    epoch ends (Keras' writers flush every two minutes): a run killed
    right after an epoch's backup keeps that epoch in its logs."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        for writer in self._writers.values():  # the train and validation writers made so far
            writer.flush()


def trim_history(path, epochs):
    """Keeps the rows of a `CSVLogger` file (`path`) of the first `epochs`
    epochs: those a resumed run does not train again. A run killed after
    logging an epoch but before its backup trains that epoch again, and
    logs it once."""
    if not os.path.isfile(path):
        return
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or "epoch" not in rows[0]:
        return
    column = rows[0].index("epoch")
    kept = [rows[0]] + [row for row in rows[1:] if len(row) > column and row[column].isdigit() and int(row[column]) < epochs]
    if len(kept) == len(rows):
        return
    with written_atomically(path) as partial, open(partial, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(kept)

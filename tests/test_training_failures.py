"""A killed run's logs are whole once it is resumed; a failed start leaves
the output directory as it found it."""

import csv
import os

import pytest

from keras_transformer import callbacks
from keras_transformer import training
from keras_transformer.callbacks import trim_history
from keras_transformer.training import train_multi30k

from helpers import once

RUN = dict(
    config="tiny", vocabulary_size=400, max_tokens=512, pad_to_multiple_of=96, max_sequence_length=96,
    epochs=2, warmup_steps=10, keep_checkpoints=2, bleu_sentences=0, limit=100, validation_limit=32, verbose=0,
)


class _KilledAfterFirstCheckpoint(callbacks.KeepLastCheckpoints):
    """Stands for a SIGTERM right after the first checkpoint is written."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        raise KeyboardInterrupt("killed")


def _epochs(path):
    with open(path, newline="") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def _tensorboard_steps(logs, tag="epoch_loss"):
    import tensorflow as tf

    steps = []
    for root, _, names in os.walk(os.path.join(logs, "train")):
        for name in names:
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                steps += [event.step for value in event.summary.value if value.tag == tag]
    return sorted(steps)


@once
def test_a_run_killed_after_its_first_checkpoint_keeps_every_epoch_in_its_logs(
    tmp_path, multi30k_dir, monkeypatch
):
    run = str(tmp_path / "run")
    with monkeypatch.context() as patch:
        patch.setattr(training, "KeepLastCheckpoints", _KilledAfterFirstCheckpoint)
        with pytest.raises(KeyboardInterrupt):
            train_multi30k(run, data_dir=multi30k_dir, **RUN)
    assert os.listdir(os.path.join(run, "checkpoints"))  # the kill came after the checkpoint
    train_multi30k(run, data_dir=multi30k_dir, **RUN)
    assert _epochs(os.path.join(run, "history.csv")) == [0, 1]
    assert _tensorboard_steps(os.path.join(run, "logs")) == [0, 1]


def test_a_resumed_run_logs_an_epoch_it_trains_again_once(tmp_path):
    history = tmp_path / "history.csv"
    history.write_text("epoch,loss\n0,5.0\n1,4.0\n2,3.5\n")
    # A kill after epoch 1's log line, before its backup: epoch 1 is trained again.
    trim_history(str(history), 1)
    assert history.read_text().splitlines() == ["epoch,loss", "0,5.0"]
    trim_history(str(tmp_path / "absent.csv"), 0)  # no log yet: nothing to do


@once
@pytest.mark.parametrize(
    "settings, message",
    [
        ({"num_heads": 3}, "d_model=64 is not divisible by num_heads=3"),
        ({"max_tokens": 0}, "max_tokens must be 1 or more, got 0"),
        ({"epochs": 0}, "epochs must be 1 or more, got 0"),
        ({"tokenizer_algorithm": "wordpiece"}, "tokenizer_algorithm must be one of"),
        ({"max_tokens": 1}, "max_tokens=1 cannot hold the longest pair"),
        ({"vocabulary_size": 5}, ""),
    ],
)
def test_a_failed_start_leaves_the_output_directory_as_it_found_it(tmp_path, multi30k_dir, settings, message):
    run = tmp_path / "run"
    with pytest.raises((ValueError, RuntimeError), match=message):
        train_multi30k(str(run), data_dir=multi30k_dir, **{**RUN, **settings})
    assert not run.exists()
    # A directory that was there keeps what it held, and only that.
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises((ValueError, RuntimeError), match=message):
        train_multi30k(str(run), data_dir=multi30k_dir, **{**RUN, **settings})
    assert os.listdir(run) == ["notes.txt"] and (run / "notes.txt").read_text() == "mine"


@once
def test_empty_data_is_refused_before_anything_is_written(tmp_path, multi30k_dir):
    import gzip
    import shutil

    data = tmp_path / "data"
    shutil.copytree(multi30k_dir, data)
    for name in ("train.en.gz", "train.de.gz"):
        with gzip.open(data / name, "wt") as f:
            f.write("")
    with pytest.raises(ValueError, match="training data of .* holds no sentence pairs"):
        with pytest.warns(UserWarning):
            train_multi30k(str(tmp_path / "run"), data_dir=str(data), **RUN)
    assert not (tmp_path / "run").exists()

"""Resumable training runs, checkpoint averaging (section 6.1), BLEU, CLI."""

import json
import os

import keras
import numpy as np
import pytest
import sacrebleu

from keras_transformer import cli
from keras_transformer.callbacks import BleuEvaluation
from keras_transformer.callbacks import KeepLastCheckpoints
from keras_transformer.callbacks import average_checkpoints
from keras_transformer.callbacks import checkpoint_step
from keras_transformer.callbacks import list_checkpoints
from keras_transformer.metrics import corpus_scores
from keras_transformer.models import CONFIGS
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.training import train_multi30k

from helpers import once


def test_bleu_is_sacrebleus_own(multi30k_dir):
    from keras_transformer.datasets import multi30k

    sources, references = multi30k.load("test_2016_flickr", "en", "de", data_dir=multi30k_dir)
    # Some imperfect "translations": references with words dropped and cased.
    hypotheses = [" ".join(r.split()[:-2]).upper() if i % 3 == 0 else r for i, r in enumerate(references)]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert scores["bleu_lowercase"] == sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert scores["bleu_lowercase"] > scores["bleu"]
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed")
    assert "case:lc" in scores["bleu_lowercase_signature"]
    with pytest.raises(ValueError, match="No sentences to score"):
        corpus_scores([], [])
    with pytest.raises(ValueError, match="every must be at least 1"):
        BleuEvaluation(["a"], ["b"], every=0)
    with pytest.raises(ValueError, match="1 sources and 2 references"):
        BleuEvaluation(["a"], ["b", "c"])


def _small_model():
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2)(inputs))


def test_keep_last_checkpoints_and_average(tmp_path):
    model = _small_model()
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.rand(32, 3), np.random.rand(32, 2)
    # What a kill in the middle of writing a checkpoint leaves.
    left = tmp_path / ".partial-step-000000003.weights.h5"
    left.write_bytes(b"half a checkpoint")
    other = tmp_path / "step-000000003.weights.h5.copy"
    other.write_bytes(b"not a checkpoint")
    assert list_checkpoints(str(tmp_path)) == []
    callback = KeepLastCheckpoints(str(tmp_path), keep=3, save_every=2)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[callback])
    paths = list_checkpoints(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == [f"step-{s:09d}.weights.h5" for s in (12, 14, 16)]
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(p) for p in paths] + [other.name])
    snapshots = []
    for path in paths:
        model.load_weights(path)
        snapshots.append([w.copy() for w in model.get_weights()])
    average_checkpoints(model, paths)
    for i, weight in enumerate(model.get_weights()):
        np.testing.assert_allclose(weight, np.mean([s[i] for s in snapshots], axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="No checkpoints"):
        average_checkpoints(model, [])


def test_checkpoints_every_n_steps_with_several_steps_an_execution(tmp_path):
    if keras.config.backend() == "torch":
        pytest.skip("Keras runs one step an execution on PyTorch")
    x, y = np.random.rand(40, 3), np.random.rand(40, 2)
    # Steps 1-40 run 4 at a time: the count passes 10 and 30 without
    # landing on them.
    model = _small_model()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    callback = KeepLastCheckpoints(str(tmp_path), keep=10, save_every=10)
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[callback])
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == [
        f"step-{s:09d}.weights.h5" for s in (12, 20, 32, 40)
    ]
    with pytest.raises(ValueError, match="save_every must be at least 1"):
        KeepLastCheckpoints(str(tmp_path), save_every=0)


def test_checkpoints_of_another_run_are_not_averaged_with_this_ones(tmp_path):
    x, y = np.random.rand(8, 3), np.random.rand(8, 2)
    earlier = _small_model()
    earlier.compile(optimizer="sgd", loss="mse")
    earlier.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[KeepLastCheckpoints(str(tmp_path), keep=2)])
    assert [checkpoint_step(p) for p in list_checkpoints(str(tmp_path))] == [8, 10]
    # A new model in the same directory: its own checkpoint stays (it was
    # deleted at once as the oldest), and the other run's go, with a warning.
    model = _small_model()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match=r"later steps than this run's 2 .*step-000000008.*step-000000010"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[KeepLastCheckpoints(str(tmp_path), keep=2)])
    (path,) = list_checkpoints(str(tmp_path))
    assert checkpoint_step(path) == 2
    saved = [w.copy() for w in model.get_weights()]
    average_checkpoints(model, [path])
    for mine, theirs in zip(model.get_weights(), saved):
        np.testing.assert_array_equal(mine, theirs)


class _Interrupt(keras.callbacks.Callback):
    """Stands for a kill after the first epoch's backup."""

    def on_epoch_end(self, epoch, logs=None):
        raise KeyboardInterrupt("killed")


# Every batch is padded to the one length (96), so that JAX compiles few
# step shapes; 100 pairs, at most 5 a batch: a run costs little more than
# its compiling.
RUN = dict(
    config="tiny", vocabulary_size=400, max_tokens=512, pad_to_multiple_of=96, max_sequence_length=96,
    epochs=2, warmup_steps=10, keep_checkpoints=2, bleu_sentences=8, limit=100, validation_limit=32, verbose=0,
)


class _RecordSeeds(keras.callbacks.Callback):
    """The dropout layers' random states when each `fit` begins."""

    def __init__(self):
        super().__init__()
        self.states = []

    def on_train_begin(self, logs=None):
        seeds = [v for v in self.model.variables if "seed_generator" in v.path]
        assert seeds, "the model has no dropout seed generators to record"
        self.states.append(np.concatenate([keras.ops.convert_to_numpy(v).ravel() for v in seeds]))


def _record_stream_starts(monkeypatch):
    """The `start` of every training stream `train_multi30k` asks for."""
    from keras_transformer.data import TokenBudgetBatches

    starts, dataset = [], TokenBudgetBatches.dataset

    def recording(self, repeat=False, start=0):
        if repeat:
            starts.append(start)
        return dataset(self, repeat=repeat, start=start)

    monkeypatch.setattr(TokenBudgetBatches, "dataset", recording)
    return starts


def test_killed_run_resumes_where_it_stopped_then_evaluates(tmp_path, multi30k_dir, capsys, monkeypatch):
    run, seeds, starts = str(tmp_path / "run"), _RecordSeeds(), _record_stream_starts(monkeypatch)
    # Overrides of the config's values, as `--dropout 0.3` with `--config
    # small` (d_ff as the config's own: no new shapes to compile).
    settings = {**RUN, "dropout": 0.2, "d_ff": CONFIGS[RUN["config"]]["d_ff"]}
    # BLEU each epoch (a decoding, compiled anew for each new model) only
    # in the resumed run, which checks that it is logged.
    quiet = {**settings, "bleu_sentences": 0}
    with pytest.raises(KeyboardInterrupt):
        train_multi30k(run, data_dir=multi30k_dir, extra_callbacks=[_Interrupt(), seeds], **quiet)
    assert _read_json(os.path.join(run, "run.json"))["backbone"]["dropout"] == 0.2
    steps_per_epoch = _read_json(os.path.join(run, "run.json"))["steps_per_epoch"]
    first = list_checkpoints(os.path.join(run, "checkpoints"))
    assert [os.path.basename(p) for p in first] == [f"step-{steps_per_epoch:09d}.weights.h5"]

    model, history = train_multi30k(run, data_dir=multi30k_dir, extra_callbacks=[seeds], **settings)
    assert model.backbone.dropout == 0.2
    # The resumed run goes on with the batches of the second pass and with
    # other dropout masks, rather than replaying the first epoch's.
    assert starts == [0, steps_per_epoch]
    assert not np.array_equal(seeds.states[0], seeds.states[1])
    # Only the second epoch ran, and the optimizer continued its count.
    assert len(history.history["loss"]) == 1
    assert "val_bleu" in history.history
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2 * steps_per_epoch
    checkpoints = list_checkpoints(os.path.join(run, "checkpoints"))
    assert len(checkpoints) == 2
    assert os.path.exists(os.path.join(run, "model", "model.weights.h5"))
    assert os.listdir(os.path.join(run, "logs"))
    assert not os.path.exists(os.path.join(run, "backup"))

    # Rerun after it finished, with more epochs: trains on from the newest
    # checkpoint (the optimizer's step too), not from scratch.
    model, history = train_multi30k(run, data_dir=multi30k_dir, **{**quiet, "epochs": 3})
    assert len(history.history["loss"]) == 1
    assert starts == [0, steps_per_epoch, 2 * steps_per_epoch]
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 3 * steps_per_epoch
    assert [os.path.basename(p) for p in list_checkpoints(os.path.join(run, "checkpoints"))] == [
        f"step-{s * steps_per_epoch:09d}.weights.h5" for s in (2, 3)
    ]
    assert len(open(os.path.join(run, "history.csv")).read().splitlines()) == 1 + 3
    printed = capsys.readouterr().out
    assert "Resuming the unfinished run from" in printed and "(after epoch 1)" in printed
    assert "Continuing from" in printed
    # Resumed with settings that make other batches or weights: refused
    # before any work, run.json as it was.
    before = _read_json(os.path.join(run, "run.json"))
    with pytest.raises(ValueError, match=r"other settings \(changed: max_tokens; the run has max_tokens=512\)"):
        train_multi30k(run, data_dir=multi30k_dir, **{**settings, "epochs": 4, "max_tokens": 1024})
    with pytest.raises(ValueError, match=r"other settings \(changed: the architecture\)"):
        train_multi30k(run, data_dir=multi30k_dir, **{**settings, "epochs": 4, "num_layers": 3})
    assert _read_json(os.path.join(run, "run.json")) == before

    capsys.readouterr()
    output = str(tmp_path / "hyp.de")
    # Greedy, on the sentences the BLEU callback decoded (on JAX the same
    # shapes: its compiled steps are read back, not compiled again); beam
    # search is tested on its own.
    cli.main(["evaluate", os.path.join(run, "model"), "--data-dir", multi30k_dir, "--split", "val",
              "--limit", str(RUN["bleu_sentences"]), "--output", output, "--beam-size", "1"])
    printed = capsys.readouterr().out
    assert f"val en-de, {RUN['bleu_sentences']} sentences, greedy" in printed
    assert "BLEU (lowercased)" in printed and "case:lc" in printed
    hypotheses = open(output, encoding="utf-8").read().splitlines()
    assert len(hypotheses) == RUN["bleu_sentences"]
    # The printed scores are sacreBLEU's on the written translations and
    # the split's first references.
    from keras_transformer.datasets import multi30k

    references = multi30k.load("val", "en", "de", data_dir=multi30k_dir)[1][: len(hypotheses)]
    for label, lowercase in (("BLEU ", False), ("BLEU (lowercased) ", True)):
        line = next(line for line in printed.splitlines() if line.startswith(label) and line[len(label)].isdigit())
        expected = sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score
        assert float(line.split()[-2]) == pytest.approx(expected, abs=0.006)


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def _tiny_preset(directory, multi30k_dir, steps):
    """An untrained tiny de-en model saved as a preset trained for `steps`."""
    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
    from keras_transformer.models import train_tokenizer

    sources, targets = multi30k.load("train", "en", "de", multi30k_dir)
    tokenizer = train_tokenizer(sources[:400] + targets[:400], 500)
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=96, decoder_sequence_length=96)
    backbone = TransformerBackbone(vocabulary_size=500, num_layers=2, d_model=64, d_ff=128, num_heads=4,
                                   max_sequence_length=96)
    model = TransformerSeq2SeqLM(backbone, preprocessor)
    model.save_to_preset(directory, metadata={"languages": {"source": "de", "target": "en"},
                                              "training": {"steps": steps}})
    return TransformerSeq2SeqLM.from_preset(directory)


class _RecordWeights(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = [keras.ops.convert_to_numpy(w) for w in self.model.backbone.weights]


# The bookkeeping of runs (run.json, the first step, the preset a run started
# from) is the same on every backend; the killed run above trains and
# resumes on each.
@once
def test_run_from_a_preset_keeps_its_weights_vocabulary_and_schedule(tmp_path, multi30k_dir, capsys):
    preset, preset_steps = str(tmp_path / "preset"), 50
    reference = _tiny_preset(preset, multi30k_dir, preset_steps)
    run, record = str(tmp_path / "run"), _RecordWeights()
    # Another vocabulary size and config: the preset's own are kept. The
    # preset translates de-en: training it on en-de warns.
    settings = {**RUN, "epochs": 1, "limit": 64, "vocabulary_size": 400, "config": "small", "dropout": 0.2, "bleu_sentences": 0}
    with pytest.warns(UserWarning, match="translates de-en; training it on en-de"):
        model, history = train_multi30k(
            run, data_dir=multi30k_dir, initial_preset=preset, extra_callbacks=[record], **settings
        )
    steps_per_epoch = _read_json(os.path.join(run, "run.json"))["steps_per_epoch"]
    for started, loaded in zip(record.weights, reference.backbone.weights):
        np.testing.assert_array_equal(started, keras.ops.convert_to_numpy(loaded))
    assert model.backbone.dropout == 0.2 and model.backbone.d_model == 64
    assert model.preprocessor.tokenizer.vocabulary_size() == 500
    with open(os.path.join(run, "tokenizer.spm"), "rb") as f:
        assert f.read() == reference.preprocessor.tokenizer.proto
    # The schedule went on from the preset's step; so do the checkpoint's
    # name and the saved model's metadata.
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == preset_steps + steps_per_epoch
    assert [os.path.basename(p) for p in list_checkpoints(os.path.join(run, "checkpoints"))] == [
        f"step-{preset_steps + steps_per_epoch:09d}.weights.h5"
    ]
    metadata = _read_json(os.path.join(run, "model", "metadata.json"))
    assert metadata["training"]["initial_preset"] == preset
    assert metadata["training"]["initial_step"] == preset_steps
    assert metadata["training"]["steps"] == preset_steps + steps_per_epoch
    # The run keeps the preset's training record, to describe both later.
    assert _read_json(os.path.join(run, "run.json"))["initial_training"] == {"steps": preset_steps}

    # Rerun for longer: one more epoch, not a fresh start; the run keeps its
    # own first step even if the preset changed in the meantime.
    changed = _read_json(os.path.join(preset, "metadata.json"))
    changed["training"]["steps"] = 999
    with open(os.path.join(preset, "metadata.json"), "w") as f:
        json.dump(changed, f)
    capsys.readouterr()
    model, history = train_multi30k(run, data_dir=multi30k_dir, initial_preset=preset, **{**settings, "epochs": 2})
    assert len(history.history["loss"]) == 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == preset_steps + 2 * steps_per_epoch
    assert "after epoch 1)" in capsys.readouterr().out
    assert _read_json(os.path.join(run, "run.json"))["initial_training"] == {"steps": preset_steps}

    # Resumed without the preset it started from: refused, the run intact.
    with pytest.raises(ValueError, match="started from preset .*--from-preset"):
        train_multi30k(run, data_dir=multi30k_dir, **{**settings, "epochs": 3})
    assert _read_json(os.path.join(run, "run.json"))["initial_preset"] == preset


@once
def test_a_run_keeps_its_first_step_when_trained_longer(tmp_path, multi30k_dir):
    run, settings = str(tmp_path / "run"), {**RUN, "epochs": 1, "limit": 64, "bleu_sentences": 0}
    model, _ = train_multi30k(run, data_dir=multi30k_dir, initial_step=100, **settings)
    steps_per_epoch = _read_json(os.path.join(run, "run.json"))["steps_per_epoch"]
    # Rerun for longer without --initial-step: the run's own first step.
    model, history = train_multi30k(run, data_dir=multi30k_dir, **{**settings, "epochs": 2})
    assert len(history.history["loss"]) == 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 100 + 2 * steps_per_epoch
    assert _read_json(os.path.join(run, "run.json"))["initial_step"] == 100
    with pytest.raises(ValueError, match="changed: initial_step; the run has initial_step=100"):
        train_multi30k(run, data_dir=multi30k_dir, initial_step=5, **{**settings, "epochs": 3})


def test_mixed_bfloat16_training_computes_in_bfloat16_and_saves_float32(tmp_path, multi30k_dir):
    run, settings = str(tmp_path / "run"), {**RUN, "epochs": 1, "limit": 64, "bleu_sentences": 0}
    model, history = train_multi30k(run, data_dir=multi30k_dir, dtype="mixed_bfloat16", **settings)
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    assert model.backbone.compute_dtype == "bfloat16"
    assert {v.dtype for v in model.backbone.weights if "seed_generator" not in v.path} == {"float32"}
    batch = model.preprocessor({"encoder_text": ["A dog."], "decoder_text": ["Ein Hund."]})[0]
    hidden_states = model.backbone(batch)["decoder_sequence_output"]
    assert keras.backend.standardize_dtype(hidden_states.dtype) == "bfloat16"
    assert _read_json(os.path.join(run, "model", "metadata.json"))["training"]["dtype"] == "mixed_bfloat16"
    # The checkpoints and the saved model: float32 weights, float32 compute.
    import h5py

    for path in (os.path.join(run, "model", "model.weights.h5"), *list_checkpoints(os.path.join(run, "checkpoints"))):
        with h5py.File(path, "r") as f:
            dtypes = set()
            f.visititems(lambda name, item: dtypes.add(str(item.dtype)) if isinstance(item, h5py.Dataset) else None)
        assert "float32" in dtypes and not dtypes & {"bfloat16", "float16"}, (path, dtypes)
    saved = TransformerSeq2SeqLM.from_preset(os.path.join(run, "model"))
    assert saved.backbone.compute_dtype == "float32"
    weights = zip(saved.backbone.get_weights(), model.backbone.get_weights())
    assert all(np.array_equal(a, b) for a, b in weights)


def test_a_run_from_a_preset_refuses_what_it_cannot_do(tmp_path, multi30k_dir):
    from keras_transformer.train_run import preset_steps

    preset = "transformer_multi30k_de_en"
    with pytest.raises(ValueError, match="initial_step must be 0 or more"):
        train_multi30k(str(tmp_path / "a"), data_dir=multi30k_dir, initial_preset=preset, initial_step=-1)
    with pytest.raises(ValueError, match="d_model, num_layers cannot change .*only dropout"):
        train_multi30k(str(tmp_path / "b"), data_dir=multi30k_dir, initial_preset=preset, num_layers=2, d_model=64)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "run.json").write_text(json.dumps({"initial_preset": None, "epochs": 3}))
    with pytest.raises(ValueError, match="trained from scratch; it cannot go on from preset"):
        train_multi30k(str(scratch), data_dir=multi30k_dir, initial_preset=preset)
    assert json.loads((scratch / "run.json").read_text()) == {"initial_preset": None, "epochs": 3}
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")

    # The steps a preset was trained for: recorded, or worked out from the
    # epochs of a run's own model (flat) or of a packaged preset (settings).
    assert preset_steps(preset, {"steps": 7, "epochs": 2, "steps_per_epoch": 3}) == 7
    assert preset_steps(preset, {"epochs": 2, "steps_per_epoch": 3, "initial_step": 10}) == 16
    assert preset_steps(preset, {"settings": {"epochs": 4, "steps_per_epoch": 5}}) == 20
    assert preset_steps(preset, {}) is None
    # An ensemble preset lists each model's steps; a run starts from its
    # first model, whose last training stage ended at that step.
    from keras_transformer.presets import preset_metadata

    training = preset_metadata(preset)["training"]
    assert isinstance(training["steps"], list)
    assert preset_steps(preset, training) == training["members"][0]["stages"][-1]["steps"]


def test_a_tokenizer_left_by_a_failed_start_is_not_the_runs(tmp_path, multi30k_dir):
    from keras_transformer.datasets import multi30k
    from keras_transformer.train_run import check_same_settings
    from keras_transformer.train_run import load_or_train_tokenizer

    sources, targets = multi30k.load("train", "en", "de", multi30k_dir)
    texts = sources[:300] + targets[:300]
    # A start that failed after writing its tokenizer (no run.json): the
    # next start trains its own, with its own settings.
    left = load_or_train_tokenizer(str(tmp_path), {}, texts, 400, "bpe")
    assert (tmp_path / "tokenizer.spm").exists()
    fresh = load_or_train_tokenizer(str(tmp_path), {}, texts, 450, "unigram")
    assert fresh.vocabulary_size() == 450 and fresh.proto != left.proto
    # A run that started (run.json) keeps its tokenizer...
    assert load_or_train_tokenizer(str(tmp_path), {"vocabulary_size": 450}, texts, 450, "unigram").proto == fresh.proto
    # ...and refuses another vocabulary size.
    with pytest.raises(ValueError, match="changed: vocabulary_size; the run has vocabulary_size=450"):
        check_same_settings(str(tmp_path), {"vocabulary_size": 450}, {"vocabulary_size": 800}, None)


@once
def test_a_damaged_run_json_is_named_and_left_as_it_was(tmp_path, multi30k_dir):
    for damaged in ('{"config": "small", "epo', "[1, 2]"):
        (tmp_path / "run.json").write_text(damaged)
        with pytest.raises(ValueError, match="run.json is damaged .*Restore the file, or choose a new output directory"):
            train_multi30k(str(tmp_path), config="small", data_dir=multi30k_dir)
        assert (tmp_path / "run.json").read_text() == damaged
    assert sorted(os.listdir(tmp_path)) == ["run.json"]  # no tokenizer, no checkpoints


@once
def test_a_damaged_backup_is_named_with_the_way_on(tmp_path, capsys):
    from keras_transformer.callbacks import continue_from_checkpoint

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    backup = tmp_path / "backup"
    backup.mkdir()
    model.save_weights(str(backup / "latest.weights.h5"))
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 1, "batch": 0}))
    continue_from_checkpoint(str(backup), str(tmp_path / "checkpoints"), 10)
    assert "Resuming the unfinished run" in capsys.readouterr().out
    whole = (backup / "latest.weights.h5").read_bytes()
    for name, damaged in (("latest.weights.h5", whole[: len(whole) // 2]), ("training_metadata.json", b'{"epo')):
        kept = (backup / name).read_bytes()
        (backup / name).write_bytes(damaged)
        with pytest.raises(ValueError, match="backup of the unfinished run, .*backup, is damaged .*Delete that directory"):
            continue_from_checkpoint(str(backup), str(tmp_path / "checkpoints"), 10)
        assert (backup / name).read_bytes() == damaged  # left for the user to look at
        (backup / name).write_bytes(kept)
    # A negative epoch is damage too, with the same way on.
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": -2, "batch": 0}))
    with pytest.raises(ValueError, match="is damaged .epoch -2.. Delete that directory to go on"):
        continue_from_checkpoint(str(backup), str(tmp_path / "checkpoints"), 10)
    # A run of several processes keeps a backup each: all of them go, so
    # that every process goes on from the same checkpoint.
    for index in (10, 1, 2):
        (tmp_path / f"backup-process-{index}").mkdir()
        (tmp_path / f"backup-process-{index}" / "training_metadata.json").write_text(json.dumps({"epoch": 1, "batch": 0}))
    with pytest.raises(ValueError, match="Delete the run's backups .*backup, .*backup-process-1, .*backup-process-2, "
                       ".*backup-process-10. to go on"):
        continue_from_checkpoint(str(tmp_path / "backup-process-1"), str(tmp_path / "checkpoints"), 10)


def test_table_3_label_smoothing_rows_train_with_their_eps_ls(tmp_path, multi30k_dir):
    # Row D3 is eps_ls 0.0 (the backbone is base's): a run of it that
    # recorded the usual 0.1 is another run, refused before any work.
    (tmp_path / "run.json").write_text(json.dumps({"config": "D3", "label_smoothing": 0.1}))
    with pytest.raises(ValueError, match=r"changed: label_smoothing.*the run has label_smoothing=0.1\)"):
        train_multi30k(str(tmp_path), config="D3", data_dir=multi30k_dir)


def test_steps_make_epochs_of_at_most_one_pass_and_reruns_train_on_to_the_total():
    from keras_transformer.train_run import epoch_plan

    assert epoch_plan(132, 30, None, {}) == (30, 132)
    assert epoch_plan(132, 30, 50, {}) == (1, 50)
    assert epoch_plan(132, 30, 300, {}) == (3, 132)
    # A run of 50 steps rerun with 100: epochs of 50 still, so one more
    # epoch, 100 steps in all (not one epoch of 100 after the first 50).
    assert epoch_plan(132, 30, 100, {"steps_per_epoch": 50}) == (2, 50)
    assert epoch_plan(132, 30, 400, {"steps_per_epoch": 132}) == (4, 132)


def test_cli_rejects_unknown_config(tmp_path, multi30k_dir, capsys):
    with pytest.raises(SystemExit, match="error: Unknown config 'huge'"):
        cli.main(["train", "--output-dir", str(tmp_path), "--data-dir", multi30k_dir, "--config", "huge"])
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(SystemExit, match="error: The output directory .*a-file' is a file"):
        cli.main(["train", "--output-dir", str(tmp_path / "a-file"), "--data-dir", multi30k_dir])
    assert (tmp_path / "a-file").read_text() == "mine"
    with pytest.raises(SystemExit):
        cli.main(["train", "--output-dir", str(tmp_path), "--bleu-sentences", "-1"])
    assert "--bleu-sentences: must be 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize("averaged,said", [(5, "Saved the average of the last 5 checkpoints to"), (1, "Saved the model to")])
def test_cli_train_passes_overrides_and_says_what_it_saved(tmp_path, monkeypatch, capsys, averaged, said):
    import keras_transformer.training

    calls = []

    def fake_train(output_dir, **kwargs):
        calls.append(kwargs)
        os.makedirs(os.path.join(output_dir, "model"))
        with open(os.path.join(output_dir, "model", "metadata.json"), "w") as f:
            json.dump({"training": {"averaged_checkpoints": averaged}}, f)
        return None, None

    monkeypatch.setattr(keras_transformer.training, "train_multi30k", fake_train)
    cli.main(["train", "--output-dir", str(tmp_path / "run"), "--config", "small", "--dropout", "0.3",
              "--d-model", "128", "--dtype", "mixed_bfloat16"])
    assert calls[0]["config"] == "small" and calls[0]["dropout"] == 0.3 and calls[0]["d_model"] == 128
    assert calls[0]["dtype"] == "mixed_bfloat16"
    assert "num_layers" not in calls[0]  # not given: the config's own
    assert f"{said} {os.path.join(str(tmp_path / 'run'), 'model')}" in capsys.readouterr().out

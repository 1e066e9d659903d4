"""The examples: packaging the shipped presets records what the run did; training from token ids."""

import argparse
import importlib.util
import json
import os

from helpers import once

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packaging_records_the_steps_trained_and_checkpoints_averaged(tmp_path):
    presets_example = _load_example("multi30k_presets")
    # A run of 3 epochs of 10 steps, rerun afterwards with --epochs 1 (which
    # trained nothing): run.json asks for 1 epoch and keeps 5 checkpoints,
    # but 30 steps were trained and 3 checkpoints averaged.
    run = {"epochs": 1, "steps_per_epoch": 10, "keep_checkpoints": 5, "backend": "torch", "initial_step": 0}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "metadata.json").write_text(
        json.dumps({"training": {"steps": 30, "averaged_checkpoints": 3}})
    )
    args = argparse.Namespace(pair="en-de", run_dir=str(tmp_path), hardware="test")
    record = presets_example.training_record(args, run)
    assert record["steps"] == 30 and record["averaged_checkpoints"] == 3


def test_token_ids_keep_every_sequence_and_its_length():
    token_ids_example = _load_example("multi30k_token_ids")
    sequences = [[2, 7, 3], [2, 3], [2, 9, 9, 9, 9, 3], [5]]
    flat = token_ids_example._flat(sequences)
    assert flat.dtype == "int32" and len(flat) == len(sequences) + sum(map(len, sequences))
    assert token_ids_example._unflat(flat, len(sequences)) == sequences


def test_weights_of_another_architecture_are_refused_and_nothing_is_written(tmp_path):
    import numpy as np
    import pytest

    token_ids_example = _load_example("multi30k_token_ids")
    np.savez(tmp_path / "weights.npz", np.zeros((3, 4), "float16"))
    output = tmp_path / "preset"
    args = argparse.Namespace(weights=str(tmp_path / "weights.npz"), preset="transformer_multi30k_en_de",
                              output_dir=str(output))
    with pytest.raises(SystemExit, match="does not hold the weights"):
        token_ids_example.to_preset(args)
    assert not output.exists()


def test_the_first_stage_command_names_the_seed_and_dtype_the_run_used():
    presets_example = _load_example("multi30k_presets")
    assert "--seed 0 " in presets_example.train_command("en-de") and "--dtype" not in presets_example.train_command(
        "en-de"
    )
    command = presets_example.train_command("en-de", {"seed": 1, "dtype": "mixed_bfloat16"})
    assert "--seed 1 --dtype mixed_bfloat16 " in command
    # A shortened run (train --steps) says so in its command.
    assert "--steps 20 " in presets_example.train_command("en-de", {"steps": 20})
    assert "--steps 20 " in presets_example.longer_command("en-de", 3, steps=20)
    assert "--steps" not in presets_example.longer_command("en-de", 3)


def test_a_shortened_run_is_not_packaged_over_the_shipped_presets(tmp_path):
    import pytest

    presets_example = _load_example("multi30k_presets")
    (tmp_path / "run.json").write_text(json.dumps({"steps": 20, "epochs": 1, "steps_per_epoch": 20}))
    args = argparse.Namespace(pair="en-de", run_dir=str(tmp_path), output_root=presets_example.PACKAGE_PRESETS,
                              limit=None, hardware=None, distilled_data=None, data_dir=None)
    with pytest.raises(SystemExit, match="trained with --steps 20 .a shortened run.: give another --output-root"):
        presets_example.package(args)


def test_a_distilled_stage_records_its_teachers_and_its_data(tmp_path):
    presets_example = _load_example("multi30k_presets")
    earlier = {"command": "STAGE ONE", "steps": 100, "averaged_checkpoints": 5, "wall_time_hours": 1.0,
               "hardware": "cpu", "backend": "torch"}
    run = {"epochs": 2, "steps_per_epoch": 10, "keep_checkpoints": 5, "backend": "torch", "initial_step": 100,
           "initial_preset": "PREVIOUS", "initial_training": earlier}
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "metadata.json").write_text(json.dumps({"training": {"steps": 120}}))
    (tmp_path / "distilled").mkdir()
    distillation = {"command": "DISTILL", "teachers": [{"role": "PREVIOUS"}, {"role": "TEACHER2"}]}
    (tmp_path / "distilled" / "distillation.json").write_text(json.dumps(distillation))
    args = argparse.Namespace(pair="en-de", run_dir=str(tmp_path / "run"), hardware="test",
                              distilled_data=str(tmp_path / "distilled"))
    record = presets_example.training_record(args, run)
    last = record["stages"][-1]
    assert last["distillation"] == distillation and record["steps"] == 120
    assert last["command"].startswith("DISTILL && keras-transformer train --from-preset PREVIOUS ")
    assert "--data-dir DISTILLED --output-dir RUN3" in last["command"]
    assert record["command"] == f"STAGE ONE && {last['command']}"


def test_distill_writes_the_ensembles_translations_beside_the_other_splits(tmp_path, monkeypatch):
    import gzip

    import pytest

    from keras_transformer import cli

    presets_example = _load_example("multi30k_presets")
    data = tmp_path / "data"
    data.mkdir()
    lines = {"train.en": ["A dog runs.", "Two men talk."], "train.de": ["Ein Hund rennt.", "Zwei Männer reden."],
             "val.en": ["A cat."], "val.de": ["Eine Katze."]}
    for name, text in lines.items():
        with gzip.open(data / f"{name}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in text))
    (data / "README.md").write_text("not a split")
    calls = []

    def translate(argv):  # stands in for the teachers' ensemble
        calls.append(argv)
        source, output = argv[argv.index("-i") + 1], argv[argv.index("-o") + 1]
        with open(source) as f, open(output, "w") as g:
            g.write("".join(f"T({line.strip()})\n" for line in f))

    monkeypatch.setattr(cli, "main", translate)
    monkeypatch.setenv("KERAS_TRANSFORMER_MULTI30K_VERIFY", "0")
    run_dir = tmp_path / "distilled"
    args = argparse.Namespace(pair="en-de", data_dir=str(data), run_dir=str(run_dir),
                              teachers=["transformer_multi30k_en_de", "transformer_multi30k_en_de"])
    presets_example.distill(args)
    [argv] = calls
    assert argv[:3] == ["translate", "--preset", "transformer_multi30k_en_de"]
    assert argv[argv.index("--ensemble") + 1] == "transformer_multi30k_en_de"
    assert argv[argv.index("--beam-size") + 1] == "4" and argv[argv.index("--alpha") + 1] == "0.6"
    assert sorted(os.listdir(run_dir)) == ["distillation.json", "train.de", "train.en", "val.de.gz", "val.en.gz"]
    assert (run_dir / "train.de").read_text().splitlines() == ["T(A dog runs.)", "T(Two men talk.)"]
    record = json.loads((run_dir / "distillation.json").read_text())
    assert [t["role"] for t in record["teachers"]] == ["PREVIOUS (the stage this one goes on from)", "TEACHER2"]
    from keras_transformer import presets

    assert record["teachers"][0]["training"] == presets.preset_metadata("transformer_multi30k_en_de")["training"]
    # The distilled data is never written over.
    with pytest.raises(SystemExit, match="not empty"):
        presets_example.distill(args)
    assert len(calls) == 1


def test_distilled_translations_join_the_references_or_replace_them(tmp_path):
    import numpy as np

    token_ids_example = _load_example("multi30k_token_ids")
    sources, references = [[5, 6, 2], [7, 2], [8, 9, 10, 2]], [[1, 11, 2], [1, 12, 13, 2], [1, 14, 2]]
    flat = token_ids_example._flat
    np.savez(tmp_path / "pairs.npz", **{"train.encoder.en": flat(sources), "train.decoder.de": flat(references),
                                        "train.text.en": np.array(["a", "b", "c"]),
                                        "train.text.de": np.array(["x", "y", "z"])})
    # The teacher translated sources 2 and 0, in that order.
    translations = [[1, 20, 21, 2], [1, 22, 2]]
    np.savez(tmp_path / "distilled.npz", rows=np.array([2, 0], "int32"), decoder=flat(translations))
    data = token_ids_example.TokenIds(tmp_path / "pairs.npz")

    def pairs(**options):
        args = argparse.Namespace(pair="en-de", limit=None, distilled=None, distilled_only=False)
        return token_ids_example._training_pairs(data, argparse.Namespace(**{**vars(args), **options}))

    assert pairs() == (sources, references, 0)
    assert pairs(limit=1) == (sources[:1], references[:1], 0)
    both = pairs(distilled=str(tmp_path / "distilled.npz"))
    assert both == (sources + [sources[2], sources[0]], references + translations, 2)
    only = pairs(distilled=str(tmp_path / "distilled.npz"), distilled_only=True)
    assert only == ([sources[2], sources[0]], translations, 2)


def test_the_pipeline_leaves_out_teachers_without_a_val_score(tmp_path):
    token_ids_example = _load_example("multi30k_token_ids")
    (tmp_path / "scored.json").write_text(json.dumps({"val": 37.5}))
    (tmp_path / "killed.json").write_text("{")
    assert token_ids_example._val_bleu(str(tmp_path / "scored.json")) == 37.5
    assert token_ids_example._val_bleu(str(tmp_path / "killed.json")) == float("-inf")
    assert token_ids_example._val_bleu(str(tmp_path / "missing.json")) == float("-inf")


def test_averaged_weights_are_the_element_wise_mean_in_float16(tmp_path):
    import numpy as np

    token_ids_example = _load_example("multi30k_token_ids")
    first = [np.array([[1.0, 2.0], [3.0, 4.0]], "float16"), np.array([0.5], "float16")]
    second = [np.array([[3.0, 2.0], [1.0, -4.0]], "float16"), np.array([1.5], "float16")]
    token_ids_example._write_average([first, second], str(tmp_path / "average.npz"), {"d_model": 2})
    assert token_ids_example._weights_architecture(str(tmp_path / "average.npz")) == {"d_model": 2}
    average = token_ids_example._load_weights(str(tmp_path / "average.npz"))
    assert [w.dtype for w in average] == ["float16", "float16"]
    np.testing.assert_array_equal(average[0], [[2.0, 2.0], [2.0, 0.0]])
    np.testing.assert_array_equal(average[1], [1.0])


def test_the_schedule_peaks_at_the_rate_asked_for_and_goes_on_from_the_step_given():
    import keras
    import numpy as np

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    token_ids_example = _load_example("multi30k_token_ids")
    backbone = TransformerBackbone(vocabulary_size=50, num_layers=1, d_model=16, d_ff=32, num_heads=2)

    def rate(step=None, **options):
        model = TransformerSeq2SeqLM(backbone)
        args = argparse.Namespace(**{"warmup_steps": 100, "peak_learning_rate": None, "initial_step": 0, **options})
        token_ids_example._compile(model, args)
        if step is not None:
            model.optimizer.build(model.trainable_variables)
            model.optimizer.iterations.assign(step - 1)  # the schedule's steps count from 1
        return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))

    # The paper's formula: d_model**-0.5 * min(step**-0.5, step * warmup**-1.5).
    np.testing.assert_allclose(rate(100), 16**-0.5 * 100**-0.5, rtol=1e-5)
    np.testing.assert_allclose(rate(100, peak_learning_rate=0.005), 0.005, rtol=1e-5)
    np.testing.assert_allclose(rate(400, peak_learning_rate=0.005), 0.005 * (100 / 400) ** 0.5, rtol=1e-5)
    # Going on after 399 updates: the 400th step's rate, without setting the step again.
    np.testing.assert_allclose(rate(peak_learning_rate=0.005, initial_step=399), rate(400, peak_learning_rate=0.005))
    assert rate(peak_learning_rate=0.005, initial_step=399) < rate(peak_learning_rate=0.005, initial_step=99)


def test_weights_of_other_sizes_become_a_preset_of_those_sizes_with_their_command(tmp_path):
    import numpy as np

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    token_ids_example = _load_example("multi30k_token_ids")
    template = TransformerBackbone.from_preset("transformer_multi30k_en_de", load_weights=False)
    sizes = {"num_layers": 1, "d_model": 32, "d_ff": 48, "num_heads": 2}
    backbone = TransformerBackbone.from_config({**template.get_config(), **sizes})
    weights = [np.random.default_rng(i).normal(size=w.shape).astype("float16") for i, w in enumerate(backbone.weights)]
    np.savez(tmp_path / "tiny.npz", *weights)
    record = {"pair": "de-en", "seed": 3, "architecture": sizes, "dropout": 0.3, "max_tokens": 8192,
              "warmup_steps": 2000, "peak_learning_rate": 0.005, "epochs": 51, "steps": 3621, "averaged_epochs": 10,
              "hardware": "test", "val": 40.0}
    (tmp_path / "tiny.json").write_text(json.dumps(record))
    token_ids_example.to_preset(argparse.Namespace(weights=str(tmp_path / "tiny.npz"),
                                                   preset="transformer_multi30k_en_de",
                                                   output_dir=str(tmp_path / "preset")))
    model = TransformerSeq2SeqLM.from_preset(str(tmp_path / "preset"))
    assert {key: model.backbone.get_config()[key] for key in sizes} == sizes
    for loaded, saved in zip(model.backbone.get_weights(), weights):
        np.testing.assert_array_equal(loaded, saved.astype(loaded.dtype))
    metadata = json.loads((tmp_path / "preset" / "metadata.json").read_text())
    command = metadata["training"]["command"]
    assert "--pair de-en --seed 3 --epochs 51 --num-layers 1 --d-model 32 --d-ff 48 --num-heads 2" in command
    assert "--max-tokens 8192 --warmup-steps 2000 --peak-learning-rate 0.005" in command
    assert metadata["scores_lowercase"] == {"val": 40.0}
    assert metadata["languages"] == {"source": "de", "target": "en"}
    # --weights-storage int8: the same preset, its weights in int8.
    token_ids_example.to_preset(argparse.Namespace(weights=str(tmp_path / "tiny.npz"),
                                                   preset="transformer_multi30k_en_de", weights_storage="int8",
                                                   output_dir=str(tmp_path / "int8")))
    assert json.loads((tmp_path / "int8" / "metadata.json").read_text())["weights_storage"] == "int8"
    assert sorted(json.loads((tmp_path / "int8" / "metadata.json").read_text())["weights_sha256"]) == ["model.weights.h5"]
    stored = TransformerSeq2SeqLM.from_preset(str(tmp_path / "int8"))
    for loaded, saved in zip(stored.backbone.get_weights(), weights):
        assert np.abs(loaded - saved).max() <= np.abs(saved).max() / 254 * 1.001


def test_scores_join_the_record_of_how_the_weights_were_trained(tmp_path, monkeypatch):
    import pytest

    token_ids_example = _load_example("multi30k_token_ids")
    (tmp_path / "model.npz").write_bytes(b"")
    (tmp_path / "model.json").write_text(json.dumps({"pair": "en-de", "architecture": {"d_model": 128}, "val": 1.0}))
    monkeypatch.setattr(token_ids_example, "TokenIds", lambda path: None)
    monkeypatch.setattr(token_ids_example, "_ensemble", lambda data, paths: paths)
    monkeypatch.setattr(token_ids_example, "_scores", lambda model, data, pair, limit: {"val": 38.5})
    args = argparse.Namespace(token_ids="pairs.npz", pair="en-de", weights=[str(tmp_path / "model.npz")],
                              score_limit=None, output=None)
    token_ids_example.score(args)
    record = json.loads((tmp_path / "model.json").read_text())
    assert record == {"pair": "en-de", "architecture": {"d_model": 128}, "val": 38.5}
    # An ensemble's scores are no model's: they go where --output says, and nowhere without it.
    args.weights.append(str(tmp_path / "other.npz"))
    with pytest.raises(SystemExit, match="--output"):
        token_ids_example.score(args)
    args.output = str(tmp_path / "ensemble.json")
    token_ids_example.score(args)
    assert json.loads((tmp_path / "ensemble.json").read_text())["models"] == ["model.npz", "other.npz"]
    assert json.loads((tmp_path / "model.json").read_text()) == record


def test_sizes_beside_a_runs_weights_and_a_step_without_them_are_refused():
    import pytest

    token_ids_example = _load_example("multi30k_token_ids")
    args = argparse.Namespace(init_weights="run.npz", initial_step=100, num_layers=4, d_model=None, d_ff=None,
                              num_heads=None)
    with pytest.raises(SystemExit, match="leave out num_layers"):
        token_ids_example._architecture(args)
    args = argparse.Namespace(init_weights=None, initial_step=100, num_layers=None, d_model=128, d_ff=None,
                              num_heads=None)
    with pytest.raises(SystemExit, match="--initial-step goes on with a run"):
        token_ids_example._architecture(args)
    args.initial_step = 0
    assert token_ids_example._architecture(args) == {"num_layers": 3, "d_model": 128, "d_ff": 1024, "num_heads": 4}


@once
def test_an_ensemble_preset_holds_each_members_weights_stages_and_the_scores_of_the_weights_as_saved(
    tmp_path, monkeypatch
):
    import numpy as np
    import pytest

    from keras_transformer.metrics import evaluate_translation
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    token_ids_example = _load_example("multi30k_token_ids")
    template = TransformerBackbone.from_preset("transformer_multi30k_en_de", load_weights=False)
    sources = ["Ein Hund rennt.", "Zwei Männer spielen Fußball im Park.", "Eine Frau liest."]
    references = ["A dog runs.", "Two men play soccer in the park.", "A woman reads."]

    class Texts:  # the test splits `prepare` would have written
        def __init__(self, path):
            pass

        def texts(self, split, language):
            return (sources if language == "de" else references) + ["not scored"]

    monkeypatch.setattr(token_ids_example, "TokenIds", Texts)
    members, weights = [], []
    for seed, sizes in enumerate(({"num_layers": 1, "d_model": 32, "d_ff": 48, "num_heads": 2},
                                  {"num_layers": 2, "d_model": 16, "d_ff": 32, "num_heads": 2})):
        backbone = TransformerBackbone.from_config({**template.get_config(), **sizes})
        rng = np.random.default_rng(seed)
        values = [rng.normal(scale=0.3, size=w.shape).astype("float16") for w in backbone.weights]
        stages = []
        for stage in ("first", "continued"):  # the second stage goes on from the first's weights
            path = tmp_path / f"{seed}-{stage}.npz"
            np.savez(path, *values)
            record = {"pair": "de-en", "seed": seed, "architecture": sizes, "epochs": 5, "steps": 100,
                      "averaged_epochs": 2, "hardware": "test", "val": 10.0 + seed}
            if stage == "continued":
                record.update(initial_weights=stages[0], initial_step=100, steps=150, val=11.0 + seed)
            (tmp_path / f"{seed}-{stage}.json").write_text(json.dumps(record))
            stages.append(str(path))
        members.append(",".join(stages))
        weights.append(values)
    args = argparse.Namespace(token_ids="pairs.npz", members=members, preset="transformer_multi30k_en_de",
                              limit=3, output_dir=str(tmp_path / "ensemble"))
    token_ids_example.ensemble_preset(args)

    model = TransformerSeq2SeqLM.from_preset(args.output_dir)
    assert len(model.ensemble_members) == 1
    loaded_models = [model, *model.ensemble_members]
    assert [(m.backbone.num_layers, m.backbone.d_model) for m in loaded_models] == [(1, 32), (2, 16)]
    for loaded, values in zip(loaded_models, weights):
        for got, saved in zip(loaded.backbone.get_weights(), values):
            np.testing.assert_array_equal(got, saved.astype(got.dtype))
    metadata = json.loads((tmp_path / "ensemble" / "metadata.json").read_text())
    assert metadata["languages"] == {"source": "de", "target": "en"}
    assert metadata["scored_sentences"] == 3
    first_member = metadata["training"]["members"][0]["stages"]
    assert [stage["steps"] for stage in first_member] == [100, 150]
    assert "--num-layers 1 --d-model 32" in first_member[0]["command"]
    assert "--init-weights PREVIOUS_STAGE.npz --initial-step 100" in first_member[1]["command"]
    # The scores are those of the preset as loaded, decoded with both models.
    result = evaluate_translation(model, sources, references, batch_size=64, beam_size=4, alpha=0.6)
    assert metadata["scores"]["test_2016_flickr"]["bleu"] == pytest.approx(result["bleu"])
    assert metadata["scores"]["test_2016_flickr"]["bleu_lowercase"] == pytest.approx(result["bleu_lowercase"])

    # A second run into the same directory, or members of two pairs, are refused; the preset stays.
    with pytest.raises(SystemExit, match="not empty"):
        token_ids_example.ensemble_preset(args)
    record = json.loads((tmp_path / "1-continued.json").read_text())
    (tmp_path / "1-continued.json").write_text(json.dumps({**record, "pair": "en-de"}))
    args.output_dir = str(tmp_path / "mixed")
    with pytest.raises(SystemExit, match="one pair"):
        token_ids_example.ensemble_preset(args)
    assert not os.path.exists(args.output_dir)
    assert TransformerSeq2SeqLM.from_preset(str(tmp_path / "ensemble")).ensemble_members


def test_an_ensemble_preset_among_the_weights_scored_or_distilled_counts_as_all_its_models(tmp_path):
    import pytest

    from keras_transformer.presets.ensembles import member_paths
    from keras_transformer.presets.registry import resolve

    token_ids_example = _load_example("multi30k_token_ids")
    models = token_ids_example._models_of(["run.npz", "transformer_multi30k_en_de"])
    assert len(models) == 2 + len(member_paths("transformer_multi30k_en_de")) and len(models) > 2
    assert models[:2] == ["run.npz", "transformer_multi30k_en_de"]
    # Each further model is a backbone preset whose sizes the example reads.
    for path in models[2:]:
        with open(os.path.join(resolve(path), "config.json")) as f:
            config = json.load(f)["config"]
        assert token_ids_example._weights_architecture(path) == {
            key: config[key] for key in ("num_layers", "d_model", "d_ff", "num_heads")
        }
    # An ensemble preset's scores are no model's record.
    args = argparse.Namespace(token_ids="pairs.npz", pair="en-de", weights=["transformer_multi30k_en_de"],
                              score_limit=None, output=None)
    with pytest.raises(SystemExit, match="--output"):
        token_ids_example.score(args)

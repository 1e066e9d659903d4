"""The presets shipped in the package: they load by name with no network,
translate fixed sentences to the same output on every backend, and score on
Multi30k test sentences as their metadata says."""

import hashlib
import os
import socket

import pytest

from keras_transformer import cli
from keras_transformer import presets
from keras_transformer.datasets import multi30k
from keras_transformer.metrics import corpus_scores
from keras_transformer.models import TransformerSeq2SeqLM

from helpers import once

# Greedy outputs of the shipped ensembles: the same strings on jax,
# tensorflow and torch (this file runs on each).
EXPECTED = {
    "transformer_multi30k_en_de": {
        "A man is riding a bicycle.": "Ein Mann fährt Fahrrad.",
        "Two dogs are playing in the snow.": "Zwei Hunde spielen im Schnee.",
        "A little girl in a pink dress climbs the stairs.":
            "Ein kleines Mädchen in einem rosa Kleid klettert die Treppe hinauf.",
    },
    "transformer_multi30k_de_en": {
        "Ein Mann fährt Fahrrad.": "A man is riding a bicycle.",
        "Zwei Hunde spielen im Schnee.": "Two dogs play in the snow.",
        "Ein kleines Mädchen in einem rosa Kleid klettert die Treppe hinauf.":
            "A little girl in a pink dress climbs the stairs.",
    },
}
SHIPPED = sorted(presets.list_presets())


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access during a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_multi30k_presets_ship_with_their_record():
    assert SHIPPED == sorted(EXPECTED)
    total = 0
    for name, info in presets.list_presets().items():
        total += info["size_bytes"]
        assert info["path"].startswith(presets.PRESETS_DIR)
        languages = info["languages"]
        assert name.endswith(f"_{languages['source']}_{languages['target']}")
        for split in ("test_2016_flickr", "test_2017_flickr"):
            score = info["scores"][split]
            assert score["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
            assert "case:lc" in score["bleu_lowercase_signature"]
        assert info["decoding"] == {"beam_size": 4, "alpha": 0.6, "max_length_offset": 50}
        # Ensembles of models trained by the example script, each model's stages recorded.
        assert info["training"]["script"] == "examples/multi30k_token_ids.py"
        members = info["training"]["members"]
        assert len(members) == 1 + len(info["ensemble"]) >= 2
        for member in members:
            for stage in member["stages"]:
                assert stage["command"].startswith("python examples/multi30k_token_ids.py train")
        assert "non-commercial" in info["data_terms"]
        # Loading checks each model's weights against its recorded SHA-256;
        # they are stored in int8 (keras_transformer.presets.int8).
        for directory in [info["path"], *(os.path.join(info["path"], path) for path in info["ensemble"])]:
            metadata = presets.read_metadata(directory)
            assert metadata["weights_storage"] == "int8"
            with open(os.path.join(directory, "model.weights.int8.npz"), "rb") as f:
                assert metadata["weights_sha256"] == {"model.weights.int8.npz": hashlib.sha256(f.read()).hexdigest()}
    assert total < 40 * 10**6


@pytest.mark.parametrize("name", SHIPPED)
def test_loads_by_name_offline_and_translates_fixed_sentences(name, no_network):
    model = TransformerSeq2SeqLM.from_preset(name)
    models = [model, *model.ensemble_members]
    assert presets.list_presets()[name]["parameter_count"] == sum(m.backbone.count_params() for m in models)
    sources = list(EXPECTED[name])
    assert model.generate(sources, sampler="greedy") == list(EXPECTED[name].values())
    assert model.generate("") == ""


# The weights against their recorded scores: the same on every backend
# (the fixed sentences above check each backend's decoding).
@once
@pytest.mark.parametrize("name", SHIPPED)
def test_scores_on_test_sentences_agree_with_the_metadata(name, multi30k_dir):
    info = presets.list_presets()[name]
    source, target = info["languages"]["source"], info["languages"]["target"]
    sources, references = multi30k.load("test_2016_flickr", source, target, data_dir=multi30k_dir)
    model = TransformerSeq2SeqLM.from_preset(name)
    translations = model.generate(sources[:100], sampler="greedy", batch_size=100)
    scores = corpus_scores(translations, references[:100])
    # The first 100 sentences, greedy, against the full test set's greedy
    # score in the metadata: close, and far above an untrained model's ~0.
    recorded = info["greedy_scores"]["test_2016_flickr"]["bleu"]
    assert abs(scores["bleu"] - recorded) < 6.0, (scores["bleu"], recorded)


@once
def test_translate_command_uses_the_en_de_preset_by_default(capsys, no_network):
    cli.main(["translate", "--beam-size", "1", *EXPECTED["transformer_multi30k_en_de"]])
    assert capsys.readouterr().out.splitlines() == list(EXPECTED["transformer_multi30k_en_de"].values())


@once
def test_translate_command_takes_a_preset_name(capsys, no_network):
    name = "transformer_multi30k_de_en"
    cli.main(["translate", "--preset", name, "--beam-size", "1", *EXPECTED[name]])
    assert capsys.readouterr().out.splitlines() == list(EXPECTED[name].values())

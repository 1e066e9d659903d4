"""Ensemble decoding: the next token ranked by the models' mean probability,
checked against exhaustive search over full forward passes (NumPy)."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.decoding import Ensemble
from keras_transformer.decoding import beam_search
from keras_transformer.decoding.rules import length_penalty

from helpers import once
from test_beam_search import END
from test_beam_search import OUTPUTS
from test_beam_search import START
from test_beam_search import teacher_forced_inputs
from test_beam_search import tiny_model


def mean_probability_log_probs(models, source, outputs):
    """log P(output | source) of each output (all of one length) under the
    models' mean next-token probabilities, from full forward passes of each
    model (no cache), all outputs in one batch."""
    inputs = teacher_forced_inputs(source, outputs)
    probabilities = []
    for model in models:
        logits = ops.convert_to_numpy(model(inputs)).astype("float64")
        exp = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities.append(exp / exp.sum(-1, keepdims=True))
    mean = np.mean(probabilities, axis=0)
    return [float(sum(np.log(mean[row, t, token]) for t, token in enumerate(output)))
            for row, output in enumerate(outputs)]


def two_layer_model(seed):
    """A model of the tiny models' vocabulary with another depth: the
    ensemble's cache holds each model's layers."""
    import keras

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    keras.utils.set_random_seed(seed)
    backbone = TransformerBackbone(6, num_layers=2, d_model=8, d_ff=16, num_heads=2, dropout=0.0)
    backbone.token_embedding.embeddings.assign(np.random.normal(0, 1.5, (6, 8)).astype("float32"))
    return TransformerSeq2SeqLM(backbone)


def test_wide_beam_over_an_ensemble_equals_exhaustive_search():
    models = [tiny_model(seed=0), two_layer_model(seed=5)]
    source, max_tokens, alpha = [START, 4, 5, 4, END], 3, 0.6
    scored = []
    for length in range(1, max_tokens + 1):
        outputs = [
            output for output in map(list, itertools.product(OUTPUTS, repeat=length))
            if END not in output[:-1] and (output[-1] == END or length == max_tokens)
        ]
        for output, log_prob in zip(outputs, mean_probability_log_probs(models, source, outputs)):
            ids = output[:-1] if output[-1] == END else output
            scored.append((log_prob / length_penalty(length, alpha), log_prob, ids))
    expected = sorted(scored, key=lambda item: -item[0])[:5]
    # 64 beams hold every prefix of 3 tokens over 4 symbols: exact search.
    result = beam_search(Ensemble(models), [source], beam_size=64, alpha=alpha,
                         max_length_offset=max_tokens - len(source), num_results=5)[0]
    if keras.config.backend() == "jax":
        # (The compiled search multiplied by each model's transposed copy.)
        assert all("_output_columns" in model.backbone.token_embedding.__dict__ for model in models)
    assert [ids for ids, _, _ in result] == [ids for _, _, ids in expected]
    np.testing.assert_allclose([s for _, s, _ in result], [s for s, _, _ in expected], rtol=1e-4)
    np.testing.assert_allclose([lp for _, _, lp in result], [lp for _, lp, _ in expected], rtol=1e-4)
    # The ensemble ranks otherwise than either model alone.
    for model in models:
        alone = beam_search(model, [source], beam_size=64, alpha=alpha,
                            max_length_offset=max_tokens - len(source), num_results=5)[0]
        assert [s for _, s, _ in alone] != pytest.approx([s for _, s, _ in result], rel=1e-3)


def test_generate_with_an_ensemble_of_different_models():
    first, second = tiny_model(seed=1), two_layer_model(seed=6)
    sources = [[START, 4, 5, END], [START, 5, 4, 4, 5, 1, END], [START, 1, END]]
    ids = np.zeros((3, 7), "int32")
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    inputs = {"encoder_token_ids": ids, "encoder_padding_mask": (ids != 0).astype("int32")}
    outputs = first.generate(inputs, beam_size=3, max_length_offset=4, return_scores=True, ensemble=[second])
    expected = beam_search(Ensemble([first, second]), sources, beam_size=3, max_length_offset=4)
    assert [[(ids, pytest.approx(score, rel=1e-5))] for ids, score, _ in (r[0] for r in expected)] == outputs
    # A model with itself is the model alone: the mean of equal distributions.
    alone = first.generate(inputs, beam_size=3, max_length_offset=4, return_scores=True)
    doubled = first.generate(inputs, beam_size=3, max_length_offset=4, return_scores=True, ensemble=[first])
    assert [[(ids, pytest.approx(score, rel=1e-5, abs=1e-6)) for ids, score in r] for r in alone] == doubled


def test_models_of_other_vocabularies_are_refused():
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    model = tiny_model()
    other = TransformerSeq2SeqLM(TransformerBackbone(9, num_layers=1, d_model=16, d_ff=32, num_heads=2))
    with pytest.raises(ValueError, match="vocabulary of 9 tokens, model 0 one of 6: the models of an ensemble must share"):
        Ensemble([model, other])
    with pytest.raises(ValueError, match="at least two models"):
        Ensemble([model])
    import keras_hub

    with pytest.raises(ValueError, match="no scores, n-best lists or ensembles"):
        model.generate({"encoder_token_ids": np.array([[START, 4, END]], "int32"),
                        "encoder_padding_mask": np.ones((1, 3), "int32")},
                       sampler=keras_hub.samplers.GreedySampler(), ensemble=[model])


@once
def test_translate_command_takes_ensemble_presets(capsys):
    from keras_transformer import cli

    text = "Two dogs are playing in the snow."
    cli.main(["translate", text])
    alone = capsys.readouterr().out
    cli.main(["translate", "--ensemble", "transformer_multi30k_en_de", text])
    assert capsys.readouterr().out == alone
    # The de-en preset shares the en-de preset's vocabulary, not its direction.
    with pytest.raises(SystemExit, match="the models of an ensemble must translate the same languages"):
        cli.main(["translate", "--ensemble", "transformer_multi30k_de_en", text])


def preset_sized_models(seeds_and_layers):
    """Small random models on the shipped en-de preset's tokenizer (of
    other sizes than its model), the first with its preprocessor's
    settings: models an ensemble preset can hold."""
    import keras

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    preset = TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_weights=False)
    models = []
    for seed, layers in seeds_and_layers:
        keras.utils.set_random_seed(seed)
        config = {**preset.backbone.get_config(), "num_layers": layers, "d_model": 16, "d_ff": 24, "num_heads": 2}
        models.append(TransformerSeq2SeqLM(TransformerBackbone.from_config(config), preprocessor=preset.preprocessor))
    return models


SENTENCES = ["A dog runs on the beach.", "Two men."]


def test_an_ensemble_preset_saves_its_models_and_loads_them_as_its_ensemble(tmp_path):
    import json

    from keras_transformer.models import TransformerSeq2SeqLM

    first, second, third = preset_sized_models([(1, 1), (2, 2), (3, 1)])
    first.set_ensemble_members([second, third])
    first.save_to_preset(tmp_path / "ensemble")
    metadata = json.loads((tmp_path / "ensemble" / "metadata.json").read_text())
    assert metadata["ensemble"] == ["ensemble/1", "ensemble/2"]
    loaded = TransformerSeq2SeqLM.from_preset(tmp_path / "ensemble")
    assert [m.backbone.num_layers for m in loaded.ensemble_members] == [2, 1]
    for member, saved in zip(loaded.ensemble_members, (second, third)):
        for a, b in zip(member.backbone.get_weights(), saved.backbone.get_weights()):
            np.testing.assert_array_equal(a, b)
    # The members are not the first model's weights: fit trains it alone.
    assert len(loaded.weights) == len(loaded.backbone.weights)
    if hasattr(loaded, "parameters"):  # PyTorch: nor its torch parameters
        assert len(list(loaded.parameters())) == len(list(loaded.backbone.parameters()))
    assert TransformerSeq2SeqLM.from_preset(tmp_path / "ensemble", load_ensemble=False).ensemble_members == []
    settings = dict(max_length_offset=6, return_scores=True)
    together = first.generate(SENTENCES, ensemble=[second, third], **settings)
    assert loaded.generate(SENTENCES, **settings) == [
        [(text, pytest.approx(score, rel=1e-4, abs=1e-5))] for [(text, score)] in together
    ]
    alone = first.generate(SENTENCES, ensemble=[], **settings)
    assert loaded.generate(SENTENCES, ensemble=[], **settings) == [
        [(text, pytest.approx(score, rel=1e-4, abs=1e-5))] for [(text, score)] in alone
    ]
    assert [score for [(_, score)] in alone] != pytest.approx([score for [(_, score)] in together], rel=1e-3)


@once
def test_a_model_saved_over_an_ensemble_preset_leaves_no_member_behind(tmp_path):
    from keras_transformer.models import TransformerSeq2SeqLM

    first, second = preset_sized_models([(1, 1), (2, 1)])
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "preset")
    first.set_ensemble_members([])
    first.save_to_preset(tmp_path / "preset")
    assert not (tmp_path / "preset" / "ensemble").exists()
    assert TransformerSeq2SeqLM.from_preset(tmp_path / "preset").ensemble_members == []


@once
def test_an_ensemble_preset_missing_or_with_a_damaged_member_is_named(tmp_path):
    import shutil

    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.presets import PresetError

    first, second = preset_sized_models([(1, 1), (2, 1)])
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "preset")
    weights = tmp_path / "preset" / "ensemble" / "1" / "model.weights.h5"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(PresetError, match="model.weights.h5"):
        TransformerSeq2SeqLM.from_preset(tmp_path / "preset")
    shutil.rmtree(tmp_path / "preset" / "ensemble" / "1")
    with pytest.raises(PresetError, match="lists the ensemble model 'ensemble/1', which it does not hold"):
        TransformerSeq2SeqLM.from_preset(tmp_path / "preset")


@once
def test_an_ensemble_preset_whose_member_does_not_fit_is_named(tmp_path):
    import json

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.presets import PresetError

    first, second = preset_sized_models([(1, 1), (2, 1)])
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "preset")
    TransformerBackbone(9, num_layers=1, d_model=16, d_ff=32, num_heads=2).save_to_preset(
        tmp_path / "preset" / "ensemble" / "1"
    )
    with pytest.raises(PresetError, match="'ensemble/1', which does not fit its first model"):
        TransformerSeq2SeqLM.from_preset(tmp_path / "preset")
    # Metadata copied from an ensemble preset lists no members for a save without them.
    first.set_ensemble_members([])
    metadata = json.loads((tmp_path / "preset" / "metadata.json").read_text())
    first.save_to_preset(tmp_path / "single", metadata=metadata)
    assert TransformerSeq2SeqLM.from_preset(tmp_path / "single").ensemble_members == []


@once
def test_ensemble_members_of_another_vocabulary_are_refused():
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    (first,) = preset_sized_models([(1, 1)])
    other = TransformerSeq2SeqLM(TransformerBackbone(9, num_layers=1, d_model=16, d_ff=32, num_heads=2))
    with pytest.raises(ValueError, match="must share one vocabulary"):
        first.set_ensemble_members([other])
    assert first.ensemble_members == []
    second, third = preset_sized_models([(2, 1), (3, 1)])
    second.set_ensemble_members([third])
    with pytest.raises(ValueError, match="has ensemble members of its own"):
        first.set_ensemble_members([second])


@once
def test_commands_decode_with_an_ensemble_presets_models_and_exports_warn(tmp_path, capsys):
    import argparse

    from keras_transformer import cli
    from keras_transformer.cli_decoding import add_decoding_options
    from keras_transformer.convert import export_marian

    first, second = preset_sized_models([(1, 1), (2, 2)])
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "preset")
    # (The decoding options' defaults as the command line's parser gives them.)
    parser = argparse.ArgumentParser()
    add_decoding_options(parser)
    args = parser.parse_args([])
    args.ensemble, args.dtype, args.quantize, args.first_model_only = [str(tmp_path / "preset")], None, None, False
    model, decoding = cli._load_translator(str(tmp_path / "preset"), args)
    # The preset's two models, then the --ensemble preset's two.
    assert [m.backbone.num_layers for m in [model, *decoding["ensemble"]]] == [1, 2, 1, 2]
    args.first_model_only = True
    model, decoding = cli._load_translator(str(tmp_path / "preset"), args)
    assert [m.backbone.num_layers for m in [model, *decoding["ensemble"]]] == [1, 1]
    with pytest.warns(UserWarning, match="the first of the ensemble's 2 models only"):
        export_marian(str(tmp_path / "preset"), tmp_path / "marian")


def test_models_built_alike_share_their_compiled_steps(monkeypatch):
    """The host search of an ensemble (sources that leave the batch, a
    growing cache) finds what the search in one loop finds; on JAX and
    TensorFlow it compiles each model's step once for the models built
    alike: the second tiny model runs the first one's compiled code."""
    from keras_transformer.runtime.compiled import compiles_steps

    models = [tiny_model(seed=0), tiny_model(seed=3), two_layer_model(seed=5)]
    traced = {i: 0 for i in range(3)}
    for i, model in enumerate(models):
        def counting(*args, _call=model.call_decoder_with_cache, _i=i, **kwargs):
            traced[_i] += 1
            return _call(*args, **kwargs)

        monkeypatch.setattr(model, "call_decoder_with_cache", counting)
    sources = [[START, 4, 5, END], [START, 5, 4, 4, 5, 1, END], [START, 1, END], [START, 4, END],
               [START, 5, 5, 1, 4, END]]
    settings = dict(beam_size=3, max_length_offset=6, num_results=2)
    host = beam_search(Ensemble(models), sources, in_loop=False, **settings)
    if compiles_steps():
        assert traced[0] > 0 and traced[2] > 0
        assert traced[1] == 0, "the second tiny model's step was compiled again"
    loop = beam_search(Ensemble(models), sources, in_loop=True, **settings)
    assert [[ids for ids, _, _ in result] for result in host] == [[ids for ids, _, _ in result] for result in loop]
    np.testing.assert_allclose([s for result in host for _, s, _ in result],
                               [s for result in loop for _, s, _ in result], rtol=1e-5)


def _ensemble_for_grouping(normalize_first=False):
    """Five models: three alike (one layer), then a two-layer one, then
    another two-layer one, interleaved so that groups are not runs."""
    import keras

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    def two_layers(seed):
        keras.utils.set_random_seed(seed)
        backbone = TransformerBackbone(6, num_layers=2, d_model=8, d_ff=16, num_heads=2, dropout=0.0,
                                       normalize_first=normalize_first)
        backbone.token_embedding.embeddings.assign(np.random.normal(0, 1.5, (6, 8)).astype("float32"))
        return TransformerSeq2SeqLM(backbone)

    one = [tiny_model(seed=seed, normalize_first=normalize_first) for seed in (0, 1, 2)]
    models = [one[0], two_layers(5), one[1], two_layers(6), one[2]]
    # Every bias, LayerNorm scale and offset, and kernel moved off its
    # initial value, so that each model's own weights show in its outputs.
    rng = np.random.default_rng(7)
    for model in models:
        for variable in model.variables:
            if "embeddings" not in variable.path:
                variable.assign(ops.convert_to_numpy(variable) + rng.normal(0, 0.2, variable.shape).astype("float32"))
    return Ensemble(models)


def _prepack_float32_products(monkeypatch, prepacked):
    """Float32 products prepacked for oneDNN (as on AMD processors), down
    to the test models' tiny matrices, or not at all."""
    import torch

    from keras_transformer.runtime import int8_products

    if prepacked and not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch has no oneDNN")
    monkeypatch.setattr(int8_products, "_float32_products_prepacked", lambda: prepacked)
    monkeypatch.setattr(int8_products, "_PREPACKED_FLOAT32_WEIGHTS", 1)


def _group_projections(ensemble):
    """Whether each group of the ensemble's last grouped step projected
    through its models' prepacked products."""
    groups = ensemble.__dict__["_torch_grouped_plan"][2]
    return [weights.projections is not None for _, weights in groups if weights is not None]


@pytest.mark.skipif(__import__("keras").config.backend() != "torch", reason="the grouped step is PyTorch's")
@pytest.mark.parametrize("normalize_first,prepacked", [(False, False), (True, False), (False, True)])
def test_alike_models_step_as_one_with_the_ensembles_probabilities(normalize_first, prepacked, monkeypatch):
    """On PyTorch, for a few rows, an ensemble's alike models step as one
    (`torch_ensemble_step.grouped_step`): the log-probabilities of three
    cached steps (two sources, one padded) and a beam search's results
    are those of the models stepped one after another; also with each
    model's output projection a prepacked product (AMD processors)."""
    from keras_transformer.decoding import DecodingSettings
    from keras_transformer.runtime import torch_ensemble_step
    from keras_transformer.decoding.interface import decoding_functions
    from keras_transformer.decoding.interface import forget_decoding_functions
    from keras_transformer.runtime.direct_calls import unchanged_weights

    _prepack_float32_products(monkeypatch, prepacked)
    ensemble = _ensemble_for_grouping(normalize_first)
    sources = np.array([[START, 4, 5, 4, END], [START, 5, END, 0, 0]], "int32")
    mask = (sources != 0).astype("int32")
    grouped = []
    original = torch_ensemble_step._group_step
    monkeypatch.setattr(torch_ensemble_step, "_group_step", lambda *a: grouped.append(1) or original(*a))

    def steps(few_rows):
        monkeypatch.setattr(torch_ensemble_step, "FEW_ROWS", few_rows)
        forget_decoding_functions(ensemble)
        encode, step = decoding_functions(ensemble)
        _, cross = encode(sources, mask)
        cache = list(zip(ensemble.empty_self_attention_cache(2, 8), cross))
        values = []
        with unchanged_weights():
            for index, tokens in enumerate([[START, START], [4, 5], [3, 4]]):
                top, indices, cache = step(np.array(tokens, "int32")[:, None], np.asarray(index, "int32"), cache,
                                           mask, np.arange(2, dtype="int32"), np.zeros((2, 1), "float32"),
                                           settings=DecodingSettings(beam_size=1))
                values.append((ops.convert_to_numpy(top), ops.convert_to_numpy(indices)))
        return values

    one_after_another = steps(0)
    assert not grouped
    as_groups = steps(16)
    assert len(grouped) == 2 * 3  # two groups, three steps
    assert _group_projections(ensemble) == [prepacked, prepacked]
    for (top, indices), (expected_top, expected_indices) in zip(as_groups, one_after_another):
        np.testing.assert_array_equal(indices, expected_indices)
        np.testing.assert_allclose(top, expected_top, rtol=1e-5, atol=1e-5)

    def search(few_rows):
        monkeypatch.setattr(torch_ensemble_step, "FEW_ROWS", few_rows)
        return beam_search(ensemble, [list(row[row != 0]) for row in sources], beam_size=4, alpha=0.6,
                           max_length_offset=4, num_results=4)

    expected = search(0)
    got = search(16)
    assert [[ids for ids, _, _ in r] for r in got] == [[ids for ids, _, _ in r] for r in expected]
    np.testing.assert_allclose([s for r in got for _, s, _ in r], [s for r in expected for _, s, _ in r], rtol=1e-5)


@pytest.mark.skipif(__import__("keras").config.backend() != "torch", reason="the grouped step is PyTorch's")
@pytest.mark.parametrize("prepacked", [False, True])
def test_grouped_weights_follow_the_models_weights(prepacked, monkeypatch):
    """Weights written between two searches reach the next search's grouped
    step (an embedding matrix alone, then a decoder layer's kernel alone):
    its results change with them, and equal the models stepped one after
    another; also with prepacked output projections."""
    from keras_transformer.runtime import torch_ensemble_step

    _prepack_float32_products(monkeypatch, prepacked)
    ensemble = _ensemble_for_grouping()
    source = [[START, 4, 5, 4, END]]

    def search(few_rows=torch_ensemble_step.FEW_ROWS):
        original, torch_ensemble_step.FEW_ROWS = torch_ensemble_step.FEW_ROWS, few_rows
        try:
            return beam_search(ensemble, source, beam_size=2, max_length_offset=4, num_results=2)[0]
        finally:
            torch_ensemble_step.FEW_ROWS = original

    def write_embeddings():
        ensemble.models[4].backbone.token_embedding.embeddings.assign(
            np.random.default_rng(3).normal(0, 1.5, (6, 16)).astype("float32")
        )

    def write_kernel():
        kernel = ensemble.models[2].backbone.decoder_layers[0].feed_forward.output_dense.kernel
        kernel.assign(ops.convert_to_numpy(kernel) * 3.0)

    before = search()
    for write in (write_embeddings, write_kernel):
        write()
        after = search()
        assert _group_projections(ensemble) == [prepacked, prepacked]
        expected = search(few_rows=0)
        assert [s for _, s, _ in after] != pytest.approx([s for _, s, _ in before], rel=1e-3)
        assert [ids for ids, _, _ in after] == [ids for ids, _, _ in expected]
        np.testing.assert_allclose([s for _, s, _ in after], [s for _, s, _ in expected], rtol=1e-5)
        before = after

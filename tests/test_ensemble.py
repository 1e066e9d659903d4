"""Ensemble decoding: the next token ranked by the models' mean probability,
checked against exhaustive search over full forward passes (NumPy)."""

import itertools

import numpy as np
import pytest
from keras import ops

from keras_transformer.decoding import Ensemble
from keras_transformer.decoding import beam_search
from keras_transformer.decoding.beam import length_penalty

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

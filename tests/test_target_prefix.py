"""A forced target prefix (`DecodingSettings.target_prefix`): every output
starts with it, in every path of the search (the host search, the
compiled loop, ensembles, the command line and the SavedModel), and the
search over what follows is exact against an enumeration of every output
that starts with it, with both length penalties written out here."""

import contextlib
import io
import itertools

import keras
import numpy as np
import pytest
from keras import ops
from test_beam_search import END
from test_beam_search import OUTPUTS
from test_beam_search import START
from test_beam_search import VOCABULARY
from test_beam_search import teacher_forced_inputs
from test_beam_search import tiny_model

from keras_transformer.decoding import Ensemble
from keras_transformer.decoding import beam_search
from keras_transformer.decoding.settings import DecodingSettings


def penalty(length, alpha, kind):
    """lp(Y), written out: GNMT's ((5 + |Y|) / 6) ** alpha, or |Y| ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha if kind == "gnmt" else float(length) ** alpha


def log_probs_after(model, source, outputs, start):
    """log P of each output's tokens from position `start` on (the prefix's
    tokens count 0), from one full forward pass, no cache (NumPy log-softmax)."""
    logits = ops.convert_to_numpy(model(teacher_forced_inputs(source, outputs))).astype("float64")
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return [sum(log_probs[row, t, token] for t, token in enumerate(output) if t >= start)
            for row, output in enumerate(outputs)]


def exhaustive_with_prefix(model, source, prefix, max_tokens, alpha, kind):
    """Every output of at most `max_tokens` tokens that starts with `prefix`
    (ending in </s>, or cut at the maximum length), best first, as
    `(score, log_prob, ids)`."""
    scored = []
    for length in range(len(prefix) + 1, max_tokens + 1):
        rests = itertools.product(OUTPUTS, repeat=length - len(prefix))
        outputs = [list(prefix) + list(rest) for rest in rests]
        outputs = [o for o in outputs if END not in o[:-1] and (o[-1] == END or length == max_tokens)]
        for output, log_prob in zip(outputs, log_probs_after(model, source, outputs, len(prefix))):
            ids = output[:-1] if output[-1] == END else output
            scored.append((log_prob / penalty(length, alpha, kind), log_prob, ids))
    return sorted(scored, key=lambda item: -item[0])


@pytest.mark.parametrize("kind,alpha,prefix,in_loop", [
    ("gnmt", 0.6, (5,), False), ("gnmt", 0.6, (5, 4), True), ("length", 1.0, (4,), False), ("gnmt", 0.0, (4, 4), True),
])
def test_forced_prefix_equals_exhaustive_search_after_it(kind, alpha, prefix, in_loop):
    model = tiny_model(seed=7)
    source = [START, 4, 5, 4, END]
    max_tokens = 4
    expected = exhaustive_with_prefix(model, source, prefix, max_tokens, alpha, kind)[:3]
    # 64 beams hold every continuation: an exact search.
    found = beam_search(model, [source], beam_size=64, alpha=alpha, length_penalty=kind, num_results=3,
                        max_length_offset=max_tokens - len(source), target_prefix=prefix, in_loop=in_loop)[0]
    assert [ids for ids, _, _ in found] == [ids for _, _, ids in expected]
    np.testing.assert_allclose([s for _, s, _ in found], [s for s, _, _ in expected], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([lp for _, _, lp in found], [lp for _, lp, _ in expected], rtol=1e-4, atol=1e-5)


def test_an_ensemble_of_one_model_twice_searches_as_the_model():
    """An ensemble ranks by its models' mean probability: of one model
    twice, that is the model's, so with the prefix it finds what the
    enumeration finds for the model alone, in the host search and the
    compiled loop."""
    model = tiny_model(seed=8)
    source, prefix, max_tokens = [START, 5, 4, END], (4, 5), 4
    expected = exhaustive_with_prefix(model, source, prefix, max_tokens, 0.6, "gnmt")[:2]
    for in_loop in (False, True) if keras.config.backend() != "torch" else (False,):
        found = beam_search(Ensemble([model, model]), [source], beam_size=64, num_results=2, in_loop=in_loop,
                            max_length_offset=max_tokens - len(source), target_prefix=prefix)[0]
        assert [ids for ids, _, _ in found] == [ids for _, _, ids in expected]
        np.testing.assert_allclose([s for _, s, _ in found], [s for s, _, _ in expected], rtol=1e-4, atol=1e-5)


def test_every_output_of_a_batch_starts_with_the_prefix():
    """In a batch whose sources leave the search at different steps (the
    host search's segments or steps), and greedily."""
    model = tiny_model(seed=5)
    sources = [[START] + [4 + (i * j) % 2 for j in range(i)] + [END] for i in range(1, 20)]
    for beam_size in (1, 3):
        results = beam_search(model, sources, beam_size=beam_size, max_length_offset=5, target_prefix=(5, 1))
        assert all(result[0][0][:2] == [5, 1] for result in results)
        alone = [beam_search(model, [source], beam_size=beam_size, max_length_offset=5, target_prefix=(5, 1))[0]
                 for source in sources[:4]]
        assert [r[0][0] for r in results[:4]] == [r[0][0] for r in alone]


def test_a_prefix_the_model_cannot_output_is_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="token id 6, outside the vocabulary of 6 tokens"):
        beam_search(model, [[START, END]], target_prefix=(VOCABULARY,))
    with pytest.raises(ValueError, match="never outputs"):
        beam_search(model, [[START, END]], target_prefix=(START,))
    with pytest.raises(TypeError, match="target_prefix must be a list of token ids"):
        DecodingSettings(target_prefix="5")
    with pytest.raises(TypeError, match="Give settings or its fields"):
        beam_search(model, [[START, END]], DecodingSettings(), beam_size=2)


@pytest.fixture(scope="module")
def preset_model():
    from keras_transformer.models import TransformerSeq2SeqLM

    return TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_ensemble=False)


TEXTS = ["A man rides a bicycle down the street.", "Two dogs play in the snow.", "A girl is reading a book."]


@pytest.mark.skipif(keras.config.backend() != "torch",
                    reason="the shipped preset once, in PyTorch's run (every backend's paths: the tests above)")
def test_generate_takes_the_prefix_as_text_and_as_ids(preset_model):
    model = preset_model
    ids = model.target_prefix_ids("Eine Frau")
    as_text = model.generate(TEXTS, target_prefix="Eine Frau", return_scores=True)
    as_ids = model.generate(TEXTS, target_prefix=ids, return_scores=True)
    assert as_text == as_ids
    assert all(text.startswith("Eine Frau") for (text, _), in as_text)
    # The unforced search does not start so: the prefix changed the outputs.
    assert not any(text.startswith("Eine Frau") for text in model.generate(TEXTS))
    with pytest.raises(ValueError, match="target_prefix is blank"):
        model.generate(TEXTS, target_prefix="  ")


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the command line once, in PyTorch's run")
def test_the_command_line_forces_the_prefix(preset_model):
    from keras_transformer import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["translate", "--first-model-only", "--target-prefix", "Eine Frau", *TEXTS])
    lines = out.getvalue().splitlines()
    assert lines == preset_model.generate(TEXTS, target_prefix="Eine Frau")
    assert all(line.startswith("Eine Frau") for line in lines)


@pytest.mark.skipif(keras.config.backend() != "torch", reason="runs in PyTorch's run, through the export's subprocess")
def test_the_saved_model_forces_the_prefix(preset_model, tmp_path):
    from test_export import load_elsewhere

    from keras_transformer import cli

    path = str(tmp_path / "export")
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(["export", "--beam-size", "4", "--target-prefix", "Eine Frau", path])
    served = load_elsewhere(path, TEXTS)
    assert served["translations"] == preset_model.generate(TEXTS, target_prefix="Eine Frau")

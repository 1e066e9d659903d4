"""The guard against repetition (`DecodingSettings.no_repeat_ngram_size`):
the banned tokens against a loop over every earlier n-gram written out in
NumPy, the search under the ban against exhaustive and greedy searches
in NumPy that ban the same tokens, on every path of the search (the host
search, its compiled segments, the compiled loop, ensembles), and no
n-gram twice in what `generate`, the command line and the SavedModel
give."""

import contextlib
import io
import itertools

import keras
import numpy as np
import pytest
from helpers import once
from keras import ops
from test_beam_search import END
from test_beam_search import OUTPUTS
from test_beam_search import START
from test_beam_search import VOCABULARY
from test_beam_search import teacher_forced_inputs
from test_beam_search import tiny_model

from keras_transformer.decoding import DecodingSettings
from keras_transformer.decoding import Ensemble
from keras_transformer.decoding import beam_search
from keras_transformer.decoding.transforms import repeated_ngram_ends
from keras_transformer.runtime.array_ops import KERAS_OPS
from keras_transformer.runtime.array_ops import array_ops
from keras_transformer.runtime.numpy_ops import NUMPY_OPS

NEVER = (0, START)  # padding and start are never output


def banned_in_numpy(output, n):
    """The tokens that would complete an n-gram `output` holds already:
    every earlier n-gram whose first n - 1 tokens are the last n - 1."""
    if len(output) < n:
        return set()
    tail = list(output[len(output) - n + 1 :]) if n > 1 else []
    return {output[p + n - 1] for p in range(len(output) - n + 1) if list(output[p : p + n - 1]) == tail}


def repeats(output, n, after=0):
    """Whether `output` holds some n tokens twice (the second time ending
    after its first `after` tokens)."""
    grams = [tuple(output[p : p + n]) for p in range(len(output) - n + 1)]
    return any(gram in grams[:p] for p, gram in enumerate(grams) if p + n > after)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_banned_tokens_are_those_of_every_earlier_ngram(n):
    rng = np.random.default_rng(n)
    rows, width, vocabulary = 7, 12, 5
    history = rng.integers(1, 3, (rows, width)).astype("int32")  # two tokens: many repeats
    namespaces = {"array_ops": array_ops(), "keras.ops": KERAS_OPS, "numpy": NUMPY_OPS}
    banned = 0
    for index in range(width + 1):
        expected = np.zeros((rows, vocabulary), bool)
        for row in range(rows):
            expected[row, list(banned_in_numpy(history[row, :index].tolist(), n))] = True
        for name, namespace in namespaces.items():
            tokens = namespace.convert_to_tensor(history, "int32")
            found = ops.convert_to_numpy(repeated_ngram_ends(tokens, index, n, vocabulary, namespace))
            np.testing.assert_array_equal(found, expected, err_msg=f"{name}, index {index}")
        banned += expected.sum()
    assert banned > rows  # (histories that repeat)


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def masked_log_probs(model, source, outputs, n):
    """log P of each output, from one full forward pass of them all (each
    padded after its end: a position's logits read only the tokens before
    it): under the model's distribution with each step's banned tokens at
    `-inf` (the rest renormalized, padding and start among them; `-inf`
    for an output that takes a banned token), and under the model's own."""
    width = max(map(len, outputs))
    padded = [output + [END] * (width - len(output)) for output in outputs]
    logits = ops.convert_to_numpy(model(teacher_forced_inputs(source, padded))).astype("float64")
    banned, free = [], []
    for row, output in enumerate(outputs):
        steps = logits[row, : len(output)].copy()
        free.append(sum(log_softmax(steps)[t, token] for t, token in enumerate(output)))
        for t in range(len(output)):
            steps[t, list(banned_in_numpy(output[:t], n))] = -np.inf
        banned.append(sum(log_softmax(steps)[t, token] for t, token in enumerate(output)))
    return banned, free


def exhaustive_with_ban(model, source, max_tokens, alpha, n):
    """Every output of at most `max_tokens` tokens (ending in </s>, or cut
    at the maximum length), best first, as `(score, log_prob, ids)`: those
    that never take a banned token, under the ban; and all, without it."""
    outputs = [list(o) for length in range(1, max_tokens + 1) for o in itertools.product(OUTPUTS, repeat=length)]
    outputs = [o for o in outputs if END not in o[:-1] and (o[-1] == END or len(o) == max_tokens)]
    scored, unbanned = [], []
    for output, log_prob, free in zip(outputs, *masked_log_probs(model, source, outputs, n)):
        ids, lp = (output[:-1] if output[-1] == END else output), ((5.0 + len(output)) / 6.0) ** alpha
        unbanned.append((free / lp, free, ids))
        if np.isfinite(log_prob):
            scored.append((log_prob / lp, log_prob, ids))
    return sorted(scored, key=lambda item: -item[0]), sorted(unbanned, key=lambda item: -item[0])


def test_a_wide_beam_under_the_ban_equals_exhaustive_search():
    model = tiny_model(seed=4)
    source = [START, 4, 4, 4, 4, END]
    max_tokens, n = 4, 2
    expected, unbanned = exhaustive_with_ban(model, source, max_tokens, 0.6, n)
    assert repeats(unbanned[0][2], n)  # (the ban changes this search's best)
    # 32 beams hold every prefix of 3 tokens over 3 symbols: exact search,
    # here on the host (PyTorch: a step a call; JAX and TensorFlow:
    # compiled segments of steps; the one compiled loop: below).
    settings = DecodingSettings(beam_size=32, num_results=3, max_length_offset=max_tokens - len(source),
                                no_repeat_ngram_size=n)
    result = beam_search(model, [source], settings, in_loop=False)[0]
    assert [ids for ids, _, _ in result] == [ids for _, _, ids in expected[:3]]
    np.testing.assert_allclose([s for _, s, _ in result], [s for s, _, _ in expected[:3]], rtol=1e-4)


def greedy_with_ban(model, sources, budgets, n):
    """Greedy decoding of all `sources` step by step, from full forward
    passes of their outputs so far (no cache; one shape for every step:
    the outputs padded), the banned tokens and those never output at
    `-inf`; and whether the ban changed a choice."""
    width, steps = max(map(len, sources)), max(budgets)
    encoder_ids = np.array([source + [0] * (width - len(source)) for source in sources], "int32")
    outputs, live, changed = [[] for _ in sources], set(range(len(sources))), False
    for index in range(steps):
        live = {row for row in live if index < budgets[row]}
        if not live:
            break
        decoder_ids = np.array([[START] + output + [END] * (steps - 1 - len(output)) for output in outputs], "int32")
        logits = ops.convert_to_numpy(model({
            "encoder_token_ids": encoder_ids, "encoder_padding_mask": (encoder_ids != 0).astype("int32"),
            "decoder_token_ids": decoder_ids, "decoder_padding_mask": np.ones(decoder_ids.shape, "int32"),
        }))[:, index].astype(np.float64)
        logits[:, list(NEVER)] = -np.inf
        for row in sorted(live):
            best = int(np.argmax(logits[row]))
            logits[row, list(banned_in_numpy(outputs[row], n))] = -np.inf
            token = int(np.argmax(logits[row]))
            changed = changed or token != best
            if token == END:
                live.remove(row)
            else:
                outputs[row].append(token)
    return outputs, changed


SOURCES = [[START] + [4 + (i * j) % 3 % 2 for j in range(i)] + [END] for i in range(3, 7)]


def test_greedy_search_under_the_ban_equals_numpy_on_every_path():
    model = tiny_model(seed=7)
    offset, n = 6, 2
    expected, changed = greedy_with_ban(model, SOURCES, [len(source) + offset for source in SOURCES], n)
    assert changed and not any(repeats(ids, n) for ids in expected)
    settings = DecodingSettings(beam_size=1, alpha=0.0, max_length_offset=offset, no_repeat_ngram_size=n)
    # The host search, an ensemble of the model with itself (a step a call
    # on every backend) and the one compiled loop.
    for name, decoder, in_loop in [("host", model, False), ("ensemble", Ensemble([model, model]), False),
                                   ("loop", model, True)]:
        found = beam_search(decoder, SOURCES, settings, in_loop=in_loop)
        assert [result[0][0] for result in found] == expected, name


@once  # (the ban's place among the transforms: the same on every backend)
def test_beams_and_samples_never_repeat_an_ngram():
    model = tiny_model(seed=7)
    for settings in [
        DecodingSettings(beam_size=4, num_results=4, max_length_offset=8, no_repeat_ngram_size=2),
        # A forced prefix that repeats itself is forced all the same (the ban comes first).
        DecodingSettings(beam_size=1, alpha=0.0, sampling="top_k", top_k=3, temperature=3.0, max_length_offset=8,
                         no_repeat_ngram_size=2, target_prefix=(4, 4, 4)),
    ]:
        for result in beam_search(model, SOURCES, settings):
            assert result and all(not repeats(ids, 2, after=len(settings.target_prefix)) for ids, _, _ in result)
            assert result[0][0][: len(settings.target_prefix)] == list(settings.target_prefix)


@once
def test_generate_takes_the_guard_and_bad_sizes_are_refused():
    model = tiny_model(seed=7)
    inputs = {"encoder_token_ids": np.array([SOURCES[-1]]), "encoder_padding_mask": np.ones((1, len(SOURCES[-1])))}
    found = model.generate(inputs, beam_size=1, max_length_offset=6, no_repeat_ngram_size=2)
    assert found == greedy_with_ban(model, SOURCES[-1:], [len(SOURCES[-1]) + 6], 2)[0]
    for size, error in [(-1, ValueError), (1 << 17, ValueError), (2.0, TypeError)]:
        with pytest.raises(error, match="no_repeat_ngram_size"):
            DecodingSettings(no_repeat_ngram_size=size)
    import keras_hub

    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        model.generate(inputs, sampler=keras_hub.samplers.GreedySampler(), no_repeat_ngram_size=2)


@pytest.fixture(scope="module")
def preset_model():
    from keras_transformer.models import TransformerSeq2SeqLM

    return TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_ensemble=False)


TEXTS = ["A dog runs, a dog runs, a dog runs, a dog runs.", "A man rides a bicycle down the street."]


@once
def test_the_command_line_bans_as_generate(preset_model):
    from keras_transformer import cli

    expected = preset_model.generate(TEXTS, beam_size=2, no_repeat_ngram_size=2)
    assert expected[0] != preset_model.generate(TEXTS[0], beam_size=2)  # (the ban changes it)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["translate", "--first-model-only", "--beam-size", "2", "--no-repeat-ngram-size", "2", *TEXTS])
    assert out.getvalue().splitlines() == expected


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="exported in TensorFlow's run, in its process")
def test_the_saved_model_bans_as_generate(preset_model, tmp_path):
    import tensorflow as tf

    from keras_transformer.export import export_saved_model

    expected = preset_model.generate(TEXTS, beam_size=2, no_repeat_ngram_size=2)
    settings = DecodingSettings(beam_size=2, no_repeat_ngram_size=2)
    translator = tf.saved_model.load(export_saved_model(preset_model, str(tmp_path / "export"), settings=settings))
    found = translator.signatures["serving_default"](text=tf.constant(TEXTS))["translations"]
    assert [text.decode("utf-8") for text in found.numpy()] == expected

"""Sampling (`DecodingSettings.sampling`): the noise against an integer hash
written out here in NumPy's uint32 arithmetic, the draws against the
distribution they come from, and whole samples against a NumPy sampler of
the same distribution, on every path of the search."""

import keras
import numpy as np
import pytest
from keras import ops
from test_beam_search import END
from test_beam_search import START
from test_beam_search import VOCABULARY
from test_beam_search import teacher_forced_inputs
from test_beam_search import tiny_model

from keras_transformer.decoding import DecodingSettings
from keras_transformer.decoding import Ensemble
from keras_transformer.decoding import beam_search
from keras_transformer.decoding.sampling import gumbel_noise
from keras_transformer.decoding.sampling import source_keys
from keras_transformer.runtime.array_ops import array_ops

NEVER = (0, START)  # padding and start are never output


def lowbias32(x):
    """Chris Wellons' lowbias32 hash on uint32 NumPy arrays."""
    x = np.asarray(x, np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def numpy_keys(sources):
    """Each source's key: the uint32 sum of the hash of each token plus its
    position times the step spread."""
    return np.array([
        np.sum(lowbias32(np.array(ids, np.uint32) + np.arange(len(ids), dtype=np.uint32) * np.uint32(0x85EBCA77)),
               dtype=np.uint32)
        for ids in sources
    ], np.uint32)


def numpy_noise(seed, keys, index, vocabulary_size):
    """Gumbel noise of step `index`: a hash of the key, step and seed, then
    of each token with it; 23 of its bits as a uniform number."""
    with np.errstate(over="ignore"):
        step = lowbias32(keys + np.uint32(index) * np.uint32(0x85EBCA77) + np.uint32(seed) * np.uint32(0x9E3779B1))
        x = lowbias32(np.arange(vocabulary_size, dtype=np.uint32)[None, :] + step[:, None] * np.uint32(0x7FEB352D))
    uniform = (((x >> np.uint32(9)) & np.uint32(0x7FFFFF)).astype(np.float32) * 2 + 1) / np.float32(2**24)
    return -np.log(-np.log(uniform))


def test_the_noise_is_the_hash_written_out_in_numpy():
    sources = [[START, 4, 5, END], [START, 5, END], [START, 4, 4, 5, 5, END]]
    width = max(map(len, sources)) + 3  # padding beyond each source changes nothing
    ids = np.zeros((len(sources), width), "int32")
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    keys = source_keys(ops.convert_to_tensor(ids), ops.convert_to_tensor((ids != 0).astype("int32")), array_ops())
    np.testing.assert_array_equal(ops.convert_to_numpy(keys).astype(np.uint32), numpy_keys(sources))
    for seed, index in [(0, 0), (7, 3), (2**31 - 1, 40)]:
        noise = gumbel_noise(seed, keys, index, 50, array_ops(keys))
        np.testing.assert_allclose(ops.convert_to_numpy(noise), numpy_noise(seed, numpy_keys(sources), index, 50),
                                   rtol=1e-6, atol=1e-6)


def test_noisy_maxima_are_draws_from_the_distribution():
    """The Gumbel-max trick on the package's noise: the best of log p plus
    noise, over 20,000 keys, falls on each token as often as p says."""
    probabilities = np.array([0.5, 0.25, 0.15, 0.07, 0.03])
    keys = ops.convert_to_tensor(np.arange(20000, dtype="int32") * 7919)
    noise = ops.convert_to_numpy(gumbel_noise(3, keys, 5, len(probabilities), array_ops(keys)))
    draws = np.argmax(np.log(probabilities)[None, :] + noise, axis=1)
    frequencies = np.bincount(draws, minlength=len(probabilities)) / len(draws)
    # Within 4 standard deviations of a binomial count.
    np.testing.assert_allclose(frequencies, probabilities, atol=4 * np.sqrt(0.25 / len(draws)))


def numpy_sample(model, source, settings, budget):
    """One sample of `source`, drawn step by step from full forward passes
    (no cache): the distribution after the temperature and the cut, the
    noise of `numpy_noise`. Returns `(ids without </s>, log P under that
    distribution)`."""
    key = numpy_keys([source])
    output, total = [], 0.0
    for index in range(budget):
        # (the prefix padded to the budget: the decoder is causal, and one
        # shape a source is compiled once)
        padded = output + [END] * (budget - len(output))
        logits = ops.convert_to_numpy(model(teacher_forced_inputs(source, [padded])))[0, index]
        logits = logits.astype(np.float32) / np.float32(settings.temperature)
        logits[list(NEVER)] = -np.inf
        order = np.sort(logits)[::-1]
        if settings.sampling == "top_k":
            logits[logits < order[settings.top_k - 1]] = -np.inf
        else:
            p = np.exp(order - order.max()) / np.exp(order - order.max()).sum()
            kept = int(np.sum(np.cumsum(p) - p < settings.top_p))
            logits[logits < order[kept - 1]] = -np.inf
        log_p = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        token = int(np.argmax(log_p + numpy_noise(settings.seed, key, index, len(logits))[0]))
        total += float(log_p[token])
        if token == END:
            return output, total
        output.append(token)
    return output, total


SOURCES = [[START] + [4 + (i * j) % 2 for j in range(i)] + [5, END] for i in range(1, 9)]


@pytest.mark.parametrize("settings", [
    DecodingSettings(beam_size=1, alpha=0.0, sampling="top_k", top_k=3, temperature=4.0, seed=5),
    DecodingSettings(beam_size=1, alpha=0.0, sampling="top_p", top_p=0.8, temperature=6.0, seed=9),
], ids=["top_k", "top_p"])
def test_samples_equal_a_numpy_sampler_on_every_path(settings):
    model = tiny_model(seed=6)
    settings = settings.replace(max_length_offset=3)
    expected = [numpy_sample(model, source, settings, len(source) + 3) for source in SOURCES]
    # The draws differ between sources and from the most probable outputs.
    assert len({tuple(ids) for ids, _ in expected}) > 2
    paths = {"host": dict(in_loop=False), "ensemble": dict(in_loop=False)}
    if keras.config.backend() != "torch":
        paths["loop"] = dict(in_loop=True)
    for name, how in paths.items():
        decoder = Ensemble([model, model]) if name == "ensemble" else model
        found = beam_search(decoder, SOURCES, settings, **how)
        assert [result[0][0] for result in found] == [ids for ids, _ in expected], name
        np.testing.assert_allclose([result[0][2] for result in found], [lp for _, lp in expected],
                                   rtol=1e-4, atol=1e-4, err_msg=name)


def test_seeds_draw_other_samples_and_the_same_seed_the_same():
    model = tiny_model(seed=6)
    settings = DecodingSettings(beam_size=1, alpha=0.0, sampling="top_k", top_k=4, temperature=5.0,
                                max_length_offset=3)
    draws = [tuple(beam_search(model, [SOURCES[3]], settings.replace(seed=seed))[0][0][0]) for seed in range(6)]
    assert len(set(draws)) > 1
    assert draws[2] == tuple(beam_search(model, [SOURCES[3]], settings.replace(seed=2))[0][0][0])


def test_bad_sampling_settings_are_refused():
    with pytest.raises(ValueError, match="needs beam_size=1"):
        DecodingSettings(sampling="top_k")
    with pytest.raises(ValueError, match="Unknown sampling"):
        DecodingSettings(beam_size=1, sampling="nucleus")
    with pytest.raises(ValueError, match="top_p must be in"):
        DecodingSettings(beam_size=1, sampling="top_p", top_p=1.5)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        DecodingSettings(beam_size=1, sampling="top_k", temperature=0)
    model = tiny_model()
    with pytest.raises(ValueError, match="Sampling gives one result"):
        model.generate({"encoder_token_ids": [[START, END]], "encoder_padding_mask": [[1, 1]]},
                       sampler="top_k", num_results=2)
    assert VOCABULARY == 6


@pytest.fixture(scope="module")
def preset_model():
    from keras_transformer.models import TransformerSeq2SeqLM

    return TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_ensemble=False)


TEXTS = ["A man rides a bicycle down the street.", "Two dogs play in the snow."]


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the command line and the export once, in PyTorch's run")
def test_the_command_line_and_the_saved_model_sample_as_generate(preset_model, tmp_path):
    import contextlib
    import io

    from test_export import load_elsewhere

    from keras_transformer import cli
    from keras_transformer.export import export_saved_model

    expected = preset_model.generate(TEXTS, sampler="top_k", top_k=5, temperature=1.5, seed=3)
    assert expected != preset_model.generate(TEXTS)  # (a draw, not the search's best)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["translate", "--first-model-only", "--sampling", "top_k", "--top-k", "5", "--temperature", "1.5",
                  "--seed", "3", *TEXTS])
    assert out.getvalue().splitlines() == expected
    settings = DecodingSettings(beam_size=1, alpha=0.0, sampling="top_k", top_k=5, temperature=1.5, seed=3)
    path = export_saved_model(preset_model, str(tmp_path / "export"), settings=settings)
    assert load_elsewhere(path, TEXTS)["translations"] == expected

"""Beam search against oracles that do not trust the search: a model whose
next token hangs on its whole prefix, each step's candidates checked
against a full pass (no cache) of the prefix each beam stands for,
exhaustive search with the length penalties written out here, and Marian
checkpoints decoded by transformers.

The tests of `test_beam_search.py` use a one-layer model whose next-token
distribution hardly depends on the tokens before the last one (its
history): a search whose beams read the wrong self-attention cache still
finds the same outputs there. The model here has two layers and a strong
decoder self-attention, so that a beam that reads another beam's cache
gets other logits (`test_the_history_model_depends_on_its_prefix`).
"""

import itertools

import numpy as np
import pytest
from helpers import once
from keras import ops

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.interface import decoding_functions
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM

PAD, UNK, START, END = 0, 1, 2, 3
VOCABULARY = 6  # <pad> <unk> <s> </s> a b
OUTPUTS = [UNK, END, 4, 5]  # what the model may emit: never <pad> or <s>
WORDS = [UNK, 4, 5]  # the tokens that do not end an output


def history_model(seed=1, self_attention_scale=4.0):
    """A random two-layer pre-norm model (d_model 16) whose decoder
    self-attention outweighs the token it reads: its value and output
    projections are `self_attention_scale` times their random values.
    The weights are drawn with NumPy, so the model is the same on every
    backend (Keras' initializers draw other numbers on each); seed 1 gives
    outputs that end before their budgets and outputs cut at them."""
    backbone = TransformerBackbone(
        VOCABULARY, num_layers=2, d_model=16, d_ff=32, num_heads=2, dropout=0.0, max_sequence_length=32,
        normalize_first=True, scale_embeddings=False,
    )
    rng = np.random.default_rng(seed)
    for weight in backbone.weights:
        path, shape = weight.path, tuple(weight.shape)
        if path.endswith("embeddings"):
            value = rng.normal(0, 1, shape)
        elif path.endswith("kernel"):  # (inputs, ...) or, for attention outputs, (heads, head size, outputs)
            inputs = shape[0] * shape[1] if path.endswith("attention_output/kernel") else shape[0]
            value = rng.normal(0, inputs**-0.5, shape)
            if path.startswith("decoder") and path.endswith(
                ("self_attention/value/kernel", "self_attention/attention_output/kernel")
            ):
                value *= self_attention_scale
        elif path.endswith("gamma"):
            value = np.ones(shape)
        else:  # biases, betas
            value = np.zeros(shape)
        weight.assign(value.astype("float32"))
    return TransformerSeq2SeqLM(backbone)


@pytest.fixture(scope="module")
def model():
    return history_model()


# --- Teacher-forced references: full passes, no cache, NumPy arithmetic ---

# The full passes run at one shape, so that JAX compiles each op once:
# chunks of `ROWS` rows, sources of `SOURCE_POSITIONS` tokens and decoder
# inputs of `TARGET_POSITIONS` (padded; with causal self-attention the
# positions after a prefix change nothing before them).
ROWS, SOURCE_POSITIONS, TARGET_POSITIONS = 64, 8, 16


def full_pass_log_probs(model, sources, decoder_inputs):
    """float64 `(rows, TARGET_POSITIONS, VOCABULARY)`: each position's
    next-token log-probabilities given the source (a token id list) and the
    decoder input (`<s>` and the tokens before), from full forward passes
    of the model, no cache (padded positions hold no meaning)."""
    found = []
    for first in range(0, len(sources), ROWS):
        encoder_ids = np.full((ROWS, SOURCE_POSITIONS), PAD, "int32")
        decoder_ids = np.full((ROWS, TARGET_POSITIONS), PAD, "int32")
        chunk = zip(sources[first : first + ROWS], decoder_inputs[first : first + ROWS])
        for row, (source, inputs) in enumerate(chunk):
            encoder_ids[row, : len(source)] = source
            decoder_ids[row, : len(inputs)] = inputs
        inputs = {
            "encoder_token_ids": encoder_ids,
            "encoder_padding_mask": (encoder_ids != PAD).astype("int32"),
            "decoder_token_ids": decoder_ids,
            "decoder_padding_mask": (decoder_ids != PAD).astype("int32"),
        }
        found.append(log_softmax(ops.convert_to_numpy(model(inputs)).astype("float64")))
    return np.concatenate(found)[: len(sources)]


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def next_token_log_probs(model, sources, prefixes):
    """`(rows, VOCABULARY)`: log P(next token | source, <s> + prefix) of
    each row, from full passes."""
    log_probs = full_pass_log_probs(model, sources, [[START, *prefix] for prefix in prefixes])
    return log_probs[np.arange(len(prefixes)), [len(prefix) for prefix in prefixes]]


def sequence_log_probs(model, sources, outputs):
    """log P(output | source) of each output, summed from full passes."""
    log_probs = full_pass_log_probs(model, sources, [[START, *output[:-1]] for output in outputs])
    return [float(log_probs[row, np.arange(len(output)), output].sum()) for row, output in enumerate(outputs)]


def gnmt_penalty(length, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), |Y| the
    output tokens with the end token: written out here, not imported."""
    return ((5.0 + length) / 6.0) ** alpha


def length_penalty(length, alpha):
    """transformers' (and Marian's) |Y| ** alpha, |Y| with the end token."""
    return float(length) ** alpha


PENALTIES = {"gnmt": gnmt_penalty, "length": length_penalty}


def check_scores(model, source, budget, results, alpha, kind):
    """Each result's log-probability is the teacher-forced log P of its
    tokens (and the end token, where it ended before its budget), and its
    score that over the penalty written out above."""
    for ids, score, log_prob in results:
        output = ids + [END] if len(ids) < budget else ids
        assert len(output) <= budget and END not in ids
        np.testing.assert_allclose(log_prob, sequence_log_probs(model, [source], [output])[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(score, log_prob / PENALTIES[kind](len(output), alpha), rtol=1e-5, atol=1e-6)


def test_the_history_model_depends_on_its_prefix(model):
    """The oracles below catch a beam reading the wrong cache only if the
    next token depends on the tokens before the last one. For every pair
    of 3-token prefixes ending in the same token, the next-token
    distributions differ by a total variation of 0.1 or more on average,
    and the likeliest next token differs for a quarter of the pairs or
    more (the one-layer model of `test_beam_search.py`: about 3e-5, and
    never)."""
    source = [START, 4, 5, 4, END]
    distances, different_best = [], []
    for last in WORDS:
        prefixes = [list(history) + [last] for history in itertools.product(WORDS, repeat=2)]
        log_probs = next_token_log_probs(model, [source] * len(prefixes), prefixes)
        probabilities = np.exp(log_probs)
        for i, j in itertools.combinations(range(len(prefixes)), 2):
            distances.append(0.5 * np.abs(probabilities[i] - probabilities[j]).sum())
            different_best.append(log_probs[i].argmax() != log_probs[j].argmax())
    assert np.mean(distances) > 0.1, np.mean(distances)
    assert np.mean(different_best) > 0.25, np.mean(different_best)


# --- Each step against full passes of the beams' own prefixes ---


class CheckedSteps:
    """`decoding_functions(model)`'s `(encode, step)`, for the host search
    that runs a step a call (`beam_search(..., functions=(checker.encode,
    checker.step))`), checking each step's candidates against full passes
    (no cache) of the prefixes that the search's beams stand for.

    The search hands each step its beams' last tokens and log-probabilities
    and gets back each source's `2 * beam_size` best extensions: `(value,
    beam * vocabulary_size + token)`. A live beam of the next step carries
    one of those extensions: its token and its log-probability (the
    extension's value, float32, exactly). So the checker knows each beam's
    prefix from the search's choices, not from the cache, which a broken
    reorder would have given the beam from another hypothesis: it follows
    each extension from the beam it extends, and finds each live beam's
    extension by its token and value (one, else the test fails). Then
    each source's candidates must be the best extensions that full passes
    of its live beams' prefixes give: the same values, each at its index.
    """

    def __init__(self, model):
        self.model = model
        self.functions = decoding_functions(model)
        self.never_output = np.zeros(VOCABULARY)
        self.never_output[list(model.special_token_ids.never_output)] = -np.inf
        self.checked = []  # (index, live beams, sources) of each step

    def encode(self, encoder_ids, encoder_mask):
        # (The search's sources, in order, padded: each source's tokens.)
        pairs = zip(np.asarray(encoder_ids), np.asarray(encoder_mask))
        self.sources = [ids[mask.astype(bool)].tolist() for ids, mask in pairs]
        self.extensions = None
        return self.functions[0](encoder_ids, encoder_mask)

    def step(self, token_ids, index, cache, encoder_mask, parents, log_probs, **kwargs):
        values, indices, cache = self.functions[1](token_ids, index, cache, encoder_mask, parents, log_probs, **kwargs)
        values = ops.convert_to_numpy(values).astype("float64")
        indices = ops.convert_to_numpy(indices).astype("int64")
        log_probs, index = np.asarray(log_probs, "float32"), int(index)
        tokens = np.asarray(token_ids).reshape(-1)
        slots, beams = log_probs.shape
        # Each live beam's hypothesis: (source, tokens after <s>).
        hypotheses = {}
        for row in np.flatnonzero(np.isfinite(log_probs.reshape(-1))):
            token, log_prob = int(tokens[row]), float(log_probs.flat[row])
            if index == 0:  # (every source in the batch, in order)
                assert token == START
                hypotheses[row] = (row // beams, ())
            else:
                found = self.extensions.get((token, log_prob), [])
                assert len(found) == 1, f"step {index}: beam {row} ({token}, {log_prob}) extends {found}"
                source, prefix = found[0]
                hypotheses[row] = (source, prefix + (token,))
        rows = sorted(hypotheses)
        sources = [hypotheses[row][0] for row in rows]
        full = next_token_log_probs(
            self.model, [self.sources[source] for source in sources], [hypotheses[row][1] for row in rows]
        )
        expected = np.full((slots * beams, VOCABULARY), -np.inf)
        for row, token_log_probs in zip(rows, full):
            expected[row] = log_probs.flat[row] + token_log_probs + self.never_output
        expected = expected.reshape(slots, beams * VOCABULARY)
        self.extensions = {}
        for slot in range(slots):
            live = [row for row in rows if row // beams == slot]
            if not live:
                continue
            assert len({hypotheses[row][0] for row in live}) == 1, f"a slot's beams of several sources: {live}"
            count = values.shape[1]
            best = np.sort(expected[slot])[::-1][:count]
            finite = np.isfinite(values[slot])
            np.testing.assert_array_equal(finite, np.isfinite(best), err_msg=f"step {index}, slot {slot}")
            where = f"step {index}, slot {slot}: the extensions of its beams' own prefixes"
            np.testing.assert_allclose(values[slot, finite], best[finite], rtol=1e-4, atol=1e-4, err_msg=where)
            np.testing.assert_allclose(
                expected[slot, indices[slot, finite]], values[slot, finite], rtol=1e-4, atol=1e-4, err_msg=where
            )
            for value, flat in zip(values[slot, finite], indices[slot, finite]):
                beam, token = divmod(int(flat), VOCABULARY)
                self.extensions.setdefault((token, float(value)), []).append(hypotheses[slot * beams + beam])
        self.checked.append((index, len(rows), len(set(sources))))
        return values, indices, cache


SOURCES = [[START, 4, 5, 4, END], [START, 5, END], [START, UNK, 5, 5, 4, 4, END]]


@pytest.mark.parametrize("beam_size,kind,alpha", [(2, "gnmt", 0.6), (3, "length", 1.0), (4, "gnmt", 1.0)])
def test_each_step_extends_the_prefixes_its_beams_stand_for(model, beam_size, kind, alpha):
    """The host search a step a call, each step's candidates checked
    against full passes of its beams' own prefixes (`CheckedSteps`): no
    beam reads another's cache. Its results score as the full pass and
    the penalty written out here give them; and the other ways of running
    the search (the default, the host search, one compiled loop) find the
    same, so the beams of the steps compiled in them are checked too."""
    offset = 4
    settings = dict(beam_size=beam_size, num_results=beam_size, alpha=alpha, length_penalty=kind,
                    max_length_offset=offset)
    checker = CheckedSteps(model)
    checked = beam_search(model, SOURCES, functions=(checker.encode, checker.step), **settings)
    # Steps with several live beams for every source, past the first.
    assert sum(live >= 2 * len(SOURCES) and index >= 2 for index, live, _ in checker.checked) >= 3, checker.checked
    for source, results in zip(SOURCES, checked):
        assert len(results) == beam_size
        check_scores(model, source, len(source) + offset, results, alpha, kind)
    lengths = {len(ids) < len(source) + offset for source, results in zip(SOURCES, checked) for ids, _, _ in results}
    assert lengths == {True, False}, "outputs that end and outputs cut at their budget"
    for in_loop in (None, False, True):
        found = beam_search(model, SOURCES, in_loop=in_loop, **settings)
        assert [[ids for ids, _, _ in r] for r in found] == [[ids for ids, _, _ in r] for r in checked], in_loop
        for mine, reference in zip(found, checked):
            np.testing.assert_allclose([r[1:] for r in mine], [r[1:] for r in reference], rtol=1e-5, atol=1e-6)


# --- A wide beam against every output, with the penalties written out ---


def every_output(model, source, max_tokens, alpha, kind):
    """Every output of at most `max_tokens` tokens (ending in `</s>`, or
    cut at `max_tokens`), scored by its full-pass log P over the penalty
    written out here: `(score, log P, token ids without </s>)`, best first."""
    outputs = [
        list(output)
        for length in range(1, max_tokens + 1)
        for output in itertools.product(OUTPUTS, repeat=length)
        if END not in output[:-1] and (output[-1] == END or length == max_tokens)
    ]
    log_probs = sequence_log_probs(model, [source] * len(outputs), outputs)
    scored = [
        (log_prob / PENALTIES[kind](len(output), alpha), log_prob, output[:-1] if output[-1] == END else output)
        for output, log_prob in zip(outputs, log_probs)
    ]
    return sorted(scored, key=lambda item: -item[0])


@pytest.mark.parametrize("kind,alpha", [("gnmt", 0.6), ("length", 1.0)])
def test_a_wide_beam_finds_the_best_outputs_of_all(model, kind, alpha):
    """Outputs of up to 5 tokens over 3 words and `</s>`: 324 beams keep
    every extension of every prefix at each step (at most 81 live
    prefixes of 4 tokens, 324 extensions), so beam search is exact and
    its best results are those of scoring every output. For `"gnmt"` it
    may stop early only where no live beam can still score better; the
    `"length"` rule (transformers' `early_stopping=False`) stops only with
    324 finished hypotheses, which these outputs never reach before their
    budget, where every beam finishes. Scores use the penalties written
    out in this file, so a wrong `rules.length_penalty` fails here. Run
    on the host search (in segments of compiled steps on JAX and
    TensorFlow), in one compiled loop, and a step a call."""
    source, max_tokens, count = [START, 4, 5, 4, END], 5, 8
    expected = every_output(model, source, max_tokens, alpha, kind)
    scores = [score for score, _, _ in expected[: count + 1]]
    # (Ranks that no rounding can swap, and outputs of several lengths, so
    # that the penalty decides between them.)
    assert -np.diff(scores).max() > 1e-3, scores
    assert len({len(ids) for _, _, ids in expected[:count]}) >= 2, expected[:count]
    settings = dict(beam_size=4 * 3 ** (max_tokens - 1), num_results=count, alpha=alpha, length_penalty=kind,
                    max_length_offset=max_tokens - len(source))
    ways = {"host": dict(in_loop=False), "loop": dict(in_loop=True), "steps": dict(functions=decoding_functions(model))}
    for way, arguments in ways.items():
        found = beam_search(model, [source], **arguments, **settings)[0]
        assert [ids for ids, _, _ in found] == [ids for _, _, ids in expected[:count]], way
        np.testing.assert_allclose([score for _, score, _ in found], scores[:count], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose([lp for _, _, lp in found], [lp for _, lp, _ in expected[:count]], rtol=1e-5,
                                   atol=1e-5)


# --- Marian checkpoints against transformers' own decoding ---

MARIAN_OFFSET = 20  # output budget: source tokens + this


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    """A tiny Marian checkpoint that transformers builds and trains a
    little on the sentence pairs of `tiny_spm.py` (no Multi30k needed),
    its `</s>` bias calibrated so that greedy decoding ends some of
    `tiny_spm.TEXTS` within the budget and not others, and its `<pad>`
    embedding zero, as opus-mt's are (`tiny_spm.with_zero_padding_embedding`)."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    pytest.importorskip("sentencepiece")
    import tiny_spm
    from marian_fixture import tiny_marian_dir

    built = tiny_marian_dir(str(tmp_path_factory.mktemp("marian")), tiny_spm.SOURCES, tiny_spm.TARGETS,
                            calibration_texts=tiny_spm.TEXTS, max_new_tokens=MARIAN_OFFSET, train_steps=100)
    return tiny_spm.with_zero_padding_embedding(built, str(tmp_path_factory.mktemp("opus-mt-like")))


@pytest.fixture(scope="module")
def marian(marian_dir):
    """This package's model of the checkpoint, and transformers' model and tokenizer."""
    import transformers

    ours = TransformerSeq2SeqLM.from_preset(marian_dir)
    theirs = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    return ours, theirs, transformers.MarianTokenizer.from_pretrained(marian_dir)


def transformers_outputs(model, sources, num_beams):
    """transformers' greedy (`num_beams=1`) or beam search (length penalty
    |Y| ** 1, `early_stopping=False`, its defaults) of each source's ids,
    within this package's budget, padding never output: token ids without
    the start and end tokens."""
    import torch

    pad, end = model.config.pad_token_id, model.config.eos_token_id
    outputs = []
    for ids in sources:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), num_beams=num_beams, length_penalty=1.0, max_new_tokens=len(ids) + MARIAN_OFFSET,
                bad_words_ids=[[pad]], forced_eos_token_id=None, do_sample=False,
            )[0].tolist()[1:]
        outputs.append(out[: out.index(end)] if end in out else out)
    return outputs


def our_outputs(ours, sources):
    """This package's greedy and beam-4 (the `"length"` penalty, alpha 1:
    transformers' ranking) token ids of each source."""
    greedy = ours.generate(_padded(ours, sources), sampler="greedy", max_length_offset=MARIAN_OFFSET)
    beam = ours.generate(_padded(ours, sources), beam_size=4, alpha=1.0, length_penalty="length",
                         max_length_offset=MARIAN_OFFSET)
    return greedy, beam


def _padded(ours, sources):
    pad = ours.special_token_ids.pad
    ids = np.full((len(sources), max(map(len, sources))), pad, "int32")
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    return {"encoder_token_ids": ids, "encoder_padding_mask": (np.arange(ids.shape[1]) < np.array(
        [[len(source)] for source in sources])).astype("int32")}


@once  # (on every backend: test_marian.py's test_greedy_and_beam_search_match_transformers)
def test_marian_greedy_and_beam_search_equal_transformers(marian):
    """On a small trained Marian model, greedy decoding and beam search
    (beam 4, the `"length"` penalty with alpha 1) give transformers'
    `generate` outputs, for sources that end before their budget and
    sources cut at it."""
    import tiny_spm

    ours, theirs, _ = marian
    sources = ours.preprocessor.generate_preprocess(tiny_spm.TEXTS)
    greedy, beam = our_outputs(ours, sources)
    assert greedy == transformers_outputs(theirs, sources, num_beams=1)
    assert beam == transformers_outputs(theirs, sources, num_beams=4)
    ended = [len(ids) < len(source) + MARIAN_OFFSET for ids, source in zip(greedy + beam, sources + sources)]
    assert any(ended) and not all(ended), [len(ids) for ids in greedy + beam]
    # Varied outputs (the model is trained a little), not one token repeated.
    assert len({tuple(ids) for ids in greedy}) == len(sources) and sum(len(set(ids)) >= 4 for ids in beam) >= 3


def test_marian_export_round_trip_translates_the_same(marian, tmp_path):
    """`convert.export_marian` of the imported model: transformers reads
    the written directory and translates as this package does (greedy and
    beam 4), and this package reads it back as the same model: the same
    weights, token ids and texts."""
    import tiny_spm
    import transformers

    from keras_transformer.convert import export_marian

    ours, _, _ = marian
    directory = export_marian(ours, str(tmp_path / "marian"))
    exported = transformers.MarianMTModel.from_pretrained(directory).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    sources = ours.preprocessor.generate_preprocess(tiny_spm.TEXTS)
    # (An imported Marian model reads no source start token: the ids are transformers' tokenizer's.)
    assert sources == [tokenizer(text).input_ids for text in tiny_spm.TEXTS]
    greedy, beam = our_outputs(ours, sources)
    for outputs, num_beams in ((greedy, 1), (beam, 4)):
        theirs = transformers_outputs(exported, sources, num_beams)
        assert theirs == outputs, num_beams
        assert tokenizer.batch_decode(theirs, skip_special_tokens=True) == ours.preprocessor.generate_postprocess(
            outputs
        )
    # Read back: the model that translated above (compared weight by
    # weight, not by translating again: each new model compiles its search).
    again = TransformerSeq2SeqLM.from_preset(directory)
    config = {name: value for name, value in ours.backbone.get_config().items() if name != "name"}
    assert {name: value for name, value in again.backbone.get_config().items() if name != "name"} == config
    assert again.special_token_ids == ours.special_token_ids
    for mine, theirs in zip(ours.backbone.weights, again.backbone.weights):
        assert mine.path == theirs.path
        np.testing.assert_array_equal(ops.convert_to_numpy(theirs), ops.convert_to_numpy(mine), err_msg=mine.path)
    assert again.preprocessor.generate_preprocess(tiny_spm.TEXTS) == sources
    assert again.preprocessor.generate_postprocess(greedy + beam) == ours.preprocessor.generate_postprocess(
        greedy + beam
    )

"""Beam search with the GNMT length penalty (section 6.1), against
exhaustive search on a tiny model."""

import itertools
import types

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.decoding import greedy_search
from keras_transformer.decoding.beam import loop_batch_size
from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.rules import length_penalty
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM

PAD, START, END = 0, 2, 3
VOCABULARY = 6  # <pad> <unk> <s> </s> a b
OUTPUTS = [1, 3, 4, 5]  # what the model may emit: never <pad> or <s>


# 23 sources of 2-10 tokens, whose searches end at different steps: a
# batch that shrinks and a self-attention cache that grows.
UNEVEN_SOURCES = [[START] + [4 + (i * j) % 2 for j in range(i % 9)] + [END] for i in range(1, 24)]


def tiny_model(seed=0, max_sequence_length=64, dtype_policy=None, **kwargs):
    """A random one-layer model; built under the global `dtype_policy`
    (`"bfloat16"`, `"mixed_bfloat16"`) where one is given."""
    import keras

    previous = keras.config.dtype_policy()
    if dtype_policy is not None:
        keras.config.set_dtype_policy(dtype_policy)
    try:
        keras.utils.set_random_seed(seed)
        backbone = TransformerBackbone(
            VOCABULARY, num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout=0.0,
            max_sequence_length=max_sequence_length, **kwargs,
        )
        # Large random embeddings make the distributions peaked and varied.
        backbone.token_embedding.embeddings.assign(np.random.normal(0, 1.5, (VOCABULARY, 16)).astype("float32"))
        return TransformerSeq2SeqLM(backbone)
    finally:
        keras.config.set_dtype_policy(previous)


def teacher_forced_inputs(source, outputs):
    """One batch that feeds each output (all of one length) to the decoder
    after the start token, with `source` for each."""
    count, length = len(outputs), len(outputs[0])
    return {
        "encoder_token_ids": np.array([source] * count, "int32"),
        "encoder_padding_mask": np.ones((count, len(source)), "int32"),
        "decoder_token_ids": np.array([[START] + output[:-1] for output in outputs], "int32"),
        "decoder_padding_mask": np.ones((count, length), "int32"),
    }


def sequence_log_probs(model, source, outputs):
    """log P(output | source) of each output (all of one length), from one
    full forward pass of them all, no cache."""
    logits = ops.convert_to_numpy(model(teacher_forced_inputs(source, outputs))).astype("float64")
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    return [float(sum(log_probs[row, t, token] for t, token in enumerate(output))) for row, output in enumerate(outputs)]


def sequence_log_prob(model, source, output):
    return sequence_log_probs(model, source, [output])[0]


def exhaustive(model, source, max_tokens, alpha):
    """Every output of at most `max_tokens` tokens: ending in </s>, or cut at
    the maximum length."""
    scored = []
    for length in range(1, max_tokens + 1):
        outputs = [list(o) for o in itertools.product(OUTPUTS, repeat=length)]
        outputs = [o for o in outputs if END not in o[:-1] and (o[-1] == END or length == max_tokens)]
        for output, log_prob in zip(outputs, sequence_log_probs(model, source, outputs)):
            ids = output[:-1] if output[-1] == END else output
            scored.append((log_prob / length_penalty(length, alpha), log_prob, ids))
    return sorted(scored, key=lambda item: -item[0])


@pytest.mark.parametrize(
    "alpha,num_results,in_loop", [(0.6, 5, False), (0.6, 1, False), (0.0, 5, False), (2.0, 3, False), (0.6, 5, True)]
)
def test_wide_beam_equals_exhaustive_search(alpha, num_results, in_loop):
    model = tiny_model()
    source = [START, 4, 5, 4, END]
    max_tokens = 3
    expected = exhaustive(model, source, max_tokens, alpha)
    # 64 beams hold every prefix of 3 tokens over 4 symbols: exact search.
    result = beam_search(model, [source], beam_size=64, alpha=alpha, max_length_offset=max_tokens - len(source),
                         num_results=num_results, in_loop=in_loop)[0]
    expected = expected[:num_results]
    assert [ids for ids, _, _ in result] == [ids for _, _, ids in expected]
    np.testing.assert_allclose([s for _, s, _ in result], [s for s, _, _ in expected], rtol=1e-4)
    np.testing.assert_allclose([lp for _, _, lp in result], [lp for _, lp, _ in expected], rtol=1e-4)


def test_alpha_zero_ranks_by_log_probability():
    model = tiny_model(seed=3)
    source = [START, 5, 5, 4, END]
    result = beam_search(model, [source], beam_size=8, alpha=0.0, num_results=8, max_length_offset=1)[0]
    log_probs = [lp for _, _, lp in result]
    assert log_probs == sorted(log_probs, reverse=True)
    assert all(score == lp for _, score, lp in result)


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == 1.0
    np.testing.assert_allclose(length_penalty(10, 0.6), (15 / 6) ** 0.6)
    assert length_penalty(7, 0.0) == 1.0


def test_beam_size_one_is_greedy():
    model = tiny_model(seed=1, max_sequence_length=32)
    sources = [[START, 4, 5, END], [START, 5, 4, 4, 5, 1, END], [START, END]]
    greedy = greedy_search(model, sources, max_length_offset=10)
    beam = beam_search(model, sources, beam_size=1, max_length_offset=10)
    assert [r[0][0] for r in beam] == greedy


def test_finished_hypotheses_are_never_extended():
    model = tiny_model(seed=2)
    source = [START, 4, 4, 5, END]
    results = beam_search(model, [source], beam_size=4, num_results=4, max_length_offset=6)[0]
    for ids, score, log_prob in results:
        assert END not in ids
        # The reported log-probability is that of exactly this output (plus
        # its end token when it ended early), with nothing added after.
        output = ids + [END] if len(ids) < len(source) + 6 else ids
        np.testing.assert_allclose(log_prob, sequence_log_prob(model, source, output), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(score, log_prob / length_penalty(len(output), 0.6), rtol=1e-6)


def test_batches_of_different_lengths_equal_one_by_one():
    model = tiny_model(seed=4)
    # Sources of many lengths: the batch shrinks as sources finish.
    sources = [[START, 4, END], [START, 5, 4, 4, 5, 1, 4, END], [], [START, 1, 5, END]]
    sources += [[START] + [4 + (i * j) % 2 for j in range(i)] + [END] for i in range(1, 9)]
    batched = beam_search(model, sources, beam_size=3, num_results=2, max_length_offset=5)
    assert batched[2] == []
    for source, result in zip(sources, batched):
        if source:
            single = beam_search(model, [source], beam_size=3, num_results=2, max_length_offset=5)[0]
            assert [ids for ids, _, _ in single] == [ids for ids, _, _ in result]
            np.testing.assert_allclose([s for _, s, _ in single], [s for _, s, _ in result], rtol=1e-5)
            assert all(len(ids) <= len(source) + 5 for ids, _, _ in result)


# PyTorch's way (a source leaves at every step) is run where it is the real
# one: on JAX and TensorFlow it would compile a step for every batch size.
# There, the search runs in segments of compiled steps (the default) or a
# step a call (given its step functions).
@pytest.mark.parametrize("mode", [
    pytest.param(mode, marks=pytest.mark.skipif(
        (mode == "eager") != (keras.config.backend() == "torch"),
        reason="each backend's own way (eager steps on PyTorch, compiled ones elsewhere)"))
    for mode in ("segments", "steps", "eager")
])
def test_sources_leave_the_batch_without_changing_results(mode, monkeypatch):
    """Where steps are compiled per shape (JAX, TensorFlow) done sources
    leave the batch in powers of two, with filler; where they are not
    (PyTorch) at every step. Either way each source gets what it gets
    alone. In segments, each call of compiled code runs until the batch
    shrinks or the cache grows."""
    from keras_transformer.decoding import beam

    kept = []  # (live sources, batch slots, slots kept) at each step (at each segment's end)
    original = beam._slots_to_keep

    def recording(done, compiled=True):
        keep = original(done, compiled)
        kept.append((int((~done).sum()), len(done), len(keep)))
        return keep

    first_rows = []
    original_functions = beam.decoding_functions

    def recording_functions(model):
        encode, step = original_functions(model)

        def first_step_rows(token_ids, index, *args, **kwargs):
            if int(index) == 0:
                first_rows.append(len(token_ids))
            return step(token_ids, index, *args, **kwargs)

        return encode, first_step_rows

    segments, grown = [], []
    original_segments, original_states = beam.search_segment_function, beam.search_state_functions

    def recording_segments(*args):
        segment = original_segments(*args)

        def counted(*inputs):
            segments.append(len(inputs[1]))
            return segment(*inputs)

        return counted

    def recording_states(model, beam_size):
        initial, kept, grow = original_states(model, beam_size)

        def recording_grow(state, length):
            grown.append(length)
            return grow(state, length=length)

        return initial, kept, recording_grow

    monkeypatch.setattr(beam, "compiles_steps", lambda: mode != "eager")
    monkeypatch.setattr(beam, "_slots_to_keep", recording)
    monkeypatch.setattr(beam, "decoding_functions", recording_functions)
    monkeypatch.setattr(beam, "search_segment_function", recording_segments)
    monkeypatch.setattr(beam, "search_state_functions", recording_states)
    model = tiny_model(seed=5)  # outputs run to their budgets: sources end one by one
    sources = [[START] + [4 + (i * j) % 2 for j in range(i)] + [END] for i in range(1, 12)]
    settings = dict(beam_size=3, max_length_offset=5)
    functions = None if mode == "segments" else beam.decoding_functions(model)
    batched = beam_search(model, sources, functions=functions, **settings)
    monkeypatch.setattr(beam, "_slots_to_keep", original)
    for source, result in zip(sources, batched):
        assert result[0][0] == beam_search(model, [source], **settings)[0][0][0]
    shrinks = [(live, slots, keep) for live, slots, keep in kept if keep < slots]
    assert shrinks, kept
    if mode == "segments":
        assert not first_rows  # no step called one at a time
        # A segment ends where the batch shrinks, where the cache grows (by
        # its chunk of positions, to the 24 that the longest budget, 16
        # tokens, rounds up to), or at the end.
        from keras_transformer.decoding.loop import segment_beam_caches

        chunk = beam.CACHE_CHUNK if segment_beam_caches(model) else beam.SEGMENT_CACHE_CHUNK
        assert grown == list(range(2 * chunk, 24, chunk)) + [24], grown
        assert len(segments) == len(shrinks) + len(grown) + 1, (segments, kept, grown)
        assert segments[0] == len(sources) and segments[-1] == 8, segments
    else:
        # The first step: only the first beam of a source is live. Compiled
        # steps run the k beams' rows that every later step has, for one
        # shape throughout; eager ones run that beam alone.
        assert first_rows[0] == len(sources) * (1 if mode == "eager" else 3)
    if mode != "eager":
        assert all(keep & (keep - 1) == 0 and live <= keep for live, _, keep in shrinks), kept
        # Never below 8 slots: each smaller size would compile every step again.
        assert min(keep for _, _, keep in kept) == beam.MIN_COMPILED_SLOTS == 8, kept
    if mode == "steps":
        assert any(live < keep for live, _, keep in kept), kept  # done sources kept as filler
    if mode == "eager":
        assert all(keep == live for live, slots, keep in kept if live < slots), kept


@pytest.mark.parametrize("kind", ["gnmt", "length"])
def test_the_search_in_one_loop_equals_the_host_search(kind):
    """`loop.search_loop` (one compiled loop; the SavedModel's search) and
    the host loop follow the same rules: same outputs, the same scores to
    float32's precision, for sources that end early and at their budget."""
    model = tiny_model(seed=21)  # (a model whose hypotheses end both ways, on every backend)
    sources = [[START, 4, END], [START, 5, 4, 4, 5, 1, 4, END], [], [START, 1, 5, END]]
    sources += [[START] + [4 + (i * j) % 2 for j in range(i)] + [END] for i in range(1, 7)]
    settings = dict(beam_size=3, num_results=2, max_length_offset=5, length_penalty=kind)
    host = beam_search(model, sources, in_loop=False, **settings)
    loop = beam_search(model, sources, in_loop=True, **settings)
    assert [[ids for ids, _, _ in result] for result in loop] == [[ids for ids, _, _ in result] for result in host]
    for found, expected in zip(loop, host):
        np.testing.assert_allclose([item[1:] for item in found], [item[1:] for item in expected], rtol=1e-5)
    cut = [len(ids) == len(source) + 5 for source, result in zip(sources, host) for ids, _, _ in result]
    assert any(cut), "some hypotheses should end at their budget"
    if kind == "gnmt":  # "length" goes on to the budget
        assert not all(cut), "some hypotheses should end early"


def test_the_one_loop_search_tries_a_short_cache_first(monkeypatch):
    """`beam._search_in_loop` runs the loop with a short self-attention
    cache first, and again with the budgets' cache only where a source was
    not done when the short one was full: the results are the host
    search's either way."""
    from keras_transformer.decoding import beam

    model = tiny_model(seed=21)
    sources = [[START, 4, END], [START, 5, 4, 4, 5, 1, 4, END], [START, 1, 5, END]]
    sources += [[START] + [4 + (i * j) % 2 for j in range(i)] + [END] for i in range(1, 7)]
    settings = dict(beam_size=3, num_results=2, max_length_offset=10, length_penalty="gnmt")
    host = beam_search(model, sources, in_loop=False, **settings)

    searches = []  # (cache positions, done) of each loop run
    made = beam.search_loop_function

    def recording(*args, **kwargs):
        search = made(*args, **kwargs)

        def recorded(encoder_ids, encoder_mask, budgets, positions):
            found = search(encoder_ids, encoder_mask, budgets, positions)
            searches.append((len(positions), bool(ops.convert_to_numpy(found[-1]))))
            return found

        return recorded

    monkeypatch.setattr(beam, "search_loop_function", recording)
    # Sources padded to 8 tokens: a first cache of 16 positions, then the budgets' 24.
    monkeypatch.setattr(beam, "FIRST_LOOP_POSITIONS", 1)
    loop = [beam_search(model, [source], in_loop=True, **settings)[0] for source in sources]
    assert [[ids for ids, _, _ in result] for result in loop] == [[ids for ids, _, _ in result] for result in host]
    for found, expected in zip(loop, host):
        np.testing.assert_allclose([item[1:] for item in found], [item[1:] for item in expected], rtol=1e-5)
    # Some sources were done within the short cache; the others searched again.
    assert (16, True) in searches and (16, False) in searches, searches
    assert all(done for positions, done in searches if positions == 24), searches
    assert len(searches) == len(sources) + searches.count((16, False)), searches


@pytest.mark.skipif(keras.config.backend() == "torch", reason="PyTorch runs a step a call: no segments")
# (Each penalty and each kind of cache once: each setting compiles its
# segments anew, 10-45 s a setting.)
@pytest.mark.parametrize("kind,alpha,beam_caches", [("gnmt", 0.6, False), ("length", 1.0, True)])
def test_segments_of_compiled_steps_equal_a_step_a_call(kind, alpha, beam_caches, monkeypatch):
    """Where steps are compiled (JAX, TensorFlow) the host search runs
    segments of steps on the device (`loop.search_segment`, the rules in
    Keras ops), shrinking the batch and growing the cache between them;
    given its step functions it runs a decoder step and the search's step
    a call. Same outputs, the same scores to float32's precision, for a
    batch that shrinks and a cache that grows twice; with a row a beam in
    the segments' caches or with caches they never reorder
    (`runtime.beam_cache`)."""
    from keras_transformer.decoding import beam
    from keras_transformer.runtime import backend_choices
    from keras_transformer.decoding.interface import decoding_functions

    monkeypatch.setattr(backend_choices, "SEGMENT_BEAM_CACHES", {keras.config.backend(): beam_caches})
    monkeypatch.setattr(beam, "concurrent_parts", lambda: 1)
    model = tiny_model(seed=5, max_sequence_length=128)
    sources = list(UNEVEN_SOURCES)
    sources.insert(5, [])
    settings = dict(beam_size=4, num_results=3, alpha=alpha, length_penalty=kind, max_length_offset=30)
    grown, shrunk = [], []
    held = []  # tensors in each grown state's first self-attention cache
    original_states = beam.search_state_functions

    def recording_states(model, beam_size):
        initial, kept, grow = original_states(model, beam_size)

        def recording_grow(state, length):
            grown.append(length)
            held.append(len(state[8][0]))
            return grow(state, length=length)

        def recording_kept(state, cross, keep, **kwargs):
            shrunk.append(len(keep))
            return kept(state, cross, keep, **kwargs)

        return initial, recording_kept, recording_grow

    monkeypatch.setattr(beam, "search_state_functions", recording_states)
    segments = beam_search(model, sources, **settings)
    in_segments = list(grown), list(shrunk), list(held)
    steps = beam_search(model, sources, functions=decoding_functions(model), **settings)
    chunk = beam.CACHE_CHUNK if beam_caches else beam.SEGMENT_CACHE_CHUNK
    grown, shrunk, held = in_segments
    assert grown[:2] == [2 * chunk, 3 * chunk] and shrunk and shrunk[-1] == 8, (grown, shrunk)
    assert set(held) == {3 if beam_caches else 2}, held
    outputs = [[[ids for ids, _, _ in result] for result in found] for found in (segments, steps)]
    assert outputs[0] == outputs[1]
    for found, expected in zip(segments, steps):
        np.testing.assert_allclose([item[1:] for item in found], [item[1:] for item in expected], rtol=1e-5)
    counts = [len(result) for result in segments]
    assert counts[5] == 0 and counts[:5] + counts[6:] == [3] * (len(sources) - 1), counts


def test_a_batch_searched_in_parts_at_once_equals_one_search(monkeypatch):
    """On a CPU under JAX or TensorFlow a batch is searched in parts, one
    a core, each in a thread of its own (`compiled.concurrent_parts`):
    each source gets what one search of the whole batch gives it, in the
    order of the sources."""
    import threading

    from keras_transformer.decoding import beam

    model = tiny_model(seed=4)
    sources = [[START] + [4 + (i * j) % 2 for j in range(i)] + [END] for i in range(1, 10)]
    sources.insert(3, [])
    settings = dict(beam_size=3, num_results=2, max_length_offset=5, in_loop=False)
    monkeypatch.setattr(beam, "concurrent_parts", lambda: 1)
    whole = beam_search(model, sources, **settings)

    searches = []  # (thread, sources) of each search
    # (Where steps are compiled, each part is searched in segments of steps.)
    name = "_host_search"
    original = getattr(beam, name)
    # Each part waits until all three have started: they run at once (a
    # part searched after another would break the barrier when it times out).
    together = [threading.Barrier(3)]

    def recording(model, part, *args):
        searches.append((threading.get_ident(), part))
        if together:
            together[0].wait(timeout=60)
        return original(model, part, *args)

    monkeypatch.setattr(beam, name, recording)
    monkeypatch.setattr(beam, "concurrent_parts", lambda: 3)
    monkeypatch.setattr(beam, "MIN_PART_SOURCES", 2)
    parts = beam_search(model, sources, **settings)
    non_empty = [source for source in sources if source]
    # Three parts, the sources interleaved, each searched in its own thread.
    assert sorted(part for _, part in searches) == sorted(non_empty[i::3] for i in range(3))
    assert len({thread for thread, _ in searches}) == 3 and threading.get_ident() not in dict(searches)
    assert parts[3] == []
    assert [[ids for ids, _, _ in result] for result in parts] == [[ids for ids, _, _ in result] for result in whole]
    for found, expected in zip(parts, whole):
        np.testing.assert_allclose([item[1:] for item in found], [item[1:] for item in expected], rtol=1e-5)

    # Fewer sources than two parts' worth: one search, in the caller's thread.
    searches.clear()
    together.clear()
    monkeypatch.setattr(beam, "MIN_PART_SOURCES", 8)
    beam_search(model, sources[:12], **settings)
    assert [thread for thread, _ in searches] == [threading.get_ident()]


def test_batches_are_searched_in_parts_on_a_cpu_where_steps_are_compiled():
    import os

    from keras_transformer.runtime.compiled import concurrent_parts

    if keras.config.backend() == "torch":  # (its eager steps use every core already)
        assert concurrent_parts() == 1
    else:  # (the test suite runs on CPUs)
        assert concurrent_parts() == len(os.sched_getaffinity(0))


def test_a_few_sentences_at_a_time_run_in_one_loop_where_the_backend_compiles_it():
    import keras

    model = tiny_model(seed=5)
    sources = [[START, 4, 5, END]]
    # (The budget does not choose the way: a short one, few steps.)
    beam_search(model, sources, max_length_offset=4)
    compiled = getattr(getattr(model, "_decoding_loops", None), "by_settings", {})
    loops = [key for key in compiled if key[0] == "loop"]
    if keras.config.backend() in ("jax", "tensorflow"):
        assert loops and getattr(model, "_decoding_functions", None) is None
    else:
        assert not loops and getattr(model, "_decoding_functions", None) is not None
    beam_search(model, sources * (loop_batch_size(model) + 1), max_length_offset=4)  # a larger batch: the host search
    assert getattr(model, "_decoding_functions", None) is not None


def test_bad_arguments():
    model = tiny_model()
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, [[START, END]], beam_size=0)
    with pytest.raises(ValueError, match="num_results"):
        beam_search(model, [[START, END]], beam_size=2, num_results=3)
    with pytest.raises(ValueError, match="alpha"):
        beam_search(model, [[START, END]], alpha=-1)
    with pytest.raises(ValueError, match="max_length_offset=-100 leaves no output token for a source of 2"):
        beam_search(model, [[START, END]], max_length_offset=-100)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        model.generate({"encoder_token_ids": [[START, END]], "encoder_padding_mask": [[1, 1]]}, batch_size=0)
    with pytest.raises(ValueError, match="Greedy decoding gives one result"):
        model.generate({"encoder_token_ids": [[START, END]], "encoder_padding_mask": [[1, 1]]},
                       sampler="greedy", num_results=2)


def test_sources_as_arrays_equal_sources_as_lists():
    model = tiny_model(seed=2)
    sources = [[START, 4, 5, END], [START, 5, END]]
    expected = beam_search(model, sources, beam_size=2, max_length_offset=4)
    for given in ([np.array(ids, "int32") for ids in sources], [ops.convert_to_tensor(ids) for ids in sources]):
        assert beam_search(model, given, beam_size=2, max_length_offset=4) == expected
    assert greedy_search(model, [np.array(ids) for ids in sources], max_length_offset=4) == greedy_search(
        model, sources, max_length_offset=4
    )


def test_sources_up_to_the_limit_of_learned_positions():
    # Learned positions have max_sequence_length rows: padding a batch of
    # sources must not go past them.
    model = tiny_model(max_sequence_length=12, position_encoding="learned")
    sources = [[START, *[4, 5] * 5, END][:11], [START, 4, END]]
    for ids, found in zip(sources, beam_search(model, sources, beam_size=2)):
        assert len(found[0][0]) <= 11
    with pytest.raises(ValueError, match="13 tokens is longer than the model's max_sequence_length=12"):
        beam_search(model, [[START, *[4] * 11, END]])


@pytest.mark.parametrize("offset", [0, 2, 6])
def test_keras_hub_samplers_run_through_generate_step(offset):
    import keras_hub

    model = tiny_model(seed=5, max_sequence_length=40)
    sources = [[START, 4, 5, END], [START, 5, 4, 4, 5, 1, END], [START, 1, END]]
    ours = greedy_search(model, sources, max_length_offset=offset)
    assert any(len(mine) == len(source) + offset for source, mine in zip(sources, ours))  # a cut one
    padded = np.zeros((len(sources), 8), "int32")
    for row, ids in enumerate(sources):
        padded[row, : len(ids)] = ids
    inputs = {"encoder_token_ids": padded, "encoder_padding_mask": padded != PAD}
    # keras-hub's greedy sampler, and its contrastive one without the
    # degeneration penalty (alpha 0: the likeliest of the top k), find
    # greedy decoding's outputs under the same length limit per source.
    for sampler in (keras_hub.samplers.GreedySampler(), keras_hub.samplers.ContrastiveSampler(k=3, alpha=0.0)):
        theirs = model.generate(inputs, sampler=sampler, max_length_offset=offset)
        assert theirs == ours, type(sampler).__name__
    with pytest.raises(ValueError, match="max_length_offset=-3 leaves no output token"):
        model.generate(inputs, sampler=keras_hub.samplers.GreedySampler(), max_length_offset=-3)


def test_keras_hub_samplers_refuse_scores():
    import keras_hub

    with pytest.raises(ValueError, match="keras-hub samplers"):
        tiny_model().generate(
            {"encoder_token_ids": np.array([[START, END]]), "encoder_padding_mask": np.ones((1, 2))},
            sampler=keras_hub.samplers.GreedySampler(), return_scores=True,
        )
    with pytest.raises(ValueError, match="Unknown sampler"):
        tiny_model().generate({"encoder_token_ids": np.array([[START, END]]), "encoder_padding_mask": np.ones((1, 2))}, sampler="topk")


class InterfaceOnly:
    """Exactly the members of `Seq2SeqDecodingModel`, delegating to a model:
    beam search must need nothing else (no model class, no private method)."""

    def __init__(self, model):
        self.special_token_ids = model.special_token_ids
        self.backbone = model.backbone
        self.variables = model.variables
        self.encode = model.encode
        self.cross_attention_cache = model.cross_attention_cache
        self.empty_self_attention_cache = model.empty_self_attention_cache
        self.call_decoder_with_cache = model.call_decoder_with_cache


def test_search_needs_only_the_decoding_interface():
    from keras_transformer.decoding import Seq2SeqDecodingModel

    model = tiny_model(seed=3)
    assert isinstance(model, Seq2SeqDecodingModel)
    stand_in = InterfaceOnly(model)
    assert isinstance(stand_in, Seq2SeqDecodingModel)
    sources = [[START, 4, 5, END], [START, 5, END], [START, 4, 4, 5, 4, END]]
    # (Short outputs: what is tested is the interface, and each longer cache
    # is another compilation on JAX and TensorFlow.)
    expected = beam_search(model, sources, beam_size=3, alpha=0.6, num_results=2, max_length_offset=6)
    found = beam_search(stand_in, sources, beam_size=3, alpha=0.6, num_results=2, max_length_offset=6)
    assert [[ids for ids, _, _ in result] for result in found] == [[ids for ids, _, _ in result] for result in expected]
    np.testing.assert_allclose(
        [[score for _, score, _ in result] for result in found],
        [[score for _, score, _ in result] for result in expected],
        rtol=1e-6,
    )


@pytest.mark.parametrize("kind", ["gnmt", "length"])
def test_search_rules_agree_on_numbers_and_on_tensors(kind):
    """The rules' formulas give the same on NumPy numbers, on TensorFlow's
    NumPy and in the search's own namespace (`runtime.array_ops`), as the
    search runs them on each backend."""
    import tensorflow.experimental.numpy as tnp

    from keras_transformer.decoding import rules
    from keras_transformer.runtime.array_ops import array_ops

    lengths = np.array([1, 2, 7, 30, 51])
    np.testing.assert_allclose(
        rules.length_penalty(lengths, 0.6, kind),
        np.asarray(rules.length_penalty(tnp.asarray(lengths, "int32"), 0.6, kind, xp=tnp)),
    )
    expected = ((5.0 + lengths) / 6.0) ** 0.6 if kind == "gnmt" else lengths**0.6
    np.testing.assert_allclose(rules.length_penalty(lengths, 0.6, kind), expected)
    budget = rules.output_budget(np.array([3, 40, 90]), 50, 100)
    np.testing.assert_array_equal(budget, [53, 90, 99])
    np.testing.assert_array_equal(np.asarray(rules.output_budget(tnp.asarray([3, 40, 90]), 50, 100, xp=tnp)), budget)
    # count, best live log P, n-th and k-th best finished, length, budget.
    cases = [
        (4, -1.0, -2.0, -3.0, 5, 20),
        (1, -1.0, -2.0, -np.inf, 5, 20),
        (1, -9.0, -2.0, -np.inf, 5, 20),
        (0, -9.0, -np.inf, -np.inf, 5, 20),
        (4, -9.0, -2.0, -3.0, 5, 20),
    ]
    for count, best_live, nth, kth, length, budget in cases:
        host = rules.search_is_over(count, best_live, nth, kth, length, budget, 4, 1, 0.6, kind)
        graph = rules.search_is_over(
            tnp.asarray(count), tnp.asarray(best_live, "float64"), tnp.asarray(nth, "float64"),
            tnp.asarray(kth, "float64"), tnp.asarray(length), tnp.asarray(budget), 4, 1, 0.6, kind, xp=tnp,
        )
        assert bool(host) == bool(np.asarray(graph)), (count, best_live, nth, kth)
        # In Keras ops and float32, as the loop on the device runs them.
        device = rules.search_is_over(
            ops.convert_to_tensor(count), ops.convert_to_tensor(best_live, "float32"),
            ops.convert_to_tensor(nth, "float32"), ops.convert_to_tensor(kth, "float32"),
            ops.convert_to_tensor(length), ops.convert_to_tensor(budget), 4, 1, 0.6, kind, xp=array_ops(),
            dtype="float32",
        )
        assert bool(ops.convert_to_numpy(device)) == bool(host), (count, best_live, nth, kth)
        if kind == "gnmt":
            reachable = best_live / ((5.0 + budget) / 6.0) ** 0.6
            assert bool(host) == (count >= 4 or (count >= 1 and nth >= reachable))
        else:
            assert bool(host) == (count >= 4 and best_live / length**0.6 <= kth)


def _candidates_in_numpy(logits, log_probs, never_output):
    """Every extension's log-probability, `(batch, beams * vocabulary_size)`."""
    logits = logits.astype("float32")
    shifted = logits - logits.max(-1, keepdims=True)
    token_log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    batch, beams = log_probs.shape
    return (log_probs[:, :, None] + (token_log_probs + never_output).reshape(batch, beams, -1)).reshape(batch, -1)


@pytest.mark.parametrize(
    "beams,vocabulary,count,ties,batch",
    # 8,000 tokens: ranked in chunks (`rules._top_k_of_many`, and on
    # PyTorch `runtime.torch_ranking`); 8,009 (a prime): no chunks.
    [
        (4, 50, 8, False, 3), (4, 12, 8, True, 3), (3, 5, 6, True, 3), (1, 9, 2, False, 3),
        (4, 8000, 8, False, 3), (2, 8000, 4, True, 3), (1, 8000, 8, False, 3), (4, 8000, 8, False, 64),
        (4, 8000, 8, True, 17), (4, 8009, 8, True, 3),
    ],
)
def test_best_extensions_rank_every_extension(beams, vocabulary, count, ties, batch):
    """Ranking each beam's tokens first gives the values and the order (ties
    included) of ranking all `beams * vocabulary_size` extensions at once."""
    import keras

    from keras_transformer.decoding.rules import best_extensions

    rng = np.random.default_rng(beams * vocabulary + batch)
    logits = rng.normal(0, 2, (batch * beams, vocabulary)).astype("float32")
    log_probs = -rng.uniform(0, 3, (batch, beams)).astype("float32")
    if ties:
        # Equal logits within a beam, and equal beams (the first step's
        # copies of one hypothesis).
        logits = np.round(logits).astype("float32")
        logits[:, vocabulary // 2] = logits.max()  # ties among the best
        logits[1] = logits[0]
        log_probs[:, 1] = log_probs[:, 0]
    log_probs[0, -1] = -np.inf  # a beam that is not live
    logits[:, 0] = logits.max() + 1.0  # a never-output token is each beam's most likely
    never_output = np.zeros(vocabulary, "float32")
    never_output[[0, 2]] = -np.inf
    values, indices = best_extensions(logits, log_probs, never_output, count)
    # Rule 2 the direct way: every extension ranked by a stable sort (lower
    # flat index first on ties).
    all_values = _candidates_in_numpy(logits, log_probs, never_output)
    expected_indices = np.argsort(-all_values, axis=1, kind="stable")[:, :count]
    expected_values = np.take_along_axis(all_values, expected_indices, axis=1)
    # (A log-softmax over 8,009 float32 logits sums them in another order
    # than NumPy on some processors: PyTorch's differed by 2.6e-6 at -1.86
    # on an AMD EPYC with AVX2.)
    np.testing.assert_allclose(ops.convert_to_numpy(values), expected_values, rtol=1e-5, atol=1e-5)
    values, indices = ops.convert_to_numpy(values), ops.convert_to_numpy(indices)
    finite = np.isfinite(expected_values)
    assert not np.isin(indices[finite] % vocabulary, [0, 2]).any()
    # Each index names an extension of its value, none twice.
    np.testing.assert_allclose(np.take_along_axis(all_values, indices, axis=1)[finite], values[finite], rtol=1e-5, atol=1e-5)
    assert all(len(set(row[f])) == f.sum() for row, f in zip(indices, finite))
    if keras.config.backend() != "torch":
        # JAX's and TensorFlow's top_k keep the lower index first among
        # equal values (PyTorch's leaves that order open).
        np.testing.assert_array_equal(indices[finite], expected_indices[finite])


@pytest.mark.parametrize("vocabulary", [8000, 8009])
def test_best_extensions_of_bfloat16_logits_leave_the_logits_as_they_were(vocabulary):
    """bfloat16 logits, as a bfloat16 model's search step gives them (in
    inference, PyTorch's log-softmax runs in place on their float32 copy):
    the values of ranking their float32 values, and the logits unchanged."""
    import keras

    from keras_transformer.decoding.rules import best_extensions

    rng = np.random.default_rng(vocabulary)
    logits = keras.ops.cast(rng.normal(0, 4, (3 * 4, vocabulary)).astype("float32"), "bfloat16")
    log_probs = -rng.uniform(0, 3, (3, 4)).astype("float32")
    never_output = np.zeros(vocabulary, "float32")
    never_output[[0, 2]] = -np.inf
    before = ops.convert_to_numpy(ops.cast(logits, "float32"))
    if keras.config.backend() == "torch":
        import torch

        with torch.inference_mode():
            values, _ = best_extensions(logits, log_probs, never_output, 8)
    else:
        values, _ = best_extensions(logits, log_probs, never_output, 8)
    np.testing.assert_array_equal(ops.convert_to_numpy(ops.cast(logits, "float32")), before)
    expected = np.sort(_candidates_in_numpy(before, log_probs, never_output), axis=1)[:, ::-1][:, :8]
    np.testing.assert_allclose(ops.convert_to_numpy(values), expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16"])
def test_step_outputs_read_back_as_keras_reads_them(dtype):
    """`compiled.to_numpy` (how a search reads its steps' candidates back)
    gives Keras' `convert_to_numpy`: the same values and dtype, in an array
    of its own (writing to it leaves the tensor as it was)."""
    from keras_transformer.runtime.array_ops import to_numpy

    values = np.array([[1.5, -2.25, 3.0], [0.0, 7.0, -1.0]], "float32")
    tensor = ops.cast(ops.convert_to_tensor(values), dtype)
    expected = ops.convert_to_numpy(tensor)
    got = to_numpy(tensor)
    assert isinstance(got, np.ndarray) and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    got[0, 0] = 100
    np.testing.assert_array_equal(ops.convert_to_numpy(tensor), expected)


def test_compiled_functions_take_each_nesting_shape_and_default_as_the_function_does():
    """`compiled.compile_for_inference` gives the function's results for
    arguments of other shapes and nestings (lists or tuples) and for
    keyword arguments given or left to their defaults, reading the
    model's weights as they are at the call; on TensorFlow, where calls
    go to a trace found by the arguments' shapes, one trace a signature."""
    from keras_transformer.runtime.compiled import compile_for_inference

    scale = keras.Variable(np.float32(2.0))
    traces = []

    def function(x, pair, offset=1.0):
        traces.append(len(pair))
        return ops.add(ops.multiply(x, scale) + pair[0] * pair[-1], offset)

    compiled = compile_for_inference(types.SimpleNamespace(variables=[scale]), function)
    rng = np.random.default_rng(0)
    calls = []
    for shape in [(3,), (2, 3), (3,), (3,)]:
        x, a, b = (rng.normal(size=shape).astype("float32") for _ in range(3))
        calls += [((x, [a, b]), {}), ((x, (a, b)), {}), ((x, (a, b, a)), {}), ((x, [a, b]), {"offset": -4.0})]
    for args, kwargs in calls:
        x, pair = args
        expected = x * scale.numpy() + pair[0] * pair[-1] + kwargs.get("offset", 1.0)
        np.testing.assert_allclose(ops.convert_to_numpy(compiled(*args, **kwargs)), expected, rtol=1e-6)
    scale.assign(np.float32(-3.0))
    x = np.ones(3, "float32")
    np.testing.assert_allclose(ops.convert_to_numpy(compiled(x, [x, x])), np.full(3, -3.0 + 1 + 1))
    if keras.config.backend() == "tensorflow":
        # (Two shapes by four nestings and keyword values; `reduce_retracing` may trace fewer.)
        assert len(traces) <= 8


@pytest.mark.parametrize("in_loop", [False, True])
def test_compiled_searches_follow_the_embeddings(in_loop):
    """The output projection's copy that compiled decoding reads
    (`SharedTokenEmbedding.output_columns`, JAX on a CPU) is made again
    when the embeddings are written: a search after the write scores as
    exhaustive search does with the new weights."""
    model = tiny_model(seed=5)
    source = [START, 4, 5, 4, END]
    # 64 beams hold every prefix of 3 tokens over 4 symbols: exact search.
    settings = dict(beam_size=64, num_results=5, max_length_offset=3 - len(source), in_loop=in_loop)
    beam_search(model, [source], **settings)
    embedding = model.backbone.token_embedding
    if keras.config.backend() == "jax":
        # (The compiled functions took a copy of the embeddings transposed.)
        np.testing.assert_array_equal(
            ops.convert_to_numpy(embedding.__dict__["_output_columns"][1]), ops.convert_to_numpy(embedding.embeddings).T
        )
    embedding.embeddings.assign(np.random.default_rng(6).normal(0, 1.5, (VOCABULARY, 16)).astype("float32"))
    result = beam_search(model, [source], **settings)[0]
    expected = exhaustive(model, source, 3, 0.6)[:5]
    assert [ids for ids, _, _ in result] == [ids for _, _, ids in expected]
    np.testing.assert_allclose([s for _, s, _ in result], [s for s, _, _ in expected], rtol=1e-4, atol=1e-5)


def test_output_columns_are_the_embeddings_transposed_where_xla_decodes_on_a_cpu():
    from keras_transformer.layers import SharedTokenEmbedding

    embedding = SharedTokenEmbedding(vocabulary_size=12, d_model=8)
    embedding.build()
    columns = embedding.output_columns()
    if keras.config.backend() != "jax":
        assert columns is None
        return
    np.testing.assert_array_equal(ops.convert_to_numpy(columns), ops.convert_to_numpy(embedding.embeddings).T)
    assert embedding.output_columns() is columns  # (kept while the embeddings stay as they are)
    with_mixed_precision = SharedTokenEmbedding(vocabulary_size=12, d_model=8, dtype="mixed_bfloat16")
    with_mixed_precision.build()
    assert with_mixed_precision.output_columns() is None
    # bfloat16 weights: bfloat16 columns, multiplied into float32 logits
    # (`bfloat16_products.float32_product`), those of the same values in float32.
    from keras_transformer.runtime.bfloat16_products import float32_product

    in_bfloat16 = SharedTokenEmbedding(vocabulary_size=12, d_model=8, dtype="bfloat16")
    in_bfloat16.build()
    columns = in_bfloat16.output_columns()
    embeddings = ops.convert_to_numpy(ops.cast(in_bfloat16.embeddings, "float32"))
    assert keras.backend.standardize_dtype(columns.dtype) == "bfloat16"
    np.testing.assert_array_equal(ops.convert_to_numpy(ops.cast(columns, "float32")), embeddings.T)
    hidden = ops.cast(np.random.default_rng(0).normal(size=(3, 8)).astype("float32"), "bfloat16")
    logits = float32_product(hidden, columns)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    exact = ops.convert_to_numpy(ops.cast(hidden, "float32")) @ embeddings.T
    np.testing.assert_allclose(ops.convert_to_numpy(logits), exact, rtol=1e-5, atol=1e-6)
    embedding.quantize("int8")
    assert embedding.output_columns() is None


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow's loops (JAX passes the copy in)")
def test_tensorflow_loops_project_through_a_transposed_copy_made_in_the_function():
    """In a function TensorFlow compiles, `loop_output_columns` binds the
    output projection to the embeddings transposed, made in the function
    (so that a loop's steps read that layout and the copy follows the
    weights); the logits are the float32 product and the bias. Run
    eagerly, it binds nothing."""
    import tensorflow as tf

    from keras_transformer.runtime.compiled import loop_output_columns
    from keras_transformer.runtime.bfloat16_products import output_columns_of

    model = tiny_model(seed=3, output_bias=True)
    embedding = model.backbone.token_embedding
    embedding.logits_bias.assign(np.random.default_rng(1).normal(size=(VOCABULARY,)).astype("float32"))
    hidden = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    bound = []

    @tf.function(jit_compile=True, autograph=False)
    def project(hidden):
        with loop_output_columns(model):
            bound.append(output_columns_of(embedding))
            return embedding(hidden, reverse=True)

    logits = ops.convert_to_numpy(project(hidden))
    assert bound[0] is not None and tuple(bound[0].shape) == (16, VOCABULARY)
    assert bound[0].op.type == "Transpose"
    weights = ops.convert_to_numpy(embedding.embeddings)
    expected = hidden @ weights.T + ops.convert_to_numpy(embedding.logits_bias)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    with loop_output_columns(model):
        assert output_columns_of(embedding) is None


def test_compiled_functions_read_the_weights_as_variable_value_gives_them():
    """`compiled._values`, which reads variables directly outside Keras'
    scopes, gives what `Variable.value` gives: the weights, the scope's
    values in a `StatelessScope`, cast values in an autocast scope."""
    from keras.src.backend import AutocastScope

    from keras_transformer.runtime.compiled import _values

    variables = tiny_model(seed=7).variables
    for value, variable in zip(_values(variables), variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(value), variable.numpy())
    zeros = [ops.zeros(variable.shape, variable.dtype) for variable in variables]
    with keras.StatelessScope(state_mapping=list(zip(variables, zeros))):
        assert all(not np.any(ops.convert_to_numpy(value)) for value in _values(variables))
    with AutocastScope("float16"):
        dtypes = [keras.backend.standardize_dtype(value.dtype) for value in _values(variables)]
        expected = [keras.backend.standardize_dtype(variable.value.dtype) for variable in variables]
    assert dtypes == expected and "float16" in dtypes

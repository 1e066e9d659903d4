"""The translation task: the paper's recipe in compile, fit on real text,
cached greedy decoding."""

import warnings

import keras
import keras_hub
import numpy as np
import pytest

from keras_transformer.data import token_budget_batches
from keras_transformer.datasets import multi30k
from keras_transformer.decoding import greedy_search
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.schedules import TransformerSchedule

from helpers import once
from helpers import to_numpy


def tiny_model(tokenizer, **overrides):
    config = dict(num_layers=2, d_model=64, d_ff=128, num_heads=4, dropout=0.0, max_sequence_length=64)
    backbone = TransformerBackbone(tokenizer.vocabulary_size(), **{**config, **overrides})
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, 32, 32)
    return TransformerSeq2SeqLM(backbone, preprocessor)


def test_compile_defaults_are_the_papers_recipe(small_tokenizer):
    model = tiny_model(small_tokenizer)
    optimizer = model.optimizer
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    schedule = optimizer._learning_rate
    assert isinstance(schedule, TransformerSchedule)
    assert (schedule.d_model, schedule.warmup_steps) == (64, 4000)
    assert isinstance(model.loss, LabelSmoothedCrossEntropy)
    assert model.loss.label_smoothing == 0.1 and model.loss.ignore_class == 0


def test_preprocessor_shifts_labels_and_keeps_its_lengths(small_tokenizer):
    preprocessor = TransformerSeq2SeqLMPreprocessor(small_tokenizer, encoder_sequence_length=12, decoder_sequence_length=10)
    x, y, weights = preprocessor({"encoder_text": ["Ein Hund läuft."], "decoder_text": ["A dog runs."]})
    x, y, weights = (keras.tree.map_structure(to_numpy, v) for v in (x, y, weights))
    assert x["encoder_token_ids"].shape == (1, 12) and x["decoder_token_ids"].shape == (1, 10)
    assert x["encoder_token_ids"][0, 0] == small_tokenizer.start_token_id
    assert x["decoder_token_ids"][0, 0] == small_tokenizer.start_token_id
    length = int(weights.sum())
    np.testing.assert_array_equal(y[0, : length - 1], x["decoder_token_ids"][0, 1:length])
    assert y[0, length - 1] == small_tokenizer.end_token_id
    config = preprocessor.get_config()
    assert (config["encoder_sequence_length"], config["decoder_sequence_length"]) == (12, 10)
    restored = TransformerSeq2SeqLMPreprocessor.from_config(config)
    assert (restored.encoder_sequence_length, restored.decoder_sequence_length) == (12, 10)


def test_preprocessor_errors(small_tokenizer):
    preprocessor = TransformerSeq2SeqLMPreprocessor(small_tokenizer)
    with pytest.raises(ValueError, match="'encoder_text'"):
        preprocessor(["just sources"])
    with pytest.raises(ValueError, match="not in y"):
        preprocessor({"encoder_text": ["a"], "decoder_text": ["b"]}, y=["b"])


def test_fit_takes_string_pairs_and_shuffles_them_each_epoch(small_tokenizer, multi30k_train, monkeypatch):
    sources, targets = multi30k_train
    model = tiny_model(small_tokenizer)
    pairs = {"encoder_text": sources[:64], "decoder_text": targets[:64]}
    # Multi30k has pairs longer than the tiny model's 32 tokens: cut, as keras-hub cuts them.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*shuffle.*ignored")
        # keras-hub alone refuses validation_split for text.
        history = model.fit(pairs, batch_size=32, epochs=1, validation_split=0.25, verbose=0, long_pairs="truncate")
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])

    # What keras-hub's fit receives: every pair once a pass, in a new order
    # each pass; in the given order with shuffle=False.
    given = []
    monkeypatch.setattr(keras_hub.models.Seq2SeqLM, "fit", lambda self, x, *args, **kwargs: given.append(x))

    def passes(data):
        return [[s.decode() for batch in data for s in batch["encoder_text"].numpy()] for _ in range(2)]

    model.fit(pairs, batch_size=32, epochs=2, long_pairs="truncate")
    first, second = passes(given[-1])
    assert sorted(first) == sorted(second) == sorted(pairs["encoder_text"])
    assert first != second and first != pairs["encoder_text"]
    model.fit(pairs, batch_size=32, epochs=2, shuffle=False, long_pairs="truncate")
    assert given[-1] is pairs


@pytest.mark.parametrize("how", ["fit", "train_on_batch"])
def test_training_traces_the_step_once(how):
    """TensorFlow traces a step that creates variables twice: the model
    creates the optimizer's before, so that its one step shape is traced
    once, as on JAX (PyTorch runs the step eagerly, once a batch)."""
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(50, num_layers=1, d_model=16, d_ff=32, num_heads=2, max_sequence_length=8)
    model = TransformerSeq2SeqLM(backbone)
    model.compile()
    traced, train_step = [], model.train_step
    model.train_step = lambda *args, **kwargs: traced.append(1) or train_step(*args, **kwargs)
    ids = np.random.default_rng(0).integers(4, 50, (12, 8)).astype("int32")
    ones = np.ones_like(ids)
    x = {"encoder_token_ids": ids, "encoder_padding_mask": ones, "decoder_token_ids": ids, "decoder_padding_mask": ones}
    if how == "fit":
        model.fit(x, ids, batch_size=4, epochs=1, shuffle=False, verbose=0)
    else:
        for rows in (slice(0, 4), slice(4, 8), slice(8, 12)):
            model.train_on_batch({name: value[rows] for name, value in x.items()}, ids[rows])
    assert len(traced) == (3 if keras.config.backend() == "torch" else 1)
    assert model.optimizer.built and int(to_numpy(model.optimizer.iterations)) == 3


def test_fit_splits_off_validation_pairs_as_keras_does(small_tokenizer, multi30k_train, monkeypatch):
    sources, targets = multi30k_train
    model = tiny_model(small_tokenizer)
    pairs = {"encoder_text": sources[:40], "decoder_text": targets[:40]}
    # The last quarter, in order, validates; the rest trains, shuffled.
    # (The test above fits with validation_split for real.)
    given = []
    monkeypatch.setattr(keras_hub.models.Seq2SeqLM, "fit",
                        lambda self, x, *args, **kwargs: given.append((x, kwargs["validation_data"])))
    model.fit(pairs, batch_size=16, epochs=2, validation_split=0.25, long_pairs="truncate")
    train, validation = given[-1]
    texts = [s.decode() for batch in train for s in batch["encoder_text"].numpy()]
    assert sorted(texts) == sorted(pairs["encoder_text"][:30]) and texts != pairs["encoder_text"][:30]
    assert [s.decode() for batch in validation for s in batch["encoder_text"].numpy()] == pairs["encoder_text"][30:]
    model.fit(pairs, batch_size=16, validation_split=0.25, shuffle=False, long_pairs="truncate")
    train, _ = given[-1]
    assert [s.decode() for batch in train for s in batch["encoder_text"].numpy()] == pairs["encoder_text"][:30]
    for split in (1.0, 0.99):  # out of range; no training pair left
        with pytest.raises(ValueError, match="validation_split"):
            model.fit(pairs, validation_split=split, long_pairs="truncate")


def _unigram_cross_entropy(train_batches, val_batches, vocabulary_size):
    """Cross-entropy of the best context-free model: target token
    frequencies of the training data (add-one smoothed)."""
    counts = np.ones(vocabulary_size)
    for _, labels, weights in train_batches:
        np.add.at(counts, labels[weights > 0], 1)
    log_probs = np.log(counts / counts.sum())
    total = tokens = 0
    for _, labels, weights in val_batches:
        total -= log_probs[labels[weights > 0]].sum()
        tokens += (weights > 0).sum()
    return total / tokens


# Learning from real pairs, through the data pipeline and the task's
# compile: once (30-55 s on JAX and TensorFlow). Each backend's training step
# learns a task that needs the source in tests/test_backbone.py
# (`test_fit_learns_to_reverse_sequences`) and resumes in
# tests/test_training.py.
@once
def test_validation_loss_falls_well_below_a_context_free_model(small_tokenizer, multi30k_dir, multi30k_train):
    sources, targets = multi30k_train
    val_sources, val_targets = multi30k.load("val", "en", "de", data_dir=multi30k_dir)
    # Pairs of at most 32 tokens padded to 32: every full batch has one shape
    # (32 x 32), so JAX compiles the steps once.
    fixed = dict(max_tokens=1024, max_length=32, pad_to_multiple_of=32)
    train = token_budget_batches(sources[:3000], targets[:3000], small_tokenizer, seed=0, **fixed)
    val = token_budget_batches(val_sources[:300], val_targets[:300], small_tokenizer, shuffle=False, **fixed)
    model = tiny_model(small_tokenizer, d_model=128, d_ff=256)
    model.compile(warmup_steps=100, label_smoothing=0.0)
    before = model.evaluate(val.dataset(), verbose=0, return_dict=True)["loss"]
    model.fit(train.dataset(), epochs=2, verbose=0)
    after = model.evaluate(val.dataset(), verbose=0, return_dict=True)["loss"]
    unigram = _unigram_cross_entropy(train, val, small_tokenizer.vocabulary_size())
    print(f"val loss {before:.2f} -> {after:.2f}; context-free model {unigram:.2f}")
    # A model that ignores the source and the target prefix cannot go below
    # the unigram cross-entropy; this one must beat it clearly.
    assert after < unigram - 1.0
    assert after < before - 2.5


def _uncached_greedy(model, source_ids, steps, start_id):
    """Greedy decoding by re-running the whole model on the growing prefix.

    The prefix is padded to `steps` tokens, so that every call has one shape
    (JAX compiles each eager op once); the causal mask keeps the padding
    after position i from reaching position i's logits."""
    ids = [start_id]
    all_logits = []
    for _ in range(steps):
        prefix = np.zeros((1, steps), "int32")
        prefix[0, : len(ids)] = ids
        inputs = {
            "encoder_token_ids": np.array([source_ids], "int32"),
            "encoder_padding_mask": np.ones((1, len(source_ids)), "int32"),
            "decoder_token_ids": prefix,
            "decoder_padding_mask": (prefix > 0).astype("int32"),
        }
        logits = to_numpy(model(inputs))[0, len(ids) - 1]
        all_logits.append(logits)
        allowed = logits.copy()
        allowed[[0, start_id]] = -np.inf  # padding and start are never outputs
        ids.append(int(np.argmax(allowed)))
    return ids[1:], np.array(all_logits)


@pytest.mark.parametrize("position_encoding", ["sinusoidal", "learned"])
def test_cached_decoding_equals_full_recompute(small_tokenizer, position_encoding):
    model = tiny_model(small_tokenizer, normalize_first=True, position_encoding=position_encoding)
    if position_encoding == "learned":
        # Random rows, so that a cached step reading the wrong position shows.
        table = model.backbone.decoder_position.position_embeddings
        table.assign(np.random.default_rng(0).normal(0, 1, tuple(table.shape)).astype("float32"))
    source = [2, 57, 301, 18, 99, 3]
    expected_ids, expected_logits = _uncached_greedy(model, source, 8, small_tokenizer.start_token_id)
    encoder_output = model.encode(np.array([source]), np.ones((1, len(source)), "int32"))
    cache = model.initial_cache(encoder_output, max_length=9)
    token = np.array([[small_tokenizer.start_token_id]], "int32")
    for index in range(8):
        logits, cache = model.call_decoder_with_cache(token, index, cache, np.ones((1, len(source)), "int32"))
        np.testing.assert_allclose(to_numpy(logits)[0], expected_logits[index], atol=1e-5, rtol=1e-5)
        token = np.array([[expected_ids[index]]], "int32")
    # greedy_search stops at the end token, so compare up to it.
    result = greedy_search(model, [source], max_length_offset=2)[0]
    end = small_tokenizer.end_token_id
    reference = expected_ids[: expected_ids.index(end)] if end in expected_ids else expected_ids
    assert result == reference[: len(result)] and len(result) == min(len(reference), len(source) + 2)


def test_compiled_decoding_follows_new_weights(small_tokenizer):
    # The compiled encode/step functions are built on the first call; after
    # the weights change (fit, load_weights, assign) they must use the new ones.
    model = tiny_model(small_tokenizer)
    source = [2, 57, 301, 18, 99, 3]
    inputs = {"encoder_token_ids": np.array([source]), "encoder_padding_mask": np.ones((1, len(source)))}
    end = small_tokenizer.end_token_id

    def reference():
        ids, _ = _uncached_greedy(model, source, len(source) + 4, small_tokenizer.start_token_id)
        return ids[: ids.index(end)] if end in ids else ids

    first = model.generate(inputs, sampler="greedy", max_length_offset=4)[0]
    assert first == reference()
    embeddings = model.backbone.token_embedding.embeddings
    embeddings.assign(np.random.default_rng(3).normal(0, 1, tuple(embeddings.shape)).astype("float32"))
    second = model.generate(inputs, sampler="greedy", max_length_offset=4)[0]
    assert second == reference() and second != first


def test_batched_greedy_equals_one_by_one(small_tokenizer):
    model = tiny_model(small_tokenizer)
    sources = [[2, 57, 301, 3], [2, 18, 99, 45, 12, 70, 3], [2, 5, 3]]
    batched = greedy_search(model, sources, max_length_offset=5)
    for source, output in zip(sources, batched):
        assert greedy_search(model, [source], max_length_offset=5)[0] == output
        assert len(output) <= len(source) + 5


def test_generate_text(small_tokenizer):
    model = tiny_model(small_tokenizer)
    outputs = model.generate(["Ein Hund läuft.", "", "   "])
    assert isinstance(outputs[0], str)
    assert outputs[1:] == ["", ""]
    assert model.generate("") == ""
    # Bytes, string arrays and string tensors are texts too.
    import tensorflow as tf

    assert model.generate("Ein Hund läuft.".encode()) == outputs[0]
    assert model.generate(np.array(["Ein Hund läuft.", ""])) == outputs[:2]
    assert model.generate(tf.constant(["Ein Hund läuft.", ""])) == outputs[:2]
    assert model.generate(tf.constant("Ein Hund läuft.")) == outputs[0]
    with pytest.raises(TypeError, match="item 1 is of type int"):
        model.generate(["Ein Hund.", 7])
    # The dict `fit` takes, without targets.
    assert model.generate({"encoder_text": ["Ein Hund läuft.", ""]}) == outputs[:2]
    for keys in ({"encoder_text": ["x"], "decoder_text": ["y"]}, {"encoder_token_ids": [[2, 5, 3]]}):
        with pytest.raises(ValueError, match="takes `encoder_text` .* or `encoder_token_ids` with `encoder_padding_mask`"):
            model.generate(keys)
    assert model.generate("Ein Hund.", sampler="greedy") == model.generate("Ein Hund.", beam_size=1)
    nbest = model.generate(["Ein Hund läuft.", ""], num_results=3)
    assert len(nbest[0]) == 3 and nbest[1] == [("", 0.0)]
    scores = [score for _, score in nbest[0]]
    assert scores == sorted(scores, reverse=True)
    assert nbest[0][0][0] == outputs[0]
    with pytest.raises(ValueError, match="max_sequence_length=64"):
        model.generate(["Wort " * 200])
    with pytest.raises(ValueError, match="Unknown sampler"):
        model.generate(["x"], sampler="nucleus")
    model.preprocessor = None
    with pytest.raises(ValueError, match="no preprocessor"):
        model.generate(["Ein Hund."])


@pytest.mark.skipif(
    keras.config.backend() != "torch",
    reason="the weight copies are PyTorch's (JAX and TensorFlow: test_compiled_decoding_follows_new_weights)",
)
def test_translations_after_training_read_the_trained_weights(multi30k_train):
    """Translate, train, translate again: the second translation is a fresh
    model's with the trained weights, scores included, and so is the
    validation loss. Decoding and evaluation keep copies of some weights
    between calls (PyTorch's joined projections, a transposed output
    projection), made again when a weight changes, which PyTorch's fused
    Adam update must count as a change. (JAX's and TensorFlow's compiled
    functions read the current weights at each call, which the test named
    above checks; compiling this preset-sized model's training and
    decoding took 76 s of JAX's run.)"""
    sources, targets = multi30k_train
    preset = "transformer_multi30k_en_de"
    model = TransformerSeq2SeqLM.from_preset(preset, load_ensemble=False)
    model.compile(warmup_steps=10)
    settings = dict(return_scores=True, max_length_offset=10)

    def translate(model, sampler):  # [(text, score)], one a source
        return [results[0] for results in model.generate(sources[:8], sampler=sampler, **settings)]

    before = translate(model, "greedy")  # (decoding's copies made)
    model.fit({"encoder_text": sources[:96], "decoder_text": targets[:96]}, batch_size=32, epochs=1, verbose=0, long_pairs="truncate")
    fresh = TransformerSeq2SeqLM.from_preset(preset, load_ensemble=False)
    fresh.compile(warmup_steps=10)
    fresh.backbone.set_weights(model.backbone.get_weights())
    expected = {sampler: translate(fresh, sampler) for sampler in ("greedy", "beam")}
    for sampler, wanted in expected.items():
        found = translate(model, sampler)
        assert [text for text, _ in found] == [text for text, _ in wanted]
        np.testing.assert_allclose([score for _, score in found], [score for _, score in wanted], rtol=1e-4)
    # (The weights did change.)
    assert not np.allclose([score for _, score in before], [score for _, score in expected["greedy"]])
    # The validation loss too (PyTorch's evaluation encodes as a translation does).
    validation = {"encoder_text": sources[96:160], "decoder_text": targets[96:160]}
    np.testing.assert_allclose(
        model.evaluate(validation, batch_size=32, verbose=0), fresh.evaluate(validation, batch_size=32, verbose=0),
        rtol=1e-5,
    )

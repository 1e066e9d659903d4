"""The shared subword vocabulary (section 5.1)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.models import TransformerTokenizer
from keras_transformer.models import TransformerWordPieceTokenizer
from keras_transformer.models import train_tokenizer
from keras_transformer.datasets import multi30k

from helpers import once


def _text(value):
    if hasattr(value, "numpy"):
        value = value.numpy()
    return value.decode("utf-8") if isinstance(value, bytes) else value


def test_round_trip_is_exact_on_german_test_sentences(small_tokenizer, multi30k_dir):
    _, german = multi30k.load("test_2016_flickr", "en", "de", data_dir=multi30k_dir)
    tricky = [s for s in german if any(c in s for c in "äöüÄÖÜß") and any(c in s for c in ",.!?\"'-")]
    assert len(tricky) > 50
    for sentence in tricky[:200] + ["Größe: 12½ cm — «Straße»!", "Emoji 🚲 und 漢字."]:
        ids = small_tokenizer.tokenize(sentence)
        assert _text(small_tokenizer.detokenize(ids)) == sentence
        assert 1 not in np.asarray(ids).tolist(), f"<unk> in {sentence!r}"


def test_whitespace_runs_are_collapsed(small_tokenizer):
    # The one documented normalization: runs of spaces become one space.
    assert _text(small_tokenizer.detokenize(small_tokenizer.tokenize("  two  spaces "))) == "two spaces"


def test_special_tokens(small_tokenizer):
    assert (small_tokenizer.pad_token_id, small_tokenizer.start_token_id, small_tokenizer.end_token_id) == (0, 2, 3)
    assert small_tokenizer.id_to_token(1) == "<unk>"
    assert small_tokenizer.vocabulary_size() == 1000


@pytest.mark.parametrize("option", [{"sequence_length": 8}, {"add_bos": True}, {"add_eos": True}])
def test_padding_or_special_tokens_in_the_tokenizer_are_refused(small_tokenizer, option):
    # The preprocessor adds <s> and </s> and pads; a tokenizer doing it too
    # would put </s> after the padding.
    with pytest.raises(ValueError, match="adds <s> and </s> and pads"):
        TransformerTokenizer(proto=small_tokenizer.proto, **option)
    with pytest.raises(ValueError, match="unpadded"):
        TransformerWordPieceTokenizer(vocabulary=["<pad>", "<unk>", "<s>", "</s>", "a"], **option)
    # The defaults, as a saved config holds them, are fine.
    defaults = {key: small_tokenizer.get_config()[key] for key in ("sequence_length", "add_bos", "add_eos")}
    same = TransformerTokenizer(proto=small_tokenizer.proto, **defaults)
    assert np.asarray(same.tokenize("Ein Hund.")).tolist() == np.asarray(small_tokenizer.tokenize("Ein Hund.")).tolist()


def test_runs_inside_tf_data(small_tokenizer):
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    dataset = tf.data.Dataset.from_tensor_slices(sentences).map(small_tokenizer)
    in_graph = [t.numpy().tolist() for t in dataset]
    eager = [np.asarray(small_tokenizer.tokenize(s)).tolist() for s in sentences]
    assert in_graph == eager
    detokenized = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(in_graph)).map(small_tokenizer.detokenize)
    assert [_text(t) for t in detokenized] == sentences


def test_assets_round_trip(small_tokenizer, tmp_path):
    small_tokenizer.save_assets(str(tmp_path))
    restored = TransformerTokenizer.from_config(small_tokenizer.get_config())
    restored.load_assets(str(tmp_path))
    sentence = "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."
    assert np.asarray(restored.tokenize(sentence)).tolist() == np.asarray(small_tokenizer.tokenize(sentence)).tolist()


@once  # keras-hub computes the vocabulary with tf.data on every backend
def test_wordpiece_alternative(multi30k_train):
    sources, targets = multi30k_train
    tokenizer = train_tokenizer(sources[:1000] + targets[:1000], 800, algorithm="wordpiece")
    assert isinstance(tokenizer, TransformerWordPieceTokenizer)
    assert (tokenizer.pad_token_id, tokenizer.start_token_id, tokenizer.end_token_id) == (0, 2, 3)
    # WordPiece splits punctuation off: not exact, as documented.
    assert _text(tokenizer.detokenize(tokenizer.tokenize("Ein Hund, der läuft."))) == "Ein Hund , der läuft ."


def test_bad_training_input():
    with pytest.raises(ValueError, match="no non-empty string"):
        TransformerTokenizer.from_texts(["", "  "], vocabulary_size=300)
    with pytest.raises(ValueError, match="too small"):
        TransformerTokenizer.from_texts(["Ein Mann fährt Fahrrad."] * 10, vocabulary_size=50)
    with pytest.raises(ValueError, match="Unknown algorithm"):
        train_tokenizer(["text"], 300, algorithm="char")


def test_generate_pre_and_postprocess_call_the_tokenizer_once_a_batch(small_tokenizer, multi30k_dir, monkeypatch):
    """`generate`'s text steps tokenize a batch of sources in one tokenizer
    call and detokenize a batch of outputs in one, with what each text
    alone gives, blank sources and empty outputs kept in their places."""
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor

    english, german = multi30k.load("test_2016_flickr", "en", "de", data_dir=multi30k_dir)
    preprocessor = TransformerSeq2SeqLMPreprocessor(small_tokenizer)
    special = preprocessor.special_token_ids
    texts = [english[0], "", english[1], "   ", english[2]]
    expected = [special.frame_source(np.asarray(small_tokenizer.tokenize(t)).tolist()) if t.strip() else [] for t in texts]
    outputs = [np.asarray(small_tokenizer.tokenize(g)).tolist() for g in german[:3]]
    outputs = [outputs[0], [], outputs[1], np.zeros(0, "int32"), np.asarray(outputs[2])]
    calls = []
    for name in ("tokenize", "detokenize"):
        def counted(inputs, original=getattr(small_tokenizer, name), name=name):
            calls.append(name)
            return original(inputs)

        monkeypatch.setattr(small_tokenizer, name, counted)
    assert preprocessor.generate_preprocess(texts) == expected
    assert preprocessor.generate_postprocess(outputs) == [german[0], "", german[1], "", german[2]]
    assert calls == ["tokenize", "detokenize"]
    assert preprocessor.generate_postprocess([[], []]) == ["", ""] and calls == ["tokenize", "detokenize"]


@pytest.mark.parametrize("count", [1, 10, 100])
def test_few_texts_one_call_each_give_keras_hubs_batch_results(small_tokenizer, multi30k_dir, count):
    """Fewer than `FEW_TEXTS` texts are encoded and decoded one
    SentencePiece call each (a batch call starts a thread pool), more in
    one batch call; the ids and texts are keras-hub's own, batched, single
    and as arrays."""
    import keras_hub

    from keras_transformer.models.transformer import tokenizer as module

    english, german = multi30k.load("test_2016_flickr", "en", "de", data_dir=multi30k_dir)
    keras_hubs = keras_hub.tokenizers.SentencePieceTokenizer
    texts = english[:count]
    targets = [np.asarray(row).tolist() for row in small_tokenizer.tokenize(german[:count])]
    few = count < module.FEW_TEXTS
    assert few == (count != 100)
    processor = small_tokenizer._sentence_piece_spm
    given = []  # each SentencePiece call: its name, and whether it had a batch

    def recording(name):
        original = getattr(processor, name)

        def call(inputs, *args, **kwargs):
            given.append((name, isinstance(inputs, list) and not isinstance(inputs[0], int)))
            return original(inputs, *args, **kwargs)

        return call

    for name in ("Encode", "Decode"):
        setattr(processor, name, recording(name))
    ids = small_tokenizer.tokenize(texts)
    assert given == ([("Encode", False)] * count if few else [("Encode", True)])
    given.clear()
    detokenized = small_tokenizer.detokenize(targets)
    assert given == ([("Decode", False)] * count if few else [("Decode", True)])

    assert [np.asarray(row).tolist() for row in ids] == [np.asarray(row).tolist() for row in keras_hubs.tokenize(small_tokenizer, texts)]
    single = small_tokenizer.tokenize(texts[0])
    np.testing.assert_array_equal(single, keras_hubs.tokenize(small_tokenizer, texts[0]))
    assert str(single.dtype) == "int32"
    assert [_text(t) for t in detokenized] == german[:count]
    assert detokenized == keras_hubs.detokenize(small_tokenizer, targets)
    assert _text(small_tokenizer.detokenize(np.asarray(targets[0]))) == german[0]

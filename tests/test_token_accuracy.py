"""The token accuracy that training reports, against Keras's own
SparseCategoricalAccuracy."""

import keras
import numpy as np

from keras_transformer.metrics import TokenAccuracy
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM


def test_token_accuracy_is_sparse_categorical_accuracy_over_real_tokens():
    """TokenAccuracy (no argmax) against Keras's SparseCategoricalAccuracy,
    weighted by a padding mask, on logits without ties; and on a tie the
    label counts as predicted."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 9, 50)).astype("float32")
    labels = rng.integers(0, 50, size=(4, 9))
    labels[:, ::3] = logits[:, ::3].argmax(-1)  # some right, most wrong
    weights = (rng.random((4, 9)) > 0.3).astype("float32")
    ours, keras_own = TokenAccuracy(), keras.metrics.SparseCategoricalAccuracy()
    ours.update_state(labels, logits, sample_weight=weights)
    keras_own.update_state(labels, logits, sample_weight=weights)
    expected = float(((logits.argmax(-1) == labels) * weights).sum() / weights.sum())
    assert 0.2 < expected < 0.8
    np.testing.assert_allclose(float(ours.result()), expected, rtol=1e-6)
    np.testing.assert_allclose(float(keras_own.result()), expected, rtol=1e-6)
    tie = np.array([[[1.0, 3.0, 3.0]]], "float32")
    ours.reset_state()
    ours.update_state(np.array([[2]]), tie)
    assert float(ours.result()) == 1.0
    assert ours.name == "accuracy"
    assert TokenAccuracy.from_config(ours.get_config()).name == "accuracy"


def test_compile_reports_token_accuracy_by_default():
    backbone = TransformerBackbone(vocabulary_size=20, num_layers=1, d_model=8, d_ff=16, num_heads=2)
    model = TransformerSeq2SeqLM(backbone)
    model.compile()
    assert [type(m) for m in model._compile_config.config["weighted_metrics"]] == [TokenAccuracy]

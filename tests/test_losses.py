"""Label-smoothed cross-entropy (section 5.4) against NumPy."""

import keras
import numpy as np
import pytest

from keras_transformer.losses import LabelSmoothedCrossEntropy

from helpers import assert_config_round_trip


def numpy_label_smoothed(labels, logits, eps, ignore_class=None):
    """The smoothed target distribution written out in full: 1 - eps on the
    label, eps / (V - 1) on every other token."""
    vocabulary = logits.shape[-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    target = np.full(logits.shape, eps / (vocabulary - 1))
    np.put_along_axis(target, labels[..., None], 1.0 - eps, axis=-1)
    per_token = -(target * log_probs).sum(-1)
    valid = np.ones(labels.shape, bool) if ignore_class is None else labels != ignore_class
    return per_token[valid].mean()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_equals_numpy_formula_ignoring_padding(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 17)).astype("float32") * 3
    labels = rng.integers(1, 17, size=(3, 5))
    labels[0, 3:] = 0
    labels[2, 1:] = 0
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps, ignore_class=0)
    expected = numpy_label_smoothed(labels, logits, eps, ignore_class=0)
    np.testing.assert_allclose(float(loss(labels, logits)), expected, rtol=1e-5)


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_equals_torch_cross_entropy_with_label_smoothing(eps):
    # PyTorch spreads its smoothing over all V classes (the label included):
    # eps' = eps * V / (V - 1) gives 1 - eps on the label and eps / (V - 1)
    # on every other token, this loss's distribution.
    import torch

    rng = np.random.default_rng(2)
    vocabulary = 23
    logits = rng.normal(size=(4, 6, vocabulary)).astype("float32") * 2
    labels = rng.integers(1, vocabulary, size=(4, 6))
    labels[1, 2:] = 0
    expected = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits).reshape(-1, vocabulary), torch.from_numpy(labels).reshape(-1),
        ignore_index=0, label_smoothing=eps * vocabulary / (vocabulary - 1),
    ).item()
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps, ignore_class=0)
    np.testing.assert_allclose(float(loss(labels, logits)), expected, rtol=1e-5)


def test_padding_logits_do_not_matter():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 9)).astype("float32")
    labels = np.array([[3, 4, 0, 0], [5, 6, 7, 8]])
    loss = LabelSmoothedCrossEntropy(ignore_class=0)
    changed = logits.copy()
    changed[0, 2:] += 100.0
    np.testing.assert_allclose(float(loss(labels, logits)), float(loss(labels, changed)), rtol=1e-6)


def test_no_smoothing_equals_keras_sparse_cross_entropy():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 6, 11)).astype("float32")
    labels = rng.integers(0, 11, size=(4, 6))
    ours = LabelSmoothedCrossEntropy(label_smoothing=0.0)(labels, logits)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    np.testing.assert_allclose(float(ours), float(keras_loss), rtol=1e-5)


def test_probabilities_input():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 7)).astype("float32")
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = rng.integers(0, 7, size=(2, 3))
    np.testing.assert_allclose(
        float(LabelSmoothedCrossEntropy(from_logits=False)(labels, probs)),
        numpy_label_smoothed(labels, logits, 0.1),
        rtol=1e-4,
    )


def test_serializable_and_validates():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2, ignore_class=0)
    assert_config_round_trip(loss)
    with pytest.raises(ValueError, match="label_smoothing"):
        LabelSmoothedCrossEntropy(label_smoothing=1.0)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradient_is_softmax_minus_smoothed_target_over_real_tokens(eps):
    """d loss / d logits = (softmax(logits) - target) / (real tokens), zero
    at padding: the gradient of every backend's form of the label's
    log-probability (a gather on PyTorch, a comparison elsewhere)."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 11)).astype("float32") * 2
    labels = rng.integers(1, 11, size=(2, 4))
    labels[1, 2:] = 0
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps, ignore_class=0)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    target = np.full(logits.shape, eps / 10)
    np.put_along_axis(target, labels[..., None], 1.0 - eps, axis=-1)
    expected = (probs - target) * (labels != 0)[..., None] / (labels != 0).sum()
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        gradient = np.asarray(jax.grad(lambda x: loss(labels, x))(logits))
    elif backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(logits)
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(labels, x)
        gradient = tape.gradient(value, x).numpy()
    else:
        import torch

        x = torch.tensor(logits, requires_grad=True)
        loss(torch.tensor(labels), x).backward()
        gradient = x.grad.numpy()
    np.testing.assert_allclose(gradient, expected, atol=1e-6)

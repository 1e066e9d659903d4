"""Label-smoothed cross-entropy (paper section 5.4, epsilon_ls = 0.1)."""

import keras
from keras import ops

from keras_transformer.runtime.backend_choices import gathers_label_log_probs
from keras_transformer.runtime.backend_choices import writes_loss_gradient
from keras_transformer.runtime.keras_internals import set_keras_mask


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against a smoothed target distribution, on integer labels.

    Convention (as tensor2tensor and fairseq): the true token gets
    probability 1 - eps and each of the V - 1 other tokens eps / (V - 1).
    (Keras' `CategoricalCrossentropy(label_smoothing=eps)` instead gives
    eps / V to every token, the true one included.) With log-probabilities
    `lp = log_softmax(logits)` the per-token loss is

        -(1 - eps) * lp[y] - eps / (V - 1) * (sum(lp) - lp[y])

    which needs only the label's log-probability and a sum over the
    vocabulary, never the smoothed distribution written out. Positions
    whose label is `ignore_class` (padding) contribute nothing, and the
    loss is averaged over the remaining tokens.

    Args:
        label_smoothing: eps_ls (the paper: 0.1). 0 gives plain
            cross-entropy.
        from_logits: whether `y_pred` holds logits (the default) or
            probabilities.
        ignore_class: label id to ignore (padding), or None.
        reduction: Keras loss reduction; the default averages over the
            tokens that are not ignored.
        name: loss name.
        dtype: dtype of the loss computation.

    Example:

    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1, ignore_class=0)
    >>> labels = np.array([[5, 2, 0]])  # the last position is padding
    >>> logits = np.random.randn(1, 3, 10).astype("float32")
    >>> float(loss(labels, logits)) > 0
    True
    """

    def __init__(
        self,
        label_smoothing=0.1,
        from_logits=True,
        ignore_class=None,
        reduction="sum_over_batch_size",
        name="label_smoothed_cross_entropy",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing = float(label_smoothing)
        self.from_logits = from_logits
        self.ignore_class = ignore_class

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")
        if len(labels.shape) == len(y_pred.shape):
            labels = ops.squeeze(labels, axis=-1)
        vocabulary_size = ops.shape(y_pred)[-1]
        valid = None
        if self.ignore_class is not None:
            valid = ops.not_equal(labels, self.ignore_class)
            labels = ops.where(valid, labels, 0)
        eps = self.label_smoothing
        if self.from_logits and writes_loss_gradient() and y_pred.shape[-1] is not None:
            loss = _smoothed_cross_entropy_from_logits(y_pred, labels, eps)
        else:
            if self.from_logits:
                log_probs = ops.log_softmax(y_pred, axis=-1)
            else:
                log_probs = ops.log(ops.clip(y_pred, keras.backend.epsilon(), 1.0))
            true_log_prob = _label_log_prob(log_probs, labels, vocabulary_size)
            loss = -(1.0 - eps) * true_log_prob
            if eps > 0:
                others = ops.sum(log_probs, axis=-1) - true_log_prob
                loss = loss - eps / ops.cast(vocabulary_size - 1, loss.dtype) * others
        if valid is not None:
            loss = ops.where(valid, loss, 0.0)
            set_keras_mask(loss, valid)
        return loss

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "label_smoothing": self.label_smoothing,
                "from_logits": self.from_logits,
                "ignore_class": self.ignore_class,
            }
        )
        return config


def _label_log_prob(log_probs, labels, vocabulary_size):
    """`log_probs[..., label]`, in the form whose gradient each backend
    computes fastest.

    PyTorch gathers it. Elsewhere (from probabilities: from logits JAX and
    TensorFlow write the gradient out, `_smoothed_cross_entropy_from_logits`)
    the label's entry is picked by comparing the vocabulary's ids with the
    label: the gradient is then a select over
    the `(tokens, vocabulary)` gradient, where a gather's is a scatter into
    zeros of that shape, which TensorFlow runs as one `UnsortedSegmentSum`.
    Value and gradient of the whole loss on (273, 15, 8,000) float32 logits,
    a 2-core Intel Xeon: TensorFlow 200 ms with the comparison against 255
    with the gather; JAX 87 against 90; PyTorch 97 against 65, so PyTorch
    keeps the gather.
    """
    if gathers_label_log_probs():
        return ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1), -1)
    is_label = ops.equal(ops.expand_dims(labels, -1), ops.arange(vocabulary_size, dtype=labels.dtype))
    return ops.sum(ops.where(is_label, log_probs, ops.zeros((), log_probs.dtype)), axis=-1)


def _smoothed_cross_entropy_from_logits(logits, labels, eps):
    """The per-token loss of `LabelSmoothedCrossEntropy` from `logits`
    (their vocabulary size known when traced), with its gradient written
    out (`keras.ops.custom_gradient`): softmax(logits) minus the smoothed
    target, in one pass over the logits. The forward pass keeps only each
    row's log-normalizer besides the logits.

    Used on JAX and TensorFlow, whose own gradient of the formula
    (log-softmax, the label's entry, the sum over the vocabulary) wrote
    several float32 arrays the size of the logits (4,095 x 8,000 of them
    in a training step of the small model): a mixed-precision training
    step took 0.89-0.90 of the time this way on JAX and 0.96 on
    TensorFlow (2-core AMD EPYC, alternating with the formula's). PyTorch
    keeps autograd's gradient of the formula: its fused log-softmax
    kernels took 43-55 ms for value and gradient of (4,095, 8,000)
    float32 logits, against 65 ms for this gradient written in PyTorch's
    own calls.
    """
    vocabulary_size = logits.shape[-1]
    other = eps / (vocabulary_size - 1)

    @ops.custom_gradient
    def smoothed_cross_entropy(logits):
        wide = ops.cast(logits, "float32")
        log_normalizer = ops.logsumexp(wide, axis=-1, keepdims=True)
        label_logit = ops.take_along_axis(wide, labels[..., None], axis=-1)[..., 0]
        true_log_prob = label_logit - log_normalizer[..., 0]
        others = ops.sum(wide, axis=-1) - vocabulary_size * log_normalizer[..., 0] - true_log_prob
        loss = -(1.0 - eps) * true_log_prob - other * others

        def gradient(upstream):
            is_label = ops.equal(ops.arange(vocabulary_size, dtype=labels.dtype), labels[..., None])
            target = ops.where(is_label, 1.0 - eps, other)
            probs = ops.exp(ops.cast(logits, "float32") - log_normalizer)
            return ops.cast(upstream[..., None] * (probs - target), logits.dtype)

        return loss, gradient

    return smoothed_cross_entropy(logits)

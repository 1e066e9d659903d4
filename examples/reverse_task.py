"""Train a small Transformer to reverse sequences with the paper's recipe.

    KERAS_BACKEND=jax python examples/reverse_task.py   # or tensorflow, torch

A backbone (section 3), its shared embedding as the pre-softmax projection
(section 3.4), Adam(0.9, 0.98, 1e-9) on the warm-up schedule (section 5.3)
and label-smoothed cross-entropy (section 5.4), trained with `model.fit`.
"""

import argparse

import keras
import numpy as np

from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.models import TransformerBackbone
from keras_transformer.schedules import paper_optimizer

PAD, BOS = 0, 1


def make_data(num_examples, length, vocabulary_size, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(2, vocabulary_size, (num_examples, length)).astype("int32")
    target = source[:, ::-1]
    decoder_input = np.concatenate([np.full((num_examples, 1), BOS, "int32"), target[:, :-1]], axis=1)
    ones = np.ones_like(source)
    inputs = {
        "encoder_token_ids": source,
        "encoder_padding_mask": ones,
        "decoder_token_ids": decoder_input,
        "decoder_padding_mask": ones,
    }
    return inputs, target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--length", type=int, default=8)
    args = parser.parse_args()

    vocabulary_size = 16
    backbone = TransformerBackbone(
        vocabulary_size=vocabulary_size, num_layers=2, d_model=64, d_ff=256, num_heads=4, dropout=0.1
    )
    logits = backbone.token_embedding(backbone.output["decoder_sequence_output"], reverse=True)
    model = keras.Model(backbone.input, logits)
    model.compile(
        optimizer=paper_optimizer(d_model=64, warmup_steps=200),
        loss=LabelSmoothedCrossEntropy(label_smoothing=0.1, ignore_class=PAD),
        metrics=["sparse_categorical_accuracy"],
    )
    inputs, target = make_data(4096, args.length, vocabulary_size)
    model.fit(inputs, target, batch_size=64, epochs=args.epochs, validation_split=0.1)

    test_inputs, test_target = make_data(256, args.length, vocabulary_size, seed=1)
    predictions = np.argmax(keras.ops.convert_to_numpy(model.predict(test_inputs, verbose=0)), -1)
    print(f"teacher-forced token accuracy on new sequences: {(predictions == test_target).mean():.3f}")


if __name__ == "__main__":
    main()

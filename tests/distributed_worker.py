"""A training process for tests/test_distribution.py.

    python tests/distributed_worker.py both OUT_DIR         (JAX, TensorFlow)
    python tests/distributed_worker.py single OUT_DIR
    torchrun --nproc_per_node 2 tests/distributed_worker.py parallel OUT_DIR

`single` builds a tiny model, saves its initial weights, takes one SGD step
on a fixed global batch of 8 pairs on one device and saves the weights.
`parallel` loads the same initial weights, takes the same step with
`keras_transformer.distribution.data_parallel()` (JAX: 4 simulated CPU
devices; TensorFlow: 2 logical CPUs; PyTorch: this process's half of the
batch, gloo), saves the weights, then runs `fit` on token-budget batches and
saves the losses it logged (a report for each process); on JAX it also
checks model parallelism. `both` runs `single`, then `parallel`, in one
process.
"""

import json
import os
import sys

MODE, OUT = sys.argv[1], sys.argv[2]
BACKEND = os.environ["KERAS_BACKEND"]
if BACKEND == "jax":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
if BACKEND == "tensorflow":
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer import distribution  # noqa: E402
from keras_transformer.data import TokenBudgetBatches  # noqa: E402
from keras_transformer.models import TransformerBackbone  # noqa: E402
from keras_transformer.models import TransformerSeq2SeqLM  # noqa: E402

VOCABULARY = 32


def global_batch():
    """8 pairs without padding, so every device's part has as many tokens."""
    rng = np.random.default_rng(0)
    encoder = rng.integers(4, VOCABULARY, (8, 6)).astype("int32")
    target = rng.integers(4, VOCABULARY, (8, 6)).astype("int32")
    target[:, 0] = 2
    inputs = {
        "encoder_token_ids": encoder,
        "encoder_padding_mask": np.ones_like(encoder),
        "decoder_token_ids": target[:, :-1],
        "decoder_padding_mask": np.ones_like(target[:, :-1]),
    }
    return inputs, target[:, 1:]


def build():
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(VOCABULARY, num_layers=1, d_model=16, d_ff=32, num_heads=4, dropout=0.0)
    model = TransformerSeq2SeqLM(backbone)
    model.compile(optimizer=keras.optimizers.SGD(0.5), weighted_metrics=[])
    return model


def save(model, name):
    np.savez(os.path.join(OUT, name), *[keras.ops.convert_to_numpy(w) for w in model.weights])


def load(model, name):
    stored = np.load(os.path.join(OUT, name))
    model.set_weights([stored[f"arr_{i}"] for i in range(len(stored.files))])


def copy_task_batches(strategy):
    """Token-budget batches of a copy task, this process's share. All are
    padded to length 16, so that the step compiles for one shape."""
    rng = np.random.default_rng(1)
    sources = [rng.integers(4, VOCABULARY, rng.integers(3, 9)).tolist() for _ in range(256)]
    encoder_ids = [[2, *s, 3] for s in sources]
    return TokenBudgetBatches(
        encoder_ids, encoder_ids, max_tokens=64, pad_to_multiple_of=16, seed=0, **strategy.batching()
    )


def main():
    inputs, labels = global_batch()
    if MODE in ("single", "both"):  # on one device (the first of several)
        model = build()  # a functional model: built without a call
        save(model, "initial.npz")
        loss = model.train_on_batch(inputs, labels, return_dict=True)["loss"]
        save(model, "single.npz")
        with open(os.path.join(OUT, "single.json"), "w") as f:
            json.dump({"loss": float(loss)}, f)
        if MODE == "single":
            return

    strategy = distribution.data_parallel()
    with strategy.scope():
        model = build()
    load(model, "initial.npz")
    if strategy.num_processes > 1:  # PyTorch: this process's part of the batch
        share = len(labels) // strategy.num_processes
        rows = slice(strategy.process_index * share, (strategy.process_index + 1) * share)
        inputs, labels = {k: v[rows] for k, v in inputs.items()}, labels[rows]
    step_loss = float(model.train_on_batch(inputs, labels, return_dict=True)["loss"])
    if strategy.process_index == 0:
        save(model, "parallel.npz")

    batches = copy_task_batches(strategy)
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(3e-3), weighted_metrics=[])
    history = model.fit(batches.dataset(repeat=True), steps_per_epoch=len(batches), epochs=4, verbose=0)
    report = {"strategy": repr(strategy), "replicas": strategy.num_replicas, "step_loss": step_loss,
              "loss": history.history["loss"]}

    if BACKEND == "jax":
        # Model parallelism: a (2, 2) mesh gives the unsharded model's outputs.
        keras.distribution.set_distribution(None)
        reference = build()
        # Compiled forward passes: JAX would compile each eager op apart.
        expected = keras.ops.convert_to_numpy(reference.predict_on_batch(inputs))
        save(reference, "reference.npz")
        distribution.model_parallel(2)
        sharded = build()
        load(sharded, "reference.npz")
        kernel = sharded.backbone.encoder_layers[0].feed_forward.inner_dense.kernel
        report["feed_forward_sharding"] = str(kernel.value.sharding.spec)
        report["model_parallel_max_difference"] = float(
            np.abs(keras.ops.convert_to_numpy(sharded.predict_on_batch(inputs)) - expected).max()
        )
    # Each process's own view, to compare what they logged.
    with open(os.path.join(OUT, f"report-{strategy.process_index}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()

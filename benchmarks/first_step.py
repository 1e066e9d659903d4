"""Time to the first training step: what `fit` costs before it trains.

    python benchmarks/first_step.py [--model tiny|small] [--steps 4]
        [--repeats 3] [--backends jax,tensorflow,torch]

Each row is a new process that builds a `TransformerSeq2SeqLM`, compiles it
with the paper's recipe and calls `fit` twice on the same `--steps` batches
of 64 x 32 random tokens: the first `fit` traces and compiles the training
step (JAX with XLA; TensorFlow as a graph, which Keras compiles with XLA
only where there is a GPU), the second is the same work once compiled.
`first fit - second fit` is the start-up cost a user pays at the first
`fit` of every model and every run start (the second fit is short and
noisy: compare the first fits). Each row is the median of `--repeats`
processes, the two orders alternating.

The peer is Keras' own order, run in the same way: `TransformerSeq2SeqLM`
creates the optimizer's variables before the step is traced (in its
`make_train_function`, for `fit` and `train_on_batch`), where Keras
on TensorFlow creates them inside the first trace, so that TensorFlow
traces the step twice (a `tf.function` that creates variables is traced
again without them). "Keras' order" skips that first build. On JAX and
PyTorch, where Keras builds the optimizer before compiling, both orders
are the same work.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import processor  # noqa: E402

MODELS = {
    "tiny": dict(num_layers=2, d_model=64, d_ff=128, num_heads=4, vocabulary_size=400),
    "small": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, vocabulary_size=8000),
}
BATCH, LENGTH = 64, 32


def worker(model_name, steps, keras_order):
    import keras

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    if keras_order:  # Keras' own order: the optimizer built in the first trace
        TransformerSeq2SeqLM._build_optimizer_before_tracing = lambda self: None
    config = dict(MODELS[model_name])
    vocabulary = config["vocabulary_size"]
    rng = np.random.default_rng(0)
    ids = rng.integers(4, vocabulary, (steps * BATCH, LENGTH + 1)).astype("int32")
    ones = np.ones((steps * BATCH, LENGTH), "int32")
    x = {"encoder_token_ids": ids[:, 1:], "encoder_padding_mask": ones,
         "decoder_token_ids": ids[:, :-1], "decoder_padding_mask": ones}
    y, weights = ids[:, 1:], ones.astype("float32")
    keras.utils.set_random_seed(0)
    model = TransformerSeq2SeqLM(TransformerBackbone(**config, dropout=0.1, max_sequence_length=LENGTH))
    model.compile(warmup_steps=4000)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        model.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        times.append(time.perf_counter() - start)
    print(json.dumps({"first": times[0], "second": times[1]}))


def run(backend, model_name, steps, keras_order):
    command = [sys.executable, __file__, "--worker", "--model", model_name, "--steps", str(steps)]
    if keras_order:
        command.append("--keras-order")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{backend} worker failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--steps", type=int, default=4, help="batches a fit (default: 4)")
    parser.add_argument("--repeats", type=int, default=3, help="processes a row, medians shown (default: 3)")
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keras-order", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.model, args.steps, args.keras_order)
    print(f"processor: {processor()}")
    print(f"model: {args.model} {MODELS[args.model]}; {args.steps} batches of {BATCH} x {LENGTH} tokens a fit; "
          f"medians of {args.repeats} processes")
    print()
    print("| backend | optimizer built | first fit (s) | second fit (s) | start-up (s) | first fit, x Keras' order |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for backend in args.backends.split(","):
        runs = {True: [], False: []}
        for _ in range(args.repeats):
            for order in (True, False):
                runs[order].append(run(backend, args.model, args.steps, order))
        rows = {order: {key: float(np.median([r[key] for r in found])) for key in ("first", "second")}
                for order, found in runs.items()}
        for order, label in ((True, "in the first trace (Keras' order)"), (False, "before tracing (this package)")):
            row = rows[order]
            print(f"| {backend} | {label} | {row['first']:.1f} | {row['second']:.2f} | {row['first'] - row['second']:.1f} | "
                  f"{row['first'] / rows[True]['first']:.2f}x |")


if __name__ == "__main__":
    main()

"""The host's share of a PyTorch training step: this package against
`torch.nn.Transformer`, with and without direct layer calls, in one run.

    python benchmarks/step_overhead.py [--layers 3,6] [--steps 50]

A model with almost no arithmetic (d_model 32, d_ff 64, 4 heads, a
200-token vocabulary, 8 sentences of 12 tokens a side) makes a training
step's time the time the host spends issuing it: Python, Keras's work on
each layer call and operation, and PyTorch's dispatch. That is what bounds
training on a GPU with batches of a few thousand tokens (docs/benchmarks.md,
"On a GPU"), measured here on any machine.

Rows, each `fit` on the same batch (the same batches every step: no data
loading), float32 and `mixed_bfloat16`:

- `keras_transformer`: this package's `TransformerSeq2SeqLM`, whose steps
  call their layers directly on PyTorch (`keras_transformer.runtime.direct_calls`);
- `keras_transformer, Keras calls`: the same with every layer called through
  `keras.layers.Layer.__call__`, as before direct calls;
- `torch.nn.Transformer`: PyTorch's model of the same size, Adam and
  label-smoothed cross-entropy, in float32 and under `torch.autocast`.

Milliseconds a step are the median of three timed runs of `--steps` steps
each, after a warm-up run; one PyTorch thread.
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
# The peer model and the processor line are train.py's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from train import processor  # noqa: E402
from train import torch_transformer  # noqa: E402

VOCABULARY, D_MODEL, D_FF, HEADS, BATCH, LENGTH = 200, 32, 64, 4, 8, 12


def batch():
    rng = np.random.default_rng(0)
    x = {
        "encoder_token_ids": rng.integers(4, VOCABULARY, (BATCH, LENGTH)).astype("int32"),
        "encoder_padding_mask": np.ones((BATCH, LENGTH), "int32"),
        "decoder_token_ids": rng.integers(4, VOCABULARY, (BATCH, LENGTH)).astype("int32"),
        "decoder_padding_mask": np.ones((BATCH, LENGTH), "int32"),
    }
    return x, rng.integers(4, VOCABULARY, (BATCH, LENGTH)).astype("int32"), np.ones((BATCH, LENGTH), "float32")


def median_ms(run, steps):
    run(steps)  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run(steps)
        times.append((time.perf_counter() - start) / steps * 1000)
    return statistics.median(times)


def keras_transformer_ms(layers, dtype, steps, keras_calls):
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.models.transformer import seq2seq_lm

    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        VOCABULARY, num_layers=layers, d_model=D_MODEL, d_ff=D_FF, num_heads=HEADS, dropout=0.1,
        max_sequence_length=64, dtype=dtype,
    )
    model = TransformerSeq2SeqLM(backbone)
    model.compile()
    data = batch()

    def forever():
        while True:
            yield data

    def run(n):
        # keras.Model.fit: the task's own `fit` batches in-memory data with
        # tf.data first, which is not what is measured here.
        keras.Model.fit(model, forever(), steps_per_epoch=n, epochs=1, verbose=0)

    direct_calls = seq2seq_lm.direct_calls
    if keras_calls:  # the steps as they ran before direct calls
        seq2seq_lm.direct_calls = contextlib.nullcontext
    try:
        return median_ms(run, steps)
    finally:
        seq2seq_lm.direct_calls = direct_calls


def torch_ms(layers, dtype, steps):
    torch.manual_seed(0)
    model = torch_transformer(
        dict(d_model=D_MODEL, d_ff=D_FF, num_heads=HEADS, num_layers=layers, vocabulary_size=VOCABULARY)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    x, y, _ = batch()
    enc = torch.from_numpy(x["encoder_token_ids"]).long()
    dec = torch.from_numpy(x["decoder_token_ids"]).long()
    labels = torch.from_numpy(y).long()

    def run(n):
        for _ in range(n):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "mixed_bfloat16"):
                logits = model(enc, dec)
            loss = loss_fn(logits.float().reshape(-1, VOCABULARY), labels.reshape(-1))
            loss.backward()
            optimizer.step()
            loss.item()

    return median_ms(run, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="3,6", help="comma-separated encoder (= decoder) depths")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import warnings

    # torch.nn.Transformer warns about its masks' types on every call.
    warnings.filterwarnings("ignore", category=UserWarning)
    print(f"Processor: {processor()}; PyTorch {torch.__version__}, Keras {keras.__version__}, one thread")
    print(f"Model: d_model {D_MODEL}, d_ff {D_FF}, {HEADS} heads, vocabulary {VOCABULARY}; "
          f"{BATCH} sentences of {LENGTH} tokens a side\n")
    print("| layers | dtype | model | ms a step | vs torch.nn.Transformer |")
    print("| ---: | --- | --- | ---: | ---: |")
    for layers in (int(n) for n in args.layers.split(",")):
        for dtype in ("float32", "mixed_bfloat16"):
            peer = torch_ms(layers, dtype, args.steps)
            rows = [
                ("keras_transformer, Keras calls", keras_transformer_ms(layers, dtype, args.steps, keras_calls=True)),
                ("keras_transformer", keras_transformer_ms(layers, dtype, args.steps, keras_calls=False)),
                ("torch.nn.Transformer", peer),
            ]
            for name, ms in rows:
                print(f"| {layers}+{layers} | {dtype} | {name} | {ms:.1f} | {ms / peer:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

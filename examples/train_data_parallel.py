"""Train on several devices with `keras_transformer.distribution` and `model.fit`.

    # JAX or TensorFlow: every device of this machine, one process
    KERAS_BACKEND=jax python examples/train_data_parallel.py --data-dir PATH/TO/multi30k
    # PyTorch: one process a device, launched by torchrun
    KERAS_BACKEND=torch torchrun --nproc_per_node 2 examples/train_data_parallel.py --data-dir PATH/TO/multi30k

On a CPU-only machine, JAX can pretend to have several devices:
`XLA_FLAGS=--xla_force_host_platform_device_count=4`.

The token budget is per device (see docs/distribution.md): each step reads
`devices x --max-tokens` tokens in all.
"""

import argparse
import os

import keras

from keras_transformer import distribution
from keras_transformer.data import token_budget_batches
from keras_transformer.datasets import multi30k
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models import TransformerTokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--devices", type=int, help="devices of this process (default: all)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="token budget per device")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--limit", type=int, help="train on the first N pairs only (a quick look)")
    args = parser.parse_args()

    # 1. Pick the backend's engine before building anything.
    strategy = distribution.data_parallel(args.devices)
    print(strategy)
    keras.utils.set_random_seed(0)  # the same tokenizer and weights in every process

    sources, targets = multi30k.load("train", "en", "de", data_dir=args.data_dir)
    if args.limit:
        sources, targets = sources[: args.limit], targets[: args.limit]
    tokenizer = TransformerTokenizer.from_texts(sources + targets, vocabulary_size=8000)

    # 2. Build and compile the model inside the strategy's scope.
    with strategy.scope():
        backbone = TransformerBackbone(
            vocabulary_size=tokenizer.vocabulary_size(),
            num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout=0.3, max_sequence_length=256,
        )
        model = TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer))
        model.compile(warmup_steps=800)

    # 3. Batches split evenly across this process's devices, and this
    #    process's share of them when several processes train together.
    batches = token_budget_batches(
        sources, targets, tokenizer, max_tokens=args.max_tokens, max_length=256, seed=0, **strategy.batching()
    )
    print(f"{len(batches)} steps an epoch on {strategy.num_replicas} devices")
    model.fit(batches.dataset(repeat=True), steps_per_epoch=len(batches), epochs=args.epochs)

    if strategy.process_index == 0:
        print(model.generate(["A man is riding a bicycle."], sampler="greedy"))


if __name__ == "__main__":
    main()

"""The exported SavedModel: its size, and its latency beside the package's
own `generate` on the same machine in the same run.

    KERAS_BACKEND=tensorflow python benchmarks/export.py --data-dir PATH/TO/multi30k

Exports a preset (beam 4, alpha 0.6 unless told otherwise), loads it with
`tf.saved_model.load`, and translates test_2016_flickr sentences one at a
time (latency per sentence: median and 90th percentile) and in batches of
64 (sentences per second), then does the same with `model.generate` of the
backend in use. Prints a markdown table; ratios are SavedModel over
`generate` (above 1: the SavedModel is faster).
"""

import argparse
import os
import statistics
import tempfile
import time

import tensorflow as tf

from keras_transformer.datasets import multi30k
from keras_transformer.export import export_saved_model
from keras_transformer.models import TransformerSeq2SeqLM


def directory_size(path):
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def timed(function, batches):
    function(batches[0])  # warm-up: tracing and compilation
    times = []
    for batch in batches:
        start = time.perf_counter()
        function(batch)
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--source", default="en")
    parser.add_argument("--target", default="de")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--single", type=int, default=50, help="sentences translated one at a time")
    parser.add_argument("--batched", type=int, default=256, help="sentences translated in batches of 64")
    args = parser.parse_args()

    sources, _ = multi30k.load("test_2016_flickr", args.source, args.target, args.data_dir)
    single = [[s] for s in sources[: args.single]]
    batched = [sources[i : i + 64] for i in range(0, args.batched, 64)]
    export_dir = os.path.join(tempfile.mkdtemp(), "saved_model")
    start = time.perf_counter()
    export_saved_model(args.preset, export_dir, beam_size=args.beam_size, alpha=args.alpha)
    export_seconds = time.perf_counter() - start
    translate = tf.saved_model.load(export_dir).signatures["serving_default"]
    model = TransformerSeq2SeqLM.from_preset(args.preset)
    decoding = dict(sampler="greedy") if args.beam_size == 1 else dict(beam_size=args.beam_size, alpha=args.alpha)

    runs = {
        "SavedModel": lambda texts: translate(text=tf.constant(texts))["translations"].numpy(),
        "generate": lambda texts: model.generate(texts, batch_size=64, **decoding),
    }
    results = {}
    for name, function in runs.items():
        one = timed(function, single)
        many = timed(function, batched)
        results[name] = (
            statistics.median(one) * 1000,
            sorted(one)[int(0.9 * (len(one) - 1))] * 1000,
            sum(len(b) for b in batched) / sum(many),
        )
    import keras

    print(f"preset {args.preset}, beam {args.beam_size}, alpha {args.alpha}; generate on {keras.config.backend()}")
    print(f"SavedModel size: {directory_size(export_dir) / 2**20:.1f} MiB; export took {export_seconds:.0f} s\n")
    print("| | batch 1: median ms/sentence | batch 1: p90 ms | batch 64: sentences/s |")
    print("| --- | ---: | ---: | ---: |")
    for name, (median, p90, rate) in results.items():
        print(f"| {name} | {median:.0f} | {p90:.0f} | {rate:.1f} |")
    saved, own = results["SavedModel"], results["generate"]
    print(f"| SavedModel / generate (speed) | {own[0] / saved[0]:.2f}x | {own[1] / saved[1]:.2f}x | "
          f"{saved[2] / own[2]:.2f}x |")


if __name__ == "__main__":
    main()

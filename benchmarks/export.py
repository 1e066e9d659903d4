"""The exported SavedModel in float32, with int8 weights and in bfloat16:
its size, speed and BLEU, beside the package's own `generate`, on the same
machine in the same run.

    KERAS_BACKEND=tensorflow python benchmarks/export.py --data-dir PATH/TO/multi30k

Exports a preset (beam 4, alpha 0.6 unless told otherwise) in each
precision, loads it with `tf.saved_model.load`, and translates
test_2016_flickr sentences one at a time (latency per sentence: median and
90th percentile) and in batches of 64 (sentences per second; sacreBLEU of
these translations), then does the same with `model.generate` (float32) of
the backend in use. Prints a markdown table; the speed ratio is against the
float32 SavedModel (above 1: faster).

`--jit-compile` adds a SavedModel compiled by XLA (`export_saved_model(...,
jit_compile=True)`) for each precision. XLA compiles once an input shape,
so every engine first translates the timed sentences once untimed (each
shape compiled: a TF Serving warm-up), and that pass's time is printed
too; `generate` compiles so as well. `--ensemble` exports an ensemble
preset's models all together (`ensemble=True`) and lets `generate` decode
them all; without it both hold its first model alone.
"""

import argparse
import os
import statistics
import tempfile
import time

import sacrebleu
import tensorflow as tf

from anchor_ctranslate2 import processor  # noqa: E402 (beside this script)
from keras_transformer.datasets import multi30k
from keras_transformer.export import export_saved_model
from keras_transformer.models import TransformerSeq2SeqLM


def directory_size(path):
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def timed(function, batches):
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
    parser.add_argument("--precisions", default="float32,int8,bfloat16",
                        help="the SavedModels to export: float32, int8 (weights), bfloat16, comma-separated")
    parser.add_argument("--jit-compile", action="store_true",
                        help="also export each precision compiled by XLA (jit_compile=True)")
    parser.add_argument("--ensemble", action="store_true",
                        help="an ensemble preset's models all together (ensemble=True), in the exports and "
                        "in generate; without it, its first model alone")
    args = parser.parse_args()

    sources, references = multi30k.load("test_2016_flickr", args.source, args.target, args.data_dir)
    single = [[s] for s in sources[: args.single]]
    batched = [sources[i : i + 64] for i in range(0, args.batched, 64)]
    decoding = dict(sampler="greedy") if args.beam_size == 1 else dict(beam_size=args.beam_size, alpha=args.alpha)
    runs, sizes = {}, {}
    exports = [(p, False) for p in args.precisions.split(",")]
    exports += [(p, True) for p in args.precisions.split(",")] if args.jit_compile else []
    for precision, jit_compile in exports:
        export_dir = os.path.join(tempfile.mkdtemp(), "saved_model")
        options = {"quantize": "int8"} if precision == "int8" else {"dtype": precision}
        start = time.perf_counter()
        export_saved_model(
            args.preset, export_dir, beam_size=args.beam_size, alpha=args.alpha, jit_compile=jit_compile,
            ensemble=args.ensemble, **options
        )
        name = f"SavedModel {precision}" + (" (XLA)" if jit_compile else "")
        sizes[name] = f"{directory_size(export_dir) / 2**20:.1f} MiB, exported in {time.perf_counter() - start:.0f} s"
        signature = tf.saved_model.load(export_dir).signatures["serving_default"]
        runs[name] = lambda texts, signature=signature: [
            text.decode("utf-8") for text in signature(text=tf.constant(texts))["translations"].numpy()
        ]
    model = TransformerSeq2SeqLM.from_preset(args.preset)
    if not args.ensemble:  # an ensemble preset's first model alone, as the exports hold it
        model.set_ensemble_members([])
    runs["generate float32"] = lambda texts: model.generate(texts, batch_size=64, **decoding)

    results = {}
    for name, function in runs.items():
        start = time.perf_counter()
        for batch in single + batched:  # warm-up: tracing, and compiling each shape
            function(batch)
        warm_up = time.perf_counter() - start
        one = timed(function, single)
        many = timed(function, batched)
        outputs = [output for batch in batched for output in function(batch)]
        bleu = sacrebleu.corpus_bleu(outputs, [references[: len(outputs)]]).score
        results[name] = (
            statistics.median(one) * 1000,
            sorted(one)[int(0.9 * (len(one) - 1))] * 1000,
            sum(len(b) for b in batched) / sum(many),
            bleu,
            warm_up,
        )
    import keras

    print(f"processor: {processor()}; preset {args.preset}, "
          f"beam {args.beam_size}, alpha {args.alpha}; {1 + len(model.ensemble_members)} model(s); "
          f"generate on {keras.config.backend()}; "
          f"{args.single} sentences one at a time, {args.batched} in batches of 64")
    for name, size in sizes.items():
        print(f"{name}: {size}")
    anchor = results[next(iter(results))]
    print(f"\n| | batch 1: median ms/sentence | batch 1: p90 ms | batch 64: sentences/s | batch 1 speed / {next(iter(results))} "
          "| batch 64 speed / the same | BLEU | first pass (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (median, p90, rate, bleu, warm_up) in results.items():
        print(f"| {name} | {median:.0f} | {p90:.0f} | {rate:.1f} | {anchor[0] / median:.2f}x | {rate / anchor[2]:.2f}x "
              f"| {bleu:.1f} | {warm_up:.1f} |")


if __name__ == "__main__":
    main()

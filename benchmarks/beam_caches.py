"""The host search's segments with and without self-attention caches that no step reorders.

    python benchmarks/beam_caches.py --preset transformer_multi30k_en_de --data-dir PATH/TO/multi30k

On JAX and TensorFlow the host search runs segments of compiled steps
(`keras_transformer.decoding.loop.search_segment`). Their self-attention
caches hold either a row a beam, reordered to the beams' parents at every
step, or the caches of `keras_transformer.layers.beam_cache`, whose keys
and values stay where they were written
(`loop.SEGMENT_BEAM_CACHES` says which, by backend). For each backend (in
a process of its own) and dtype, two copies of the model translate the
same test_2016_flickr sources with beam 4 and alpha 0.6 in alternating
passes, the order reversed every other round, so that a slow spell of the
host falls on both; each after a first pass that compiles. The table
gives each copy's median sentences/s, the ratio of their times in each
round (plain cache / beam cache), how many best translations are the
same, and the BLEU of each.
"""

import argparse
import json
import os
import time

from anchor_ctranslate2 import backend_worker
from anchor_ctranslate2 import processor


def worker(preset, data_dir, dtypes, sentences, batch_size, passes):
    import keras
    import numpy as np
    import sacrebleu

    from keras_transformer.datasets import multi30k
    from keras_transformer.decoding import loop
    from keras_transformer.models import TransformerSeq2SeqLM

    backend = keras.config.backend()
    sources, references = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)
    sources, references = sources[:sentences], references[:sentences]
    rows = []
    for dtype in dtypes:
        models = {}
        for held in (False, True):
            models[held] = TransformerSeq2SeqLM.from_preset(preset, dtype=dtype)
            # An ensemble preset's first model alone.
            models[held].set_ensemble_members([])

        def translate(held):
            # (Read where a search's functions are traced: in this copy's passes only.)
            loop.SEGMENT_BEAM_CACHES = {backend: held}
            return models[held].generate(sources, beam_size=4, alpha=0.6, batch_size=batch_size)

        outputs = {held: translate(held) for held in (False, True)}  # compiles
        times = {False: [], True: []}
        for round_ in range(passes):
            for held in (False, True) if round_ % 2 == 0 else (True, False):
                start = time.perf_counter()
                translate(held)
                times[held].append(time.perf_counter() - start)
        rows.append({
            "backend": backend, "dtype": dtype,
            "plain": sentences / float(np.median(times[False])), "held": sentences / float(np.median(times[True])),
            "ratios": [plain / held for plain, held in zip(times[False], times[True])],
            "same": sum(a == b for a, b in zip(outputs[False], outputs[True])),
            "bleu": [sacrebleu.corpus_bleu(outputs[held], [references]).score for held in (False, True)],
        })
    print(json.dumps(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--backends", default="jax,tensorflow")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=4, help="timed passes of each copy")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.data_dir is None:
        parser.error("--data-dir (or $KERAS_TRANSFORMER_MULTI30K): the local Multi30k copy")
    if args.worker:
        return worker(args.preset, args.data_dir, args.dtypes.split(","), args.sentences, args.batch_size,
                      args.passes)
    print(f"processor: {processor()}; preset {args.preset}; {args.sentences} sentences {args.batch_size} at a "
          f"time, beam 4, alpha 0.6; {args.passes} alternating passes")
    print("| backend | weights | plain cache (sent/s) | beam cache (sent/s) | plain time / beam time, each round "
          "| median | same translations | BLEU plain / beam |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    arguments = ["--preset", args.preset, "--data-dir", args.data_dir, "--dtypes", args.dtypes,
                 "--sentences", str(args.sentences), "--batch-size", str(args.batch_size), "--passes", str(args.passes)]
    for backend in args.backends.split(","):
        for row in backend_worker(os.path.abspath(__file__), backend, arguments):
            ratios = sorted(row["ratios"])
            median = (ratios[(len(ratios) - 1) // 2] + ratios[len(ratios) // 2]) / 2
            print(f"| {row['backend']} | {row['dtype']} | {row['plain']:.1f} | {row['held']:.1f} "
                  f"| {', '.join(f'{r:.2f}' for r in row['ratios'])} | {median:.2f}x "
                  f"| {row['same']}/{args.sentences} | {row['bleu'][0]:.2f} / {row['bleu'][1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()

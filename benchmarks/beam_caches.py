"""The host search's self-attention caches, two kinds side by side.

    python benchmarks/beam_caches.py --preset transformer_multi30k_en_de --data-dir PATH/TO/multi30k
    python benchmarks/beam_caches.py --compare cache-bits --batch-size 1 --sentences 48 --passes 6 \
        --data-dir PATH/TO/multi30k

`--compare beam-caches` (the default): on JAX and TensorFlow the host
search runs segments of compiled steps
(`keras_transformer.decoding.loop.search_segment`). Their self-attention
caches hold either a row a beam, reordered to the beams' parents at every
step, or the caches of `keras_transformer.runtime.beam_cache`, whose keys
and values stay where they were written (`runtime.backend_choices.SEGMENT_BEAM_CACHES` says
which, by backend).

`--compare cache-bits`: bfloat16 caches holding bfloat16, or their bits
(`keras_transformer.runtime.cache_bits`, `HELD_AS_BITS`; TensorFlow's
segments then hold plain caches, not beam caches), one sentence at a time
(the search in one compiled loop) or 64 at a time (segments).

`--compare cache-chunk`: segments that hold a row a beam growing their
caches by 16 positions at a time or by 8 (`decoding.beam.SEGMENT_CACHE_CHUNK`).

`--compare eager-chunk`: the same for PyTorch's eager host search
(`decoding.beam.EAGER_CACHE_CHUNK`; `--backends torch`).

For each backend (in a process of its own) and dtype, two copies of the
model translate the same test_2016_flickr sources with beam 4 and alpha
0.6 in alternating passes, the order reversed every other round, so that
a slow spell of the host falls on both; each after a first pass that
compiles. The table gives each copy's median sentences/s, the ratio of
their times in each round (first kind / second kind), how many best
translations are the same, and the BLEU of each.
"""

import argparse
import json
import os
import time

from anchor_ctranslate2 import backend_worker
from anchor_ctranslate2 import processor


def _beam_caches(backend, second):
    from keras_transformer.runtime import backend_choices

    backend_choices.SEGMENT_BEAM_CACHES = {backend: second}


def _cache_bits(backend, second):
    from keras_transformer.runtime import cache_bits

    cache_bits.HELD_AS_BITS = {backend: second}


def _cache_chunk(backend, second):
    from keras_transformer.decoding import beam

    beam.SEGMENT_CACHE_CHUNK = 8 if second else 16


def _eager_chunk(backend, second):
    from keras_transformer.decoding import beam

    beam.EAGER_CACHE_CHUNK = 8 if second else 16


# Each comparison: its two kinds' names, and how a copy of the model
# selects its kind (`second`: False for the first, True for the second).
COMPARISONS = {
    "beam-caches": (("plain cache", "beam cache"), _beam_caches),
    "cache-bits": (("bfloat16 cache", "bits cache"), _cache_bits),
    "cache-chunk": (("chunk 16", "chunk 8"), _cache_chunk),
    "eager-chunk": (("chunk 16", "chunk 8"), _eager_chunk),
}


def worker(preset, data_dir, dtypes, sentences, batch_size, passes, compare):
    import keras
    import numpy as np
    import sacrebleu

    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerSeq2SeqLM

    select = COMPARISONS[compare][1]

    backend = keras.config.backend()
    sources, references = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)
    sources, references = sources[:sentences], references[:sentences]
    rows = []
    for dtype in dtypes:
        models = {}
        for second in (False, True):
            models[second] = TransformerSeq2SeqLM.from_preset(preset, dtype=dtype)
            # An ensemble preset's first model alone.
            models[second].set_ensemble_members([])

        def translate(second):
            # (Read where a search's functions are traced: in this copy's passes only.)
            select(backend, second)
            return models[second].generate(sources, beam_size=4, alpha=0.6, batch_size=batch_size)

        outputs = {second: translate(second) for second in (False, True)}  # compiles
        times = {False: [], True: []}
        for round_ in range(passes):
            for second in (False, True) if round_ % 2 == 0 else (True, False):
                start = time.perf_counter()
                translate(second)
                times[second].append(time.perf_counter() - start)
        rows.append({
            "backend": backend, "dtype": dtype,
            "first": sentences / float(np.median(times[False])), "second": sentences / float(np.median(times[True])),
            "ratios": [a / b for a, b in zip(times[False], times[True])],
            "same": sum(a == b for a, b in zip(outputs[False], outputs[True])),
            "bleu": [sacrebleu.corpus_bleu(outputs[second], [references]).score for second in (False, True)],
        })
    print(json.dumps(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--backends", default="jax,tensorflow")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="beam-caches")
    parser.add_argument("--dtypes", help="default: float32,bfloat16 (beam-caches), bfloat16 (cache-bits)")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=4, help="timed passes of each copy")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.data_dir is None:
        parser.error("--data-dir (or $KERAS_TRANSFORMER_MULTI30K): the local Multi30k copy")
    args.dtypes = args.dtypes or ("bfloat16" if args.compare == "cache-bits" else "float32,bfloat16")
    if args.worker:
        return worker(args.preset, args.data_dir, args.dtypes.split(","), args.sentences, args.batch_size,
                      args.passes, args.compare)
    first, second = COMPARISONS[args.compare][0]
    print(f"processor: {processor()}; preset {args.preset}; {args.sentences} sentences {args.batch_size} at a "
          f"time, beam 4, alpha 0.6; {args.passes} alternating passes")
    print(f"| backend | weights | {first} (sent/s) | {second} (sent/s) | {first} time / {second} time, each round "
          f"| median | same translations | BLEU {first} / {second} |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    arguments = ["--preset", args.preset, "--data-dir", args.data_dir, "--dtypes", args.dtypes, "--compare", args.compare,
                 "--sentences", str(args.sentences), "--batch-size", str(args.batch_size), "--passes", str(args.passes)]
    for backend in args.backends.split(","):
        for row in backend_worker(os.path.abspath(__file__), backend, arguments):
            ratios = sorted(row["ratios"])
            median = (ratios[(len(ratios) - 1) // 2] + ratios[len(ratios) // 2]) / 2
            print(f"| {row['backend']} | {row['dtype']} | {row['first']:.1f} | {row['second']:.1f} "
                  f"| {', '.join(f'{r:.2f}' for r in row['ratios'])} | {median:.2f}x "
                  f"| {row['same']}/{args.sentences} | {row['bleu'][0]:.2f} / {row['bleu'][1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()

"""Beam search in one compiled loop against the host loop, by batch size.

    python benchmarks/loop_vs_host.py --preset transformer_multi30k_en_de --data-dir PATH/TO/multi30k

`keras_transformer.decoding.beam_search` runs either on the host between
compiled steps (`in_loop=False`: finished sources leave the batch, the
cache grows as outputs grow) or as one `keras.ops.while_loop` compiled
whole (`in_loop=True`, JAX and TensorFlow). For each backend (each in its
own process) and batch size, both translate the same test_2016_flickr
sources with beam 4 and alpha 0.6, back to back; each timing is a second
pass, after one that compiles. The last column counts the sources whose
best translations are the same. `generate` picks the loop for batches of up
to `beam.loop_batch_size(model)` sources, from such tables.
"""

import argparse
import json
import os
import time

from anchor_ctranslate2 import backend_worker
from anchor_ctranslate2 import processor

BATCHES = ((1, 64), (4, 64), (16, 128), (64, 128))  # (batch size, sentences)


def worker(preset, data_dir):
    import keras

    from keras_transformer.datasets import multi30k
    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset)
    # An ensemble preset's first model alone: the model the peers hold.
    model.set_ensemble_members([])
    sources, _ = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)
    token_ids = model.preprocessor.generate_preprocess(
        sources[: max(n for _, n in BATCHES)], model.backbone.max_sequence_length
    )

    def translate(batch_size, in_loop, items):
        found = []
        for start in range(0, len(items), batch_size):
            found += beam_search(model, items[start : start + batch_size], beam_size=4, alpha=0.6, in_loop=in_loop)
        return [result[0][0] for result in found]

    rows = []
    for batch_size, n in BATCHES:
        speed, outputs = {}, {}
        for in_loop in (False, True):
            translate(batch_size, in_loop, token_ids[:n])  # compile
            start = time.perf_counter()
            outputs[in_loop] = translate(batch_size, in_loop, token_ids[:n])
            speed[in_loop] = n / (time.perf_counter() - start)
        same = sum(a == b for a, b in zip(outputs[False], outputs[True]))
        rows.append({"backend": keras.config.backend(), "batch": batch_size, "sentences": n,
                     "host": speed[False], "loop": speed[True], "same": same})
    print(json.dumps(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--backends", default="jax,tensorflow")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.preset, args.data_dir)
    print(f"processor: {processor()}; preset {args.preset}; beam 4, alpha 0.6")
    print("| backend | batch | host loop (sent/s) | compiled loop (sent/s) | loop / host | same translations |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for backend in args.backends.split(","):
        arguments = ["--preset", args.preset, "--data-dir", args.data_dir]
        for row in backend_worker(os.path.abspath(__file__), backend, arguments):
            print(f"| {row['backend']} | {row['batch']} | {row['host']:.1f} | {row['loop']:.1f} "
                  f"| {row['loop'] / row['host']:.2f}x | {row['same']}/{row['sentences']} |", flush=True)


if __name__ == "__main__":
    main()

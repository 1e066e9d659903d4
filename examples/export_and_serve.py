"""Export a preset as a SavedModel compiled by XLA, then translate with it
in plain TensorFlow, as TensorFlow Serving would.

    python examples/export_and_serve.py --output-dir /tmp/en-de-savedmodel   # --overwrite to run it again
    python examples/export_and_serve.py --ensemble --output-dir /tmp/en-de-ensemble   # every model
    python examples/export_and_serve.py --quantize int8 --output-dir /tmp/en-de-int8

Writes `transformer_multi30k_en_de` (or `--preset`) with
`export_saved_model(..., jit_compile=True)`: tokenization, the encoder,
beam search and detokenization in one graph, the search compiled by XLA.
`--ensemble` holds all the preset's models and decodes them together, as
`generate` does by default; without it the SavedModel holds the first
model. Then loads it with `tf.saved_model.load` and tensorflow-text, as
a server's process would (which needs neither Keras nor keras_transformer),
translates a few
sentences one request at a time and all of them in one request, prints
the times (the first request of each shape compiles), and compares the
translations with `generate`'s for the same models and settings.

To serve it, copy the directory under a version number
(`MODEL_DIR/1/`) and start TensorFlow Serving with
`--xla_cpu_compilation_enabled=true` (docs/export.md).
"""

import argparse
import os
import tempfile
import time

SENTENCES = [
    "A man is riding a bicycle down the street.",
    "Two children are playing in the sand at the beach.",
    "A woman in a red coat walks her dog.",
    "A group of people are standing in front of a building.",
    "",  # an empty text gives an empty translation
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "en-de-savedmodel"))
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export there")
    parser.add_argument("--ensemble", action="store_true", help="hold every model of an ensemble preset")
    parser.add_argument("--quantize", choices=["int8"])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    args = parser.parse_args()

    from keras_transformer.export import export_saved_model

    start = time.perf_counter()
    export_saved_model(
        args.preset, args.output_dir, beam_size=args.beam_size, alpha=args.alpha, overwrite=args.overwrite,
        dtype=args.dtype, quantize=args.quantize, jit_compile=True, ensemble=args.ensemble,
    )
    print(f"Exported {args.preset} to {args.output_dir} in {time.perf_counter() - start:.1f} s.")

    # What a server does: plain TensorFlow and tensorflow-text.
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    translate = tf.saved_model.load(args.output_dir).signatures["serving_default"]
    for label in ("first requests (each new shape compiles)", "again"):
        start = time.perf_counter()
        one_at_a_time = [translate(text=tf.constant([text]))["translations"].numpy()[0].decode() for text in SENTENCES]
        elapsed = time.perf_counter() - start
        print(f"One sentence a request, {label}: {elapsed / len(SENTENCES) * 1e3:.0f} ms a sentence")
    start = time.perf_counter()
    batched = [t.decode() for t in translate(text=tf.constant(SENTENCES))["translations"].numpy()]
    print(f"All {len(SENTENCES)} in one request: {time.perf_counter() - start:.2f} s")

    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(
        args.preset, load_ensemble=args.ensemble, **({"dtype": args.dtype} if args.dtype else {})
    )
    if args.quantize:
        for each in [model, *model.ensemble_members]:
            each.quantize(args.quantize)
    expected = model.generate(SENTENCES, beam_size=args.beam_size, alpha=args.alpha)
    for text, served in zip(SENTENCES, one_at_a_time):
        print(f"  {text!r} -> {served!r}")
    same = sum(a == b for a, b in zip(one_at_a_time, expected))
    print(f"The SavedModel and generate agree on {same} of {len(SENTENCES)} sentences "
          f"(one request a sentence); the batched request on "
          f"{sum(a == b for a, b in zip(batched, expected))}.")


if __name__ == "__main__":
    main()

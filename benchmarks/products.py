"""PyTorch's float32 products in decoding: `linear` (MKL's product) against
weights prepacked once for oneDNN, alone and in translations, in one run.

    python benchmarks/products.py --data-dir PATH/TO/multi30k [--preset transformer_multi30k_en_de]

On AMD processors this package's PyTorch decoding multiplies float32
matrices of at least `int8_products._PREPACKED_FLOAT32_WEIGHTS` entries with
prepacked oneDNN weights (`int8_products.prepacked_product`): MKL runs its
fastest code on Intel's processors only. This script measures both ways on
the machine at hand, whatever its processor:

1. Microseconds a product (median of three timed runs), `linear` against
   oneDNN's prepacked product, of the preset's matrices and an opus-mt
   sized model's, at 4 (one sentence's beams), 16, 64 and 256 rows (64
   sentences' beams).
2. Sentences per second, passes alternating in one process, with the
   prepacked products off and on (the same translations checked): the
   preset's first model on Multi30k test_2016_flickr, beam 4, one at a
   time and 64 at a time; an opus-mt sized model with random weights
   (d_model 512, 6+6 layers, 8 heads, d_ff 2,048, 58,101 tokens, SiLU) on
   random sources of 10-24 tokens, its outputs running to the budget
   (source length + 30), one at a time and 16 at a time.
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from decoding_step import median_us  # noqa: E402
from train import processor  # noqa: E402

# (inputs, outputs, what it is)
MATRICES = [
    (128, 8000, "the presets' output projection"),
    (128, 384, "the presets' joined self-attention projection"),
    (128, 128, "the presets' attention output"),
    (512, 58101, "opus-mt's output projection"),
    (512, 2048, "opus-mt's first feed-forward product"),
    (512, 512, "opus-mt's attention output"),
]
ROWS = (4, 16, 64, 256)


def product_rows(calls):
    """`(matrix, [(linear us, prepacked us) per row count])` for MATRICES."""
    generator = torch.Generator().manual_seed(0)
    table = []
    with torch.inference_mode():
        for inputs, outputs, name in MATRICES:
            weight = torch.randn(outputs, inputs, generator=generator)
            bias = torch.randn(outputs, generator=generator)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
            cells = []
            for rows in ROWS:
                x = torch.randn(rows, inputs, generator=generator)
                n = max(calls * 4 // rows, 10) if outputs * inputs > 2**20 else calls
                plain = median_us(lambda: torch.nn.functional.linear(x, weight, bias), n)
                prepacked = median_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""), n)
                cells.append((plain, prepacked))
            table.append((f"{inputs:,} x {outputs:,} ({name})", cells))
    return table


def alternating(model, batches, passes, translate):
    """Sentences/s of `translate(batch)` over `batches` with prepacked
    float32 products off and on, passes alternating; whether both gave the
    same outputs."""
    from keras_transformer.runtime import int8_products

    prepacked_here = int8_products._float32_products_prepacked
    settings = {"linear": lambda: False, "prepacked": lambda: True}

    def run(setting):
        int8_products._float32_products_prepacked = settings[setting]
        # The products are made again for the setting: drop those held.
        for layer in model._flatten_layers(include_self=True):
            for name in ("_torch_step_weights", "_torch_prepacked_projection"):
                layer.__dict__.pop(name, None)
        start = time.perf_counter()
        outputs = [output for batch in batches for output in translate(batch)]
        return sum(map(len, batches)) / (time.perf_counter() - start), outputs

    try:
        for setting in settings:  # warm-up
            run(setting)
        speeds, outputs = {setting: [] for setting in settings}, {}
        for _ in range(passes):
            for setting in settings:
                speed, found = run(setting)
                speeds[setting].append(speed)
                outputs.setdefault(setting, found)
    finally:
        int8_products._float32_products_prepacked = prepacked_here
    return speeds, outputs["linear"] == outputs["prepacked"]


def preset_rows(preset, data_dir, passes):
    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset)
    model.set_ensemble_members([])  # an ensemble preset's first model
    sources, _ = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)

    def translate(texts):
        return model.generate(texts, beam_size=4, alpha=0.6, length_penalty="length", batch_size=len(texts))

    rows = []
    for at_once, count in ((1, 32), (64, 256)):
        batches = [sources[i : i + at_once] for i in range(0, count, at_once)]
        rows.append((f"{preset}'s first model, test_2016_flickr", at_once, count,
                     *alternating(model, batches, passes, translate)))
    return rows


def opus_mt_rows(passes):
    import keras

    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(58101, num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout=0.1,
                                   max_sequence_length=512, activation="silu")
    model = TransformerSeq2SeqLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(0)

    def translate(sources):
        return [r[0][0] for r in beam_search(model, sources, beam_size=4, alpha=0.6, max_length_offset=30)]

    rows = []
    for at_once, count in ((1, 6), (16, 32)):
        sources = [[1, *rng.integers(5, 58000, size=int(rng.integers(10, 25))).tolist(), 2] for _ in range(count)]
        batches = [sources[i : i + at_once] for i in range(0, count, at_once)]
        rows.append(("opus-mt sized, random weights and sources", at_once, count,
                     *alternating(model, batches, max(passes - 1, 1), translate)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"),
                        help="Multi30k (the preset's rows); without it only the opus-mt sized rows run")
    parser.add_argument("--calls", type=int, default=400, help="product calls a timed run (fewer for large ones)")
    parser.add_argument("--passes", type=int, default=4, help="alternating passes of each setting")
    args = parser.parse_args()
    if not torch.backends.mkldnn.is_available():
        sys.exit("This PyTorch has no oneDNN: there is nothing to compare.")
    from keras_transformer.runtime import int8_products
    from keras_transformer.utils.memory import reuse_freed_memory

    reuse_freed_memory()  # as `keras-transformer translate` does
    print(f"processor: {processor()}; PyTorch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"this package prepacks float32 products here: {int8_products._float32_products_prepacked()}", flush=True)
    print()
    print("| matrix (inputs x outputs) | " + " | ".join(f"{rows} rows: linear / prepacked (us)" for rows in ROWS) + " |")
    print("| --- |" + " ---: |" * len(ROWS))
    for name, cells in product_rows(args.calls):
        print(f"| {name} | " + " | ".join(f"{a:,.0f} / {b:,.0f} ({a / b:.2f}x)" for a, b in cells) + " |", flush=True)
    print()
    rows = preset_rows(args.preset, args.data_dir, args.passes) if args.data_dir else []
    rows += opus_mt_rows(args.passes)
    print("| model | at a time | sources | linear (sent/s) | prepacked (sent/s) | prepacked / linear | same outputs |")
    print("| --- | ---: | ---: | --- | --- | --- | --- |")
    for name, at_once, count, speeds, same in rows:
        plain, packed = speeds["linear"], speeds["prepacked"]
        print(f"| {name} | {at_once} | {count} | {', '.join(f'{s:.2f}' for s in plain)} "
              f"| {', '.join(f'{s:.2f}' for s in packed)} "
              f"| {', '.join(f'{b / a:.2f}x' for a, b in zip(plain, packed))} | {'yes' if same else 'no'} |", flush=True)


if __name__ == "__main__":
    main()

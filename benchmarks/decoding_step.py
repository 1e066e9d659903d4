"""Where a PyTorch beam-search step's time goes, one sentence at a time:
this package's step and its parts against the same step written as plain
PyTorch calls, in one run.

    python benchmarks/decoding_step.py [--preset transformer_multi30k_en_de] [--calls 2000]

One sentence's beams (4 rows) at one position of a cached search, the
preset's first model (an ensemble preset's first member), float32:

- `search step`: the step `beam_search` runs (`decoding.interface`'s
  step, in inference mode): the caches reordered to the beams' parents,
  the decoder, the output projection and the ranking of the extensions;
- its parts, each timed alone: the decoder stack (`backbone.decode` with
  the cache, inside a search's `unchanged_weights()`), one decoder layer
  run as many times as there are layers (its weights stay in the core's
  caches), the output projection, the ranking (`rules.best_extensions`)
  and the cache reorder;
- `plain PyTorch step`: the peer, a step of the same shapes (decoder
  layers of the preset's sizes, post-norm, random weights) written as
  PyTorch calls in one function: reorder, embedding and positions, each
  layer's projections, attention over the cache and feed-forward, the
  output projection, log-softmax and one top-k. No Keras, nothing checked.

Microseconds a call are the median of three timed runs of `--calls`
calls, after a warm-up run; PyTorch's default threads.
"""

import argparse
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
# The processor line is train.py's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from train import processor  # noqa: E402

ROWS, BEAMS, POSITION, CACHE = 4, 4, 10, 32


def median_us(call, calls):
    for _ in range(calls // 10):  # warm-up
        call()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def package_rows(preset, calls):
    """This package's search step and its parts, `(name, us)`."""
    from keras_transformer.decoding import DecodingSettings
    from keras_transformer.decoding import interface
    from keras_transformer.decoding.rules import best_extensions
    from keras_transformer.decoding.rules import never_output_bias
    from keras_transformer.runtime.direct_calls import direct_calls
    from keras_transformer.runtime.direct_calls import in_place_cache_writes
    from keras_transformer.runtime.direct_calls import unchanged_weights
    from keras_transformer.runtime.torch_decoding_step import decoding_step
    from keras_transformer.runtime.torch_step_weights import step_weights
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset)
    model.set_ensemble_members([])
    backbone = model.backbone
    source = np.array([[1, *range(10, 24), 2]], "int32")
    mask = np.ones_like(source)
    encode, step = interface.decoding_functions(model)
    _, cross = encode(source, mask)
    cache = list(zip(model.empty_self_attention_cache(ROWS, CACHE), cross))
    tokens = np.full((ROWS, 1), 5, "int32")
    parents = np.array([1, 0, 0, 2], "int32")
    log_probs = np.log(np.full((1, BEAMS), 0.25, "float32"))
    index = np.asarray(POSITION, "int32")
    rows = []
    with unchanged_weights():
        settings = DecodingSettings(beam_size=BEAMS)
        rows.append(("search step", median_us(
            lambda: step(tokens, index, cache, mask, parents, log_probs, settings=settings), calls
        )))
        with torch.inference_mode(), direct_calls(), in_place_cache_writes():
            rows.append(("part: decoder stack", median_us(
                lambda: backbone.decode(tokens, encoder_padding_mask=mask, cache=cache, cache_index=POSITION), calls
            )))
            layer = backbone.decoder_layers[0]
            weights = step_weights(layer)
            x = torch.randn(ROWS, 1, backbone.d_model)

            def one_layer_repeated():
                for _ in backbone.decoder_layers:
                    decoding_step(layer, weights, x, POSITION, cache[0][0], cache[0][1], mask)

            rows.append((f"part: one layer, {len(backbone.decoder_layers)} times", median_us(one_layer_repeated, calls)))
            hidden = torch.randn(ROWS, backbone.d_model)
            rows.append(("part: output projection", median_us(
                lambda: backbone.token_embedding(hidden, reverse=True), calls
            )))
            never_output = never_output_bias(model)
            logits = torch.randn(ROWS, backbone.vocabulary_size)
            rows.append(("part: ranking", median_us(
                lambda: best_extensions(logits, log_probs, never_output, 2 * BEAMS), calls
            )))
            rows.append(("part: cache reorder", median_us(lambda: interface._reordered(cache, parents), calls)))
    return backbone, rows


def plain_step_us(backbone, calls):
    """The peer: the same step's shapes as plain PyTorch calls."""
    from torch.nn.functional import embedding
    from torch.nn.functional import layer_norm
    from torch.nn.functional import linear
    from torch.nn.functional import relu
    from torch.nn.functional import scaled_dot_product_attention

    d, heads, d_ff = backbone.d_model, backbone.num_heads, backbone.d_ff
    vocabulary, dk = backbone.vocabulary_size, backbone.d_model // backbone.num_heads
    generator = torch.Generator().manual_seed(0)

    def weight(*shape):
        return torch.randn(*shape, generator=generator) * 0.05

    embeddings, positions = weight(vocabulary, d), weight(CACHE, d)
    layers = [
        dict(qkv=weight(3 * d, d), self_out=weight(d, d), cross_q=weight(d, d), cross_out=weight(d, d),
             inner=weight(d_ff, d), outer=weight(d, d_ff), bias=weight(d), inner_bias=weight(d_ff),
             gamma=torch.ones(d), beta=torch.zeros(d))
        for _ in backbone.decoder_layers
    ]
    caches = [[weight(ROWS, heads, CACHE, dk) for _ in range(2)] for _ in layers]
    cross = [[weight(1, heads, 16, dk) for _ in range(2)] for _ in layers]
    tokens = torch.full((ROWS,), 5)
    parents = torch.tensor([1, 0, 0, 2])
    log_probs = torch.zeros(1, BEAMS)

    def step():
        x = (embedding(tokens, embeddings) * d**0.5 + positions[POSITION])[:, None]
        for p, (keys, values), (cross_keys, cross_values) in zip(layers, caches, cross):
            keys, values = keys.index_select(0, parents), values.index_select(0, parents)
            q, k, v = linear(x, p["qkv"]).view(ROWS, 3, heads, 1, dk).unbind(1)
            keys[:, :, POSITION : POSITION + 1], values[:, :, POSITION : POSITION + 1] = k, v
            a = scaled_dot_product_attention(q, keys[:, :, : POSITION + 1], values[:, :, : POSITION + 1])
            x = layer_norm(x + linear(a.view(ROWS, 1, d), p["self_out"], p["bias"]), (d,), p["gamma"], p["beta"])
            q = linear(x, p["cross_q"], p["bias"]).view(1, ROWS, heads, dk).transpose(1, 2)
            a = scaled_dot_product_attention(q, cross_keys, cross_values).transpose(1, 2).reshape(ROWS, 1, d)
            x = layer_norm(x + linear(a, p["cross_out"], p["bias"]), (d,), p["gamma"], p["beta"])
            inner = relu(linear(x, p["inner"], p["inner_bias"]))
            x = layer_norm(x + linear(inner, p["outer"], p["bias"]), (d,), p["gamma"], p["beta"])
        scores = torch.log_softmax(linear(x[:, 0], embeddings), dim=-1).view(1, BEAMS, vocabulary)
        return torch.topk((scores + log_probs[:, :, None]).view(1, -1), 2 * BEAMS)

    with torch.inference_mode():
        return median_us(step, calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    backbone, rows = package_rows(args.preset, args.calls)
    plain = plain_step_us(backbone, args.calls)
    print(f"processor: {processor()}; PyTorch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"preset {args.preset} (first model: {len(backbone.decoder_layers)} decoder layers, "
          f"d_model {backbone.d_model}, d_ff {backbone.d_ff}, {backbone.vocabulary_size} tokens); "
          f"{ROWS} rows (one sentence, beam {BEAMS}), position {POSITION} of a {CACHE}-position cache\n")
    print("| step or part | us a call | / plain PyTorch step |")
    print("| --- | ---: | ---: |")
    for name, us in [*rows, ("plain PyTorch step (peer)", plain)]:
        print(f"| {name} | {us:.0f} | {us / plain:.2f}x |")


if __name__ == "__main__":
    main()

"""Where a PyTorch beam-search step's time goes, one sentence at a time:
this package's step and its parts against the same step written as plain
PyTorch calls, in one run.

    python benchmarks/decoding_step.py [--preset transformer_multi30k_en_de] [--rounds 5] [--seconds 0.3]
        [--threads N] [--compile]

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

With `--compile`, rows for PyTorch's compiler (`torch.compile`, Inductor,
which writes C++ on a CPU), each step taking its position as a 0-d tensor
and attending over the whole cache with a mask, so that one compilation
serves every position of a cache length; the cache's length bucketed, as a
compiled search grows it, and compiled again for each bucket (16, 32, 48
positions: the first call's compile time, the later buckets' and the graph
breaks are printed below the table):

- `Keras layer calls`: the search step's body (`decoding.interface`'s:
  reorder, `call_decoder_with_cache`, `transforms.candidates`) outside
  `direct_calls()`, so that every layer runs through `Layer.__call__` and
  Keras ops: the path the direct calls replace; eager, and compiled with
  static shapes;
- `plain PyTorch step, position as a tensor`: the peer written so
  (`index_copy_` into the cache, a mask for the positions after it);
  eager, and compiled with static shapes (the default mode and
  `max-autotune-no-cudagraphs`) and with `dynamic=True` (one compilation
  for every cache length).

The rows are timed in alternating rounds (`--rounds`, each row for about
`--seconds` in each, the count of calls fixed by a warm-up of the same
length), so that the machine's other load falls on all of them alike;
microseconds a call are the medians over the rounds. PyTorch's default
threads unless `--threads` (one thread is steadier on a busy machine).
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
# The processor line is train.py's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if "--compile" in sys.argv:  # compile times from a cold cache: Inductor's own, not an earlier run's
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from train import processor  # noqa: E402

ROWS, BEAMS, POSITION, CACHE = 4, 4, 10, 32
BUCKETS = (16, 32, 48)  # cache lengths a compiled step meets (it is timed at CACHE)


def within(*contexts):
    """A function entering `contexts` (context manager factories) at each
    call, for the timing of a row."""

    @contextlib.contextmanager
    def entered():
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context())
            yield

    return entered


def timed(rows, rounds, seconds):
    """`rows`: `(name, call, context)`; times each row's `call()` inside
    its `context()` in alternating rounds, returns `{name: median us}`."""
    counts = {}
    for name, call, context in rows:  # warm-up, which sets the count of calls
        with context():
            start, count = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                call()
                count += 1
        counts[name] = max(count, 3)
    times = {name: [] for name, _, _ in rows}
    for _ in range(rounds):
        for name, call, context in rows:
            with context():
                start = time.perf_counter()
                for _ in range(counts[name]):
                    call()
                times[name].append((time.perf_counter() - start) / counts[name] * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def package_rows(preset):
    """This package's search step and its parts, `(name, call, context)`;
    and what the compiled rows need of the model."""
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
    settings = DecodingSettings(beam_size=BEAMS)
    layer = backbone.decoder_layers[0]
    x = torch.randn(ROWS, 1, backbone.d_model)
    hidden = torch.randn(ROWS, backbone.d_model)
    never_output = never_output_bias(model)
    logits = torch.randn(ROWS, backbone.vocabulary_size)
    held = {}

    def one_layer_repeated():
        if "weights" not in held:  # (made inside the timing's contexts)
            held["weights"] = step_weights(layer)
        for _ in backbone.decoder_layers:
            decoding_step(layer, held["weights"], x, POSITION, cache[0][0], cache[0][1], mask)

    parts = within(unchanged_weights, torch.inference_mode, direct_calls, in_place_cache_writes)
    rows = [
        ("search step", lambda: step(tokens, index, cache, mask, parents, log_probs, settings=settings),
         within(unchanged_weights)),
        ("part: decoder stack",
         lambda: backbone.decode(tokens, encoder_padding_mask=mask, cache=cache, cache_index=POSITION), parts),
        (f"part: one layer, {len(backbone.decoder_layers)} times", one_layer_repeated, parts),
        ("part: output projection", lambda: backbone.token_embedding(hidden, reverse=True), parts),
        ("part: ranking", lambda: best_extensions(logits, log_probs, never_output, 2 * BEAMS), parts),
        ("part: cache reorder", lambda: interface._reordered(cache, parents), parts),
    ]
    return model, cross, rows


def plain_step(backbone, position_as_tensor=False):
    """The peer: the same step's shapes as plain PyTorch calls,
    `step(caches)` (caches: per layer, `[keys, values]`, `(rows, heads,
    length, depth)`) and those caches. With `position_as_tensor`, `step(caches,
    position)` takes a 0-d tensor and attends over the whole cache with a
    mask, as a compiled step would."""
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

    embeddings, positions = weight(vocabulary, d), weight(max(BUCKETS), d)
    layers = [
        dict(qkv=weight(3 * d, d), self_out=weight(d, d), cross_q=weight(d, d), cross_out=weight(d, d),
             inner=weight(d_ff, d), outer=weight(d, d_ff), bias=weight(d), inner_bias=weight(d_ff),
             gamma=torch.ones(d), beta=torch.zeros(d))
        for _ in backbone.decoder_layers
    ]
    cross = [[weight(1, heads, 16, dk) for _ in range(2)] for _ in layers]
    tokens = torch.full((ROWS,), 5)
    parents = torch.tensor([1, 0, 0, 2])
    log_probs = torch.zeros(1, BEAMS)

    def self_attention(q, k, v, keys, values, position):
        if not position_as_tensor:
            keys[:, :, position : position + 1], values[:, :, position : position + 1] = k, v
            return scaled_dot_product_attention(q, keys[:, :, : position + 1], values[:, :, : position + 1])
        at = position.view(1)
        keys.index_copy_(2, at, k)
        values.index_copy_(2, at, v)
        allowed = torch.arange(keys.shape[2]) <= position
        mask = torch.zeros(1, keys.shape[2]).masked_fill(~allowed, float("-inf"))
        return scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    def step(caches, position=POSITION):
        at = position.view(1) if position_as_tensor else position
        x = (embedding(tokens, embeddings) * d**0.5 + positions[at])[:, None]
        for p, (keys, values), (cross_keys, cross_values) in zip(layers, caches, cross):
            keys, values = keys.index_select(0, parents), values.index_select(0, parents)
            q, k, v = linear(x, p["qkv"]).view(ROWS, 3, heads, 1, dk).unbind(1)
            a = self_attention(q, k, v, keys, values, position)
            x = layer_norm(x + linear(a.view(ROWS, 1, d), p["self_out"], p["bias"]), (d,), p["gamma"], p["beta"])
            q = linear(x, p["cross_q"], p["bias"]).view(1, ROWS, heads, dk).transpose(1, 2)
            a = scaled_dot_product_attention(q, cross_keys, cross_values).transpose(1, 2).reshape(ROWS, 1, d)
            x = layer_norm(x + linear(a, p["cross_out"], p["bias"]), (d,), p["gamma"], p["beta"])
            inner = relu(linear(x, p["inner"], p["inner_bias"]))
            x = layer_norm(x + linear(inner, p["outer"], p["bias"]), (d,), p["gamma"], p["beta"])
        scores = torch.log_softmax(linear(x[:, 0], embeddings), dim=-1).view(1, BEAMS, vocabulary)
        return torch.topk((scores + log_probs[:, :, None]).view(1, -1), 2 * BEAMS)

    def caches(length):
        return [[weight(ROWS, heads, length, dk) for _ in range(2)] for _ in layers]

    return step, caches


def keras_step(model, cross):
    """The search step's body as `decoding.interface` writes it, outside
    `direct_calls()` (every layer through `Layer.__call__`),
    `step(caches, position)`, and its caches of a length."""
    from keras_transformer.decoding import DecodingSettings
    from keras_transformer.decoding import interface
    from keras_transformer.decoding.rules import never_output_bias
    from keras_transformer.decoding.transforms import candidates

    settings, never_output = DecodingSettings(beam_size=BEAMS), never_output_bias(model)
    tokens = torch.full((ROWS, 1), 5, dtype=torch.int32)
    mask = torch.ones((1, 16), dtype=torch.int32)
    parents = torch.tensor([1, 0, 0, 2], dtype=torch.int32)
    log_probs = torch.log(torch.full((1, BEAMS), 0.25))

    def step(caches, position):
        caches = interface._reordered(caches, parents)
        logits, caches = model.call_decoder_with_cache(tokens, position, caches, mask)
        return candidates(logits, log_probs, position, never_output, settings)

    def caches(length):
        return list(zip(model.empty_self_attention_cache(ROWS, length), cross))

    return step, caches


def compiled_rows(name, step, caches, **options):
    """`step` compiled by `torch.compile(**options)`: its row (at a
    `CACHE`-position cache) and what its compilation took."""
    from torch._dynamo.utils import counters

    compiled = torch.compile(step, **options)
    position = torch.tensor(POSITION)
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    reasons, seconds = set(counters["graph_break"]), []
    with torch.no_grad():  # (inference mode: Dynamo's guards on NumPy constants fail)
        for length in BUCKETS:
            start = time.perf_counter()
            compiled(caches(length), position)
            seconds.append(time.perf_counter() - start)
            if length == BUCKETS[0]:  # what one compilation made
                first = (counters["stats"]["unique_graphs"] - graphs, sum(counters["graph_break"].values()) - breaks)
        held = caches(CACHE)
        compiled(held, position + 1)  # another position: the same compiled code
    report = dict(
        name=name, seconds=seconds, graphs=first[0], breaks=first[1],
        recompiled=counters["stats"]["unique_graphs"] - graphs - first[0],
        reasons=sorted({" ".join(reason.split())[:200] for reason in set(counters["graph_break"]) - reasons}),
    )
    return (name, lambda: compiled(held, position), within(torch.no_grad)), report


def compile_rows(model, cross):
    """The rows of `--compile`, `(name, call, context)`, and the reports of
    their compilations."""
    # Each variant and bucket compiles the same functions again: more than
    # Dynamo's default limit of compilations a function.
    torch._dynamo.config.recompile_limit = 64
    rows, reports = [], []
    position = torch.tensor(POSITION)
    for label, (step, caches) in [
        ("Keras layer calls", keras_step(model, cross)),
        ("plain PyTorch step, position as a tensor", plain_step(model.backbone, position_as_tensor=True)),
    ]:
        held = caches(CACHE)
        rows.append((f"{label}, eager", lambda step=step, held=held: step(held, position),
                     within(torch.inference_mode)))
        if label.startswith("Keras"):  # as an eager search calls it
            rows.append((f"{label}, eager, position as an int", lambda step=step, held=held: step(held, POSITION),
                         within(torch.inference_mode)))
        variants = [("compiled, static shapes", {})]
        if label.startswith("plain"):
            variants += [("compiled, static, max-autotune-no-cudagraphs", dict(mode="max-autotune-no-cudagraphs")),
                         ("compiled, dynamic=True", dict(dynamic=True))]
        for variant, options in variants:
            row, report = compiled_rows(f"{label}, {variant}", step, caches, dynamic=options.pop("dynamic", False),
                                        **options)
            rows.append(row)
            reports.append(report)
    return rows, reports


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.3, help="each row's time in each round")
    parser.add_argument("--threads", type=int, help="PyTorch's threads (default: PyTorch's own)")
    parser.add_argument("--compile", action="store_true", help="add the rows of torch.compile")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    model, cross, rows = package_rows(args.preset)
    backbone = model.backbone
    step, caches = plain_step(backbone)
    held = caches(CACHE)
    rows.append(("plain PyTorch step (peer)", lambda: step(held), within(torch.inference_mode)))
    reports = []
    if args.compile:
        more, reports = compile_rows(model, cross)
        rows += more
    us = timed(rows, args.rounds, args.seconds)
    plain = us["plain PyTorch step (peer)"]
    print(f"processor: {processor()}; PyTorch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"load average {' '.join(f'{x:.2f}' for x in load)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    print(f"preset {args.preset} (first model: {len(backbone.decoder_layers)} decoder layers, "
          f"d_model {backbone.d_model}, d_ff {backbone.d_ff}, {backbone.vocabulary_size} tokens); "
          f"{ROWS} rows (one sentence, beam {BEAMS}), position {POSITION} of a {CACHE}-position cache; "
          f"medians of {args.rounds} alternating rounds\n")
    print("| step or part | us a call | / plain PyTorch step |")
    print("| --- | ---: | ---: |")
    for name, _, _ in rows:
        print(f"| {name} | {us[name]:.0f} | {us[name] / plain:.2f}x |")
    if reports:
        print(f"\n| compiled | first call (cache {BUCKETS[0]}), s | later buckets {BUCKETS[1:]}, s "
              "| graphs | graph breaks | graphs compiled again |")
        print("| --- | ---: | --- | ---: | ---: | ---: |")
        for report in reports:
            first, *later = report["seconds"]
            print(f"| {report['name']} | {first:.1f} | {', '.join(f'{s:.1f}' for s in later)} | "
                  f"{report['graphs']} | {report['breaks']} | {report['recompiled']} |")
        for report in reports:
            for reason in report["reasons"]:
                print(f"- {report['name']}: graph break: {reason}")


if __name__ == "__main__":
    main()

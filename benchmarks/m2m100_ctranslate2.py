"""This package against CTranslate2 on the same M2M100 / NLLB-200 weights:
sentences per second one at a time and 64 at a time.

    python benchmarks/m2m100_ctranslate2.py --shape small --batch1-sentences 4 --batch64-sentences 64
    python benchmarks/m2m100_ctranslate2.py --shape 600m --directory DIR --backends torch \\
        --batch1-sentences 4 --batch64-sentences 64 --passes 3

The checkpoint is `load_memory.py`'s: a random `m2m_100` checkpoint built
by transformers (`--shape 600m`: NLLB-200-distilled-600M's shape, d_model
1024, 12+12 layers, 16 heads, d_ff 4096, 256,206 tokens; `small`: d_model
512, 6+6 layers, 32,000 tokens) in `--directory` unless it is there, and
converted beside it (`DIR-ct2-float32`) by CTranslate2's own
`TransformersConverter` in float32. This package loads the checkpoint
itself with `TransformerSeq2SeqLM.from_preset(DIR)` in float32, on each
backend of `--backends` (default: `KERAS_BACKEND`, else PyTorch).

Random weights give no sentences worth detokenizing, and the checkpoint's
tokenizer (the tiny one of `tests/m2m100_fixture.py`) names few of its
256,206 ids, so both engines take token ids: the same random sources of
`--source-length` tokens (`__en__ ... </s>`, as `M2M100Tokenizer` frames
them; CTranslate2 gets the tokens its converted vocabulary names for these
ids), with `__de__` forced first, beam `--beam-size`, log P / |Y|^0.6
(this package's `length_penalty="length"`, CTranslate2's
`length_penalty=0.6`). Random weights rarely end a sentence, so both
engines are given the same output length, `--new-tokens` tokens counting
the forced language code (CTranslate2's `max_decoding_length`; this
package's `max_length_offset`, the source being of fixed length), and the
table says whether every output of every engine has that length, and how
many of them are the same as CTranslate2's (random weights' next-token
scores lie close together, so rounding may choose differently).

Each engine loads once, in a process of its own, with `--threads` threads
(default 1: CTranslate2's `intra_threads`, and `OMP_NUM_THREADS`, XLA's
and TensorFlow's thread settings for this package), translates each batch
size's sources once to warm up (and compile), and then the engines take
passes in turn, the order reversed at every other round (as
`alternate_ctranslate2.py`). The tables give each engine's median time of
a pass, its sentences per second, and CTranslate2's time over the
engine's in each round and their median (above 1: faster than
CTranslate2), then the processor, the load average before and after, and
each process's peak resident memory.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load_memory import SHAPES  # noqa: E402
from load_memory import resident  # noqa: E402
from load_memory import build  # noqa: E402

ALPHA = 0.6
SOURCE_CODE, TARGET_CODE = "__en__", "__de__"
BATCH_SIZES = (1, 64)


def prepare(directory, shape):
    """Builds the checkpoint (unless there) and CTranslate2's float32
    conversion of it beside it (unless there); its directory."""
    import ctranslate2

    class Converter(ctranslate2.converters.TransformersConverter):
        # The tiny tokenizer names a few hundred of the ids; CTranslate2
        # names the others `madeupwordN`, as many as the weights' rows
        # (not the 8 `M2M100Tokenizer.num_madeup_words` says).
        def load_tokenizer(self, *args, **kwargs):
            tokenizer = super().load_tokenizer(*args, **kwargs)
            vars(tokenizer).pop("num_madeup_words", None)
            return tokenizer

    build(directory, shape)
    converted = directory + "-ct2-float32"
    if not os.path.isdir(converted):
        converter = Converter(directory, low_cpu_mem_usage=True)
        converter.convert(converted + ".building", quantization="float32", force=True)
        os.rename(converted + ".building", converted)
    return converted


def vocabulary(converted):
    """CTranslate2's converted vocabulary: its tokens, by id."""
    with open(os.path.join(converted, "shared_vocabulary.json"), encoding="utf-8") as f:
        return json.load(f)


def make_sources(tokens, count, length, seed=0):
    """`count` random sources of `length` ids: the source code, ordinary
    pieces (those before the first language code), `</s>`."""
    import numpy as np

    first_code = min(i for i, t in enumerate(tokens) if t.startswith("__") and t.endswith("__"))
    generator = np.random.default_rng(seed)
    body = generator.integers(4, first_code, size=(count, length - 2))
    start, end = tokens.index(SOURCE_CODE), tokens.index("</s>")
    return [[start, *map(int, row), end] for row in body]


def _ctranslate2(args, tokens):
    """CTranslate2's translate: id sources to id outputs (the forced
    code first, no end token)."""
    import ctranslate2

    translator = ctranslate2.Translator(args.converted, device="cpu", intra_threads=args.threads, inter_threads=1)
    index = {token: i for i, token in enumerate(tokens)}

    def translate(batch):
        results = translator.translate_batch(
            [[tokens[i] for i in row] for row in batch], target_prefix=[[TARGET_CODE]] * len(batch),
            beam_size=args.beam_size, length_penalty=ALPHA, max_decoding_length=args.new_tokens,
            max_batch_size=len(batch),
        )
        return [[index[t] for t in r.hypotheses[0]] for r in results]

    return translate


def _keras_transformer(args, tokens):
    """This package's translate on the backend of `KERAS_BACKEND`, after
    checking that its tokenizer numbers the tokens as CTranslate2 does."""
    import numpy as np

    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(args.directory)
    tokenizer = model.preprocessor.tokenizer
    named = min(int(tokenizer.vocabulary_size()), len(tokens))
    differ = [i for i in range(named) if tokenizer.id_to_token(i) != tokens[i]]
    if differ or tokenizer.token_to_id(TARGET_CODE) != tokens.index(TARGET_CODE):
        sys.exit(f"The tokenizer and CTranslate2's vocabulary number tokens differently (ids {differ[:5]}).")
    offset = args.new_tokens - args.source_length  # the output budget: source length + offset

    def translate(batch):
        ids = np.array(batch, "int32")
        outputs = model.generate(
            {"encoder_token_ids": ids, "encoder_padding_mask": np.ones(ids.shape, bool)}, beam_size=args.beam_size,
            alpha=ALPHA, length_penalty="length", max_length_offset=offset, batch_size=len(batch),
            target_language=TARGET_CODE,
        )
        return [list(map(int, output)) for output in outputs]

    return translate


def worker(args):
    """One engine: warms up on each batch size, prints `ready`, then for
    each batch size read (a line) times a pass and prints its seconds and
    outputs as JSON; at the end of its input, its peak resident memory."""
    tokens = vocabulary(args.converted)
    sources = make_sources(tokens, max(args.batch1_sentences, args.batch64_sentences), args.source_length)
    translate = (_ctranslate2 if args.engine == "ctranslate2" else _keras_transformer)(args, tokens)
    counts = {1: args.batch1_sentences, 64: args.batch64_sentences}

    def one_pass(batch_size):
        items = sources[: counts[batch_size]]
        return [out for i in range(0, len(items), batch_size) for out in translate(items[i : i + batch_size])]

    for batch_size in BATCH_SIZES:
        one_pass(batch_size)  # compiles, warms up
    print("ready", flush=True)
    for line in sys.stdin:
        start = time.perf_counter()
        outputs = one_pass(int(line))
        print(json.dumps({"seconds": time.perf_counter() - start, "outputs": outputs}), flush=True)
    print(json.dumps({"peak_bytes": resident("VmHWM")}), flush=True)


def thread_environment(threads):
    """The environment variables that hold each framework to `threads`
    threads."""
    env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")}
    env["TF_NUM_INTEROP_THREADS"] = "1"
    if threads == 1:
        env["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_cpu_multi_thread_eigen=false",
                                     "intra_op_parallelism_threads=1"]).strip()
    return env


def start_engines(args, common):
    """Each engine's process, loaded and warm, by name."""
    engines = {f"CTranslate2 float32 ({args.threads} thread{'s' * (args.threads != 1)})": ("ctranslate2", "jax")}
    for backend in args.backends.split(","):
        engines[f"keras_transformer ({backend}) float32"] = (backend, backend)
    processes = {}
    for name, (engine, backend) in engines.items():
        print(f"loading {name} ...", file=sys.stderr, flush=True)
        env = {**os.environ, **thread_environment(args.threads), "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine", engine, *common],
                                   env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if process.stdout.readline().strip() != "ready":
            sys.exit(f"The {name} worker failed (its errors above).")
        processes[name] = process
    return processes


def alternate(processes, passes):
    """`passes` rounds of each engine's pass at each batch size, the order
    reversed at every other round: seconds and the last outputs, by batch
    size and engine."""
    times = {b: {name: [] for name in processes} for b in BATCH_SIZES}
    outputs = {b: {} for b in BATCH_SIZES}
    for round_ in range(passes):
        print(f"round {round_ + 1} of {passes} ...", file=sys.stderr, flush=True)
        for batch_size in BATCH_SIZES:
            for name in list(processes)[:: 1 if round_ % 2 == 0 else -1]:
                processes[name].stdin.write(f"{batch_size}\n")
                processes[name].stdin.flush()
                reply = json.loads(processes[name].stdout.readline())
                times[batch_size][name].append(reply["seconds"])
                outputs[batch_size][name] = reply["outputs"]
    return times, outputs


def report(args, times, outputs, peaks):
    """Prints a table for each batch size, the output check and memory."""
    counts = {1: args.batch1_sentences, 64: args.batch64_sentences}
    for batch_size in BATCH_SIZES:
        peer_name = next(iter(times[batch_size]))
        peer = times[batch_size][peer_name]
        print(f"\nbatch {batch_size}: {counts[batch_size]} sentences a pass")
        print("| engine | median time (s) | sentences/s | CT2 fp32 time / time, each round | median | "
              f"outputs of {args.new_tokens} tokens | same as CT2's |")
        print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
        for name, seconds in times[batch_size].items():
            ratios = [p / s for p, s in zip(peer, seconds)]
            median = statistics.median(seconds)
            outs = outputs[batch_size][name]
            full = sum(len(o) == args.new_tokens for o in outs)
            same = sum(o == p for o, p in zip(outs, outputs[batch_size][peer_name]))
            print(f"| {name} | {median:.2f} | {counts[batch_size] / median:.2f} | "
                  f"{', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f}x | "
                  f"{full} of {len(outs)} | {same} of {len(outs)} |")
    print(f"\noutput length: {args.new_tokens} tokens (the forced code included) in every output of every "
          "engine: " + ("yes" if all(len(o) == args.new_tokens for b in outputs.values() for outs in b.values()
                                     for o in outs) else "NO"))
    print("peak resident memory: " + ", ".join(f"{name} {peak / 2**30:.2f} GiB" for name, peak in peaks.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--directory", help="where the checkpoint is (built there if absent; default: a temporary one)")
    parser.add_argument("--backends", default=os.environ.get("KERAS_BACKEND", "torch"))
    parser.add_argument("--batch1-sentences", type=int, default=8, help="sentences a pass, one at a time")
    parser.add_argument("--batch64-sentences", type=int, default=64, help="sentences a pass, 64 at a time")
    parser.add_argument("--passes", type=int, default=3, help="timed passes of each engine at each batch size")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--source-length", type=int, default=16, help="tokens a source, code and </s> included")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens an output, the forced code included")
    parser.add_argument("--threads", type=int, default=1, help="threads of each engine")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--converted", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from keras_transformer.utils.memory import reuse_freed_memory

    reuse_freed_memory()
    if args.prepare:
        print(prepare(args.directory, args.shape))
        return
    if args.engine:
        if args.engine == "ctranslate2":
            from keras_transformer.utils.tensorflow_free import skip_tensorflow

            skip_tensorflow()
        return worker(args)
    from keras_transformer.utils.processor import describe

    temporary = None if args.directory else tempfile.mkdtemp(prefix="m2m100-ctranslate2-")
    args.directory = os.path.abspath(args.directory or os.path.join(temporary, "checkpoint"))
    print(f"building or reading {args.directory} and its conversion ...", file=sys.stderr, flush=True)
    prepared = subprocess.run([sys.executable, os.path.abspath(__file__), "--prepare", "--shape", args.shape,
                               "--directory", args.directory], env={**os.environ, **thread_environment(args.threads)},
                              stdout=subprocess.PIPE, text=True, check=True)
    args.converted = prepared.stdout.strip().splitlines()[-1]
    load_before = os.getloadavg()
    print(f"processor: {describe()}; {args.shape} shape ({SHAPES[args.shape]}), float32; sources of "
          f"{args.source_length} tokens, outputs of {args.new_tokens}, {TARGET_CODE} forced, beam {args.beam_size}, "
          f"log P / |Y|^{ALPHA}; {args.threads} thread(s) an engine; {args.passes} alternating passes", flush=True)
    common = ["--directory", args.directory, "--converted", args.converted, "--source-length",
              str(args.source_length), "--new-tokens", str(args.new_tokens), "--beam-size", str(args.beam_size),
              "--batch1-sentences", str(args.batch1_sentences), "--batch64-sentences", str(args.batch64_sentences),
              "--threads", str(args.threads)]
    processes = start_engines(args, common)
    times, outputs = alternate(processes, args.passes)
    peaks = {}
    for name, process in processes.items():
        process.stdin.close()
        peaks[name] = json.loads(process.stdout.readline())["peak_bytes"]
        process.wait()
    report(args, times, outputs, peaks)
    print("load average (1, 5, 15 min): before " + ", ".join(f"{x:.2f}" for x in load_before) + "; after "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    if temporary:
        shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    main()

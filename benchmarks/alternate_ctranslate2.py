"""This package against CTranslate2 in alternating passes, each engine warm
in a process of its own.

    python benchmarks/alternate_ctranslate2.py --preset transformer_multi30k_en_de \
        --data-dir PATH/TO/multi30k --sentences 1000 --passes 5 --backends jax --dtypes float32,bfloat16

`decode.py --ctranslate2` times each engine once, one after another, and
CTranslate2 again after each backend; on a shared host the machine's speed
drifts within minutes, and the same code's ratios moved by a tenth between
runs. Here CTranslate2 (each of its weights asked for, float32 by default,
with each thread count asked for; by default one thread a core) and this
package (each backend and dtype asked
for) load once, each in a process of its own, warm
up with a pass, and then take passes in turn, the order reversed at every
other round, so that a slow spell of the host falls on all of them alike.
Each pass translates the same test_2016_flickr sentences from text to text
(the preset's tokenizer for both, as in `decode.py --ctranslate2`), 64 at
a time, with beam 4 and log P / |Y|^0.6, at most source length + 50
tokens. The table gives each engine's median time, and CTranslate2's float32
time (its fastest thread count's in that round) over the engine's in each round
(above 1: faster than CTranslate2) with their median; BLEU is sacreBLEU's
cased score of the engine's last pass. One sentence at a time
(`--batch-size 1`) CTranslate2 ran fastest on one thread in
`decode.py --ctranslate2`: pass `--ctranslate2-threads 1,2`.
`--baseline-source DIR` adds, for each backend and dtype, an engine that
runs this package from another source tree (a checkout of an earlier
commit, e.g. made with `git worktree add DIR COMMIT`), so that a change's
speed is measured before and after in the same alternating run. With
`--ctranslate2-dtypes float32,int8` CTranslate2's int8 weights take their
passes too (their ratio, as every engine's, is to CTranslate2's float32).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from anchor_ctranslate2 import ALPHA  # noqa: E402
from anchor_ctranslate2 import BEAM  # noqa: E402
from anchor_ctranslate2 import OFFSET  # noqa: E402
from anchor_ctranslate2 import _sources  # noqa: E402
from anchor_ctranslate2 import processor  # noqa: E402


def worker(args):
    """One engine: warms up, prints `ready`, then times a pass for each
    line read, printing its seconds; at the end of its input prints the
    last pass's BLEU as JSON."""
    import sacrebleu

    engine, _, dtype = args.engine.partition(":")  # (CTranslate2's: its thread count and weights)
    model, sources, references = _sources(args.preset, args.data_dir, args.sentences)
    if engine == "ctranslate2":
        import ctranslate2

        threads, _, weights = dtype.partition(":")
        translator = ctranslate2.Translator(os.path.join(args.directory, f"ct2-{weights}"), device="cpu",
                                            intra_threads=int(threads))
        tokenizer = model.preprocessor.tokenizer

        def translate(texts):
            batch = [[tokenizer.id_to_token(i) for i in row] for row in model.preprocessor.generate_preprocess(texts)]
            results = translator.translate_batch(batch, beam_size=BEAM, length_penalty=ALPHA,
                                                 max_decoding_length=max(map(len, batch)) + OFFSET,
                                                 max_batch_size=len(batch))
            return model.preprocessor.generate_postprocess(
                [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results])
    else:
        if dtype == "int8":
            model.quantize("int8")
        elif dtype == "bfloat16":
            from keras_transformer.models import TransformerSeq2SeqLM

            model = TransformerSeq2SeqLM.from_preset(args.preset, dtype="bfloat16")
            model.set_ensemble_members([])  # the first model alone, as CTranslate2 holds

        def translate(texts):
            return model.generate(texts, beam_size=BEAM, alpha=ALPHA, length_penalty="length",
                                  max_length_offset=OFFSET, batch_size=len(texts))

    batches = [sources[i : i + args.batch_size] for i in range(0, len(sources), args.batch_size)]

    def one_pass():
        return [output for batch in batches for output in translate(batch)]

    outputs = one_pass()  # compiles, warms up
    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.perf_counter()
        outputs = one_pass()
        print(time.perf_counter() - start, flush=True)
    print(json.dumps({"bleu": sacrebleu.corpus_bleu(outputs, [references]).score}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, help="a trained TransformerSeq2SeqLM preset (name or directory)")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--sentences", type=int, default=1000, help="test_2016_flickr sentences a pass")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=5, help="timed passes of each engine")
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="this package's: float32, bfloat16, int8")
    parser.add_argument("--ctranslate2-threads", default=str(os.cpu_count() or 1),
                        help="CTranslate2's thread counts, each an engine (default: the cores)")
    parser.add_argument("--ctranslate2-dtypes", default="float32",
                        help="CTranslate2's weights, each an engine: float32 (always), int8")
    parser.add_argument("--baseline-source", metavar="DIR",
                        help="another source tree of this package (an earlier commit's checkout) to time too")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from keras_transformer.utils.memory import reuse_freed_memory

    reuse_freed_memory()  # in every engine's process, as `keras-transformer translate` does
    if args.engine:
        if args.engine.startswith("ctranslate2:"):
            # CTranslate2 without TensorFlow in its process (see `anchor_ctranslate2.compare`).
            from keras_transformer.utils.tensorflow_free import skip_tensorflow

            skip_tensorflow()
        return worker(args)
    if not args.data_dir:
        sys.exit("Pass --data-dir (the Multi30k directory) or set KERAS_TRANSFORMER_MULTI30K.")
    print(f"processor: {processor()}; preset {args.preset}; {args.sentences} sentences {args.batch_size} at a "
          f"time, beam {BEAM}, log P / |Y|^{ALPHA}; {args.passes} alternating passes", flush=True)
    with tempfile.TemporaryDirectory() as root:
        print("converting for CTranslate2 ...", file=sys.stderr, flush=True)
        from anchor_ctranslate2 import convert

        converted = convert(args.preset, root)  # root/ct2-float32, root/ct2-int8, ...
        directory = root
        peer_dtypes = ["float32"] + [d for d in args.ctranslate2_dtypes.split(",") if d != "float32"]
        unknown = sorted(set(peer_dtypes) - set(converted))
        if unknown:
            sys.exit(f"CTranslate2 has no {unknown} weights here; this processor's: {sorted(converted)}.")
        engines = {f"CTranslate2 {weights} ({threads} thread{'s' * (threads != '1')})":
                   (f"ctranslate2:{threads}:{weights}", "jax")
                   for weights in peer_dtypes for threads in args.ctranslate2_threads.split(",")}
        for backend in args.backends.split(","):
            for dtype in args.dtypes.split(","):
                engines[f"keras_transformer ({backend}) {dtype}"] = (f"{backend}:{dtype}", backend)
                if args.baseline_source:
                    engines[f"baseline ({backend}) {dtype}"] = (f"{backend}:{dtype}", backend)
        processes = {}
        common = ["--preset", args.preset, "--data-dir", args.data_dir, "--sentences", str(args.sentences),
                  "--batch-size", str(args.batch_size), "--directory", directory]
        for name, (engine, backend) in engines.items():
            print(f"loading {name} ...", file=sys.stderr, flush=True)
            env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
            if name.startswith("baseline"):
                env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.baseline_source),
                                                     env.get("PYTHONPATH", "")])
            process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine", engine, *common],
                                       env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if process.stdout.readline().strip() != "ready":
                sys.exit(f"The {name} worker failed (its errors above).")
            processes[name] = process
        times = {name: [] for name in processes}
        for round_ in range(args.passes):
            print(f"round {round_ + 1} of {args.passes} ...", file=sys.stderr, flush=True)
            for name in list(processes)[:: 1 if round_ % 2 == 0 else -1]:
                processes[name].stdin.write("pass\n")
                processes[name].stdin.flush()
                times[name].append(float(processes[name].stdout.readline()))
        bleu = {}
        for name, process in processes.items():
            process.stdin.close()
            bleu[name] = json.loads(process.stdout.readline())["bleu"]
            process.wait()
    # CTranslate2 float32's fastest thread count in each round.
    peer = [min(round_) for round_ in zip(*(t for name, t in times.items() if name.startswith("CTranslate2 float32")))]
    print("| engine | median time (s) | sentences/s | CT2 fp32 time / time, each round | median | BLEU |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for name, seconds in times.items():
        ratios = [p / s for p, s in zip(peer, seconds)]
        median = statistics.median(seconds)
        print(f"| {name} | {median:.2f} | {args.sentences / median:.1f} | {', '.join(f'{r:.2f}' for r in ratios)} "
              f"| {statistics.median(ratios):.2f}x | {bleu[name]:.1f} |")


if __name__ == "__main__":
    main()

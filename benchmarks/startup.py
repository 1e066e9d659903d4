"""How long a translation command takes from a cold process, compiling
included: `keras-transformer translate` against a CTranslate2 process.

    python benchmarks/startup.py --data-dir PATH/TO/multi30k

Each row is the wall time of a new process, as a user runs it: one
sentence (`translate "A man is riding a bicycle."`) and a file of the
first `--lines` test_2016_flickr sources (`translate -i FILE -o OUT`),
beam 4, with the shipped en-de preset's first model (`--first-model-only`:
the model the peer runs), on each Keras backend. On JAX,
whose compiled steps the command keeps on disk
(`keras_transformer.utils.compile_cache`), three runs: with the cache off,
the run that fills an empty cache, and a run that reads it back. On JAX
and PyTorch, which translate without importing TensorFlow
(`keras_transformer.utils.tensorflow_free`), also a run that imports it,
as the command did before. Last, on each backend, the command as it runs
by default: with all the preset's models (an ensemble of 5), TensorFlow
left out where it can be, the compile cache off.

The peer is a CTranslate2 process that does the same from the same weights
(written out with `export_marian` and converted beforehand, as the cache
is filled beforehand): it imports ctranslate2 and sentencepiece, loads the
model, and translates the sentence or file with beam 4, 64 at a time,
tokenizing with the preset's SentencePiece model. Needs the `dev` extra's
ctranslate2 (`--no-ctranslate2` leaves it out).
"""

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_ctranslate2 import processor  # noqa: E402

from keras_transformer.presets.registry import preset_metadata  # noqa: E402

PRESET = "transformer_multi30k_en_de"
SENTENCE = "A man is riding a bicycle."

# The CTranslate2 process: text in, text out, as the command does.
CTRANSLATE2 = """
import sys
import ctranslate2
import sentencepiece

model_dir, marian_dir, output = sys.argv[1:4]
lines = sys.argv[4:] or open(sys.stdin.fileno(), encoding="utf-8").read().splitlines()
source = sentencepiece.SentencePieceProcessor(model_file=marian_dir + "/source.spm")
target = sentencepiece.SentencePieceProcessor(model_file=marian_dir + "/target.spm")
translator = ctranslate2.Translator(model_dir, device="cpu")
batch = [["<s>", *source.encode(line, out_type=str), "</s>"] for line in lines]
results = translator.translate_batch(batch, beam_size=4, length_penalty=0.6, max_batch_size=64,
                                     max_decoding_length=max(map(len, batch)) + 50)
with open(output, "w", encoding="utf-8") as f:
    f.writelines(target.decode_pieces(r.hypotheses[0]) + "\\n" for r in results)
"""


def timed(command, env=None, stdin=None):
    start = time.perf_counter()
    result = subprocess.run(command, env={**os.environ, **(env or {})}, stdin=stdin,
                            capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(command[:4])} ... failed:\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def ours(backend, lines_file, output, cache, tensorflow=False, ensemble=False):
    """Seconds for one sentence and for the file, with `cache` as
    KERAS_TRANSFORMER_COMPILE_CACHE; `tensorflow`: imported as before
    (`KERAS_TRANSFORMER_WITHOUT_TENSORFLOW=0`); `ensemble`: with all the
    preset's models, else its first alone."""
    env = {"KERAS_BACKEND": backend, "KERAS_TRANSFORMER_COMPILE_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_TRANSFORMER_WITHOUT_TENSORFLOW": "0" if tensorflow else "1"}
    command = [sys.executable, "-m", "keras_transformer.cli", "translate", "--preset", PRESET]
    command += [] if ensemble else ["--first-model-only"]
    return (timed(command + [SENTENCE], env), timed(command + ["-i", lines_file, "-o", output], env))


def ctranslate2_process(root, lines_file, output):
    import ctranslate2

    from keras_transformer.convert import export_marian

    marian_dir = export_marian(PRESET, os.path.join(root, "marian"))
    model_dir = os.path.join(root, "ct2")
    ctranslate2.converters.TransformersConverter(marian_dir).convert(model_dir)
    command = [sys.executable, "-c", CTRANSLATE2, model_dir, marian_dir]
    with open(lines_file, encoding="utf-8") as stdin:
        return ctranslate2.__version__, (timed(command + [output, SENTENCE]), timed(command + [output], stdin=stdin))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--lines", type=int, default=256, help="test_2016_flickr sources in the file")
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--no-ctranslate2", action="store_true")
    args = parser.parse_args()
    if not args.data_dir:
        parser.error("--data-dir (or KERAS_TRANSFORMER_MULTI30K) is required")
    with tempfile.TemporaryDirectory() as root:
        lines_file, output = os.path.join(root, "in.en"), os.path.join(root, "out.de")
        with gzip.open(os.path.join(args.data_dir, "test_2016_flickr.en.gz"), "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(args.lines), f)]
        with open(lines_file, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        rows = []
        models = len(preset_metadata(PRESET).get("ensemble") or []) + 1
        if not args.no_ctranslate2:
            print("timing CTranslate2 ...", file=sys.stderr, flush=True)
            version, times = ctranslate2_process(root, lines_file, output)
            rows.append((f"CTranslate2 {version}", 1, "-", "-", *times))
        for backend in args.backends.split(","):
            print(f"timing {backend} ...", file=sys.stderr, flush=True)
            name = f"keras_transformer ({backend})"
            if backend != "tensorflow":
                # As before TensorFlow was left out, beside the rows without it.
                rows.append((name, 1, "off", "yes", *ours(backend, lines_file, output, "off", tensorflow=True)))
            imported = "yes" if backend == "tensorflow" else "no"
            rows.append((name, 1, "off", imported, *ours(backend, lines_file, output, "off")))
            if backend == "jax":
                cache = os.path.join(root, "jax-cache")
                rows.append((name, 1, "empty", imported, *ours(backend, lines_file, output, cache)))
                rows.append((name, 1, "filled", imported, *ours(backend, lines_file, output, cache)))
            rows.append((name, models, "off", imported, *ours(backend, lines_file, output, "off", ensemble=True)))
    peer = rows[0] if not args.no_ctranslate2 else None
    print(f"processor: {processor()}; preset {PRESET}; beam 4; file: {args.lines} test_2016_flickr lines")
    print()
    print("| command | models | compile cache | TensorFlow imported | one sentence (s) | file (s) "
          "| one sentence, x CTranslate2's time | file, x CTranslate2's time |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for name, models, cache, tensorflow, one, file in rows:
        ratios = f"{one / peer[4]:.2f}x | {file / peer[5]:.2f}x" if peer else "- | -"
        print(f"| {name} | {models} | {cache} | {tensorflow} | {one:.1f} | {file:.1f} | {ratios} |")


if __name__ == "__main__":
    main()

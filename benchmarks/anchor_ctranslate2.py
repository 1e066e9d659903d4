"""This package against CTranslate2 on the same weights (`decode.py --ctranslate2`).

The preset is written out with `keras_transformer.convert.export_marian`,
converted by CTranslate2's own `TransformersConverter` (what
`ct2-transformers-converter` runs) in float32 and int8 (and bfloat16
where CTranslate2 lists it among its CPU compute types: its 4.8.5 wheel
did not on an Intel Xeon with AMX), and both engines (this package in
float32, with int8 weights and in bfloat16, and an ensemble preset's
every model together in float32) translate the same
Multi30k test_2016_flickr sources with beam 4 and the same ranking:
log P / |Y|^0.6 (this package's `length_penalty="length"`, CTranslate2's
`length_penalty=0.6`), at most source length + 50 tokens, each from text
to text with the preset's tokenizer (CTranslate2 takes and gives tokens:
the timed call tokenizes and detokenizes for it as `generate` does for
this package). Sentences per second at batch 1 (the best of
`BATCH1_PASSES` passes) and batch 64 (one pass), after a pass that
compiles or warms up, and BLEU (sacreBLEU, cased) of the batch-64 pass. CTranslate2 runs with one thread and with one a core,
each timing in a process of its own, and each of its columns is the
faster of the two (its rows name the thread counts, batch 1 / batch 64);
this package runs on each Keras backend in its own process, with the
backend's default threads. CTranslate2's float32 is timed again
after each backend, and each backend's ratios are to the mean of the
timings around it (see `compare`).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

# The processor line every benchmark prints: its model name, cores, and the
# instructions by which the layers choose their products. (No framework
# imported: the backend stays each worker's to choose.)
from keras_transformer.utils.processor import describe as processor  # noqa: E402,F401

ALPHA, BEAM, OFFSET = 0.6, 4, 50
DTYPES = ("float32", "int8")
# CTranslate2's `intra_threads`: one, and one a core; each column of its
# rows is the faster of the two. On a 2-core Intel Xeon (AMX) its float32
# translated one sentence at a time at 100.5 sentences/s with one thread
# and 9.4 with two, 64 at a time at 282 and 142: with a thread a core it
# waits on its threads, and the anchor would be far below its best.
THREADS = tuple(sorted({1, os.cpu_count() or 1}))


def ctranslate2_dtypes():
    """CTranslate2's weight types to time: float32 and int8, and bfloat16
    where CTranslate2 computes in it on this CPU (the peer of this
    package's bfloat16 row)."""
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types("cpu")
    return DTYPES + (("bfloat16",) if "bfloat16" in supported else ())


def _sources(preset, data_dir, count, ensemble=False):
    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset)
    if not ensemble:
        # An ensemble preset's first model alone: the model the peers hold.
        model.set_ensemble_members([])
    sources, references = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)
    return model, sources[:count], references[:count]


# Timed passes at batch 1, after the pass that compiles or warms up: the
# best of them counts (64 at a time, one pass). One pass of 32 sentences
# lasts a fraction of a second, which other work on a shared host moves
# far: on a 2-core AMD EPYC, CTranslate2's float32 with one thread timed
# 126.0 and 165.6 sentences/s one at a time in one run, a pass each.
BATCH1_PASSES = 3


def _timed(translate, items, batch_size, passes=1):
    """Sentences per second of `translate` over `items` in batches of
    `batch_size`, the best of `passes` passes after one that warms up, and
    the last pass's outputs."""
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    for batch in batches:  # compile / warm up
        translate(batch)
    best = 0.0
    for _ in range(passes):
        start = time.perf_counter()
        outputs = [output for batch in batches for output in translate(batch)]
        best = max(best, len(items) / (time.perf_counter() - start))
    return best, outputs


def ours_worker(preset, data_dir, batch1, batch64):
    """Times this package on the current backend, with float32 weights,
    int8 weights (`model.quantize("int8")`) and bfloat16 computation
    (`from_preset(dtype="bfloat16")`); prints the rows as one JSON line."""
    import keras
    import sacrebleu

    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.presets.ensembles import member_paths

    rows = []
    # An ensemble preset's every model (what `generate` decodes with by
    # default; CTranslate2 holds one model) as a further float32 row.
    members = len(member_paths(preset))
    runs = [("float32", False), ("int8", False), ("bfloat16", False)]
    runs += [(f"float32, {1 + members} models", True)] if members else []
    for dtype, ensemble in runs:
        model, sources, references = _sources(preset, data_dir, max(batch1, batch64), ensemble=ensemble)
        if dtype == "int8":
            model.quantize("int8")
        elif dtype == "bfloat16":
            model = TransformerSeq2SeqLM.from_preset(preset, dtype="bfloat16")
            # An ensemble preset's first model alone: the model the peers hold.
            model.set_ensemble_members([])

        def translate(texts, model=model):
            return model.generate(texts, beam_size=BEAM, alpha=ALPHA, length_penalty="length",
                                  max_length_offset=OFFSET, batch_size=len(texts))

        speed1, _ = _timed(translate, sources[:batch1], 1, BATCH1_PASSES)
        speed64, outputs = _timed(translate, sources[:batch64], 64)
        bleu = sacrebleu.corpus_bleu(outputs, [references[:batch64]]).score
        rows.append({"engine": f"keras_transformer ({keras.config.backend()})", "dtype": dtype,
                     "batch1": speed1, "batch64": speed64, "bleu": bleu})
        print(f"{keras.config.backend()} {dtype}: {speed1:.1f} / {speed64:.1f} sent/s, BLEU {bleu:.1f}",
              file=sys.stderr, flush=True)
    print(json.dumps(rows))


def convert(preset, root):
    """The preset's first model written out as a Marian checkpoint and
    converted by CTranslate2 in each of `ctranslate2_dtypes()`, under
    `root`: the directories by dtype."""
    import ctranslate2

    from keras_transformer.convert import export_marian
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset, load_ensemble=False)
    marian_dir = export_marian(model, os.path.join(root, "marian"))
    directories = {}
    for dtype in ctranslate2_dtypes():
        directories[dtype] = os.path.join(root, f"ct2-{dtype}")
        ctranslate2.converters.TransformersConverter(marian_dir).convert(directories[dtype], quantization=dtype)
    return directories


def ctranslate2_worker(preset, data_dir, batch1, batch64, directory, dtype, threads):
    """Times CTranslate2 on one converted model with `threads` threads (in
    a process of its own, see `compare`); prints the row as one JSON line."""
    import ctranslate2
    import sacrebleu

    model, sources, references = _sources(preset, data_dir, max(batch1, batch64))
    tokenizer = model.preprocessor.tokenizer
    translator = ctranslate2.Translator(directory, device="cpu", intra_threads=int(threads))

    def translate(texts):
        # Text to text, as this package's `generate`: the preset's
        # tokenizer and framing (<s> pieces </s>) on both sides.
        batch = [[tokenizer.id_to_token(i) for i in row] for row in model.preprocessor.generate_preprocess(texts)]
        limit = max(map(len, batch)) + OFFSET
        results = translator.translate_batch(batch, beam_size=BEAM, length_penalty=ALPHA,
                                             max_decoding_length=limit, max_batch_size=len(batch))
        return model.preprocessor.generate_postprocess(
            [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results])

    speed1, _ = _timed(translate, sources[:batch1], 1, BATCH1_PASSES)
    speed64, outputs = _timed(translate, sources[:batch64], 64)
    bleu = sacrebleu.corpus_bleu(outputs, [references[:batch64]]).score
    print(json.dumps({"engine": f"CTranslate2 {ctranslate2.__version__}", "dtype": dtype, "threads": int(threads),
                      "batch1": speed1, "batch64": speed64, "bleu": bleu}))


def _best_of_threads(timings):
    """One CTranslate2 row from its timings with each thread count: each
    column's best, and the thread counts that gave it."""
    best1 = max(timings, key=lambda t: t["batch1"])
    best64 = max(timings, key=lambda t: t["batch64"])
    return {**best64, "batch1": best1["batch1"], "threads": f"{best1['threads']} / {best64['threads']}"}


def backend_worker(script, backend, arguments):
    """Runs `script --worker *arguments` with `KERAS_BACKEND=backend` in a
    process of its own, and gives what it printed last, as JSON; a worker
    that fails ends the run with the end of its errors."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.run([sys.executable, script, "--worker", *arguments], env=env, capture_output=True, text=True)
    if process.returncode:
        sys.exit(f"The {backend} worker failed:\n{process.stderr[-3000:]}")
    return json.loads(process.stdout.strip().splitlines()[-1])


def _worker(script, args, backend, *extra, required=True):
    """Runs a timing worker (`decode.py` with `extra`) on `backend` in a
    process of its own, its progress and errors on this process's standard
    error; its rows. A worker that fails ends the run where `required`,
    else gives None (the other engines' rows still print)."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, script, "--preset", args.preset, "--data-dir", args.data_dir,
               "--batch1-sentences", str(args.batch1_sentences), "--batch64-sentences", str(args.batch64_sentences),
               *(["--system-malloc"] if args.system_malloc else []), *extra]
    process = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    if process.returncode:
        message = f"The {backend} worker {' '.join(extra)} failed (its errors above)."
        if required:
            sys.exit(message)
        print(message, file=sys.stderr, flush=True)
        return None
    rows = json.loads(process.stdout.strip().splitlines()[-1])
    return rows if isinstance(rows, list) else [rows]


def compare(args, script):
    """The table: CTranslate2 float32 and int8 (and bfloat16, where this
    CPU has it), then this package per backend, with ratios to
    CTranslate2 float32.

    Each CTranslate2 timing runs in a process of its own, on JAX (for the
    preset's tokenizer) with TensorFlow left out: in a process that had
    imported PyTorch or run TensorFlow, or that had run CTranslate2's int8
    model, CTranslate2's float32 ran several times slower on a 2-core AMD
    machine (one sentence at a time: 5-7 sentences/s against 53-77 alone).
    The machine's speed can also drift during a run of half an hour (shared
    hosts), so CTranslate2's float32 is timed again after each backend, and
    each backend's ratios are to the mean of the two timings around it;
    every timing is printed under the table.
    """
    print(f"processor: {processor()}; preset {args.preset}; beam {BEAM}, log P / |Y|^{ALPHA}; "
          f"batch 1: {args.batch1_sentences} sentences, batch 64: {args.batch64_sentences}; memory: "
          + ("glibc's malloc as it is" if args.system_malloc else "freed memory kept for reuse (every engine)"),
          flush=True)
    with tempfile.TemporaryDirectory() as root:
        print("converting for CTranslate2 ...", file=sys.stderr, flush=True)
        directories = convert(args.preset, root)

        every = []  # every CTranslate2 timing, printed under the table

        def ctranslate2(dtype):
            # CTranslate2's best of one thread and one a core, each column
            # on its own (see `_best_of_threads`).
            timings = []
            for threads in THREADS:
                print(f"timing CTranslate2 {dtype}, {threads} thread(s) ...", file=sys.stderr, flush=True)
                timings += _worker(script, args, "jax", "--ctranslate2-engine", directories[dtype], dtype,
                                   str(threads))
            every.append(timings)
            return _best_of_threads(timings)

        rows = [ctranslate2(dtype) for dtype in directories]
        anchors = [rows[0]]
        for row in rows:
            row["anchor"] = rows[0]
        for backend in args.backends.split(","):
            print(f"timing {backend} ...", file=sys.stderr, flush=True)
            found = _worker(script, args, backend, "--ours-worker")
            anchors.append(ctranslate2("float32"))
            around = {key: (anchors[-2][key] + anchors[-1][key]) / 2 for key in ("batch1", "batch64")}
            rows.extend({**row, "anchor": around} for row in found)
    print("| engine | weights | batch 1 (sent/s) | batch 64 (sent/s) | batch 1 / CT2 fp32 | batch 64 / CT2 fp32 | BLEU |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        anchor = row["anchor"]
        engine = row["engine"] + (f" (threads {row['threads']})" if "threads" in row else "")
        print(f"| {engine} | {row['dtype']} | {row['batch1']:.1f} | {row['batch64']:.1f} "
              f"| {row['batch1'] / anchor['batch1']:.2f}x | {row['batch64'] / anchor['batch64']:.2f}x "
              f"| {row['bleu']:.1f} |", flush=True)
    print()
    print("CTranslate2 float32, timed before the first backend and after each (sentences/s, its best "
          "thread count): batch 1 " + ", ".join(f"{a['batch1']:.1f}" for a in anchors) + "; batch 64 "
          + ", ".join(f"{a['batch64']:.1f}" for a in anchors)
          + ". Each backend's ratios are to the mean of the timings before and after it; the"
          " CTranslate2 rows' to the first.")
    print("CTranslate2 by thread count, every timing in run order (batch 1 / batch 64, sentences/s): "
          + "; ".join(", ".join(f"{t['dtype']} {t['threads']} thread(s) {t['batch1']:.1f} / {t['batch64']:.1f}"
                                for t in timings) for timings in every) + ".")

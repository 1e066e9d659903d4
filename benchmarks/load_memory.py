"""How much host memory `from_preset` of an M2M100 / NLLB checkpoint takes,
against the checkpoint's float32 size, on each backend.

    python benchmarks/load_memory.py                   # d_model 512, 6+6 layers, 32,000 tokens (231 MiB)
    python benchmarks/load_memory.py --shape 600m      # NLLB-200-distilled-600M's shape (2.3 GiB)

The checkpoint is built by transformers (`M2M100ForConditionalGeneration`
with random weights, `save_pretrained`, with the tiny test tokenizer of
`tests/m2m100_fixture.py`) into `--directory` unless it is there. Each row
is a new process that first loads a tiny checkpoint of the same family
(so that imports and the backend's start are not counted), then
`TransformerSeq2SeqLM.from_preset(DIR)` (`float32`, `bfloat16`, and
`bfloat16` then `quantize("int8")`): its peak resident memory above the
memory before the load (the process's `VmHWM`, its resident high-water
mark, which also counts the warm-up's peak: an upper bound; unlike
`getrusage`'s `ru_maxrss` it does not start from the parent's memory at
the fork), the memory it holds after,
both as multiples of the float32 weights' size, and the seconds it took.

`--probe DIR WARM_UP_DIR [MODE]` runs one row's process and prints it as
JSON (`tests/test_m2m100.py` runs it).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    "small": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab_size=32000),
    "600m": dict(d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=256206),
}
MODES = ("float32", "bfloat16", "bfloat16+int8")


def resident(field="VmRSS"):
    """The process's resident memory (`VmHWM`: its peak so far), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def probe(directory, warm_up, mode="float32"):
    """One row: load `directory` after `warm_up` in this process; a dict."""
    import numpy as np

    from keras_transformer.models import TransformerSeq2SeqLM

    TransformerSeq2SeqLM.from_preset(warm_up)
    before = resident()
    start = time.perf_counter()
    dtype = mode.split("+")[0]
    model = TransformerSeq2SeqLM.from_preset(directory, **({} if dtype == "float32" else {"dtype": dtype}))
    if mode.endswith("int8"):
        model.quantize("int8")
    seconds = time.perf_counter() - start
    peak = resident("VmHWM")
    size = 4 * sum(int(np.prod(v.shape)) for v in model.backbone.weights if not v.path.endswith("scale"))
    return {"mode": mode, "float32_bytes": size, "peak": (peak - before) / size, "held": (resident() - before) / size,
            "seconds": round(seconds, 2)}


def build(directory, shape):
    """A random `m2m_100` checkpoint of `shape` in `directory` (and the
    tiny one of the same tokenizer beside it, for the warm-up)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from m2m100_fixture import save_sized
    from m2m100_fixture import save_tiny

    tiny = directory + "-tiny"
    if not os.path.isdir(tiny):
        save_tiny(tiny, "m2m100")
    if not os.path.isdir(directory):
        s = SHAPES[shape]
        save_sized(directory, tiny, d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
                   encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
                   decoder_ffn_dim=s["ffn"], vocab_size=s["vocab_size"])
    return directory, tiny


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--directory", help="where the checkpoint is (built there if absent; default: a temporary one)")
    parser.add_argument("--backends", default="torch,jax,tensorflow")
    parser.add_argument("--probe", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(*args.probe)))
        return
    temporary = None if args.directory else tempfile.mkdtemp(prefix="load-memory-")
    directory, tiny = build(args.directory or os.path.join(temporary, "checkpoint"), args.shape)
    print(f"{'backend':<11} {'mode':<14} {'float32 MiB':>11} {'peak / f32':>10} {'held / f32':>10} {'seconds':>8}")
    for backend in args.backends.split(","):
        for mode in MODES:
            result = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--probe", directory, tiny, mode], capture_output=True,
                text=True, env={**os.environ, "KERAS_BACKEND": backend},
            )
            if result.returncode:
                print(f"{backend:<11} {mode:<14} failed:\n{result.stderr[-2000:]}", flush=True)
                continue
            row = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"{backend:<11} {mode:<14} {row['float32_bytes'] / 2**20:>11.0f} {row['peak']:>10.2f} "
                  f"{row['held']:>10.2f} {row['seconds']:>8.1f}", flush=True)
    if temporary:
        shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    main()

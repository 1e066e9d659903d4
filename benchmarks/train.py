"""Training throughput on real Multi30k batches, every backend, one run.

    python benchmarks/train.py --data-dir PATH/TO/multi30k [--steps 20]
        [--model small|base] [--dtype float32,mixed_bfloat16] [--system-malloc]
        [--backends jax,tensorflow,torch] [--token-ids PAIRS.npz]

For each Keras backend (each in its own process) it times training steps of
a 3+3-layer, d_model 256, d_ff 1024, 4-head model (`--model small`; `base`:
6+6 layers, d_model 512, d_ff 2048, 8 heads) with an 8,000-token shared
vocabulary:

- `keras_transformer`: this package, on token-budget batches grouped by
  length (4,096 tokens a side), in each `--dtype` (`mixed_bfloat16`: the
  matrix products in bfloat16, weights, softmax, LayerNorm and loss in
  float32);
- `keras-hub fixed`: the same-size model built from keras-hub's
  `TokenAndPositionEmbedding`, `TransformerEncoder` and `TransformerDecoder`,
  fed as keras.io's translation example does: 64 sentences a batch, padded
  to a fixed 40 tokens;

and, as a third peer, PyTorch's `torch.nn.Transformer` of the same size on
the token-budget batches (in float32, and in bfloat16 under
`torch.autocast` for mixed precision). The figure of merit is real
(non-padding) target tokens per second. Model FLOP/s count the matrix
multiplications of the padded batch (forward and backward: 3x forward) and
are shown as a fraction of a 2048 x 2048 matmul timed in the same run on
the row's own backend, multiplied as its training step multiplies in that
precision (`backend_matmul_flops`: on JAX, mixed precision multiplies
bfloat16 operands into float32), with the processor's name and whether it
has AMX (bfloat16 matrix tiles). The products' own bfloat16 / float32
ratio, printed for each backend, bounds its "vs float32" column.

Each timing runs the same batches twice: the first pass compiles (JAX, XLA
and TensorFlow compile once per batch shape), the second is timed. Every
engine's process keeps freed memory for reuse, as `keras-transformer train`
does (`keras_transformer.utils.memory`); `--system-malloc` leaves glibc's
malloc as it is, to measure what that gives.

On a machine with a GPU every engine trains on it (Keras puts JAX and
PyTorch there itself; the `torch.nn.Transformer` peer is moved there), and
the FLOP/s are shown against the GPU's own matmul. Such machines often have
JAX and PyTorch but not TensorFlow, which the tokenizer runs on: tokenize
where TensorFlow is (`--write-token-ids PAIRS.npz`), then time there with
`--token-ids PAIRS.npz --backends jax,torch`.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

# The processor line every benchmark prints: its model name, cores, and the
# instructions by which the layers choose their products. (No framework
# imported: the backend stays each worker's to choose.)
from keras_transformer.utils.processor import describe as processor  # noqa: E402,F401

MODELS = {
    "small": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, vocabulary_size=8000),
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, vocabulary_size=8000),
}
CONFIG = dict(MODELS["small"])  # the --model chosen (set in main)
FIXED_LENGTH, FIXED_BATCH = 40, 64


def numpy_matmul_flops(size=2048, repeats=5):
    a = np.random.rand(size, size).astype("float32")
    b = np.random.rand(size, size).astype("float32")
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def torch_matmul_flops(dtype, size=2048, repeats=5, device="cpu"):
    """A PyTorch matmul's FLOP/s in `dtype` ("float32" or "bfloat16")."""
    import torch

    a = torch.rand(size, size, dtype=getattr(torch, dtype), device=device)
    b = torch.rand(size, size, dtype=getattr(torch, dtype), device=device)
    (a @ b).sum().item()
    start = time.perf_counter()
    for _ in range(repeats):
        c = a @ b
    c.sum().item()  # waits for the device
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def backend_matmul_flops(dtype, size=2048, repeats=5):
    """The FLOP/s of a product of two `size` x `size` matrices on the
    worker's Keras backend, multiplied as its training step multiplies in
    `dtype`: float32 products for "float32"; for "mixed_bfloat16",
    bfloat16 operands into a float32 result on JAX (this package's
    `runtime.bfloat16_products`, where XLA's CPU code multiplies fastest),
    into bfloat16 on TensorFlow (its oneDNN kernels, which its training
    step runs) and PyTorch. The bound of each row's "of matmul" and "vs
    float32" on that backend."""
    import keras

    backend = keras.config.backend()
    operand = "float32" if dtype == "float32" else "bfloat16"
    if backend == "torch":
        import torch

        return torch_matmul_flops(operand, size, repeats, "cuda" if torch.cuda.is_available() else "cpu")
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        a, b = (jax.random.uniform(jax.random.key(i), (size, size)).astype(operand) for i in (0, 1))
        product = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.float32))

        def run():
            return product(a, b).block_until_ready()
    else:
        import tensorflow as tf

        a, b = (tf.cast(tf.random.uniform((size, size), seed=i), operand) for i in (0, 1))

        def run():
            return tf.linalg.matmul(a, b).numpy()  # (eager kernels on a CPU run as they are called)
    run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def gpu():
    """The GPU's name if PyTorch sees one, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def step_flops(batch_size, source_length, target_length, config=CONFIG):
    """Forward+backward FLOPs of one step on a padded batch (3x forward)."""
    d, d_ff, n, vocab = config["d_model"], config["d_ff"], config["num_layers"], config["vocabulary_size"]
    S, T = source_length, target_length
    encoder = n * S * (2 * 4 * d * d + 2 * 2 * d * d_ff + 2 * 2 * S * d)
    decoder = n * T * (2 * 8 * d * d + 2 * 2 * d * d_ff + 2 * 2 * T * d + 2 * 2 * S * d)
    logits = T * 2 * d * vocab
    return 3 * batch_size * (encoder + decoder + logits)


def load_data(data_dir, limit, token_ids=None):
    """Framed `(encoder_ids, decoder_ids)` of the first `limit` en-de
    training pairs: tokenized by a tokenizer trained here, or read from
    `token_ids` (an .npz that `--write-token-ids` made), for machines
    without TensorFlow (which the tokenizer runs on)."""
    if token_ids:
        arrays = np.load(token_ids)
        return tuple(
            [ids.tolist() for ids in np.split(arrays[f"{side}_flat"], np.cumsum(arrays[f"{side}_lengths"])[:-1])][:limit]
            for side in ("encoder", "decoder")
        )
    from keras_transformer.data import tokenize_pairs
    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerTokenizer

    sources, targets = multi30k.load("train", "en", "de", data_dir=data_dir)
    tokenizer = TransformerTokenizer.from_texts(sources + targets, vocabulary_size=CONFIG["vocabulary_size"])
    encoder_ids, decoder_ids, _ = tokenize_pairs(sources[:limit], targets[:limit], tokenizer)
    return encoder_ids, decoder_ids


def write_token_ids(data_dir, path):
    encoder_ids, decoder_ids = load_data(data_dir, None)
    np.savez_compressed(path, **{
        f"{side}_{part}": array
        for side, ids in (("encoder", encoder_ids), ("decoder", decoder_ids))
        for part, array in (("flat", np.concatenate(ids).astype("int32")), ("lengths", [len(i) for i in ids]))
    })


def budget_batches(encoder_ids, decoder_ids, steps):
    from keras_transformer.data import TokenBudgetBatches

    batches = TokenBudgetBatches(encoder_ids, decoder_ids, max_tokens=4096, seed=0)
    return [b for _, b in zip(range(steps), batches)], batches.padding_fraction()


def fixed_batches(encoder_ids, decoder_ids, steps):
    """keras.io style: fixed 40-token padding, 64 sentences a batch."""
    pairs = [(e, d) for e, d in zip(encoder_ids, decoder_ids) if len(e) <= FIXED_LENGTH + 1 and len(d) <= FIXED_LENGTH + 1]
    batches = []
    for start in range(0, FIXED_BATCH * steps, FIXED_BATCH):
        enc = np.zeros((FIXED_BATCH, FIXED_LENGTH), "int32")
        dec = np.zeros((FIXED_BATCH, FIXED_LENGTH + 1), "int32")
        for row, (e, t) in enumerate(pairs[start : start + FIXED_BATCH]):
            enc[row, : min(len(e), FIXED_LENGTH)] = e[:FIXED_LENGTH]
            dec[row, : len(t)] = t
        batches.append((enc, dec[:, :-1], dec[:, 1:]))
    return batches


def time_passes(run_step, batches, flops_of):
    for batch in batches:  # compile / warm up
        run_step(batch)
    start = time.perf_counter()
    tokens = flops = 0
    for batch in batches:
        tokens += run_step(batch)
        flops += flops_of(batch)
    seconds = time.perf_counter() - start
    return {"tokens_per_second": tokens / seconds, "flops_per_second": flops / seconds, "seconds": seconds}


def worker_keras(data_dir, steps, dtypes, with_keras_hub, token_ids=None):
    import keras
    import keras_hub

    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    encoder_ids, decoder_ids = load_data(data_dir, 20000, token_ids)
    results = {"backend": keras.config.backend(), "matmul": {dtype: backend_matmul_flops(dtype) for dtype in dtypes}}
    batches, padding = budget_batches(encoder_ids, decoder_ids, steps)

    def ours_flops(batch):
        x, y, _ = batch
        return step_flops(len(y), x["encoder_token_ids"].shape[1], y.shape[1])

    for dtype in dtypes:
        keras.utils.set_random_seed(0)
        backbone = TransformerBackbone(**CONFIG, dropout=0.1, max_sequence_length=256, dtype=dtype)
        model = TransformerSeq2SeqLM(backbone)
        model.compile(warmup_steps=4000)

        def ours(batch, model=model):
            x, y, w = batch
            model.train_on_batch(x, y, sample_weight=w)
            return int(w.sum())

        results[f"keras_transformer {dtype}"] = {**time_passes(ours, batches, ours_flops), "padding": padding}
        print(f"{keras.config.backend()} {dtype} done", file=sys.stderr, flush=True)
    if not with_keras_hub:
        print(json.dumps(results))
        return

    # The keras.io translation example's model, same sizes.
    d, n = CONFIG["d_model"], CONFIG["num_layers"]
    encoder_inputs = keras.Input((None,), dtype="int32")
    x = keras_hub.layers.TokenAndPositionEmbedding(CONFIG["vocabulary_size"], FIXED_LENGTH, d)(encoder_inputs)
    for _ in range(n):
        x = keras_hub.layers.TransformerEncoder(CONFIG["d_ff"], CONFIG["num_heads"], dropout=0.1)(x)
    decoder_inputs = keras.Input((None,), dtype="int32")
    y = keras_hub.layers.TokenAndPositionEmbedding(CONFIG["vocabulary_size"], FIXED_LENGTH, d)(decoder_inputs)
    for _ in range(n):
        y = keras_hub.layers.TransformerDecoder(CONFIG["d_ff"], CONFIG["num_heads"], dropout=0.1)(y, x)
    logits = keras.layers.Dense(CONFIG["vocabulary_size"])(y)
    peer = keras.Model([encoder_inputs, decoder_inputs], logits)
    peer.compile(
        optimizer=keras.optimizers.Adam(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
    )
    fixed = fixed_batches(encoder_ids, decoder_ids, steps)

    def keras_hub_step(batch):
        enc, dec, labels = batch
        peer.train_on_batch([enc, dec], labels)
        return int((labels != 0).sum())

    results["keras_hub_fixed float32"] = {
        **time_passes(keras_hub_step, fixed, lambda b: step_flops(FIXED_BATCH, FIXED_LENGTH, FIXED_LENGTH)),
        "padding": float(1 - sum(((b[0] != 0).sum() + (b[1] != 0).sum()) for b in fixed) / (len(fixed) * 2 * FIXED_BATCH * FIXED_LENGTH)),
    }
    print(json.dumps(results))


def torch_transformer(config):
    """The PyTorch peer: `torch.nn.Transformer` of `config`'s size with a
    tied embedding scaled by sqrt(d_model); token id 0 is padding. Called
    on `(encoder_ids, decoder_ids)`, it returns the logits."""
    import torch

    d = config["d_model"]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(config["vocabulary_size"], d)
            self.transformer = torch.nn.Transformer(
                d, config["num_heads"], config["num_layers"], config["num_layers"], config["d_ff"],
                dropout=0.1, batch_first=True,
            )

        def forward(self, enc, dec):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(dec.shape[1], device=dec.device)
            hidden = self.transformer(
                self.embedding(enc) * d**0.5, self.embedding(dec) * d**0.5, tgt_mask=mask,
                src_key_padding_mask=enc == 0, tgt_key_padding_mask=dec == 0,
                memory_key_padding_mask=enc == 0, tgt_is_causal=True,
            )
            return hidden @ self.embedding.weight.T

    return Model()


def worker_torch(data_dir, steps, dtypes, token_ids=None):
    import torch

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    encoder_ids, decoder_ids = load_data(data_dir, 20000, token_ids)
    batches, padding = budget_batches(encoder_ids, decoder_ids, steps)

    def flops(batch):
        x, y, _ = batch
        return step_flops(len(y), x["encoder_token_ids"].shape[1], y.shape[1])

    results = {"backend": "torch", "matmul": {
        dtype: torch_matmul_flops("float32" if dtype == "float32" else "bfloat16", device=device) for dtype in dtypes
    }}
    for dtype in dtypes:
        torch.manual_seed(0)
        model = torch_transformer(CONFIG).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
        # Mixed precision as PyTorch does it: float32 weights, bfloat16 autocast.
        autocast = dict(device_type=device, dtype=torch.bfloat16, enabled=dtype == "mixed_bfloat16")

        def step(batch, model=model, optimizer=optimizer, loss_fn=loss_fn, autocast=autocast):
            x, y, w = batch
            enc = torch.from_numpy(x["encoder_token_ids"]).long().to(device)
            dec = torch.from_numpy(x["decoder_token_ids"]).long().to(device)
            labels = torch.from_numpy(y).long().to(device)
            optimizer.zero_grad()
            with torch.autocast(**autocast):
                logits = model(enc, dec)
            loss = loss_fn(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
            loss.backward()
            optimizer.step()
            loss.item()  # waits for the device, as Keras's train_on_batch does
            return int(w.sum())

        results[f"torch.nn.Transformer {dtype}"] = {**time_passes(step, batches, flops), "padding": padding}
    print(json.dumps(results))


def run_worker(kind, backend, args, with_keras_hub=True):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [
        sys.executable, __file__, "--worker", kind, "--steps", str(args.steps),
        *(["--data-dir", args.data_dir] if args.data_dir else []),
        *(["--token-ids", args.token_ids] if args.token_ids else []),
        "--model", args.model, "--dtype", args.dtype, *([] if with_keras_hub else ["--no-keras-hub"]),
        *(["--system-malloc"] if args.system_malloc else []),
    ]
    # The worker's errors and warnings show on this process's standard error.
    output = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--steps", type=int, default=20, help="batches per timed pass")
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--model", choices=sorted(MODELS), default="small", help="small: 3+3 layers, d_model 256; base: 6+6, 512")
    parser.add_argument("--dtype", default="float32,mixed_bfloat16", help="comma-separated: float32, mixed_bfloat16")
    parser.add_argument("--no-keras-hub", action="store_true", help="skip the keras-hub fixed-padding peer")
    parser.add_argument(
        "--system-malloc", action="store_true",
        help="leave glibc's malloc as it is (by default every engine keeps freed memory for reuse, "
        "as `keras-transformer train` does: keras_transformer.utils.memory)",
    )
    parser.add_argument(
        "--token-ids", metavar="NPZ",
        help="read the tokenized pairs from this file (made by --write-token-ids) instead of tokenizing "
        "Multi30k: for machines without TensorFlow, such as a GPU machine with JAX and PyTorch only",
    )
    parser.add_argument("--write-token-ids", metavar="NPZ", help="tokenize Multi30k, write the pairs here and stop")
    parser.add_argument("--worker", choices=["keras", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    CONFIG.clear()
    CONFIG.update(MODELS[args.model])
    dtypes = args.dtype.split(",")
    if args.worker and not args.system_malloc:
        from keras_transformer.utils.memory import reuse_freed_memory

        reuse_freed_memory()
    if args.write_token_ids:
        return write_token_ids(args.data_dir, args.write_token_ids)
    if args.worker == "keras":
        return worker_keras(args.data_dir, args.steps, dtypes, not args.no_keras_hub, args.token_ids)
    if args.worker == "torch":
        return worker_torch(args.data_dir, args.steps, dtypes, args.token_ids)

    gpu_name = gpu()
    numpy_rate = numpy_matmul_flops()
    # Each row's FLOP/s against a product of its precision on its own
    # backend, timed in its worker (`backend_matmul_flops`); on a GPU (where
    # every engine trains), against PyTorch's products there.
    if gpu_name:
        gpu_rates = {dtype: torch_matmul_flops(dtype, size=8192, repeats=20, device="cuda") for dtype in ("float32", "bfloat16")}
    rows = []  # (model, dtype, backend, result, {dtype: its worker's matmul FLOP/s})
    worker_rates = {}  # backend: its Keras worker's matmul FLOP/s by dtype
    workers = [("keras", backend) for backend in args.backends.split(",")] + [("torch", "torch")]
    for kind, backend in workers:
        print(f"timing {'torch.nn.Transformer' if kind == 'torch' else backend} ...", file=sys.stderr)
        result = run_worker(kind, backend, args, not args.no_keras_hub)
        rates = result.pop("matmul")
        if kind == "keras":
            worker_rates[backend] = rates
        rows += [(*name.split(" "), backend, value, rates) for name, value in result.items() if name != "backend"]

    config = MODELS[args.model]
    print(f"\nModel: {config['num_layers']}+{config['num_layers']} layers, d_model {config['d_model']}, "
          f"d_ff {config['d_ff']}, {config['num_heads']} heads, vocabulary {config['vocabulary_size']:,}")
    print(f"Processor: {processor()}")
    if gpu_name:
        print(f"GPU: {gpu_name} (every engine trains on it); matmul 8192x8192: PyTorch float32 "
              f"{gpu_rates['float32'] / 1e12:.0f} TFLOP/s, bfloat16 {gpu_rates['bfloat16'] / 1e12:.0f} TFLOP/s")
    print("Memory: " + ("glibc's malloc as it is" if args.system_malloc else "freed memory kept for reuse (every engine)"))
    print(f"Matmul 2048x2048, GFLOP/s: NumPy float32 {numpy_rate / 1e9:.0f}; each backend as its training "
          "multiplies (its worker's): " + "; ".join(
              f"{backend} " + ", ".join(f"{dtype} {rate / 1e9:,.0f}" for dtype, rate in rates.items())
              + (f" ({rates['mixed_bfloat16'] / rates['float32']:.2f}x)" if len(rates) == 2 else "")
              for backend, rates in worker_rates.items()) + "\n")
    speed = {(name, dtype, backend): r["tokens_per_second"] for name, dtype, backend, r, _ in rows}
    # (The column against keras-hub's fixed padding only where its rows were timed.)
    with_fixed = any(name == "keras_hub_fixed" for name, *_ in rows)
    print("| model (backend) | dtype | target tokens/s | vs float32 | padding | model GFLOP/s | of matmul |"
          + (" vs keras-hub fixed |" if with_fixed else ""))
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if with_fixed else ""))
    for name, dtype, backend, r, rates in rows:
        tokens = r["tokens_per_second"]
        versus_float32 = f"{tokens / speed[name, 'float32', backend]:.2f}x" if (name, "float32", backend) in speed else ""
        fixed = speed.get(("keras_hub_fixed", "float32", backend))
        versus_fixed = f"{tokens / fixed:.2f}x" if fixed and name != "keras_hub_fixed" else ""
        rate = gpu_rates["float32" if dtype == "float32" else "bfloat16"] if gpu_name else rates.get(dtype)
        of_matmul = f"{r['flops_per_second'] / rate:.0%}" if rate else ""
        print(
            f"| {name} ({backend}) | {dtype} | {tokens:,.0f} | {versus_float32} | {r['padding']:.1%} "
            f"| {r['flops_per_second'] / 1e9:.0f} | {of_matmul} |" + (f" {versus_fixed} |" if with_fixed else "")
        )


if __name__ == "__main__":
    main()

"""Translation speed: the key/value cache against recomputing, and against
keras-hub's samplers, on every backend in one run.

    python benchmarks/decode.py --preset PRESET_OR_DIR --data-dir PATH/TO/multi30k

For each Keras backend (each in its own process) it translates Multi30k
test_2016_flickr sources with the same trained model, greedy and beam 4
(alpha 0.6 where the method has a length penalty), one sentence at a time
(batch 1) and 64 at a time (batch 64):

- `cached`: this package's beam search (`keras_transformer.decoding`): one
  position a step through the self-attention key/value cache, the
  encoder-decoder attention's keys and values computed once per source;
- `recompute`: the same search and stopping rule without a cache: each step
  runs the whole decoder over the prefix (rounded up to 8 positions, so
  compiled code is reused) and projects the encoder output into keys and
  values again;
- `keras-hub`: keras-hub's `GreedySampler` / `BeamSampler(4)` in keras-hub's
  compiled generate loop, on the same model and cache through
  `TransformerSeq2SeqLM.generate_step`. `BeamSampler` has no length penalty,
  keeps extending beams that have ended, and stops when every beam of every
  source has produced an end token or at the batch's maximum length.

`--ctranslate2` instead compares this package with CTranslate2 on the same
weights, float32 and int8 (see `anchor_ctranslate2.py`; needs the `dev`
extra's ctranslate2), and `--transformers` with transformers'
`MarianMTModel` on the same weights, on the GPU where PyTorch sees one
(see `anchor_transformers.py`; needs the `dev` extra's transformers).

Every method has the same maximum output length (source length + 50). The
figure of merit is sentences per second; each timing is a second pass over
the same sentences, after a first pass that compiles. BLEU (sacreBLEU, cased)
is that of the batch-64 sentences, to show what each method produces.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


class Recompute:
    """A model stand-in for `beam_search` that decodes without a cache: pass
    it with `functions=recompute.decoding_functions()`.

    Its "cache" holds the output prefix of every beam (a NumPy array that
    the step reorders to the beams' parents) and the encoder output; each
    step runs the whole decoder over the prefix.
    """

    def __init__(self, model):
        self.model = model
        self.backbone = model.backbone
        self.special_token_ids = model.special_token_ids
        self._functions = None

    def empty_self_attention_cache(self, rows, max_length):
        prefix = np.zeros((rows, max_length), "int32")
        return [(prefix, prefix)]

    def decoding_functions(self):
        if self._functions is None:
            from keras import ops

            from keras_transformer.runtime.compiled import compile_for_inference
            from keras_transformer.decoding.rules import never_output_bias
            from keras_transformer.decoding.transforms import candidates

            model = self.model
            never_output = never_output_bias(model)

            def encode(encoder_token_ids, encoder_padding_mask):
                output = model.encode(encoder_token_ids, encoder_padding_mask)
                return output, [(output, output)]

            def prefix_step(prefix, index, encoder_output, encoder_padding_mask, log_probs, settings):
                # One row of encoder output a source, for its beams' rows.
                beams = ops.shape(log_probs)[1]
                encoder_output = ops.repeat(encoder_output, beams, axis=0)
                encoder_padding_mask = ops.repeat(encoder_padding_mask, beams, axis=0)
                hidden = model.backbone.decode(prefix, encoder_output, encoder_padding_mask=encoder_padding_mask)
                logits = model.backbone.token_embedding(ops.take(hidden, index, axis=1), reverse=True)
                return candidates(logits, log_probs, index, never_output, settings)

            compiled_step = compile_for_inference(model, prefix_step)

            def step(token_ids, index, cache, encoder_padding_mask, parents, log_probs, **kwargs):
                (prefix, _), (encoder_output, _) = cache[0]
                index = int(index)
                prefix = ops.convert_to_numpy(prefix)[ops.convert_to_numpy(parents)]
                prefix[:, index] = np.asarray(token_ids)[:, 0]
                length = min(_round_up(index + 1, 8), prefix.shape[1])
                values, indices = compiled_step(
                    prefix[:, :length], np.asarray(index, "int32"), encoder_output, encoder_padding_mask,
                    log_probs, **kwargs,
                )
                return values, indices, [((prefix, prefix), (encoder_output, encoder_output))]

            self._functions = (compile_for_inference(model, encode), step)
        return self._functions


def worker(preset, data_dir, batch1_sentences, batch64_sentences):
    import keras
    import keras_hub
    import sacrebleu

    from keras_transformer.datasets import multi30k
    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.decoding.beam import pad_sources
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset)
    # An ensemble preset's first model alone: the model the peers hold.
    model.set_ensemble_members([])
    sources, references = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)
    count = max(batch1_sentences, batch64_sentences)
    token_ids = model.preprocessor.generate_preprocess(sources[:count], model.backbone.max_sequence_length)
    recompute = Recompute(model)

    def ours(target, sampler):
        beam_size, alpha = (1, 0.0) if sampler == "greedy" else (4, 0.6)
        functions = target.decoding_functions() if isinstance(target, Recompute) else None
        return lambda batch: [
            r[0][0] if r else []
            for r in beam_search(target, batch, beam_size=beam_size, alpha=alpha, functions=functions)
        ]

    def keras_hub_sampler(sampler):
        instance = keras_hub.samplers.GreedySampler() if sampler == "greedy" else keras_hub.samplers.BeamSampler(4)

        def translate(batch):
            ids, mask = pad_sources(batch, model.preprocessor.tokenizer.pad_token_id)
            inputs = {"encoder_token_ids": ids, "encoder_padding_mask": mask}
            return model.generate(inputs, sampler=instance, batch_size=len(batch))

        return translate

    def timed(translate, batch_size, n):
        batches = [token_ids[i : i + batch_size] for i in range(0, n, batch_size)]
        for batch in batches:  # compile / warm up
            translate(batch)
        start = time.perf_counter()
        outputs = [output for batch in batches for output in translate(batch)]
        return n / (time.perf_counter() - start), outputs

    rows = []
    for sampler in ("greedy", "beam"):
        methods = {
            "cached": ours(model, sampler),
            "recompute": ours(recompute, sampler),
            "keras-hub": keras_hub_sampler(sampler),
        }
        for batch_size, n in ((1, batch1_sentences), (64, batch64_sentences)):
            for method, translate in methods.items():
                print(f"{keras.config.backend()} {sampler} batch {batch_size} {method}", file=sys.stderr, flush=True)
                speed, outputs = timed(translate, batch_size, n)
                bleu = None
                if batch_size == 64:
                    texts = model.preprocessor.generate_postprocess(outputs)
                    bleu = sacrebleu.corpus_bleu(texts, [references[:n]]).score
                rows.append(
                    {"sampler": sampler, "batch": batch_size, "method": method, "sentences_per_second": speed, "bleu": bleu}
                )
    print(json.dumps({"backend": keras.config.backend(), "rows": rows}))


def run_worker(backend, args):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [
        sys.executable, __file__, "--worker", "--preset", args.preset, "--data-dir", args.data_dir,
        "--batch1-sentences", str(args.batch1_sentences), "--batch64-sentences", str(args.batch64_sentences),
        *(["--system-malloc"] if args.system_malloc else []),
    ]
    process = subprocess.run(command, env=env, capture_output=True, text=True)
    if process.returncode:
        sys.exit(f"The {backend} worker failed:\n{process.stderr[-3000:]}")
    return json.loads(process.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, help="a trained TransformerSeq2SeqLM preset (name or directory)")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--batch1-sentences", type=int, default=16, help="sentences timed one at a time")
    parser.add_argument("--batch64-sentences", type=int, default=128, help="sentences timed 64 at a time")
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="compare beam 4 with CTranslate2 (float32, int8) on the same weights")
    parser.add_argument("--transformers", action="store_true",
                        help="compare beam 4 with transformers' MarianMTModel (float32, bfloat16) on the same "
                        "weights, on the GPU where PyTorch sees one")
    parser.add_argument(
        "--system-malloc", action="store_true",
        help="leave glibc's malloc as it is (by default every engine keeps freed memory for reuse, "
        "as `keras-transformer translate` does: keras_transformer.utils.memory)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ours-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ctranslate2-engine", nargs=3, metavar=("DIRECTORY", "DTYPE", "THREADS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--transformers-engine", nargs=2, metavar=("DIRECTORY", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ctranslate2_engine or args.transformers_engine:
        # CTranslate2 (or transformers) alone in its process: no TensorFlow (see
        # `anchor_ctranslate2.compare`); JAX reads the preset's tokenizer.
        from keras_transformer.utils.tensorflow_free import skip_tensorflow

        skip_tensorflow()
    if not args.system_malloc:
        from keras_transformer.utils.memory import reuse_freed_memory

        reuse_freed_memory()  # in this process (CTranslate2's runs) and in each worker
    if args.worker:
        return worker(args.preset, args.data_dir, args.batch1_sentences, args.batch64_sentences)
    if args.ours_worker:
        import anchor_ctranslate2

        return anchor_ctranslate2.ours_worker(args.preset, args.data_dir, args.batch1_sentences, args.batch64_sentences)
    if args.transformers or args.transformers_engine:
        import anchor_transformers

        if args.transformers_engine:
            return anchor_transformers.transformers_worker(
                args.data_dir, args.batch1_sentences, args.batch64_sentences, *args.transformers_engine
            )
        return anchor_transformers.compare(args, os.path.abspath(__file__))
    if args.ctranslate2 or args.ctranslate2_engine:
        import anchor_ctranslate2

        if args.ctranslate2_engine:
            return anchor_ctranslate2.ctranslate2_worker(
                args.preset, args.data_dir, args.batch1_sentences, args.batch64_sentences, *args.ctranslate2_engine
            )
        return anchor_ctranslate2.compare(args, os.path.abspath(__file__))

    print("| backend | decoding | batch | cached (sent/s) | recompute (sent/s) | keras-hub (sent/s) "
          "| cached / recompute | cached / keras-hub | BLEU cached | BLEU keras-hub |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for backend in args.backends.split(","):
        print(f"timing {backend} ...", file=sys.stderr, flush=True)
        result = run_worker(backend, args)
        table = {}
        for row in result["rows"]:
            table.setdefault((row["sampler"], row["batch"]), {})[row["method"]] = row
        for (sampler, batch), methods in table.items():
            speed = {method: methods[method]["sentences_per_second"] for method in methods}
            bleu = {method: methods[method]["bleu"] for method in methods}
            name = "greedy" if sampler == "greedy" else "beam 4"
            bleu_cells = (
                f"{bleu['cached']:.1f} | {bleu['keras-hub']:.1f}" if bleu["cached"] is not None else " | "
            )
            print(
                f"| {backend} | {name} | {batch} | {speed['cached']:.1f} | {speed['recompute']:.1f} "
                f"| {speed['keras-hub']:.1f} | {speed['cached'] / speed['recompute']:.1f}x "
                f"| {speed['cached'] / speed['keras-hub']:.1f}x | {bleu_cells} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

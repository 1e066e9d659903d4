"""Train Multi30k models from token ids, on a machine without TensorFlow.

The tokenizer (tensorflow-text) and `keras-transformer train` need
TensorFlow; a GPU machine often has only PyTorch or JAX. This script splits
the work: tokenize where TensorFlow is, train and score where the
accelerator is, and turn the weights back into a preset where TensorFlow is.

    # 1. Here: every split's pairs as token ids, with the preset's vocabulary.
    python examples/multi30k_token_ids.py prepare --data-dir PATH/TO/multi30k \\
        --preset transformer_multi30k_en_de --output pairs.npz
    # 2. There (KERAS_BACKEND=torch or jax; Keras and keras-hub installed):
    KERAS_BACKEND=torch python examples/multi30k_token_ids.py train --token-ids pairs.npz \\
        --pair en-de --seed 2 --output ende-s2.npz
    # 3. Here again: the weights as a preset, with the tokenizer they were trained with.
    python examples/multi30k_token_ids.py to-preset --weights ende-s2.npz \\
        --preset transformer_multi30k_en_de --output-dir presets/ende-s2

`train` is the first stage of `examples/multi30k_presets.py` (3+3 layers,
d_model 256, dropout 0.3, batches of about 4,096 tokens, Adam with 800
warm-up steps, label smoothing 0.1, the last 5 epochs averaged) with the
preset's vocabulary, and prints the averaged model's lowercased sacreBLEU
on val, test_2016_flickr and test_2017_flickr (beam 4, alpha 0.6), which
it also writes beside the weights (`NAME.json`). `--seconds` stops it
earlier, after the last epoch that fits, leaving time to score.
"""

import argparse
import json
import os
import platform
import time

import numpy as np

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")
LANGUAGES = ("en", "de")


def prepare(args):
    """Writes each split's token ids, its raw sentences and the vocabulary."""
    from keras_transformer.data.batching import tokenize_pairs
    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerTokenizer

    tokenizer = TransformerTokenizer.from_preset(args.preset)
    arrays = {"vocabulary": np.frombuffer(tokenizer.proto, dtype=np.uint8)}
    for split in SPLITS:
        lines = dict(zip(LANGUAGES, multi30k.load(split, *LANGUAGES, args.data_dir)))
        for source, target in (LANGUAGES, LANGUAGES[::-1]):
            # The encoder's framing of the source, the decoder's of the target.
            encoder_ids, decoder_ids, dropped = tokenize_pairs(lines[source], lines[target], tokenizer)
            if dropped:
                raise SystemExit(f"{split} {source}-{target}: {dropped} pairs do not fit the model.")
            arrays[f"{split}.encoder.{source}"] = _flat(encoder_ids)
            arrays[f"{split}.decoder.{target}"] = _flat(decoder_ids)
            arrays[f"{split}.text.{source}"] = np.array(lines[source])
    np.savez_compressed(args.output, **arrays)
    counts = ", ".join(f"{split} {len(arrays[split + '.text.en']):,}" for split in SPLITS)
    print(f"Wrote {args.output}: {counts} pairs, a vocabulary of {tokenizer.vocabulary_size():,}.")


def _flat(sequences):
    """Id lists of several lengths as one array: the lengths, then the ids."""
    lengths = np.array([len(s) for s in sequences], "int32")
    return np.concatenate([lengths, *[np.asarray(s, "int32") for s in sequences]])


def _unflat(array, count):
    lengths, values = array[:count], array[count:]
    return [a.tolist() for a in np.split(values, np.cumsum(lengths)[:-1])]


class TokenIds:
    """The arrays `prepare` wrote."""

    def __init__(self, path):
        self.arrays = np.load(path)

    def texts(self, split, language):
        return [str(line) for line in self.arrays[f"{split}.text.{language}"]]

    def ids(self, split, kind, language):
        return _unflat(self.arrays[f"{split}.{kind}.{language}"], len(self.arrays[f"{split}.text.{language}"]))

    def detokenizer(self):
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_proto=self.arrays["vocabulary"].tobytes())


def train(args):
    """Trains one model on the token ids, averages its last epochs and scores it."""
    import keras

    from keras_transformer.data.batching import TokenBudgetBatches
    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.metrics import corpus_scores
    from keras_transformer.models import CONFIGS
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.schedules import paper_optimizer

    started = time.time()
    data = TokenIds(args.token_ids)
    source, target = args.pair.split("-")
    keras.utils.set_random_seed(args.seed)
    batches = TokenBudgetBatches(
        data.ids("train", "encoder", source)[: args.limit], data.ids("train", "decoder", target)[: args.limit],
        max_tokens=args.max_tokens, max_length=256, seed=args.seed,
    )
    detokenizer = data.detokenizer()
    backbone = TransformerBackbone(vocabulary_size=detokenizer.get_piece_size(), max_sequence_length=256,
                                   **{**CONFIGS["small"], "dropout": args.dropout})
    model = TransformerSeq2SeqLM(backbone)
    model.compile(optimizer=paper_optimizer(backbone.d_model, args.warmup_steps), label_smoothing=0.1)
    print(f"{backbone.count_params():,} parameters, {len(batches)} batches an epoch")

    # Averaged in memory rather than through `keras_transformer.callbacks`'
    # checkpoint files: a rented machine's disk is gone when it is.
    class AverageLastEpochs(keras.callbacks.Callback):
        """Keeps the weights of the last `keep` epochs in memory (section 6.1's averaging) and stops
        after the last epoch that ends, with time to score, before `--seconds` have passed."""

        def __init__(self, keep):
            super().__init__()
            self.keep, self.kept, self.epoch_seconds = keep, [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.time()

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_seconds.append(time.time() - self.began)
            self.kept = [*self.kept, backbone.get_weights()][-self.keep:]
            print(f"epoch {epoch + 1}: loss {logs['loss']:.4f}, {self.epoch_seconds[-1]:.1f} s", flush=True)
            if args.seconds and time.time() + max(self.epoch_seconds[-3:]) + args.scoring_seconds > (
                started + args.seconds
            ):
                print(f"--seconds {args.seconds}: stopping after epoch {epoch + 1}")
                self.model.stop_training = True

    def repeated():
        while True:
            yield from batches

    average = AverageLastEpochs(args.keep_checkpoints)
    # keras.Model's own fit: keras-hub's would turn the batches into a tf.data pipeline.
    keras.Model.fit(model, repeated(), steps_per_epoch=len(batches), epochs=args.epochs, callbacks=[average], verbose=0)
    backbone.set_weights([np.mean(w, axis=0).astype(w[0].dtype) for w in zip(*average.kept)])

    result = {"pair": args.pair, "seed": args.seed, "epochs": len(average.epoch_seconds),
              "steps": len(average.epoch_seconds) * len(batches), "averaged_epochs": len(average.kept),
              "seconds_an_epoch": round(float(np.median(average.epoch_seconds)), 2), "hardware": _hardware()}
    # On token ids with beam_search: `evaluate_translation` takes text, and
    # its tokenizer needs TensorFlow.
    for split in ("val", "test_2016_flickr", "test_2017_flickr"):
        sources = data.ids(split, "encoder", source)[: args.score_limit]
        translations = [None] * len(sources)
        order = np.argsort([len(s) for s in sources])
        for start in range(0, len(order), 200):
            rows = order[start : start + 200]
            found = beam_search(model, [sources[r] for r in rows], beam_size=4, alpha=0.6)
            for row, hypotheses in zip(rows, found):
                translations[row] = detokenizer.decode(hypotheses[0][0]) if hypotheses else ""
        result[split] = round(corpus_scores(translations, data.texts(split, target)[: len(sources)])["bleu_lowercase"], 2)
        print(f"{split}: lowercased BLEU {result[split]}")
    np.savez(args.output, *[w.astype("float16") for w in backbone.get_weights()])
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"Wrote {args.output} (float16 weights)")


def _hardware():
    """What trains: the accelerator, else the CPU, and the backend."""
    import keras

    backend = keras.config.backend()
    device = f"{os.cpu_count()}-core {platform.machine()} CPU"
    if backend == "torch":
        import torch

        device = f"{torch.cuda.get_device_name()} GPU" if torch.cuda.is_available() else device
    elif backend == "jax":
        import jax

        device = f"{jax.devices()[0].device_kind} GPU" if jax.default_backend() == "gpu" else device
    return f"{device}; {backend} backend"


def to_preset(args):
    """The weights in a preset: the architecture, tokenizer and settings of
    `--preset`; the metadata's `training` block from the `NAME.json` that
    `train` wrote beside them, if it is there."""
    from keras_transformer.models import TransformerSeq2SeqLM

    if os.path.exists(args.output_dir) and os.listdir(args.output_dir):
        raise SystemExit(f"{args.output_dir} is not empty: choose another --output-dir.")
    model = TransformerSeq2SeqLM.from_preset(args.preset)
    weights = np.load(args.weights)
    values = [weights[f"arr_{i}"] for i in range(len(weights.files))]
    shapes = [tuple(w.shape) for w in model.backbone.weights]
    if [v.shape for v in values] != shapes:
        raise SystemExit(f"{args.weights} does not hold the weights of {args.preset}'s architecture.")
    model.backbone.set_weights([v.astype(w.dtype) for v, w in zip(values, model.backbone.weights)])
    metadata = {}
    record = os.path.splitext(args.weights)[0] + ".json"
    if os.path.exists(record):
        with open(record) as f:
            result = json.load(f)
        source, target = result["pair"].split("-")
        metadata = {
            "languages": {"source": source, "target": target},
            "training": {
                "command": f"python examples/multi30k_token_ids.py train --token-ids PAIRS --pair {result['pair']} "
                           f"--seed {result['seed']} --epochs {result['epochs']} --output WEIGHTS",
                "steps": result["steps"],
                "averaged_checkpoints": result["averaged_epochs"],
                "hardware": result.get("hardware", "unknown"),
            },
            "scores_lowercase": {split: result[split] for split in ("val", "test_2016_flickr", "test_2017_flickr")},
        }
    model.save_to_preset(args.output_dir, metadata=metadata)
    print(f"Wrote {args.output_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    p = steps.add_parser("prepare", help="tokenize Multi30k (needs TensorFlow)")
    p.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    p.add_argument("--preset", default="transformer_multi30k_en_de", help="whose vocabulary to use")
    p.add_argument("--output", required=True, help="the .npz to write")
    p = steps.add_parser("train", help="train and score one model (no TensorFlow needed)")
    p.add_argument("--token-ids", required=True, help="the .npz `prepare` wrote")
    p.add_argument("--pair", choices=("en-de", "de-en"), default="en-de")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seconds", type=float, help="stop after the last epoch that ends within this many seconds")
    p.add_argument("--scoring-seconds", type=float, default=60, help="time kept for scoring under --seconds")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--warmup-steps", type=int, default=800)
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--keep-checkpoints", type=int, default=5, help="how many last epochs to average")
    p.add_argument("--limit", type=int, help="train on the first N pairs only (a smoke test)")
    p.add_argument("--score-limit", type=int, help="score the first N sentences of each split only")
    p.add_argument("--output", required=True, help="the .npz of float16 weights to write")
    p = steps.add_parser("to-preset", help="write trained weights as a preset (needs TensorFlow)")
    p.add_argument("--weights", required=True, help="the .npz `train` wrote")
    p.add_argument("--preset", default="transformer_multi30k_en_de", help="whose architecture and tokenizer")
    p.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    {"prepare": prepare, "train": train, "to-preset": to_preset}[args.step](args)


if __name__ == "__main__":
    main()

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
`--init-weights` starts it from a preset (an ensemble preset's first
model) or earlier weights instead of at random, and `--distilled` adds a
teacher's translations of the training sources (`distill`) to the
references, or puts them in their place (`--distilled-only`).

`--num-layers`, `--d-model`, `--d-ff` and `--num-heads` train another size
than `small`, `--peak-learning-rate` scales the schedule to peak at that
rate, and `--initial-step` goes on with a run from `--init-weights` where
its schedule stopped; the record beside the weights keeps them all.
`ensemble-preset` writes several runs as one ensemble preset, scored on
both test sets (the shipped presets):

    python examples/multi30k_token_ids.py ensemble-preset --token-ids pairs.npz \\
        --members ende-s2.npz,ende-s2-more.npz ende-s3.npz ende-s1.npz --output-dir presets/en-de

`to-preset` stores the weights in float32 and `ensemble-preset` in
float16; with `--weights-storage int8` both store them in int8 (half the
size of float16, loading as float models; `ensemble-preset`'s scores are
then those of the int8 weights).

`distill` scores an ensemble (presets or `train`'s weights) on val and
test_2016_flickr and translates the training sources with it. `pipeline`
runs the three on one GPU, each phase's runs side by side as processes
(a small model's steps are bound by the host, so they share the GPU well),
each within its phase's seconds: teachers from scratch, then the ensemble
of the current model and the teachers that came within `--teacher-margin`
val BLEU of it translates the training sources, then students start from
the current model and train on the references, the translations, or both,
and each student averaged with the current model is scored too; the best
of each pair (by val BLEU) is written out:

    KERAS_BACKEND=torch python examples/multi30k_token_ids.py pipeline --token-ids pairs.npz \
        --initial en-de=transformer_multi30k_en_de de-en=transformer_multi30k_de_en \
        --output-dir OUT
"""

import argparse
import json
import os
import platform
import shutil
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

    started = time.time()
    data = TokenIds(args.token_ids)
    keras.utils.set_random_seed(args.seed)
    sources, targets, distilled = _training_pairs(data, args)
    batches = TokenBudgetBatches(sources, targets, max_tokens=args.max_tokens, max_length=256, seed=args.seed)
    architecture = _architecture(args)
    model = _model(data, dropout=args.dropout, weights=args.init_weights, architecture=architecture)
    backbone = model.backbone
    _compile(model, args)
    print(f"{backbone.count_params():,} parameters, {len(batches)} batches an epoch "
          f"({distilled:,} distilled pairs)", flush=True)

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
            if args.write_every and (epoch + 1) % args.write_every == 0:
                # A run cut off (a rented machine taken back) keeps its last average.
                write(self.average(), epoch + 1)
            if args.seconds and time.time() + max(self.epoch_seconds[-3:]) + args.scoring_seconds > (
                started + args.seconds
            ):
                print(f"--seconds {args.seconds}: stopping after epoch {epoch + 1}")
                self.model.stop_training = True

        def average(self):
            return [np.mean(w, axis=0).astype(w[0].dtype) for w in zip(*self.kept)]

    def write(weights, epochs):
        with open(args.output + ".partial", "wb") as file:  # whole or not at all
            np.savez(file, *[w.astype("float16") for w in weights])
        os.replace(args.output + ".partial", args.output)
        _write_record(args.output, record(epochs))

    def record(epochs):
        return {"pair": args.pair, "seed": args.seed, "architecture": architecture, "dropout": args.dropout,
                "max_tokens": args.max_tokens, "warmup_steps": args.warmup_steps,
                "peak_learning_rate": args.peak_learning_rate, "epochs": epochs,
                "initial_step": args.initial_step,
                "steps": args.initial_step + epochs * len(batches),
                "averaged_epochs": len(average.kept),
                "seconds_an_epoch": round(float(np.median(average.epoch_seconds)), 2), "hardware": _hardware(),
                "initial_weights": bool(args.init_weights), "distilled_pairs": distilled,
                "distilled_only": bool(args.distilled and args.distilled_only)}

    def repeated():
        while True:
            yield from batches

    average = AverageLastEpochs(args.keep_checkpoints)
    # keras.Model's own fit: keras-hub's would turn the batches into a tf.data pipeline.
    keras.Model.fit(model, repeated(), steps_per_epoch=len(batches), epochs=args.epochs, callbacks=[average], verbose=0)
    backbone.set_weights(average.average())
    result = record(len(average.epoch_seconds))
    # Saved before scoring: weights outlast a scoring that fails.
    write(backbone.get_weights(), len(average.epoch_seconds))
    if not args.no_scoring:
        result.update(_scores(model, data, args.pair, args.score_limit))
        _write_record(args.output, result)
    print(f"Wrote {args.output} (float16 weights)")


def _compile(model, args):
    """Adam on the paper's schedule with label smoothing 0.1, peaking at
    `args.peak_learning_rate` if given, its step at `args.initial_step`."""
    from keras_transformer.schedules import paper_optimizer

    d_model = model.backbone.d_model
    # The paper's schedule peaks at d_model**-0.5 * warmup_steps**-0.5;
    # scaled, it peaks at the rate asked for (fairseq's `--lr` with
    # `inverse_sqrt` has the same shape).
    scale = args.peak_learning_rate * (d_model * args.warmup_steps) ** 0.5 if args.peak_learning_rate else 1.0
    model.compile(optimizer=paper_optimizer(d_model, args.warmup_steps, scale), label_smoothing=0.1)
    if args.initial_step:
        # The schedule goes on from there; Adam's moments start anew.
        model.optimizer.build(model.trainable_variables)
        model.optimizer.iterations.assign(args.initial_step)


def _record_path(weights):
    """The record beside an .npz of weights: `NAME.json` for `NAME.npz`."""
    return os.path.splitext(weights)[0] + ".json"


def _read_record(weights):
    """What `train` (and `score`) wrote beside `weights`; {} if nothing."""
    if not weights.endswith(".npz") or not os.path.exists(_record_path(weights)):
        return {}
    with open(_record_path(weights)) as f:
        return json.load(f)


def _write_record(weights, record):
    with open(_record_path(weights), "w") as f:
        json.dump(record, f, indent=1)


def _architecture(args):
    """The `small` configuration's sizes, with those given on the command
    line in their place; where training starts from a model, that model's."""
    from keras_transformer.models import CONFIGS

    sizes = {key: value for key, value in CONFIGS["small"].items() if key != "dropout"}
    given = {key: getattr(args, key) for key in sizes if getattr(args, key) is not None}
    if args.initial_step and not args.init_weights:
        raise SystemExit("--initial-step goes on with a run: give its weights with --init-weights.")
    if args.init_weights:
        if given:
            raise SystemExit(f"--init-weights brings its own sizes; leave out {', '.join(sorted(given))}.")
        return _weights_architecture(args.init_weights)
    return {**sizes, **given}


def _weights_architecture(path):
    """The sizes of the model in a preset, or in an .npz `train` wrote
    (the `small` configuration's where its record names none)."""
    from keras_transformer.models import CONFIGS

    keys = ("num_layers", "d_model", "d_ff", "num_heads")
    if path.endswith(".npz"):
        return _read_record(path).get("architecture") or {k: CONFIGS["small"][k] for k in keys}
    from keras_transformer.models import TransformerBackbone

    config = TransformerBackbone.from_preset(path, load_weights=False).get_config()
    return {key: config[key] for key in keys}


def _training_pairs(data, args):
    """The training split's encoder and decoder ids for `args.pair` (its
    first `args.limit`), with the translations in `args.distilled` beside
    them, or instead of them with `args.distilled_only`; and how many
    translations there are."""
    source, target = args.pair.split("-")
    all_sources = data.ids("train", "encoder", source)
    sources = all_sources[: args.limit]
    targets = data.ids("train", "decoder", target)[: args.limit]
    if not args.distilled:
        return sources, targets, 0
    # Sequence-level knowledge distillation (Kim and Rush, 2016): a
    # teacher's translations of the training sources.
    teacher = np.load(args.distilled)
    rows = teacher["rows"].tolist()
    if args.distilled_only:
        sources, targets = [], []
    return sources + [all_sources[r] for r in rows], targets + _unflat(teacher["decoder"], len(rows)), len(rows)


def _model(data, dropout=0.0, weights=None, architecture=None):
    """A Transformer on the pairs' vocabulary: with `weights` (a preset, or
    an .npz that `train` wrote) and their sizes if given, else of
    `architecture`'s sizes."""
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    if weights:
        architecture = _weights_architecture(weights)
    backbone = TransformerBackbone(vocabulary_size=data.detokenizer().get_piece_size(), max_sequence_length=256,
                                   dropout=dropout, **architecture)
    model = TransformerSeq2SeqLM(backbone)
    if weights:
        values = _load_weights(weights)
        if [v.shape for v in values] != [tuple(w.shape) for w in backbone.weights]:
            raise SystemExit(f"{weights} does not hold the weights of a Transformer of {architecture} "
                             "on this vocabulary.")
        backbone.set_weights([v.astype(w.dtype) for v, w in zip(values, backbone.weights)])
    return model


def _models_of(paths):
    """`paths` with each ensemble preset among them (a preset name or
    directory) followed by the directories of its other models, which are
    backbone presets."""
    from keras_transformer.presets.ensembles import member_paths
    from keras_transformer.presets.registry import resolve

    expanded = []
    for path in paths:
        expanded.append(path)
        if not path.endswith(".npz"):
            expanded += [os.path.join(resolve(path), member) for member in member_paths(path)]
    return expanded


def _ensemble(data, paths):
    """The model at `paths[0]`, or the ensemble of all of them; an
    ensemble preset among them counts as all its models."""
    from keras_transformer.decoding.ensemble import Ensemble

    models = [_model(data, weights=path) for path in _models_of(paths)]
    return models[0] if len(models) == 1 else Ensemble(models)


def _load_weights(path):
    """The backbone's weights from an .npz that `train` wrote, or from a
    preset (a name or a directory; its tokenizer is not loaded, so no
    TensorFlow is needed)."""
    if not path.endswith(".npz"):
        from keras_transformer.models import TransformerBackbone

        return TransformerBackbone.from_preset(path).get_weights()
    weights = np.load(path)
    return [weights[f"arr_{i}"] for i in range(len(weights.files))]


def _translate(model, sources, detokenizer=None, batch_size=200, order=None, seconds=None):
    """Beam 4, alpha 0.6 translations of `sources` (token id lists), as
    text with `detokenizer`, else as id lists; `None` for those not reached
    within `seconds`. Batches are of similar lengths, in `order` if given."""
    from keras_transformer.decoding.beam import beam_search

    started = time.time()
    translations = [None] * len(sources)
    by_length = np.argsort([len(s) for s in sources], kind="stable")
    chunks = [by_length[i : i + batch_size] for i in range(0, len(by_length), batch_size)]
    for index in order if order is not None else range(len(chunks)):
        if seconds and time.time() - started > seconds:
            break
        rows = chunks[index]
        found = beam_search(model, [sources[r] for r in rows], beam_size=4, alpha=0.6)
        for row, hypotheses in zip(rows, found):
            ids = hypotheses[0][0] if hypotheses else []
            translations[row] = detokenizer.decode(ids) if detokenizer else ids
    return translations


def _scores(model, data, pair, limit=None, splits=("val", "test_2016_flickr", "test_2017_flickr")):
    """Lowercased sacreBLEU of `model` on `splits`, beam 4, alpha 0.6, on
    the token ids `prepare` wrote (with beam_search: `evaluate_translation`
    takes text and a model with its tokenizer, which this one lacks)."""
    from keras_transformer.metrics import corpus_scores

    source, target = pair.split("-")
    result = {}
    for split in splits:
        sources = data.ids(split, "encoder", source)[:limit]
        translations = _translate(model, sources, data.detokenizer())
        references = data.texts(split, target)[: len(sources)]
        result[split] = round(corpus_scores(translations, references)["bleu_lowercase"], 2)
        print(f"{split}: lowercased BLEU {result[split]}", flush=True)
    return result


def distill(args):
    """Translates the training sources with an ensemble of `--weights`
    (beam 4, alpha 0.6) and writes them as decoder token ids, for `train
    --distilled`; scores the ensemble first."""
    started = time.time()
    data = TokenIds(args.token_ids)
    model = _ensemble(data, args.weights)
    result = {"pair": args.pair, "teachers": [os.path.basename(path) for path in args.weights]}
    result.update(_scores(model, data, args.pair, args.score_limit, splits=("val", "test_2016_flickr")))
    sources = data.ids("train", "encoder", args.pair.split("-")[0])[: args.limit]
    chunks = -(-len(sources) // args.batch_size)
    # Batches in a random order: a translation cut short by --seconds still
    # covers every length.
    order = np.random.default_rng(0).permutation(chunks)
    left = args.seconds - (time.time() - started) if args.seconds else None
    translations = _translate(model, sources, batch_size=args.batch_size, order=order, seconds=left)
    rows = [i for i, ids in enumerate(translations) if ids is not None]
    special = model.special_token_ids
    decoder_ids = [special.frame_target(translations[r]) for r in rows]
    np.savez(args.output, rows=np.array(rows, "int32"), decoder=_flat(decoder_ids))
    result.update(distilled_pairs=len(rows), seconds=round(time.time() - started, 1))
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"Wrote {args.output}: {len(rows):,} of {len(sources):,} training sources translated "
          f"in {result['seconds']} s", flush=True)


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
    """The weights in a preset: the tokenizer and settings of `--preset`,
    the sizes of the model the weights are of; the metadata's `training`
    block from the `NAME.json` that `train` wrote beside them, if it is
    there."""
    from keras_transformer.models import TransformerSeq2SeqLM

    if os.path.exists(args.output_dir) and os.listdir(args.output_dir):
        raise SystemExit(f"{args.output_dir} is not empty: choose another --output-dir.")
    template = TransformerSeq2SeqLM.from_preset(args.preset, load_weights=False, load_ensemble=False)
    model = _task_with_weights(template, args.weights)
    metadata = {}
    result = _read_record(args.weights)
    if result:
        source, target = result["pair"].split("-")
        metadata = {
            "languages": {"source": source, "target": target},
            "training": {
                "command": _train_command(result),
                "steps": result["steps"],
                "averaged_checkpoints": result["averaged_epochs"],
                "hardware": result.get("hardware", "unknown"),
            },
            "scores_lowercase": {
                split: result[split] for split in ("val", "test_2016_flickr", "test_2017_flickr") if split in result
            },
        }
    model.save_to_preset(args.output_dir, metadata=metadata, weights_storage=_weights_storage(args))
    print(f"Wrote {args.output_dir}")


def _weights_storage(args):
    """`--weights-storage`: "float" (the weights as the model holds them)
    or "int8" (half the size of float16; loads as a float model)."""
    return getattr(args, "weights_storage", None) or "float"


def _task_with_weights(template, weights):
    """A task with `template`'s preprocessor and settings (its dtype too),
    of the sizes and with the weights in `weights` (an .npz `train` wrote
    or a preset)."""
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    config = {**template.backbone.get_config(), **_weights_architecture(weights)}
    model = TransformerSeq2SeqLM(TransformerBackbone.from_config(config), preprocessor=template.preprocessor)
    values = _load_weights(weights)
    if [v.shape for v in values] != [tuple(w.shape) for w in model.backbone.weights]:
        raise SystemExit(f"{weights} does not hold the weights of a model of its recorded sizes on the "
                         "preset's vocabulary.")
    model.backbone.set_weights([v.astype(w.dtype) for v, w in zip(values, model.backbone.weights)])
    return model


def _train_command(record):
    """The `train` command line that a record's settings come from."""
    command = (f"python examples/multi30k_token_ids.py train --token-ids PAIRS --pair {record['pair']} "
               f"--seed {record['seed']} --epochs {record['epochs']}")
    if record.get("initial_weights"):  # a later stage: the sizes are those of the weights it starts from
        command += f" --init-weights PREVIOUS_STAGE.npz --initial-step {record.get('initial_step', 0)}"
    else:
        for key, value in (record.get("architecture") or {}).items():
            command += f" --{key.replace('_', '-')} {value}"
    for key in ("dropout", "max_tokens", "warmup_steps", "peak_learning_rate"):
        if record.get(key) is not None:
            command += f" --{key.replace('_', '-')} {record[key]}"
    return command + " --output WEIGHTS"


def ensemble_preset(args):
    """An ensemble preset (`keras_transformer.presets.ensembles`) of weights
    that `train` wrote: the tokenizer of `--preset`, the first member's
    model with the others as its ensemble, weights in float16 (or, with
    `--weights-storage int8`, in int8: `keras_transformer.presets.int8`);
    in metadata.json each member's training stages (their records) and the
    ensemble's scores on test_2016_flickr and test_2017_flickr, beam 4 and
    alpha 0.6 and greedy, of the weights as saved."""
    import keras

    from keras_transformer.metrics import evaluate_translation
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.presets import preset_metadata

    if os.path.exists(args.output_dir) and os.listdir(args.output_dir):
        raise SystemExit(f"{args.output_dir} is not empty: choose another --output-dir.")
    stages = [member.split(",") for member in args.members]
    records = [[_read_record(path) for path in paths] for paths in stages]
    pairs = {member[-1].get("pair") for member in records}
    if len(pairs) != 1 or None in pairs:
        raise SystemExit(f"The members must be records of one pair, each with its NAME.json; got pairs {pairs}.")
    pair = pairs.pop()
    source, target = pair.split("-")
    template = TransformerSeq2SeqLM.from_preset(
        args.preset, load_weights=False, load_ensemble=False, dtype="float16"
    )
    models = [_task_with_weights(template, paths[-1]) for paths in stages]
    models[0].set_ensemble_members(models[1:])
    template_metadata = preset_metadata(args.preset)
    names = {"en": "English", "de": "German"}
    sizes = [f"{m.backbone.num_layers}+{m.backbone.num_layers} layers d_model {m.backbone.d_model}" for m in models]
    metadata = {
        "languages": {"source": source, "target": target},
        "data": f"Multi30k task 1 train split, {pair}, 29,000 sentence pairs",
        "data_terms": template_metadata.get("data_terms"),
        "training": {
            "script": "examples/multi30k_token_ids.py",
            "members": [
                {"stages": [{"command": _train_command(record), **{key: record.get(key) for key in (
                    "steps", "averaged_epochs", "seconds_an_epoch", "hardware", "val", "test_2016_flickr",
                    "test_2017_flickr")}} for record in member]}
                for member in records
            ],
            "steps": [member[-1].get("steps") for member in records],
            "hardware": sorted({record.get("hardware", "unknown") for member in records for record in member}),
        },
        "weights_dtype": "int8" if _weights_storage(args) == "int8" else "float16",
        "decoding": {"beam_size": 4, "alpha": 0.6, "max_length_offset": 50},
        "keras_version": keras.version(),
    }
    staging = _temporary_directory()
    try:
        # Scored as saved: float16 (or int8) weights loaded into float32 models.
        models[0].save_to_preset(staging, metadata=metadata, weights_storage=_weights_storage(args))
        ensemble = TransformerSeq2SeqLM.from_preset(staging)
        data = TokenIds(args.token_ids)
        scores, greedy = {}, {}
        for split in ("test_2016_flickr", "test_2017_flickr"):
            sources, references = data.texts(split, source)[: args.limit], data.texts(split, target)[: args.limit]
            for decoding, table in (({"beam_size": 4, "alpha": 0.6}, scores), ({"sampler": "greedy"}, greedy)):
                result = evaluate_translation(ensemble, sources, references, batch_size=64, **decoding)
                table[split] = {key: value for key, value in result.items() if key != "translations"}
                print(f"{split} {'greedy' if table is greedy else 'beam 4'}: BLEU {result['bleu']:.2f}, "
                      f"lowercased {result['bleu_lowercase']:.2f}", flush=True)
        first = scores["test_2016_flickr"]
        metadata.update(
            description=(
                f"An ensemble of {len(models)} Transformers ({', '.join(sizes)}; shared "
                f"{models[0].backbone.vocabulary_size:,}-token BPE vocabulary) trained on Multi30k "
                f"{names[source]} to {names[target]}, decoded together; test_2016_flickr BLEU "
                f"{first['bleu']:.1f} (lowercased {first['bleu_lowercase']:.1f}), beam 4."
            ),
            scores=scores,
            greedy_scores=greedy,
        )
        if args.limit:
            metadata["scored_sentences"] = args.limit  # a smoke test's scores, not the split's
        models[0].save_to_preset(args.output_dir, metadata=metadata, weights_storage=_weights_storage(args))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"Wrote {args.output_dir}")


def pipeline(args):
    """Teachers, their ensemble's translations, then students, on one
    accelerator: each phase's runs side by side as processes (a small model
    leaves most of a GPU idle), each within its phase's seconds. Writes the
    best student of each pair (by val BLEU), `summary.json` with every run's
    scores, and `log.txt`, into `--output-dir`."""
    import subprocess
    import sys

    os.makedirs(args.output_dir, exist_ok=True)
    work = os.path.join(args.output_dir, "runs") if args.keep_runs else _temporary_directory()
    os.makedirs(work, exist_ok=True)
    initial = dict(item.split("=", 1) for item in args.initial)
    pairs = list(initial)
    # Each run's host work on a couple of cores, not every run on all of them.
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    common = ["--token-ids", args.token_ids] + (["--limit", str(args.limit)] if args.limit else [])
    if args.score_limit:
        common += ["--score-limit", str(args.score_limit)]

    def run_phase(name, runs, seconds):
        if not runs:
            return
        began = time.time()
        print(f"{name}: {len(runs)} runs side by side, {seconds:.0f} s", flush=True)
        processes = []
        for label, arguments in runs:
            log = open(os.path.join(work, label + ".log"), "w")
            # The run's own options after the common ones, so that they win.
            command = [sys.executable, os.path.abspath(__file__), arguments[0], *common, *arguments[1:]]
            processes.append((label, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        for label, process, log in processes:
            try:
                process.wait(timeout=max(1.0, began + seconds + args.grace_seconds - time.time()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
            print(f"  {label}: exit {process.returncode}", flush=True)
        print(f"{name}: {time.time() - began:.0f} s", flush=True)
        if all(process.returncode for _, process, _ in processes):
            with open(os.path.join(work, runs[0][0] + ".log")) as f:
                print(f.read()[-3000:])
            raise SystemExit(f"{name}: every run failed; the first one's log ends above.")

    # Process start-up (imports, the accelerator's) is not in a run's --seconds.
    start_up = 20
    teachers = {
        pair: [os.path.join(work, f"teacher-{pair}-s{seed}.npz") for seed in args.teacher_seeds] for pair in pairs
    }
    runs = [(f"teacher-{pair}-s{seed}", ["train", "--pair", pair, "--seed", str(seed),
             "--seconds", str(args.teacher_seconds - start_up), "--scoring-seconds", str(args.scoring_seconds),
             "--output", path]) for pair in pairs for seed, path in zip(args.teacher_seeds, teachers[pair])]
    if runs:  # the current models scored beside the teachers, to compare them with
        runs += [(f"initial-{pair}", ["distill", "--pair", pair, "--weights", initial[pair], "--limit", "0",
                  "--output", os.path.join(work, f"initial-{pair}.npz")]) for pair in pairs]
    run_phase("teachers", runs, args.teacher_seconds)

    # Teachers that trained too briefly to come near the current model on
    # val would drag the ensemble down: they are left out.
    for pair in pairs if args.teacher_seeds else ():
        floor = _val_bleu(os.path.join(work, f"initial-{pair}.json")) - args.teacher_margin
        teachers[pair] = [t for t in teachers[pair] if _val_bleu(t.replace(".npz", ".json")) >= floor]
        print(f"{pair}: teachers {[os.path.basename(t) for t in teachers[pair]]} (val BLEU >= {floor:.2f})")
    variants = {"distilled-and-references": [], "distilled-only": ["--distilled-only"], "references-only": None}
    variants = {name: options for name, options in variants.items() if name in args.students}
    distilled = {pair: os.path.join(work, f"distilled-{pair}.npz") for pair in pairs}
    runs = [(f"distilled-{pair}", ["distill", "--pair", pair, "--seconds", str(args.distill_seconds - start_up),
             "--weights", initial[pair], *teachers[pair],
             "--batch-size", str(args.batch_size), "--output", distilled[pair]]) for pair in pairs]
    # Only students that read translations need them.
    run_phase("distillation", runs if any(v is not None for v in variants.values()) else [], args.distill_seconds)
    runs, students = [], []
    for pair in pairs:
        for variant, options in variants.items():
            if options is not None and not os.path.exists(distilled[pair]):
                continue
            students.append((pair, variant))
            extra = [] if options is None else ["--distilled", distilled[pair], *options]
            runs.append((f"student-{pair}-{variant}", [
                "train", "--pair", pair, "--init-weights", initial[pair], "--epochs", "100", *extra,
                "--seconds", str(args.student_seconds - start_up), "--scoring-seconds", str(args.scoring_seconds),
                "--output", os.path.join(work, f"student-{pair}-{variant}.npz")]))
    run_phase("students", runs, args.student_seconds)

    # Each student's weights averaged with those it started from (section
    # 6.1's checkpoint averaging, across stages), scored as a candidate too.
    runs, initial_weights = [], {}
    for pair, variant in students:
        path = os.path.join(work, f"student-{pair}-{variant}.npz")
        if os.path.exists(path):
            if pair not in initial_weights:
                initial_weights[pair] = _load_weights(initial[pair])
            average = os.path.join(work, f"average-{pair}-{variant}.npz")
            _write_average([initial_weights[pair], _load_weights(path)], average, _weights_architecture(path))
            runs.append((f"average-{pair}-{variant}", ["score", "--pair", pair, "--weights", average]))
    run_phase("averages", runs, args.average_seconds)

    summary = {}
    for name in sorted(os.listdir(work)):
        if name.endswith(".json"):
            with open(os.path.join(work, name)) as f:
                summary[name.removesuffix(".json")] = json.load(f)
    with open(os.path.join(args.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.output_dir, "log.txt"), "w") as out:
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                with open(os.path.join(work, name)) as f:
                    out.write(f"==> {name}\n" + f.read() + "\n")
    for pair in pairs:
        candidates = {
            k: v for k, v in summary.items() if k.startswith((f"student-{pair}-", f"average-{pair}-")) and "val" in v
        }
        if not candidates:
            print(f"{pair}: no student finished")
            continue
        best = max(candidates, key=lambda k: candidates[k]["val"])
        for extension in (".npz", ".json"):
            written = os.path.join(args.output_dir, f"student-{pair}{extension}")
            shutil.copy(os.path.join(work, best + extension), written)
        print(f"{pair}: best student {best}: {candidates[best]}", flush=True)


def _write_average(models, path, architecture=None):
    """The element-wise mean of several models' weights, in float16 as
    `train` writes them, with a record of their sizes if given."""
    means = [np.mean([w.astype("float32") for w in weights], axis=0) for weights in zip(*models)]
    np.savez(path, *[w.astype("float16") for w in means])
    if architecture:
        _write_record(path, {"architecture": architecture})


def score(args):
    """Lowercased sacreBLEU of a model or an ensemble on val,
    test_2016_flickr and test_2017_flickr: added to a model's record, or
    written to `--output` (which an ensemble needs)."""
    if len(_models_of(args.weights)) > 1 and not args.output:
        raise SystemExit("Scores of an ensemble need --output (a .json to write): no model's record is theirs.")
    data = TokenIds(args.token_ids)
    if args.output:
        result = {"pair": args.pair, "models": [os.path.basename(path) for path in args.weights]}
    else:  # added to the model's record, whose training settings stay
        result = {**_read_record(args.weights[0]), "pair": args.pair}
    result.update(_scores(_ensemble(data, args.weights), data, args.pair, args.score_limit))
    with open(args.output or _record_path(args.weights[0]), "w") as f:
        json.dump(result, f, indent=1)


def _val_bleu(path):
    """The val BLEU a run recorded; minus infinity where it recorded none."""
    try:
        with open(path) as f:
            return json.load(f)["val"]
    except (OSError, KeyError, ValueError):
        return float("-inf")


def _temporary_directory():
    import tempfile

    return tempfile.mkdtemp(prefix="multi30k-runs-")


WEIGHTS_STORAGE_HELP = ("how the preset stores the weights: float (as the model holds them) or int8 "
                        "(half the size of float16; loads as a float model)")


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
    p.add_argument("--peak-learning-rate", type=float,
                   help="the schedule's learning rate at the end of the warm-up (default: the paper's, "
                        "d_model**-0.5 * warmup_steps**-0.5)")
    p.add_argument("--initial-step", type=int, default=0,
                   help="the schedule's step to start at (to go on from --init-weights where its run stopped)")
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--num-layers", type=int, help="encoder and decoder layers each (default: the `small` model's)")
    p.add_argument("--d-model", type=int, help="model width (default: the `small` model's)")
    p.add_argument("--d-ff", type=int, help="feed-forward width (default: the `small` model's)")
    p.add_argument("--num-heads", type=int, help="attention heads (default: the `small` model's)")
    p.add_argument("--no-scoring", action="store_true", help="write the weights unscored (`score` them elsewhere)")
    p.add_argument("--keep-checkpoints", type=int, default=5, help="how many last epochs to average")
    p.add_argument("--write-every", type=int,
                   help="also write the average so far every N epochs (a run cut off keeps its last one)")
    p.add_argument("--limit", type=int, help="train on the first N pairs only (a smoke test)")
    p.add_argument("--score-limit", type=int, help="score the first N sentences of each split only")
    p.add_argument("--init-weights",
                   help="start from this model (a preset: an ensemble's first model; or an .npz `train` wrote), "
                        "not at random")
    p.add_argument("--distilled", help="also train on these translations of the training sources (`distill`)")
    p.add_argument("--distilled-only", action="store_true", help="train on --distilled alone, not the references")
    p.add_argument("--output", required=True, help="the .npz of float16 weights to write")
    p = steps.add_parser("distill", help="score an ensemble and translate the training sources with it")
    p.add_argument("--token-ids", required=True, help="the .npz `prepare` wrote")
    p.add_argument("--pair", choices=("en-de", "de-en"), default="en-de")
    p.add_argument("--weights", nargs="+", required=True,
                   help="the models (presets, an ensemble preset with all its models, or .npz files `train` wrote)")
    p.add_argument("--batch-size", type=int, default=200, help="sources translated together")
    p.add_argument("--seconds", type=float, help="stop translating after this many seconds")
    p.add_argument("--limit", type=int, help="translate the first N training sources only (0: score only)")
    p.add_argument("--score-limit", type=int, help="score the first N sentences of each split only")
    p.add_argument("--output", required=True, help="the .npz of translations to write")
    p = steps.add_parser("score", help="score a model or an ensemble; the scores go beside the first model")
    p.add_argument("--token-ids", required=True, help="the .npz `prepare` wrote")
    p.add_argument("--pair", choices=("en-de", "de-en"), default="en-de")
    p.add_argument("--weights", nargs="+", required=True,
                   help="the models (presets, an ensemble preset with all its models, or .npz files `train` wrote)")
    p.add_argument("--limit", type=int, help="ignored (the pipeline passes it to every step)")
    p.add_argument("--score-limit", type=int, help="score the first N sentences of each split only")
    p.add_argument("--output", help="the .json to write (default: the model's record, NAME.json beside NAME.npz)")
    p = steps.add_parser("pipeline", help="teachers, distillation and students side by side on one GPU")
    p.add_argument("--token-ids", required=True, help="the .npz `prepare` wrote")
    p.add_argument("--initial", nargs="+", required=True, metavar="PAIR=MODEL",
                   help="each pair's current model (a preset, or an .npz `train` wrote): a teacher, and where "
                        "students start")
    p.add_argument("--teacher-seeds", type=int, nargs="*", default=[1, 2, 3],
                   help="seeds of the teachers trained from scratch (none: the current model teaches alone)")
    p.add_argument("--students", nargs="+", default=["distilled-and-references", "distilled-only", "references-only"],
                   choices=["distilled-and-references", "distilled-only", "references-only"],
                   help="what the students, which start from the current model, train on")
    # Six teachers sharing an H200 took 11-12 s an epoch: 30 epochs in about 6 minutes.
    p.add_argument("--teacher-seconds", type=float, default=420, help="the teachers' phase")
    p.add_argument("--distill-seconds", type=float, default=90, help="the translation phase")
    p.add_argument("--student-seconds", type=float, default=240, help="the students' phase")
    p.add_argument("--average-seconds", type=float, default=60,
                   help="the phase that scores each student averaged with the model it started from")
    p.add_argument("--teacher-margin", type=float, default=1.5,
                   help="leave out teachers more than this many val BLEU below the current model")
    p.add_argument("--scoring-seconds", type=float, default=25, help="time each run keeps for scoring")
    p.add_argument("--grace-seconds", type=float, default=30, help="how long past its phase a run may go")
    p.add_argument("--batch-size", type=int, default=1000, help="sources translated together when distilling")
    p.add_argument("--limit", type=int, help="train on the first N pairs only (a smoke test)")
    p.add_argument("--score-limit", type=int, help="score the first N sentences of each split only")
    p.add_argument("--keep-runs", action="store_true", help="keep every run's files under OUTPUT_DIR/runs")
    p.add_argument("--output-dir", required=True)
    p = steps.add_parser("to-preset", help="write trained weights as a preset (needs TensorFlow)")
    p.add_argument("--weights", required=True, help="the .npz `train` wrote")
    p.add_argument("--preset", default="transformer_multi30k_en_de", help="whose tokenizer and settings")
    p.add_argument("--weights-storage", choices=["float", "int8"], default="float", help=WEIGHTS_STORAGE_HELP)
    p.add_argument("--output-dir", required=True)
    p = steps.add_parser("ensemble-preset", help="write an ensemble of trained weights as a preset, scored")
    p.add_argument("--token-ids", required=True, help="the .npz `prepare` wrote (its test sentences are scored)")
    p.add_argument("--members", nargs="+", required=True, metavar="STAGE1.npz[,STAGE2.npz...]",
                   help="each model as the weights of its training stages, the last its final weights; the "
                        "first model's tokenizer settings are --preset's")
    p.add_argument("--preset", default="transformer_multi30k_en_de", help="whose tokenizer and settings")
    p.add_argument("--limit", type=int, help="score the first N sentences of each test set only (a smoke test)")
    p.add_argument("--weights-storage", choices=["float", "int8"], default="float", help=WEIGHTS_STORAGE_HELP)
    p.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    commands = {"prepare": prepare, "train": train, "distill": distill, "score": score, "pipeline": pipeline,
                "to-preset": to_preset, "ensemble-preset": ensemble_preset}
    commands[args.step](args)


if __name__ == "__main__":
    main()

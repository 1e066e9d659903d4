"""Train and package the Multi30k presets shipped with keras_transformer.

The shipped presets `transformer_multi30k_en_de` and
`transformer_multi30k_de_en` trained in two stages. The first comes from
these two commands (from the repository root; a run that is killed resumes
when the command is repeated):

    KERAS_BACKEND=torch python examples/multi30k_presets.py train --pair en-de \\
        --data-dir PATH/TO/multi30k --run-dir runs/multi30k-en-de
    python examples/multi30k_presets.py package --pair en-de \\
        --data-dir PATH/TO/multi30k --run-dir runs/multi30k-en-de

`train` is `keras-transformer train` with the settings below: the paper's
recipe (shared BPE vocabulary, batches of about 4,096 tokens grouped by
length, Adam(0.9, 0.98, 1e-9) with warm-up, label smoothing 0.1, the last 5
checkpoints averaged) on a 3+3-layer, d_model 256 model sized for a CPU,
with dropout 0.3 for the small corpus. `package` scores the averaged model
with sacreBLEU on test_2016_flickr and test_2017_flickr (beam 4, alpha 0.6,
as in the paper), and writes the preset, weights stored in float16, into
`keras_transformer/presets/NAME/` with its training command, data terms and
scores in `metadata.json`.

The second stage trains `LONGER_EPOCHS` more epochs from the first one as
packaged (`keras-transformer train --from-preset`; the learning-rate
schedule goes on from the first stage's last step). The preset's metadata
then lists both stages, and its wall time is theirs together (the same for
en-de with `--pair en-de`):

    python examples/multi30k_presets.py package --pair de-en \\
        --data-dir PATH/TO/multi30k --run-dir runs/multi30k-de-en --output-root stage-1
    KERAS_BACKEND=torch python examples/multi30k_presets.py train --pair de-en \\
        --data-dir PATH/TO/multi30k --run-dir runs/multi30k-de-en-longer \\
        --from-preset stage-1/transformer_multi30k_de_en
    python examples/multi30k_presets.py package --pair de-en \\
        --data-dir PATH/TO/multi30k --run-dir runs/multi30k-de-en-longer

A stage takes hours on a CPU. To try the steps first, `train --steps 20`
trains 20 steps only, and `package --output-root somewhere-else --limit 50`
scores its model on 50 sentences of each test split (neither writes over
the shipped presets).
"""

import argparse
import glob
import json
import os
import platform
import shutil
import tempfile

from keras_transformer.utils.arguments import positive_int

PAIRS = {"en-de": ("en", "de"), "de-en": ("de", "en"), "en-fr": ("en", "fr")}
SETTINGS = dict(
    config="small", dropout=0.3, vocabulary_size=8000, max_tokens=4096, epochs=30,
    warmup_steps=800, keep_checkpoints=5, bleu_sentences=200, seed=0,
)
# Epochs of the second stage, for the pairs that have one.
LONGER_EPOCHS = {"en-de": 12, "de-en": 12}
DECODING = dict(beam_size=4, alpha=0.6, max_length_offset=50)
TEST_SPLITS = ("test_2016_flickr", "test_2017_flickr")
DATA_TERMS = (
    "Multi30k (Elliott et al., 2016, 'Multi30K: Multilingual English-German Image "
    "Descriptions') is derived from Flickr30K and licensed for non-commercial research "
    "and educational use only; so are these weights."
)
PACKAGE_PRESETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "keras_transformer", "presets")


def preset_name(pair):
    return "transformer_multi30k_" + pair.replace("-", "_")


def train_command(pair, run=None):
    """The first stage's `keras-transformer train` command; with `run` (its
    run.json), the seed and dtype that run trained with."""
    source, target = PAIRS[pair]
    run = run or {}
    settings = {**SETTINGS, "seed": run.get("seed", SETTINGS["seed"])}
    if run.get("dtype") not in (None, "float32"):
        settings["dtype"] = run["dtype"]
    if run.get("steps"):
        settings["steps"] = run["steps"]
    options = " ".join(
        f"--{key.replace('_', '-')} {value}" for key, value in settings.items() if key != "config"
    )
    return (
        f"keras-transformer train --source {source} --target {target} --config {SETTINGS['config']} "
        f"{options} --data-dir DATA --output-dir RUN"
    )


def longer_settings(pair, epochs=None, steps=None):
    """The second stage's settings: the first's, for `epochs` (default:
    `LONGER_EPOCHS[pair]`) more epochs, or `steps` steps if given; the
    architecture and vocabulary come from the first stage."""
    skip = ("config", "vocabulary_size")
    epochs = epochs or LONGER_EPOCHS[pair]
    settings = {**{k: v for k, v in SETTINGS.items() if k not in skip}, "epochs": epochs}
    if steps:
        settings["steps"] = steps
    return settings


def longer_command(pair, epochs=None, start="STAGE1", data="DATA", run="RUN2", steps=None):
    """The `keras-transformer train` command of a later stage: from the
    preset `start`, on the data in `data`, into `run`."""
    source, target = PAIRS[pair]
    options = " ".join(
        f"--{key.replace('_', '-')} {value}" for key, value in longer_settings(pair, epochs, steps).items()
    )
    return (
        f"keras-transformer train --from-preset {start} --source {source} --target {target} "
        f"{options} --data-dir {data} --output-dir {run}"
    )


def first_stage_record(preset):
    """The `training` block of the preset a second stage starts from; exits
    with a message if it lacks what the second stage's metadata needs."""
    from keras_transformer.presets import preset_metadata

    training = preset_metadata(preset).get("training") or {}
    missing = [key for key in ("command", "steps", "wall_time_hours") if key not in training]
    if missing:
        raise SystemExit(
            f"{preset!r} has no training record to build on (its metadata.json lacks training."
            f"{', training.'.join(missing)}): start a second stage from a preset written by `package`."
        )
    return training


def train(args):
    from keras_transformer.training import train_multi30k

    source, target = PAIRS[args.pair]
    if args.from_preset:
        if args.pair not in LONGER_EPOCHS:
            raise SystemExit(f"{args.pair} has no second stage; choose one of {sorted(LONGER_EPOCHS)}.")
        first_stage_record(args.from_preset)
        train_multi30k(args.run_dir, source=source, target=target, data_dir=args.data_dir,
                       initial_preset=args.from_preset, **longer_settings(args.pair, steps=args.steps))
    else:
        train_multi30k(args.run_dir, source=source, target=target, data_dir=args.data_dir, steps=args.steps,
                       **SETTINGS)


def distill_command(pair, teachers):
    """The command that writes a distillation stage's data."""
    names = " ".join(["PREVIOUS", *[f"TEACHER{i}" for i in range(2, teachers + 1)]])
    return (f"python examples/multi30k_presets.py distill --pair {pair} --data-dir DATA --teachers {names} "
            "--run-dir DISTILLED")


def distill(args):
    """Sequence-level knowledge distillation (Kim and Rush, 2016), its data:
    the training sources translated by an ensemble of teachers (beam 4,
    alpha 0.6, with `keras-transformer translate`), in a directory laid out
    as Multi30k's (`--run-dir`), with the other splits copied unchanged and
    `distillation.json` recording the teachers. A later stage trains on it:
    `train --from-preset PREVIOUS --data-dir DISTILLED`."""
    from keras_transformer import cli
    from keras_transformer.datasets import multi30k

    source, target = PAIRS[args.pair]
    if not args.teachers:
        raise SystemExit("distill needs --teachers: the presets whose ensemble translates the training sources.")
    if not args.data_dir:
        raise SystemExit("distill needs --data-dir (or $KERAS_TRANSFORMER_MULTI30K): the Multi30k files it copies.")
    if os.path.exists(args.run_dir) and os.listdir(args.run_dir):
        raise SystemExit(f"{args.run_dir} is not empty: choose another --run-dir for the distilled data.")
    record = distillation_record(args.pair, args.teachers)  # fails early on a teacher without metadata
    os.makedirs(args.run_dir, exist_ok=True)
    for name in os.listdir(args.data_dir):  # the other splits' files, compressed or not
        split, _, language = name.removesuffix(".gz").partition(".")
        if split != "train" and language in multi30k.SPLITS.get(split, ()):
            shutil.copy(os.path.join(args.data_dir, name), args.run_dir)
    sources = os.path.join(args.run_dir, f"train.{source}")
    with open(sources, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in multi30k.read_lines("train", source, args.data_dir)))
    ensemble = [option for teacher in args.teachers[1:] for option in ("--ensemble", teacher)]
    cli.main(["translate", "--preset", args.teachers[0], *ensemble, "--beam-size", str(DECODING["beam_size"]),
              "--alpha", str(DECODING["alpha"]), "-i", sources, "-o", os.path.join(args.run_dir, f"train.{target}")])
    with open(os.path.join(args.run_dir, "distillation.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"Wrote {args.run_dir}: train on it with `train --from-preset {args.teachers[0]} --data-dir {args.run_dir}`")


def distillation_record(pair, teachers):
    """What `distillation.json` holds: the translation command and each
    teacher's training record and scores (by role, not by path)."""
    from keras_transformer.presets import preset_metadata

    record = {"method": "sequence-level knowledge distillation: the training targets are an ensemble's "
                        "beam-search translations of the training sources",
              "command": distill_command(pair, len(teachers)), "decoding": DECODING, "teachers": []}
    for i, teacher in enumerate(teachers):
        metadata = preset_metadata(teacher)
        if not metadata.get("training"):
            raise SystemExit(f"Teacher {teacher!r} has no training record in its metadata.json.")
        record["teachers"].append({
            "role": "PREVIOUS (the stage this one goes on from)" if i == 0 else f"TEACHER{i + 1}",
            "training": metadata["training"],
            "scores": metadata.get("scores") or metadata.get("scores_lowercase"),
        })
    return record


def training_record(args, run):
    """The `training` block of the metadata: one stage, or, for a run from
    a preset, that preset's stages and this one."""
    settings = {key: value for key, value in run.items() if key != "initial_training"}
    # What the saved model records it was trained for and averaged, rather
    # than what run.json asked for: a rerun of a finished run asks for
    # fewer epochs, and keep_checkpoints counts those kept, not those made.
    from keras_transformer.presets import read_metadata

    saved = read_metadata(os.path.join(args.run_dir, "model")).get("training", {})
    stage = {
        "command": train_command(args.pair, run),
        "example": f"python examples/multi30k_presets.py train --pair {args.pair} --data-dir DATA --run-dir RUN",
        "settings": settings,
        "steps": saved.get("steps", (run.get("initial_step") or 0) + run["epochs"] * run["steps_per_epoch"]),
        "averaged_checkpoints": saved.get("averaged_checkpoints", run["keep_checkpoints"]),
        "wall_time_hours": training_hours(args.run_dir),
        "hardware": args.hardware or f"{os.cpu_count()}-core {platform.machine()} CPU, no GPU",
        "backend": run["backend"],
    }
    if not run.get("initial_preset"):
        return stage
    # The record the run kept when it started; runs from before it kept one
    # read the preset, which must still be the one the run started from.
    before = run.get("initial_training")
    if not before:
        before = first_stage_record(run["initial_preset"])
        if before["steps"] != run.get("initial_step"):
            raise SystemExit(
                f"{run['initial_preset']!r} was trained for {before['steps']} steps but the run started "
                f"from step {run.get('initial_step')}: it is no longer the preset the run started from "
                "(was it packaged over already?). Package into another --output-root."
            )
    before = dict(before)
    package_first = (
        f"python examples/multi30k_presets.py package --pair {args.pair} --data-dir DATA --run-dir RUN "
        f"--output-root STAGE1_ROOT"
    )
    stage.update(
        command=longer_command(args.pair, run["epochs"], steps=run.get("steps")),
        example=stage["example"].replace("RUN", "RUN2") + " --from-preset STAGE1",
        started_from=f"STAGE1 = STAGE1_ROOT/{preset_name(args.pair)}: the previous stage packaged by "
                     f"`{package_first}` (float16 weights)",
    )
    if getattr(args, "distilled_data", None):
        with open(os.path.join(args.distilled_data, "distillation.json")) as f:
            distillation = json.load(f)
        stage.update(
            command=distillation["command"] + " && "
            + longer_command(args.pair, run["epochs"], start="PREVIOUS", data="DISTILLED", run="RUN3",
                             steps=run.get("steps")),
            example=f"python examples/multi30k_presets.py train --pair {args.pair} --data-dir DISTILLED "
                    "--run-dir RUN3 --from-preset PREVIOUS",
            started_from=f"PREVIOUS = {preset_name(args.pair)} as trained by the stages before",
            distillation=distillation,
        )
    stages = before.pop("stages", None) or [before]
    stages = [*stages, stage]
    stage1 = f"STAGE1_ROOT/{preset_name(args.pair)}"
    command = stages[0]["command"]
    for later in stages[1:]:
        if "distillation" in later:  # it names the stage it goes on from itself
            command += f" && {later['command']}"
        else:
            command += f" && {package_first} && {later['command'].replace('STAGE1', stage1)}"
    return {
        "command": command,
        "stages": stages,
        "steps": stage["steps"],
        "averaged_checkpoints": stage["averaged_checkpoints"],
        "wall_time_hours": round(sum(s["wall_time_hours"] for s in stages), 2),
        "hardware": _per_stage([s["hardware"] for s in stages]),
        "backend": _per_stage([s["backend"] for s in stages]),
    }


def _per_stage(values):
    """One value if the stages agree, else each stage's."""
    if len(set(values)) == 1:
        return values[0]
    return " | ".join(f"stage {i}: {value}" for i, value in enumerate(values, 1))


def training_hours(run_dir):
    """Wall time of the run from its TensorBoard logs: for each time the
    run was started (one event file each), the time to its last finished
    epoch; epochs cut off by a kill are not counted."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    seconds = 0.0
    for events in sorted(glob.glob(os.path.join(run_dir, "logs", "train", "events.out.tfevents.*"))):
        records = list(EventFileLoader(events).Load())
        epochs = [r.wall_time for r in records if any(v.tag == "epoch_loss" for v in r.summary.value)]
        if epochs:
            seconds += epochs[-1] - records[0].wall_time
    return round(seconds / 3600, 2)


def package(args):
    import keras

    from keras_transformer.datasets import multi30k
    from keras_transformer.metrics import evaluate_translation
    from keras_transformer.models import TransformerSeq2SeqLM

    source, target = PAIRS[args.pair]
    name = preset_name(args.pair)
    shipped = os.path.realpath(args.output_root) == os.path.realpath(PACKAGE_PRESETS)
    if args.limit and shipped:
        raise SystemExit("--limit scores a few sentences only (a smoke test): give another --output-root, "
                         "so that the shipped preset keeps its scores.")
    with open(os.path.join(args.run_dir, "run.json")) as f:
        run = json.load(f)
    if run.get("steps") and shipped:
        raise SystemExit(f"{args.run_dir} was trained with --steps {run['steps']} (a shortened run): give another "
                         "--output-root, so that the shipped preset is not replaced by it.")
    # Read before the preset is written: a second stage's first may be the
    # preset that this call replaces.
    training = training_record(args, run)
    model = TransformerSeq2SeqLM.from_preset(os.path.join(args.run_dir, "model"))

    # float16 halves the file; the scores below are those of these weights,
    # loaded back into a float32 model as every user loads them.
    staging = tempfile.mkdtemp()
    try:
        compact = TransformerSeq2SeqLM.from_preset(os.path.join(args.run_dir, "model"), dtype="float16")
        compact.save_to_preset(staging)
        model = TransformerSeq2SeqLM.from_preset(staging)
        scores, greedy = {}, {}
        for split in TEST_SPLITS:
            sources, references = multi30k.load(split, source, target, args.data_dir)
            sources, references = sources[: args.limit], references[: args.limit]
            for kind, decoding, table in (("beam", DECODING, scores), ("greedy", dict(sampler="greedy"), greedy)):
                result = evaluate_translation(model, sources, references, batch_size=64, **decoding)
                table[split] = {key: value for key, value in result.items() if key != "translations"}
                print(f"{name} {split} {kind}: BLEU {result['bleu']:.2f}, lowercased "
                      f"{result['bleu_lowercase']:.2f}, chrF {result['chrf']:.2f}")
        languages = {"en": "English", "de": "German", "fr": "French"}
        architecture = model.backbone
        pairs = f"{run['limit']:,}" if run.get("limit") else "29,000"
        metadata = {
            "description": (
                f"Transformer ({architecture.num_layers}+{architecture.num_layers} layers, d_model "
                f"{architecture.d_model}, {architecture.num_heads} heads, d_ff {architecture.d_ff}, shared "
                f"{architecture.vocabulary_size:,}-token BPE vocabulary) trained on Multi30k "
                f"{languages[source]} to {languages[target]}; "
                f"test_2016_flickr BLEU {scores['test_2016_flickr']['bleu']:.1f} "
                f"(lowercased {scores['test_2016_flickr']['bleu_lowercase']:.1f}), beam 4."
            ),
            "languages": {"source": source, "target": target},
            "data": f"Multi30k task 1 train split, {source}-{target}, {pairs} sentence pairs",
            "data_terms": DATA_TERMS,
            "training": training,
            "weights_dtype": "float16",
            "decoding": DECODING,
            "scores": scores,
            "greedy_scores": greedy,
            "keras_version": keras.version(),
        }
        if args.limit:
            metadata["scored_sentences"] = args.limit  # a smoke test's scores, not the split's
        compact.save_to_preset(os.path.join(args.output_root, name), metadata=metadata)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"Wrote {os.path.join(args.output_root, name)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["train", "package", "distill"])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="en-de")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--run-dir", required=True,
                        help="the training run's directory (`distill`: where the distilled data goes)")
    parser.add_argument("--output-root", default=PACKAGE_PRESETS, help="where `package` writes the preset")
    parser.add_argument("--hardware", help="what trained the run, for the metadata")
    parser.add_argument("--from-preset", help="`train`: a second stage, from this packaged first stage")
    parser.add_argument("--limit", type=int, help="score only the first N test sentences (a smoke test)")
    parser.add_argument("--steps", type=positive_int, help="`train`: stop after N steps in all, rounded up to whole "
                        "epochs (a shortened run, for a smoke test; `package` writes it only elsewhere "
                        "than the shipped presets)")
    parser.add_argument("--teachers", nargs="+", help="`distill`: the presets of the teacher ensemble, the "
                        "stage to go on from first")
    parser.add_argument("--distilled-data", help="`package`: the run trained on this `distill` output")
    args = parser.parse_args()
    {"train": train, "package": package, "distill": distill}[args.step](args)


if __name__ == "__main__":
    main()

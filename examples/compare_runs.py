"""Score the checkpoints of two or more `keras-transformer train` runs at the
steps they share, on the whole Multi30k validation set.

    python examples/compare_runs.py --data-dir PATH/TO/multi30k RUN_A RUN_B

For instance a float32 run and the same command with `--dtype
mixed_bfloat16` (same seed, so the same batches and dropout): does the
lower precision train as well, step for step? Each run's kept checkpoints
(the newest 5) are loaded into a float32 model and translate the 1,014
validation sentences (beam 4, alpha 0.6); the table gives sacreBLEU
(cased) at each step that every run kept. The validation BLEU printed during
training scores 200 sentences greedily, which moves by several points from
one epoch to the next; this one is steadier.
"""

import argparse
import json
import os
import warnings

from keras_transformer.callbacks import checkpoint_step
from keras_transformer.callbacks import list_checkpoints
from keras_transformer.datasets import multi30k
from keras_transformer.metrics import evaluate_translation
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models import TransformerTokenizer


def run_model(run_dir):
    """The float32 model of a training run's architecture and tokenizer.
    Its checkpoints hold the optimizer's state too, which translating does
    not need (Keras warns that it skips it)."""
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    tokenizer = TransformerTokenizer(proto=os.path.join(run_dir, "tokenizer.spm"))
    backbone = TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **run["backbone"])
    length = run["backbone"]["max_sequence_length"]
    model = TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer, length, length))
    return model, run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="the --output-dir of each training run")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
    checkpoints = {run: {checkpoint_step(p): p for p in list_checkpoints(os.path.join(run, "checkpoints"))}
                   for run in args.runs}
    shared = sorted(set.intersection(*(set(steps) for steps in checkpoints.values())))
    if not shared:
        raise SystemExit("The runs kept no checkpoint of the same step: " + json.dumps(
            {run: sorted(steps) for run, steps in checkpoints.items()}))
    scores, names = {}, []
    for run_dir in args.runs:
        model, run = run_model(run_dir)
        source, target = run["source"], run["target"]
        sources, references = multi30k.load("val", source, target, args.data_dir)
        names.append(f"{os.path.basename(os.path.normpath(run_dir))} ({run.get('dtype', 'float32')})")
        for step in shared:
            model.load_weights(checkpoints[run_dir][step])
            result = evaluate_translation(model, sources, references, verbose=0, sampler="beam")
            scores.setdefault(step, []).append(result["bleu"])
            print(f"{names[-1]} step {step}: BLEU {result['bleu']:.2f}", flush=True)
    print(f"\nsacreBLEU (cased) on Multi30k val {source}-{target}, beam 4\n")
    print("| step | " + " | ".join(names) + " | last - first |")
    print("| ---: |" + " ---: |" * (len(names) + 1))
    for step in shared:
        row = scores[step]
        print(f"| {step} | " + " | ".join(f"{s:.2f}" for s in row) + f" | {row[-1] - row[0]:+.2f} |")


if __name__ == "__main__":
    main()

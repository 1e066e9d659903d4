"""Train an English-German Transformer on Multi30k with `model.fit`.

    KERAS_BACKEND=torch python examples/train_multi30k.py --data-dir PATH/TO/multi30k

The paper's recipe, step by step (`keras-transformer train` does the same,
with resuming and TensorBoard logs):

1. a shared BPE vocabulary for source and target (section 5.1);
2. batches of about 4,096 tokens grouped by length (section 5.1);
3. Adam(0.9, 0.98, 1e-9) with warm-up, label smoothing 0.1, dropout
   (sections 5.3, 5.4) -- the defaults of `TransformerSeq2SeqLM.compile()`;
4. the last checkpoints averaged (section 6.1);
5. sacreBLEU on test_2016_flickr.
"""

import argparse
import os
import tempfile

import keras

from keras_transformer.callbacks import KeepLastCheckpoints
from keras_transformer.callbacks import average_checkpoints
from keras_transformer.callbacks import list_checkpoints
from keras_transformer.data import token_budget_batches
from keras_transformer.datasets import multi30k
from keras_transformer.metrics import evaluate_translation
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models import TransformerTokenizer
from keras_transformer.utils.memory import reuse_freed_memory


def main():
    # Keep the large buffers each step frees for the next step instead of
    # mapping them afresh (fewer page faults): first, before the backend
    # starts its threads (see keras_transformer.utils.memory).
    reuse_freed_memory()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_MULTI30K"))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--limit", type=int, help="train on the first N pairs only (a quick look)")
    parser.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "multi30k-en-de"))
    args = parser.parse_args()
    checkpoints = os.path.join(args.output_dir, "checkpoints")
    if list_checkpoints(checkpoints):
        # They would be averaged with this run's.
        raise SystemExit(f"{checkpoints} holds another run's checkpoints: choose another --output-dir.")
    keras.utils.set_random_seed(0)  # before the tokenizer: see TransformerTokenizer

    sources, targets = multi30k.load("train", "en", "de", data_dir=args.data_dir)
    if args.limit:
        sources, targets = sources[: args.limit], targets[: args.limit]
    val_sources, val_targets = multi30k.load("val", "en", "de", data_dir=args.data_dir)

    # 1. One vocabulary for both languages.
    tokenizer = TransformerTokenizer.from_texts(sources + targets, vocabulary_size=8000)

    # 2. Length-grouped batches under a token budget.
    train = token_budget_batches(sources, targets, tokenizer, max_tokens=4096, max_length=256, seed=0)
    val = token_budget_batches(val_sources, val_targets, tokenizer, max_tokens=4096, shuffle=False)
    print(f"{len(train)} batches an epoch, {train.padding_fraction():.1%} padding")

    # 3. A 3+3-layer model that fits a CPU, and the paper's recipe.
    backbone = TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout=0.3, max_sequence_length=256,
    )
    model = TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer))
    model.compile(warmup_steps=800)
    model.fit(
        train.dataset(),
        validation_data=val.dataset(),
        epochs=args.epochs,
        callbacks=[KeepLastCheckpoints(checkpoints, keep=5)],
    )

    # 4. Average the last five checkpoints.
    average_checkpoints(model, list_checkpoints(checkpoints))
    model.save_to_preset(os.path.join(args.output_dir, "model"))

    # 5. BLEU on the 2016 test set.
    test_sources, test_references = multi30k.load("test_2016_flickr", "en", "de", data_dir=args.data_dir)
    scores = evaluate_translation(model, test_sources, test_references)
    print(f"test_2016_flickr BLEU {scores['bleu']:.2f} ({scores['bleu_signature']})")
    print(f"lowercased BLEU {scores['bleu_lowercase']:.2f}, chrF {scores['chrf']:.2f}")
    for source, translation in list(zip(test_sources, scores["translations"]))[:3]:
        print(f"  {source}\n  -> {translation}")


if __name__ == "__main__":
    main()

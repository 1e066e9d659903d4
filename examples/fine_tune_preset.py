"""Fine-tune a shipped preset on new sentence pairs, save it, load it again.

    python examples/fine_tune_preset.py --output-dir /tmp/my-en-de

Starts from `transformer_multi30k_en_de` (English to German image
captions), fine-tunes it with `model.fit` on pairs of another register (here
a handful of sentences written for this example; use your own corpus), saves
the result with `save_to_preset`, loads it back with `from_preset` and
checks that the loaded model translates exactly as the fine-tuned one did.
Eight pairs are only enough to show the mechanics (the model learns them by
heart: "The train leaves at eight o'clock." goes from "Der Zugperspektive."
to "Der Zug fährt um acht Uhr ab."); fine-tune on thousands.
`keras-transformer translate --preset /tmp/my-en-de "..."` then uses it.
"""

import argparse
import os
import tempfile

import keras

from keras_transformer.models import TransformerSeq2SeqLM

PAIRS = [
    ("The train leaves at eight o'clock.", "Der Zug fährt um acht Uhr ab."),
    ("The museum is closed on Mondays.", "Das Museum ist montags geschlossen."),
    ("Where is the train station?", "Wo ist der Bahnhof?"),
    ("The bus is late today.", "Der Bus hat heute Verspätung."),
    ("I would like a cup of coffee.", "Ich hätte gern eine Tasse Kaffee."),
    ("The shop opens at nine o'clock.", "Das Geschäft öffnet um neun Uhr."),
    ("Is this seat free?", "Ist dieser Platz frei?"),
    ("The tickets are sold out.", "Die Karten sind ausverkauft."),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "fine-tuned-en-de"))
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    # The shipped presets are ensembles: fine-tune and keep their first model.
    model = TransformerSeq2SeqLM.from_preset(args.preset, load_ensemble=False)
    sources = [source for source, _ in PAIRS]
    targets = [target for _, target in PAIRS]
    print("Before:", model.generate(sources[:2]))

    # A small constant learning rate: the warm-up schedule of the paper is
    # for training from scratch.
    model.compile(optimizer=keras.optimizers.Adam(5e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9))
    model.fit({"encoder_text": sources, "decoder_text": targets}, batch_size=8, epochs=args.epochs, verbose=2)
    translations = model.generate(sources)
    print("After: ", translations[:2])

    model.save_to_preset(args.output_dir, metadata={"fine_tuned_from": args.preset})
    reloaded = TransformerSeq2SeqLM.from_preset(args.output_dir)
    assert reloaded.generate(sources) == translations, "the saved preset translates differently"
    print(f"Saved to {args.output_dir}; the reloaded model gives the same translations.")


if __name__ == "__main__":
    main()

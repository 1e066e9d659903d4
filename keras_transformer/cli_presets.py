"""The `presets` command: the presets shipped with the package, or those
named (directories, transformers checkpoints, hf:// handles), with their
languages, licence and scores.

    keras-transformer presets
    keras-transformer presets nllb-200-600M --languages
    keras-transformer presets hf://facebook/m2m100_418M
"""

import json
import os
import textwrap

# Language codes shown of a multilingual preset without --languages.
SHOWN_CODES = 6


def add_presets(subparsers):
    p = subparsers.add_parser(
        "presets", help="List the shipped presets, or describe the presets named: languages, licence, scores.")
    p.add_argument("preset", nargs="*", help="presets to describe: names, directories (of this package, or "
                   "transformers checkpoints) or hf:// handles (default: the shipped presets)")
    p.add_argument("--languages", action="store_true",
                   help="list every language code of a multilingual preset (default: how many, and the first few)")
    p.add_argument("--json", action="store_true", help="print the full metadata as JSON")


def presets_command(args):
    from keras_transformer import presets

    listed = {name: described(name) for name in args.preset} if args.preset else presets.list_presets()
    if args.json:
        print(json.dumps(listed, indent=2, ensure_ascii=False))
        return
    if not listed:
        print("No presets are installed.")
        return
    for name, info in listed.items():
        params = info.get("parameter_count")
        params = f"{params / 1e6:.1f}M parameters" if params else "parameters unknown"
        size = f", {info['size_bytes'] / 2**20:.1f} MiB" if info.get("size_bytes") else ""
        print(f"{name}  ({params}{size})")
        if info.get("description"):
            print(f"    {info['description']}")
        print(*languages_lines(info, args.languages), sep="\n")
        if info.get("license"):
            print(f"    license: {info['license']}")
        decoding = info.get("decoding", {})
        for split, score in info.get("scores", {}).items():
            print(
                f"    {split}: BLEU {score['bleu']:.1f}, lowercased {score['bleu_lowercase']:.1f}, "
                f"chrF {score['chrf']:.1f} (beam {decoding.get('beam_size', '?')}, "
                f"alpha {decoding.get('alpha', '?')})"
            )


def described(preset):
    """What `presets` shows of a preset that is named: its metadata (none
    for a transformers checkpoint), with its size on disk where local, and
    its language codes (`language_codes`) where the metadata names no
    languages, read from its tokenizer (M2M100, NLLB-200: the licence
    too)."""
    from keras_transformer import presets

    info = dict(presets.preset_metadata(preset))
    directory = presets.resolve(preset)
    if os.path.isdir(directory):
        info["size_bytes"] = sum(os.path.getsize(os.path.join(root, name))
                                 for root, _, names in os.walk(directory) for name in names)
    if not info.get("languages") and "language_codes" not in info:
        from keras_transformer.models import TransformerTokenizer
        from keras_transformer.models.transformer.languages import model_languages

        tokenizer = TransformerTokenizer.from_preset(preset)
        info["language_codes"] = model_languages(tokenizer)
        if info["language_codes"] and hasattr(tokenizer, "language_id") and "license" not in info:
            from keras_transformer.convert.m2m100_files import family_and_licence

            info["family"], info["license"] = family_and_licence(preset, tokenizer)
    return info


def languages_lines(info, every=False):
    """The lines that say which languages a preset translates: its pair
    (`en to de`), or how many codes and the first few (all with `every`)."""
    pair, codes = info.get("languages"), info.get("language_codes") or []
    if isinstance(pair, dict) and pair.get("source") and pair.get("target"):
        return [f"    languages: {pair['source']} to {pair['target']}"]
    if not codes:
        return []
    if every:
        listed = textwrap.fill(" ".join(codes), width=100, initial_indent=" " * 8, subsequent_indent=" " * 8)
        return [f"    languages: {len(codes)}, any to any:", listed]
    shown = ", ".join(codes[:SHOWN_CODES]) + (", ...; --languages lists them" if len(codes) > SHOWN_CODES else "")
    return [f"    languages: {len(codes)}, any to any ({shown})"]

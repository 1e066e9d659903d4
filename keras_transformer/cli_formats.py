"""The command line's commands that write a model out in another format or
place: `export` (a TensorFlow SavedModel), `convert` (a Marian, M2M100 or
NLLB-200 checkpoint to a preset), `export-transformers` (a preset to a
transformers checkpoint: `m2m_100` for M2M100 and NLLB-200 models, Marian
for the others; `export-marian` is its former name) and `upload` (a preset
to Kaggle or the Hugging Face hub).

    keras-transformer export --preset transformer_multi30k_en_de exported/en-de
    keras-transformer export --quantize int8 exported/en-de-int8
    keras-transformer convert hf://Helsinki-NLP/opus-mt-en-de opus-mt-en-de
    keras-transformer convert hf://facebook/nllb-200-distilled-600M nllb-200-600M
    keras-transformer export-transformers marian/en-de --preset transformer_multi30k_en_de
    keras-transformer export-transformers nllb-en-fr --preset nllb-200-600M-en-fr
    keras-transformer upload --preset my-en-de hf://OWNER/my-en-de
"""

from keras_transformer.utils import arguments

DEFAULT_PRESET = "transformer_multi30k_en_de"


def add_commands(subparsers):
    """Adds the commands to `subparsers`; returns their functions by name."""
    _add_export(subparsers)
    _add_convert(subparsers)
    _add_export_transformers(subparsers)
    _add_upload(subparsers)
    return {"export": _export, "convert": _convert, "export-transformers": _export_transformers,
            "export-marian": _export_transformers, "upload": _upload}


def add_precision(p):
    """`--dtype` and `--quantize`, for commands that load a preset."""
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="compute in this precision (default: the preset's, float32)")
    p.add_argument("--quantize", choices=("int8",),
                   help="store the weights in int8 (Keras's quantization): a quarter of the memory")


def _add_export(subparsers):
    p = subparsers.add_parser(
        "export",
        help="Write a TensorFlow SavedModel that translates strings (for TF Serving).",
        description="Export a preset to a SavedModel: tokenization, the encoder, cached beam search "
        "and detokenization in one graph, loadable with TensorFlow and tensorflow-text only.",
    )
    p.add_argument("output_dir", help="the SavedModel's directory (must be empty or absent)")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"a preset name or directory (default: {DEFAULT_PRESET})")
    p.add_argument("--beam-size", type=arguments.positive_int, default=4, help="fixed in the export; 1 decodes greedily (default: 4)")
    p.add_argument("--alpha", type=arguments.non_negative_float, default=0.6, help="length penalty, fixed in the export (default: 0.6)")
    p.add_argument("--max-length-offset", type=arguments.positive_int, default=50,
                   help="at most source length + this many output tokens (default: 50)")
    p.add_argument("--length-penalty", choices=("gnmt", "length"), default="gnmt",
                   help="gnmt: ((5 + |Y|) / 6) ** alpha, the paper's; length: |Y| ** alpha (default: gnmt)")
    p.add_argument("--target-prefix", metavar="TEXT", help="start every translation with TEXT, forced in the "
                   "export's search")
    p.add_argument("--no-repeat-ngram-size", type=arguments.non_negative_int, default=0, metavar="N",
                   help="no translation repeats N tokens, in the export's search (default: 0, off)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in the output directory")
    p.add_argument("--jit-compile", action="store_true",
                   help="compile the search with XLA: several times as fast one sentence at a time, but each "
                   "new input shape compiles at its first request (TF Serving on CPUs: "
                   "--xla_cpu_compilation_enabled=true)")
    p.add_argument("--ensemble", action="store_true",
                   help="for an ensemble preset, hold all its models and decode them together, as translate "
                   "does (default: its first model alone)")
    add_precision(p)


def _export(args):
    from keras_transformer.decoding.settings import DecodingSettings
    from keras_transformer.export import ExportError
    from keras_transformer.export import export_saved_model

    settings = DecodingSettings(
        beam_size=args.beam_size, alpha=args.alpha, max_length_offset=args.max_length_offset,
        length_penalty=args.length_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
    )
    try:
        path = export_saved_model(
            args.preset, args.output_dir, overwrite=args.overwrite, dtype=args.dtype, quantize=args.quantize,
            jit_compile=args.jit_compile, ensemble=args.ensemble, target_prefix=args.target_prefix,
            settings=settings,
        )
    except ExportError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"Wrote the SavedModel to {path}")


def _add_convert(subparsers):
    p = subparsers.add_parser(
        "convert",
        help="Convert a Marian (opus-mt), M2M100 or NLLB-200 checkpoint into a preset of this package.",
        description="Read a model as transformers saves it (a directory with config.json, "
        "model.safetensors or pytorch_model.bin and the tokenizer files, or an hf:// handle such as "
        "hf://Helsinki-NLP/opus-mt-en-de, hf://facebook/m2m100_418M or "
        "hf://facebook/nllb-200-distilled-600M) and save it as a preset directory.",
    )
    p.add_argument("source", help="the checkpoint's directory or hf:// handle")
    p.add_argument("output_dir", help="the preset directory to write (must be empty or absent)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier preset in the output directory")


def _convert(args):
    from keras_transformer.convert import convert_m2m100
    from keras_transformer.convert import convert_marian
    from keras_transformer.convert.marian import read_config

    # Marian's converter explains what is not a transformers checkpoint;
    # the m2m_100 one refuses the model types no converter reads.
    model_type = (read_config(args.source) or {}).get("model_type")
    convert = convert_marian if model_type in (None, "marian") else convert_m2m100
    convert(args.source, args.output_dir, overwrite=args.overwrite)
    print(f"Wrote the preset to {args.output_dir}")


def _add_export_transformers(subparsers):
    p = subparsers.add_parser(
        "export-transformers", aliases=["export-marian"],
        help="Write a preset as a transformers checkpoint directory (for transformers and CTranslate2).",
        description="Write a preset as transformers saves models: an m2m_100 directory for M2M100 and "
        "NLLB-200 models, a Marian one for the others; transformers (AutoModelForSeq2SeqLM, "
        "AutoTokenizer) loads it and ct2-transformers-converter converts it. (export-marian is the "
        "command's former name.)",
    )
    p.add_argument("output_dir", help="the directory to write (must be empty or absent)")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"a preset name or directory (default: {DEFAULT_PRESET})")
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier export")


def _export_transformers(args):
    from keras_transformer.convert import export_transformers

    path, model_type = export_transformers(args.preset, args.output_dir, overwrite=args.overwrite)
    print(f"Wrote the {'Marian' if model_type == 'marian' else model_type} model to {path}")


def _add_upload(subparsers):
    p = subparsers.add_parser(
        "upload",
        help="Share a preset on Kaggle or the Hugging Face hub (keras-hub's upload, after its checks).",
        description="Check every model of a preset as keras-hub and this package check it, then upload it "
        "with keras_hub.upload_preset. Presets of earlier versions with int8 weights (the shipped ones) go up "
        "as a copy with the same weights in model.weights.h5. Logging in is the hub client's: "
        "`huggingface-cli login`, or KAGGLE_USERNAME and KAGGLE_KEY.",
    )
    p.add_argument("handle", help="kaggle://OWNER/MODEL/keras/VARIANT or hf://OWNER/MODEL")
    p.add_argument("--preset", required=True, help="a preset directory, or the name of a shipped preset")


def _upload(args):
    from keras_transformer.presets import upload_preset

    upload_preset(args.handle, args.preset)
    print(f"Uploaded {args.preset} to {args.handle}")

"""The `keras-transformer` command line.

    keras-transformer translate "A man is riding a bicycle."
    keras-transformer translate --preset transformer_multi30k_de_en < input.de > output.en
    keras-transformer presets
    keras-transformer presets nllb-200-600M --languages
    keras-transformer export --preset transformer_multi30k_en_de exported/en-de
    keras-transformer train --source en --target de --output-dir runs/en-de
    keras-transformer evaluate runs/en-de/model --split test_2016_flickr
    keras-transformer attention --preset runs/en-de/model "A man rides a bike." -o attention.png
    keras-transformer serve --preset transformer_multi30k_en_de --port 5000

Run `keras-transformer COMMAND --help` for the options of each command.
"""

import argparse
import contextlib
import difflib
import os
import signal
import sys
import warnings

from keras_transformer import cli_formats
from keras_transformer import cli_io
from keras_transformer import cli_presets
from keras_transformer import command_process
from keras_transformer.cli_decoding import add_decoding_options
from keras_transformer.cli_decoding import add_document_options
from keras_transformer.cli_decoding import decoding_options
from keras_transformer.cli_decoding import document_options
from keras_transformer.utils import arguments
from keras_transformer.utils.locks import locked

DEFAULT_PRESET = cli_formats.DEFAULT_PRESET


def _add_train(subparsers):
    from keras_transformer import train_config

    p = subparsers.add_parser("train", help="Train on Multi30k with the paper's recipe.")
    p.add_argument("--output-dir", required=True, help="the run's directory; rerun to resume")
    train_config.add_arguments(p)
    p.add_argument("--devices", type=arguments.positive_int,
                   help="train data-parallel on N devices (JAX, TensorFlow: of this process; "
                        "PyTorch: launch with torchrun --nproc_per_node N); --max-tokens is per device")
    p.add_argument("--multi-host", action="store_true",
                   help="join a multi-machine job: JAX reads KERAS_DISTRIBUTION_* variables, "
                        "TensorFlow TF_CONFIG, PyTorch torchrun's variables")


def _add_evaluate(subparsers):
    p = subparsers.add_parser("evaluate", help="Translate a Multi30k split and report sacreBLEU.")
    p.add_argument("model", help="a preset directory (such as RUN/model) or preset name")
    p.add_argument("--split", default="test_2016_flickr",
                   help="train, val, test_2016_flickr, test_2017_flickr or test_2017_mscoco "
                   "(default: test_2016_flickr)")
    p.add_argument("--source", help="source language (default: the model's)")
    p.add_argument("--target", help="target language (default: the model's)")
    p.add_argument("--data-dir", help="a directory with Multi30k's raw files (train.en.gz, ...; default: "
                   "$KERAS_TRANSFORMER_MULTI30K, else a download)")
    p.add_argument("--batch-size", type=arguments.positive_int, default=64,
                   help="sentences translated together (default: 64)")
    add_decoding_options(p)
    p.add_argument("--limit", type=arguments.positive_int, help="translate only the first N sentences")
    p.add_argument("--output", help="write the translations to this file")
    _add_precision(p)


def _add_precision(p):
    cli_formats.add_precision(p)
    p.add_argument("--ensemble", action="append", default=[], metavar="PRESET", help="also decode with this "
                   "preset (same vocabulary and languages), averaging the models' probabilities; repeatable")
    p.add_argument("--first-model-only", action="store_true", help="of an ensemble preset, decode with its first "
                   "model alone (faster; the shipped presets are ensembles)")


# Whether the command runs in a process of its own (`run`), which it may
# keep TensorFlow out of, rather than in a caller's (`main`).
_OWN_PROCESS = False


def _leave_out_tensorflow(names):
    """On JAX and PyTorch, SentencePiece presets translate without
    TensorFlow (`command_process.leave_out_tensorflow`): left out before
    anything imports keras-hub (`translate`, `evaluate` and `serve` call
    this first), only in the command's own process, not in a caller's of
    `main`."""
    if _OWN_PROCESS:
        command_process.leave_out_tensorflow(names)


def _load_translator(preset, args):
    """The models of `preset` and --ensemble as --dtype and --quantize ask, and the decoding settings."""
    names = [preset, *args.ensemble]
    from keras_transformer import presets
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.utils.memory import reuse_freed_memory

    # Each decoding step allocates and frees the same large buffers (the
    # logits of every beam): kept for reuse, PyTorch translated 64 sentences
    # at a time 1.18x as fast (docs/benchmarks.md).
    reuse_freed_memory()
    # JAX keeps the decoding steps it compiles on disk for the next command
    # (`KERAS_TRANSFORMER_COMPILE_CACHE=off` turns it off).
    from keras_transformer.utils.compile_cache import use_compile_cache

    use_compile_cache()
    languages = {name: presets.preset_metadata(name).get("languages") for name in names} if args.ensemble else {}
    if len({tuple(sorted(pair.items())) for pair in languages.values() if pair}) > 1:
        raise SystemExit(f"error: the models of an ensemble must translate the same languages; got {languages}")
    options = {"dtype": args.dtype} if args.dtype else {}
    if args.first_model_only:
        options["load_ensemble"] = False
    loaded = [TransformerSeq2SeqLM.from_preset(name, **options) for name in names]
    # An ensemble preset's own models, then the other presets' (and theirs).
    models = [member for model in loaded for member in (model, *model.ensemble_members)]
    for model in models if args.quantize else ():
        model.quantize(args.quantize)
    return models[0], {**decoding_options(args), "ensemble": models[1:]}


def _add_attention(subparsers):
    p = subparsers.add_parser(
        "attention", help="Plot attention maps per layer and head (the paper's Figures 3-5)."
    )
    p.add_argument("text", help="the source sentence")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"a preset name or directory such as RUN/model (default: {DEFAULT_PRESET})")
    p.add_argument("--target", help="the translation to show (default: the model's greedy translation)")
    p.add_argument("--kinds", default="encoder_self_attention,decoder_self_attention,cross_attention",
                   help="comma-separated: encoder_self_attention, decoder_self_attention, cross_attention")
    p.add_argument("-o", "--output", required=True, help="the picture to write (.png, .pdf, .svg)")


def _attention(args):
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.visualization import attention_maps
    from keras_transformer.visualization import plot_attention

    model = TransformerSeq2SeqLM.from_preset(args.preset)
    maps = attention_maps(model, args.text, args.target)
    plot_attention(maps, args.output, kinds=[kind.strip() for kind in args.kinds.split(",") if kind.strip()])
    print(f"{maps['target']}\nWrote {args.output}")


def _train(args):
    from keras_transformer import train_config
    from keras_transformer.training import train_multi30k

    if args.devices and args.multi_host:  # before joining a job, which waits for the others
        raise SystemExit("error: --devices and --multi-host together: a job on several machines trains on "
                         "every device of every process; leave --devices out (CUDA_VISIBLE_DEVICES limits a machine's)")
    settings = train_config.from_arguments(args)
    strategy = None
    if args.devices or args.multi_host:
        from keras_transformer import distribution

        strategy = distribution.join_and_distribute(devices=args.devices, multi_host=args.multi_host)
        print(f"Training on {strategy.num_replicas} device{'s' if strategy.num_replicas > 1 else ''}: {strategy}")
    chief = strategy is None or strategy.process_index == 0
    # One run a directory (utils/locks.py), held by the process that writes
    # the run's files: a second run into it fails at once.
    with locked(args.output_dir, "train") if chief else contextlib.nullcontext():
        train_multi30k(args.output_dir, strategy=strategy, **settings)
    if chief:
        from keras_transformer import presets

        model_dir = os.path.join(args.output_dir, "model")
        averaged = presets.read_metadata(model_dir).get("training", {}).get("averaged_checkpoints", 0)
        what = f"the average of the last {averaged} checkpoints" if averaged > 1 else "the model"
        print(f"Saved {what} to {model_dir}")


def _languages(model_path, args):
    """The model's languages: --source/--target, else its metadata."""
    from keras_transformer import presets

    source, target = args.source, args.target
    languages = presets.read_metadata(presets.resolve(model_path)).get("languages", {})
    known = (languages.get("source"), languages.get("target"))
    if None not in known and (source or known[0], target or known[1]) != known:
        print(f"warning: the model translates {known[0]}-{known[1]}; evaluating it on "
              f"{source or known[0]}-{target or known[1]}", file=sys.stderr)
    source, target = source or known[0], target or known[1]
    run_info = os.path.join(os.path.dirname(os.path.abspath(model_path)), "run.json")
    if (source is None or target is None) and os.path.exists(run_info):
        info = presets.read_json_object(
            run_info, "training run's record", "Restore it from a copy, or give --source and --target."
        )
        source, target = source or info.get("source"), target or info.get("target")
    if source is None or target is None:
        raise SystemExit("error: give --source and --target for this model")
    return source, target


def _evaluate(args):
    from keras_transformer import presets
    from keras_transformer.datasets import multi30k

    _leave_out_tensorflow([args.model, *args.ensemble])  # before the checks import keras-hub
    presets.check(args.model, ("config", "tokenizer"))  # before its languages are read
    if args.output:
        cli_io.check_output_path(args.output)
    source, target = _languages(args.model, args)
    sources, references = multi30k.load(args.split, source, target, args.data_dir)
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    model, decoding = _load_translator(args.model, args)
    from keras_transformer.metrics import evaluate_translation  # imports keras-hub

    scores = evaluate_translation(model, sources, references, batch_size=args.batch_size, **decoding)
    if args.output:
        cli_io.write_lines(scores["translations"], args.output)
    how = (f"sampled ({args.sampling}, seed {args.seed})" if args.sampling else
           "greedy" if args.beam_size == 1 else f"beam {args.beam_size}, alpha {args.alpha}") + (
        f", an ensemble of {1 + len(decoding['ensemble'])} models" if decoding["ensemble"] else "")
    print(f"{args.split} {source}-{target}, {len(sources)} sentences, {how}")
    print(f"BLEU {scores['bleu']:.2f}  {scores['bleu_signature']}")
    print(f"BLEU (lowercased) {scores['bleu_lowercase']:.2f}  {scores['bleu_lowercase_signature']}")
    print(f"chrF {scores['chrf']:.2f}  {scores['chrf_signature']}")


def _add_translate(subparsers):
    p = subparsers.add_parser(
        "translate",
        help="Translate sentences with a preset (default: English to German).",
        description="Translate the TEXT arguments, or else the lines of --input or stdin, one "
        "translation a line on stdout (or --output): one output line for each input line, whether "
        "lines end in \\n, \\r\\n or \\r, and an empty line for a blank one (whitespace, or "
        "invisible characters such as a zero-width space). --output is written whole at the end, "
        "or not at all. Lines are translated in batches of similar length; a progress bar goes to "
        "stderr when there are more than one batch. --split-sentences translates a line's sentences one "
        "by one; --document translates the whole input as one text, its line breaks kept.",
    )
    p.add_argument("text", nargs="*", help="sentences to translate (default: read lines from --input or stdin)")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"a preset name or directory (default: {DEFAULT_PRESET})")
    add_decoding_options(p)
    add_document_options(p)
    p.add_argument("--batch-size", type=arguments.positive_int, default=64, help="sentences translated together (default: 64)")
    p.add_argument("-i", "--input", help="a text file, one sentence a line (default: stdin)")
    p.add_argument("-o", "--output", help="write the translations to this file (default: stdout)")
    _add_precision(p)


def _translate(args):
    if args.beam_size < 1:
        raise SystemExit("error: --beam-size must be at least 1")
    if args.text and args.input:
        raise SystemExit(
            f"error: give TEXT or --input, not both (got --input {args.input} and {len(args.text)} "
            "TEXT argument(s)); to write the translations to a file use -o/--output."
        )
    texts = cli_io.read_sentences(args.text, args.input, whole=args.document)
    cli_io.check_output_path(args.output, reads=args.input)
    _leave_out_tensorflow([args.preset, *args.ensemble])
    model, decoding = _load_translator(args.preset, args)
    # The progress bar goes to stderr, so that stdout holds translations only.
    verbose = 1 if len(texts) > args.batch_size else 0
    with contextlib.redirect_stdout(sys.stderr):
        translations = model.generate(texts, batch_size=args.batch_size, verbose=verbose, **decoding,
                                      **document_options(args))
    # (A document read whole is written as it is, its own line ends kept.)
    cli_io.write_lines(translations, args.output, ends=not (args.document and not args.text))  # whole or not at all


def _add_serve(subparsers):
    from keras_transformer.serving import command

    p = subparsers.add_parser("serve", help="Serve translations over HTTP (LibreTranslate's API) with a web page.",
                              description=command.DESCRIPTION)
    command.add_arguments(p)


def _serve(args):
    from keras_transformer.serving import command

    command.require_packages()
    if args.workers > 1:  # (each worker prepares its own process: this one loads no model)
        from keras_transformer.serving import workers

        status = workers.run(args)
        if status:
            raise SystemExit(status)
        return
    _leave_out_tensorflow(command.preset_names(args))
    command.serve(args)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="The Transformer of 'Attention Is All You Need' on Keras 3.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_train(subparsers)
    _add_evaluate(subparsers)
    _add_attention(subparsers)
    _add_translate(subparsers)
    cli_presets.add_presets(subparsers)
    _add_serve(subparsers)
    format_commands = cli_formats.add_commands(subparsers)
    args = parser.parse_args(argv)
    commands = {
        "train": _train, "evaluate": _evaluate, "attention": _attention,
        "translate": _translate, "presets": cli_presets.presets_command, "serve": _serve, **format_commands,
    }
    try:
        commands[args.command](args)
    except BrokenPipeError:
        # The reader of stdout stopped (`| head`): exit quietly, as other
        # commands do, and keep Python's flush at exit from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except (ValueError, OSError, EOFError) as error:
        # Bad input (presets, text, files, settings) and file system errors
        # (a missing, unwritable or corrupt file, a full disk): the message,
        # not a traceback. PresetError is a ValueError.
        raise SystemExit(f"error: {error}") from None
    except Exception as error:
        from keras_transformer.utils.files import is_disk_full

        if is_disk_full(error):  # TensorFlow's and h5py's own errors
            raise SystemExit(f"error: no space left on the device ({type(error).__name__}: {error})") from None
        raise
    return 0


def run():
    """The `keras-transformer` console script: `main` with the C++
    libraries' log lines kept quiet (except for `train`, whose native errors
    matter in long runs), in a process of its own."""
    global _OWN_PROCESS
    _OWN_PROCESS = True
    try:
        _check_backend_name()
        _start_and_run()
    except KeyboardInterrupt:
        # Ctrl-C: one line, not a traceback, and the shell's code for it.
        # Files are as they were (`--output` is written whole or not at all).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        resume = "; run the same command again to resume the run" if sys.argv[1:2] == ["train"] else ""
        print(f"interrupted{resume}", file=sys.stderr, flush=True)
        sys.exit(130)


# The backends this package runs on, and those Keras also takes.
BACKENDS = ("jax", "tensorflow", "torch")
OTHER_KERAS_BACKENDS = ("numpy", "openvino")


def _check_backend_name():
    """Refuses a `KERAS_BACKEND` that Keras does not know, naming the ones
    to choose from, before Keras reads it (its error names none)."""
    name = os.environ.get("KERAS_BACKEND")
    if not name or name in BACKENDS + OTHER_KERAS_BACKENDS:
        return
    close = difflib.get_close_matches(name.lower(), BACKENDS, n=1, cutoff=0.5)
    raise SystemExit(
        f"error: KERAS_BACKEND={name!r} is not a Keras backend: set it to jax, tensorflow or torch "
        + (f"(did you mean {close[0]!r}?) " if close else "")
        + "to choose one, or unset it for Keras's default."
    )


def _start_and_run():
    command_process.prepare(sys.argv[1] if len(sys.argv) > 1 else None)
    # Warnings as one line, as the command's own ("warning: ..."), without
    # the source line Python shows for programmers.
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"warning: {message}\n"
    sys.exit(main())


if __name__ == "__main__":
    run()

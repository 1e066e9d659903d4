"""The command line's decoding options (`translate`, `evaluate`): the
search's settings, a forced target prefix, the languages of multilingual
models, and sampling, as `generate` takes them; and `translate`'s options
for documents (sentence splitting, HTML, whole files)."""

from keras_transformer.utils import arguments


def add_decoding_options(p):
    p.add_argument("--beam-size", type=arguments.positive_int, default=4, help="1 decodes greedily (default: 4)")
    p.add_argument("--alpha", type=arguments.non_negative_float, default=0.6, help="length penalty (default: 0.6)")
    p.add_argument("--length-penalty", choices=("gnmt", "length"), default="gnmt",
                   help="gnmt: ((5 + |Y|) / 6) ** alpha, the paper's; length: |Y| ** alpha, as transformers "
                   "ranks beams (default: gnmt)")
    p.add_argument("--target-prefix", metavar="TEXT", help="start every translation with TEXT, forced at the "
                   "first steps (the search continues from it)")
    p.add_argument("--source-language", "--from", dest="source_language", metavar="CODE",
                   help="multilingual models (M2M100, NLLB-200): the language of the sources, as the model "
                   "names it (__de__, deu_Latn) or an ISO code (de, deu)")
    p.add_argument("--target-language", "--to", dest="target_language", metavar="CODE",
                   help="multilingual models (M2M100, NLLB-200, opus-mt with >>xx<< tokens): the language "
                   "to translate into")
    p.add_argument("--sampling", choices=("top_k", "top_p"), help="draw each translation from the model's "
                   "distribution instead of searching (--beam-size and --alpha do not apply)")
    p.add_argument("--top-k", type=arguments.positive_int, default=50, help="top_k: draw among the K most "
                   "probable tokens (default: 50)")
    p.add_argument("--top-p", type=float, default=0.9, help="top_p: draw among the fewest most probable tokens "
                   "whose probabilities sum to P (default: 0.9)")
    p.add_argument("--temperature", type=float, default=1.0, help="divide the logits by this first (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="a sample is a function of its source and the seed "
                   "(default: 0)")
    p.add_argument("--no-repeat-ngram-size", type=arguments.non_negative_int, default=0, metavar="N",
                   help="no translation repeats N tokens, a guard against degenerate repetition (default: 0, off)")


def decoding_options(args):
    """`generate`'s keyword arguments for the options of `add_decoding_options`."""
    if args.sampling:
        decoding = dict(sampler=args.sampling, top_k=args.top_k, top_p=args.top_p, temperature=args.temperature,
                        seed=args.seed)
    elif args.beam_size == 1:
        decoding = dict(sampler="greedy")
    else:
        decoding = dict(beam_size=args.beam_size, alpha=args.alpha, length_penalty=args.length_penalty)
    languages = {"source_language": args.source_language, "target_language": args.target_language}
    return {**decoding, "target_prefix": args.target_prefix, "no_repeat_ngram_size": args.no_repeat_ngram_size,
            **languages}


def add_document_options(p):
    p.add_argument("--split-sentences", action="store_true", help="split each input into sentences (sentencex, "
                   "in the source language), translate them, and put them back together on its line; a "
                   "sentence longer than the model reads is split at ;:, or between words")
    p.add_argument("--format", choices=("text", "html"), default="text", help="html: keep tags, translate text nodes "
                   "and the attributes for readers (alt, title, ...; not <script>, <style> or what is marked "
                   "translate=\"no\"), sentences with inline elements (<b>, <a>, ...) whole (default: text)")
    p.add_argument("--document", action="store_true", help="translate the whole input (file or stdin; or each "
                   "TEXT) as one document and write it as it is, its line ends (\\r\\n too) and whitespace kept: "
                   "for HTML pages whose tags span lines (implies --split-sentences)")


def document_options(args):
    """`generate`'s keyword arguments for the options of `add_document_options`."""
    return {"split_sentences": bool(args.split_sentences or args.document), "format": args.format}

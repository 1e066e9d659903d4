"""This package against transformers' `MarianMTModel` on the same weights
(`decode.py --transformers`), on the machine's accelerator where it has one.

CTranslate2's wheels run on CUDA 12 only; on a machine with another CUDA
(or none) transformers' PyTorch model is the peer that runs wherever
PyTorch does, the GPU included. The preset's first model is written out
with `keras_transformer.convert.export_marian`, and transformers loads that
directory as a user would (`MarianMTModel.from_pretrained`,
`MarianTokenizer.from_pretrained`), in float32 and in bfloat16, on CUDA
where PyTorch sees it. Both engines translate the same Multi30k
test_2016_flickr sources from text to text, each with its own tokenizer
(the exported `source.spm` and `vocab.json` are the preset's pieces), with
beam 4 and the same ranking: log P / |Y|^0.6 (this package's
`length_penalty="length"`, transformers' `length_penalty=0.6`), at most
source length + 50 tokens. Sentences per second at batch 1 and batch 64 (a
second pass, after a pass that compiles or warms up), BLEU (sacreBLEU,
cased) of the batch-64 pass, each engine and backend in a process of its
own; every row's ratios are to transformers in float32.

Both stop a source's search by the same rule, transformers' default
`early_stopping=False` (this package's with `length_penalty="length"`,
`decoding.rules.search_is_over`): with 4 hypotheses finished, once the
best live beam, scored at the current length, does not beat the fourth
best finished one.
"""

import json
import os
import sys
import tempfile

from anchor_ctranslate2 import ALPHA
from anchor_ctranslate2 import BEAM
from anchor_ctranslate2 import OFFSET
from anchor_ctranslate2 import _timed
from anchor_ctranslate2 import _worker
from anchor_ctranslate2 import processor

DTYPES = ("float32", "bfloat16")


def export(preset, root):
    """The preset's first model as a Marian directory under `root`."""
    from keras_transformer.convert import export_marian
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(preset, load_ensemble=False)
    return export_marian(model, os.path.join(root, "marian"))


def accelerator():
    """What PyTorch computes on here: the GPU's name, or "CPU"."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def transformers_worker(data_dir, batch1, batch64, directory, dtype):
    """Times transformers' `MarianMTModel` from `directory` in `dtype` (in
    a process of its own); prints the row as one JSON line."""
    import sacrebleu
    import torch
    import transformers

    from keras_transformer.datasets import multi30k

    sources, references = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)
    count = max(batch1, batch64)
    sources, references = sources[:count], references[:count]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    start, pad = model.config.bos_token_id, model.config.pad_token_id

    def translate(texts):
        # The preset's models read `<s> pieces </s>`; transformers'
        # tokenizer writes `pieces </s>` (docs/pretrained.md).
        rows = [[start, *ids] for ids in tokenizer(texts).input_ids]
        width = max(map(len, rows))
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row)
            attention_mask[i, : len(row)] = 1
        with torch.inference_mode():
            outputs = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), num_beams=BEAM,
                length_penalty=ALPHA, do_sample=False,
                # at most source length + 50 tokens after the start token
                max_length=width + OFFSET + 1,
            )
        return tokenizer.batch_decode(outputs, skip_special_tokens=True)

    speed1, _ = _timed(translate, sources[:batch1], 1)
    speed64, outputs = _timed(translate, sources[:batch64], 64)
    bleu = sacrebleu.corpus_bleu(outputs, [references[:batch64]]).score
    print(json.dumps({"engine": f"transformers {transformers.__version__} ({device})", "dtype": dtype,
                      "batch1": speed1, "batch64": speed64, "bleu": bleu}))


def _print_row(row, anchor):
    print(f"| {row['engine']} | {row['dtype']} | {row['batch1']:.1f} | {row['batch64']:.1f} "
          f"| {row['batch1'] / anchor['batch1']:.2f}x | {row['batch64'] / anchor['batch64']:.2f}x "
          f"| {row['bleu']:.1f} |", flush=True)


def compare(args, script):
    """The table: transformers in float32 and bfloat16, then this package
    per backend (float32, int8 weights, bfloat16, an ensemble preset's
    every model), each row printed as soon as it is timed, with ratios to
    transformers in float32."""
    print(f"processor: {processor()}; accelerator: {accelerator()}; preset {args.preset}; beam {BEAM}, "
          f"log P / |Y|^{ALPHA}; batch 1: {args.batch1_sentences} sentences, batch 64: "
          f"{args.batch64_sentences}", flush=True)
    with tempfile.TemporaryDirectory() as root:
        print("exporting the preset's first model with export_marian ...", file=sys.stderr, flush=True)
        directory = export(args.preset, root)
        print("| engine | weights | batch 1 (sent/s) | batch 64 (sent/s) | batch 1 / transformers fp32 "
              "| batch 64 / transformers fp32 | BLEU |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |", flush=True)
        anchor = None
        for dtype in DTYPES:
            print(f"timing transformers {dtype} ...", file=sys.stderr, flush=True)
            rows = _worker(script, args, "torch", "--transformers-engine", directory, dtype, required=False)
            if rows is None:
                if anchor is None:
                    sys.exit("transformers in float32, which every ratio is to, did not run.")
                continue
            anchor = anchor or rows[0]
            _print_row(rows[0], anchor)
    for backend in args.backends.split(","):
        print(f"timing {backend} ...", file=sys.stderr, flush=True)
        for row in _worker(script, args, backend, "--ours-worker", required=False) or []:
            _print_row(row, anchor)

"""The named configurations of the paper's Table 3.

`PAPER_CONFIGS[name]` holds the `TransformerBackbone` keyword arguments of one
row (everything but `vocabulary_size`); `PAPER_TABLE3[name]` what the paper
reports for it. Unlisted values are those of the base model, as in the
table. Row names:

| name | row | change from base |
| --- | --- | --- |
| `base` | base | N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1 |
| `A1`..`A4` | (A) | h, d_k, d_v = (1, 512, 512), (4, 128, 128), (16, 32, 32), (32, 16, 16) |
| `B1`, `B2` | (B) | d_k = 16, 32 (d_v stays 64) |
| `C1`..`C3` | (C) | N = 2, 4, 8 |
| `C4`, `C5` | (C) | d_model, d_k, d_v = (256, 32, 32), (1024, 128, 128) |
| `C6`, `C7` | (C) | d_ff = 1024, 4096 |
| `D1`, `D2` | (D) | P_drop = 0.0, 0.2 |
| `D3`, `D4` | (D) | label smoothing 0.0, 0.2 (a training setting: same backbone as base) |
| `E` | (E) | learned positional embeddings instead of sinusoids |
| `big` | big | d_model=1024, d_ff=4096, h=16, P_drop=0.3 |
"""

_BASE = dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, key_dim=64, value_dim=64, dropout=0.1)


def _row(**changes):
    return {**_BASE, **changes}


PAPER_CONFIGS = {
    "base": _row(),
    "A1": _row(num_heads=1, key_dim=512, value_dim=512),
    "A2": _row(num_heads=4, key_dim=128, value_dim=128),
    "A3": _row(num_heads=16, key_dim=32, value_dim=32),
    "A4": _row(num_heads=32, key_dim=16, value_dim=16),
    "B1": _row(key_dim=16),
    "B2": _row(key_dim=32),
    "C1": _row(num_layers=2),
    "C2": _row(num_layers=4),
    "C3": _row(num_layers=8),
    "C4": _row(d_model=256, key_dim=32, value_dim=32),
    "C5": _row(d_model=1024, key_dim=128, value_dim=128),
    "C6": _row(d_ff=1024),
    "C7": _row(d_ff=4096),
    "D1": _row(dropout=0.0),
    "D2": _row(dropout=0.2),
    "D3": _row(),
    "D4": _row(),
    "E": _row(position_encoding="learned"),
    "big": _row(d_model=1024, d_ff=4096, num_heads=16, dropout=0.3),
}

# What Table 3 reports for each row: label smoothing, training steps,
# newstest2013 perplexity and BLEU, and parameters in millions (None where
# the table leaves the cell empty).
PAPER_TABLE3 = {
    "base": dict(label_smoothing=0.1, train_steps=100_000, ppl=4.92, bleu=25.8, params_millions=65),
    "A1": dict(ppl=5.29, bleu=24.9),
    "A2": dict(ppl=5.00, bleu=25.5),
    "A3": dict(ppl=4.91, bleu=25.8),
    "A4": dict(ppl=5.01, bleu=25.4),
    "B1": dict(ppl=5.16, bleu=25.1, params_millions=58),
    "B2": dict(ppl=5.01, bleu=25.4, params_millions=60),
    "C1": dict(ppl=6.11, bleu=23.7, params_millions=36),
    "C2": dict(ppl=5.19, bleu=25.3, params_millions=50),
    "C3": dict(ppl=4.88, bleu=25.5, params_millions=80),
    "C4": dict(ppl=5.75, bleu=24.5, params_millions=28),
    "C5": dict(ppl=4.66, bleu=26.0, params_millions=168),
    "C6": dict(ppl=5.12, bleu=25.4, params_millions=53),
    "C7": dict(ppl=4.75, bleu=26.2, params_millions=90),
    "D1": dict(ppl=5.77, bleu=24.6),
    "D2": dict(ppl=4.95, bleu=25.5),
    "D3": dict(label_smoothing=0.0, ppl=4.67, bleu=25.3),
    "D4": dict(label_smoothing=0.2, ppl=5.47, bleu=25.7),
    "E": dict(ppl=4.92, bleu=25.7),
    "big": dict(train_steps=300_000, ppl=4.33, bleu=26.4, params_millions=213),
}
for _name, _row_info in PAPER_TABLE3.items():
    _row_info.setdefault("label_smoothing", 0.1)
    _row_info.setdefault("train_steps", 100_000)
    _row_info.setdefault("params_millions", None)

# The shared BPE vocabulary of the paper's English-German models (section 5.1).
PAPER_VOCABULARY_SIZE = 37000

# Sizes for small corpora and small machines, beside the paper's rows:
# `small` is a 3+3-layer, d_model 256 model that trains on Multi30k on a
# CPU; `tiny` is for tests and smoke runs.
CONFIGS = {
    **PAPER_CONFIGS,
    "small": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout=0.1),
    "tiny": dict(num_layers=2, d_model=64, d_ff=128, num_heads=4, dropout=0.1),
}

"""The tokenizer files of `m2m_100` checkpoints, read into an
`M2M100Tokenizer`.

M2M100 (`M2M100Tokenizer.save_pretrained`): `sentencepiece.bpe.model`,
`vocab.json` (piece -> id, without the language codes) and
`tokenizer_config.json`, whose `added_tokens_decoder` gives the codes' ids
(else fairseq's list of 100 codes follows `vocab.json`'s ids). NLLB-200:
`sentencepiece.bpe.model` and `tokenizer.json`, whose vocabulary and
added tokens give every id (else fairseq's numbering: the SentencePiece
ids plus one, the codes after them, as `tokenizer_config.json` lists them).
"""

import json
import os

from keras_transformer.convert.marian import fetch_file
from keras_transformer.models.transformer.languages import M2M100_CODES
from keras_transformer.models.transformer.languages import is_language_code
from keras_transformer.presets import PresetError

SPM_FILE, VOCABULARY_JSON = "sentencepiece.bpe.model", "vocab.json"
TOKENIZER_JSON, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
LICENCES = {"NLLB-200": "CC-BY-NC-4.0", "M2M100": "MIT"}


def _json(path):
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_tokenizer(preset, **kwargs):
    """An `M2M100Tokenizer` from an `m2m_100` directory or handle; `kwargs`
    go to its constructor (`source_language="__en__"`).

    Example:

    ```python
    tokenizer = load_tokenizer("hf://facebook/m2m100_418M")
    tokenizer.language_codes[:3]  # ['__af__', '__am__', '__ar__']
    ```
    """
    from keras_transformer.models.transformer.m2m100_tokenizer import M2M100Tokenizer

    spm = fetch_file(preset, SPM_FILE, required=False)
    if spm is None:
        raise PresetError(
            f"The m2m_100 model {os.fspath(preset)!r} has no {SPM_FILE}: this package tokenizes with the "
            f"SentencePiece model (transformers 5 saves NLLB tokenizers as {TOKENIZER_JSON} only; copy "
            f"{SPM_FILE} from the original repository beside it)."
        )
    config = _json(fetch_file(preset, TOKENIZER_CONFIG, required=False))
    vocabulary, codes = vocabulary_and_codes(preset, spm, config)
    # Without src_lang, transformers' tokenizers read sources as English.
    languages = {"source_language": config.get("src_lang") or "en", "target_language": config.get("tgt_lang")}
    languages = {key: _code_of(value, codes) for key, value in languages.items()}
    try:
        return M2M100Tokenizer(spm, vocabulary, language_codes=codes, **{**languages, **kwargs})
    except (ValueError, RuntimeError, OSError) as error:
        raise PresetError(f"The tokenizer files of {os.fspath(preset)!r} cannot be read: {error}") from error


def _code_of(language, codes):
    """transformers' `src_lang` / `tgt_lang` (`"en"`, `"eng_Latn"`) as a code."""
    for code in (language, f"__{language}__", "eng_Latn" if language == "en" else None):
        if code in codes:
            return code
    return None


def vocabulary_and_codes(preset, spm, config):
    """`(piece -> id, language codes in id order)` of the tokenizer files."""
    vocabulary_file = fetch_file(preset, VOCABULARY_JSON, required=False)
    if vocabulary_file is not None:  # M2M100
        vocabulary = _json(vocabulary_file)
        added = {int(i): token["content"] for i, token in config.get("added_tokens_decoder", {}).items()}
        codes = {i: token for i, token in added.items() if is_language_code(token)}
        if not codes:
            listed = M2M100_CODES.get(config.get("language_codes", "m2m100"), M2M100_CODES["m2m100"])
            codes = {len(vocabulary) + i: f"__{code}__" for i, code in enumerate(listed)}
    else:  # NLLB
        tokenizer_json = _json(fetch_file(preset, TOKENIZER_JSON, required=False))
        vocabulary = dict(tokenizer_json.get("model", {}).get("vocab") or {})
        added = {token["id"]: token["content"] for token in tokenizer_json.get("added_tokens", [])}
        if not vocabulary:
            listed = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
            vocabulary, added = fairseq_numbering(spm, [code for code in listed if is_language_code(code)])
            # The added tokens' ids that the config gives (as transformers reads them).
            given = {int(i): token["content"] for i, token in config.get("added_tokens_decoder", {}).items()}
            if given:
                added = {i: token for i, token in given.items() if token not in vocabulary}
        vocabulary.update({token: i for i, token in added.items()})
        codes = {i: token for i, token in added.items() if is_language_code(token)}
    vocabulary.update({token: i for i, token in codes.items()})
    if not codes:
        raise PresetError(
            f"The tokenizer files of {os.fspath(preset)!r} name no language codes (__de__, deu_Latn): "
            "they are not those of an M2M100 or NLLB-200 model."
        )
    return vocabulary, [codes[i] for i in sorted(codes)]


def fairseq_numbering(spm, codes):
    """NLLB's ids as fairseq numbers them, from its SentencePiece model
    (`spm`: a path or the model's bytes) and language `codes`: fairseq's
    specials, each SentencePiece piece's id plus one, then the codes and
    `<mask>`. Returns `(piece -> id, {id: added token})`."""
    import sentencepiece

    spm = {"model_proto": spm} if isinstance(spm, bytes) else {"model_file": spm}
    processor = sentencepiece.SentencePieceProcessor(**spm)
    vocabulary = dict(SPECIALS)
    for i in range(processor.get_piece_size()):
        if not (processor.is_control(i) or processor.is_unknown(i)):
            vocabulary[processor.id_to_piece(i)] = i + 1
    first = processor.get_piece_size() + 1
    added = {first + i: code for i, code in enumerate(codes)}
    added[first + len(added)] = "<mask>"
    return vocabulary, added


def family_and_licence(preset, tokenizer):
    """`(family, licence)` of an `m2m_100` checkpoint, by its language codes:
    NLLB-200's (`deu_Latn`) are CC-BY-NC-4.0, M2M100's (`__de__`) MIT."""
    family = "M2M100" if tokenizer.language_codes[0].startswith("__") else "NLLB-200"
    return family, LICENCES[family]

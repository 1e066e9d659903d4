"""Languages as settings of translation: which a model knows, and where a
chosen one goes.

A multilingual model names its languages with tokens of its vocabulary:
fairseq's M2M100 `__de__`, NLLB-200 `deu_Latn`, multilingual opus-mt
(Marian) models `>>de<<`. Users name them as the checkpoint does or by an
ISO 639-1 / 639-3 code (`"de"`, `"deu"`) where that names one of the
model's codes. For M2M100 and NLLB the source code starts the source and
the target code is forced as the first output (`target_prefix`, as
transformers' `forced_bos_token_id`); for opus-mt the target code starts
the source.
"""

import difflib

import numpy as np

from keras_transformer.utils.language_codes import ISO_639
from keras_transformer.utils.language_codes import LANGUAGE_CODE
from keras_transformer.utils.language_codes import code_core

# fairseq's M2M100 codes, in the order of their ids after vocab.json
# (transformers' `FAIRSEQ_LANGUAGE_CODES`), for checkpoints whose
# tokenizer files do not list them.
M2M100_CODES = {
    "m2m100": "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he "
    "hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or "
    "pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu".split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}



def is_language_code(token):
    """Whether a vocabulary token names a language as fairseq
    (`__de__`, `deu_Latn`) or opus-mt (`>>de<<`) checkpoints do.

    >>> [is_language_code(t) for t in ("__de__", "deu_Latn", ">>fr<<", "▁de")]
    [True, True, True, False]
    """
    return bool(LANGUAGE_CODE.match(token))


def _iso_aliases(name):
    """The ISO 639 codes `name` may stand for: itself, its 639-3 codes
    (for a 639-1 code) or its 639-1 code (for a 639-3 one)."""
    aliases = {name, *ISO_639.get(name, ())}
    aliases |= {short for short, long in ISO_639.items() if name in long}
    return aliases


def resolve_language(name, codes, role="language"):
    """The code among `codes` (the model's) that `name` names.

    `name` is a code as the checkpoint names it (`"__de__"`, `"deu_Latn"`,
    `">>de<<"`, in any case) or an ISO 639-1 / 639-3 code (`"de"`, `"deu"`)
    that names exactly one of `codes`.

    Raises:
        ValueError: `name` names none of `codes` (the message lists close
            matches) or several (it lists them).

    Example:

    >>> resolve_language("de", ["eng_Latn", "deu_Latn"])
    'deu_Latn'
    >>> resolve_language("deu", ["__en__", "__de__"])
    '__de__'
    >>> resolve_language("zh", ["zho_Hans", "zho_Hant"])
    Traceback (most recent call last):
    ...
    ValueError: The language 'zh' is ambiguous for this model: it has zho_Hans, zho_Hant. Give one of them.
    """
    codes = list(codes)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{role} must be a language code such as {codes[:2]}, got {name!r}.")
    name = name.strip()
    exact = [code for code in codes if code.lower() == name.lower()]
    if len(exact) == 1:
        return exact[0]
    aliases = _iso_aliases(name.lower())
    found = [code for code in codes if code_core(code) in aliases]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(
            f"The language {name!r} is ambiguous for this model: it has {', '.join(found)}. Give one of them."
        )
    cores = {code_core(code): code for code in codes if code_core(code)}
    close = difflib.get_close_matches(name, codes, n=5, cutoff=0.6)
    close += [cores[c] for c in difflib.get_close_matches(name.lower(), cores, n=5, cutoff=0.6) if cores[c] not in close]
    hint = f" Close matches: {', '.join(close[:5])}." if close else ""
    raise ValueError(
        f"The model does not know the {role} {name!r}.{hint} It knows {len(codes)} languages "
        f"(`model.languages`), such as {', '.join(codes[:6])}."
    )


def language_names(codes):
    """`{name: code}`: every name that `resolve_language` takes for one of
    `codes` (the code itself, and the ISO 639-1 / 639-3 codes that name
    it alone), lowercased: what a SavedModel's language inputs look up.

    >>> sorted(language_names(["__en__", "__de__"]).items())[:4]
    [('__de__', '__de__'), ('__en__', '__en__'), ('de', '__de__'), ('deu', '__de__')]
    """
    codes = list(codes)
    names = {}
    for code in codes:
        core = code_core(code)
        for name in {code.lower(), *(_iso_aliases(core) if core else ())}:
            try:
                if resolve_language(name, codes) == code:
                    names[name] = code
            except ValueError:  # (ambiguous: zh for zho_Hans and zho_Hant)
                pass
    return names


def model_languages(tokenizer):
    """The language codes of a tokenizer's vocabulary, in id order: those
    it lists (`language_codes`), else its opus-mt `>>xx<<` tokens; `[]`
    for a model of one language pair."""
    listed = getattr(tokenizer, "language_codes", None)
    if listed is not None:
        return list(listed)
    vocabulary = getattr(tokenizer, "vocabulary", None)
    if not isinstance(vocabulary, dict):
        return []
    return [token for token, _ in sorted(vocabulary.items(), key=lambda item: item[1]) if token.startswith(">>")
            and is_language_code(token)]


def with_languages(tokenizer, texts, source_language, target_language, target_prefix):
    """`(texts, target_prefix)` for `generate`, with the languages placed
    where the model reads them.

    M2M100 and NLLB: each source starts with the source code (unless it
    starts with a language code already), and the target code is forced
    first, before `target_prefix` (text or ids). Without `target_language`,
    the tokenizer's own target language if it has one. opus-mt: the target
    code starts each source. A model without language codes takes neither.
    """
    codes = model_languages(tokenizer)
    if not codes:
        if source_language is not None or target_language is not None:
            raise ValueError(
                "This model translates one language pair: it takes no source_language or target_language. "
                "Multilingual models (M2M100, NLLB-200, opus-mt models with >>xx<< tokens) do."
            )
        return texts, target_prefix
    if codes[0].startswith(">>"):
        if source_language is not None:
            raise ValueError("opus-mt models read the source language from the text: give target_language only.")
        if target_language is None:
            return texts, target_prefix
        code = resolve_language(target_language, codes, "target_language")
        return [_starting_with(text, code, codes) for text in texts], target_prefix
    if source_language is not None:
        code = resolve_language(source_language, codes, "source_language")
        texts = [_starting_with(text, code, codes) for text in texts]
    elif tokenizer.source_language is None and any(_first_word(text) not in codes for text in texts if text.strip()):
        raise ValueError(
            f"Give source_language: this model translates between {len(codes)} languages "
            f"({', '.join(codes[:4])}, ... see `model.languages`), and the sources do not start with a code."
        )
    code = target_language and resolve_language(target_language, codes, "target_language")
    code = code or tokenizer.target_language
    if code is None:
        raise ValueError(
            f"Give target_language: this model translates into {len(codes)} languages "
            f"({', '.join(codes[:4])}, ... see `model.languages`)."
        )
    if isinstance(target_prefix, bytes):
        target_prefix = target_prefix.decode("utf-8")
    if isinstance(target_prefix, str):
        return texts, np.asarray(tokenizer.tokenize_target(f"{code} {target_prefix}")).tolist()
    return texts, [tokenizer.language_id(code), *(target_prefix or ())]


def with_pair_languages(tokenizer, x, source_language, target_language):
    """Sentence pairs `x` (a dict of `encoder_text` and `decoder_text`)
    with their languages where the model reads them in training, for
    `fit` and `evaluate`.

    M2M100 and NLLB: the source code before each source and the target
    code before each target that starts with none, so that the
    preprocessor frames the source `[source code] text </s>`, the decoder
    input `</s> [target code] text` and the labels `[target code] text
    </s>`, as fairseq trained them. opus-mt: the target code before each
    source. Without languages, `x` as it is.

    Example:

    >>> class Codes:  # a tokenizer's languages
    ...     language_codes = ["__en__", "__fr__"]
    >>> with_pair_languages(Codes(), {"encoder_text": ["A dog."], "decoder_text": ["Un chien."]}, "en", "fr")
    {'encoder_text': ['__en__ A dog.'], 'decoder_text': ['__fr__ Un chien.']}
    """
    if source_language is None and target_language is None:
        return x
    codes = model_languages(tokenizer)
    if not codes:
        raise ValueError("This model translates one language pair: it takes no source_language or target_language.")
    if not isinstance(x, dict) or not {"encoder_text", "decoder_text"} <= set(x):
        raise ValueError(
            "source_language and target_language frame sentence pairs held in memory (a dict of 'encoder_text' and "
            "'decoder_text'); the texts of a dataset carry their codes themselves (\"__fr__ Un chien.\")."
        )
    sources, targets = (_texts(x[key]) for key in ("encoder_text", "decoder_text"))
    if codes[0].startswith(">>"):
        if source_language is not None:
            raise ValueError("opus-mt models read the source language from the text: give target_language only.")
        code = resolve_language(target_language, codes, "target_language")
        return {**x, "encoder_text": [_starting_with(text, code, codes) for text in sources]}
    framed = {"encoder_text": sources, "decoder_text": targets}
    for key, language, role in (("encoder_text", source_language, "source_language"),
                                ("decoder_text", target_language, "target_language")):
        if language is not None:
            code = resolve_language(language, codes, role)
            framed[key] = [_starting_with(text, code, codes) for text in framed[key]]
    return {**x, **framed}


def _texts(texts):
    """Texts (a string, or a list or array of strings or bytes) as a list of str."""
    texts = [texts] if isinstance(texts, (str, bytes)) else list(np.asarray(texts, object).reshape(-1))
    return [text.decode("utf-8") if isinstance(text, bytes) else str(text) for text in texts]


def _first_word(text):
    words = text.split(maxsplit=1)
    return words[0] if words else ""


def _starting_with(text, code, codes):
    """`text` with `code` first, unless it is blank or starts with a code."""
    if not text.strip() or _first_word(text) in codes:
        return text
    return f"{code} {text}"

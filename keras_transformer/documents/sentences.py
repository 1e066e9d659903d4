"""Sentences of a paragraph, and pieces of a sentence too long for a model.

A translation model reads one sentence at a time (it was trained on
sentence pairs): a paragraph is split into sentences by sentencex
(Wikimedia's rule-based segmenter, about 300 languages through fallback
chains, with each language's abbreviations: "Dr.", "z. B.", "e.g."), and
a sentence longer than the model reads is split again at a clause
boundary (`;`, `:`, `,`), else between words, else between characters,
into pieces that fit; it is never cut.
"""

import re

from keras_transformer.utils.language_codes import iso_639_1
from keras_transformer.utils.text import is_blank

# Where a too-long sentence may be split, coarsest first: after clause
# punctuation (with the whitespace that follows; none after the
# full-width marks of Chinese and Japanese), then at whitespace.
_CLAUSE_BREAK = re.compile(r"((?<=[;:,])\s+|(?<=[；：，、])\s*)")
_WORD_BREAK = re.compile(r"(\s+)")


def segmenter_language(code):
    """The ISO 639-1 code that sentencex knows a language by, for a code
    as the models name languages: ISO 639-1 or 639-3 (`"de"`, `"deu"`), or
    a multilingual model's (`"__de__"`, `"deu_Latn"`, `">>de<<"`). Codes
    it cannot read are given as they are (sentencex then falls back to
    English's rules).

    >>> [segmenter_language(code) for code in ("de", "deu", "__fr__", "ces_Latn", ">>es<<", "DE")]
    ['de', 'de', 'fr', 'cs', 'es', 'de']
    """
    return iso_639_1(code)


def sentences(text, language="en"):
    """The sentences of `text` (one line: sentencex reads line breaks as
    paragraph breaks), as `(start, end)` character spans without the
    whitespace around them, in order; `[]` for a blank text.

    Example:

    >>> text = "Dr. Smith met us, e.g. at noon. Then he left!"
    >>> [text[start:end] for start, end in sentences(text)]
    ['Dr. Smith met us, e.g. at noon.', 'Then he left!']
    >>> text = "Das ist z. B. ein Test. Er kam am 3. Mai an."
    >>> [text[start:end] for start, end in sentences(text, "de")]
    ['Das ist z. B. ein Test.', 'Er kam am 3. Mai an.']
    """
    segment = _segmenter()
    found = list(segment(segmenter_language(language), text))
    if "".join(found) != text:  # (sentencex keeps every character; were it not to, one sentence)
        found = [text]
    spans, start = [], 0
    for sentence in found:
        end = start + len(sentence)
        stripped = sentence.strip()
        if stripped and not is_blank(stripped):
            first = start + len(sentence) - len(sentence.lstrip())
            spans.append((first, first + len(stripped)))
        start = end
    return spans


def _segmenter():
    try:
        from sentencex import segment
    except ImportError:
        raise ImportError(
            "Splitting documents into sentences needs sentencex: pip install 'keras-aiayn[documents]' "
            "(or pip install sentencex)."
        ) from None
    return segment


def fitting_pieces(text, max_tokens, count_tokens):
    """`text` split into pieces of at most `max_tokens` tokens each (as
    `count_tokens(piece)` counts them), each with the text that follows
    it (whitespace, or `""`): at clause punctuation (`;:,`) where that
    makes pieces that fit, else between words, else between characters.
    The pieces and what follows them make up `text` exactly. A text that
    fits is one piece.

    Raises:
        ValueError: a single character takes more than `max_tokens`.

    Example:

    >>> words = lambda piece: len(piece.split())
    >>> fitting_pieces("one two, three four five; six", 3, words)
    [('one two,', ' '), ('three four five;', ' '), ('six', '')]
    >>> fitting_pieces("one two three four five", 2, words)
    [('one two', ' '), ('three four', ' '), ('five', '')]
    """
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return [(text, "")]
    return _packed(text, max_tokens, count_tokens, level=0)


def _units(text, level):
    """`text` as `[(unit, separator), ...]` at a split level: clauses (0),
    words (1), characters (2)."""
    if level == 2:
        return [(character, "") for character in text]
    parts = (_CLAUSE_BREAK if level == 0 else _WORD_BREAK).split(text)
    units = [(parts[i], parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)]
    return [(unit, separator) for unit, separator in units if unit] or [(text, "")]


def _joined(units):
    """The text of consecutive units, with the separators between them."""
    return "".join(unit + separator for unit, separator in units[:-1]) + units[-1][0]


def _packed(text, max_tokens, count_tokens, level):
    """`fitting_pieces` of `text` from split level `level` on: as many
    consecutive units a piece as fit (the most, found by bisection), a
    unit that does not fit alone split at the next level."""
    if level == 3:
        raise ValueError(
            f"The character {text!r} alone takes {count_tokens(text)} tokens, more than max_tokens={max_tokens}."
        )
    units = _units(text, level)
    pieces, start = [], 0
    while start < len(units):
        if count_tokens(units[start][0]) > max_tokens:
            inner = _packed(units[start][0], max_tokens, count_tokens, level + 1)
            pieces.extend(inner[:-1])
            pieces.append((inner[-1][0], units[start][1]))
            start += 1
            continue
        fits, over = start + 1, len(units) + 1  # units[start:fits] fit; units[start:over] do not
        while over - fits > 1:
            middle = (fits + over) // 2
            if count_tokens(_joined(units[start:middle])) <= max_tokens:
                fits = middle
            else:
                over = middle
        pieces.append((_joined(units[start:fits]), units[fits - 1][1]))
        start = fits
    return pieces

"""A document as the sentences to translate, and the plan that puts their
translations back together.

`Document(text)` splits a text into what a translation model reads, one
sentence at a time (`segments`), and keeps everything else as it was:
line breaks and blank lines, the whitespace at the start and end of each
line and between sentences, and, for HTML, the markup (`markup.py`).
`assemble(translations)` puts one translation for each segment back in
the segment's place. Every sentence is a segment once, in order; a
sentence longer than the model reads (`max_tokens`) is split into pieces
that fit (`sentences.fitting_pieces`), never cut.
"""

import operator
import re

from keras_transformer.documents import inline
from keras_transformer.documents.markup import MarkupPiece
from keras_transformer.documents.markup import html_pieces
from keras_transformer.documents.markup import quote_escaper
from keras_transformer.documents.sentences import fitting_pieces
from keras_transformer.documents.sentences import sentences
from keras_transformer.utils.text import is_blank

FORMATS = ("text", "html")

# A line's end, kept with it (as `utils.text.split_lines` reads lines).
_LINE_END = re.compile(r"(\r\n|\r|\n)")
# HTML's whitespace, which a reader sees as one space (not the no-break space).
_HTML_SPACE = re.compile(r"[ \t\n\r\f]+")


class Document:
    """A text split into the sentences a model translates, and put back
    together from their translations.

    Each line of a text document (HTML: the text of each run of text
    nodes and inline elements such as `<b>` and `<a>`, read as HTML's
    whitespace reads) is split into sentences by a segmenter that knows
    the `language`'s abbreviations (`sentences.sentences`). What is not a
    sentence stays as it is: line breaks, blank lines, the whitespace
    around and between sentences, and HTML's markup. The tags of inline
    elements inside a sentence go with it (`markup_segments`) and into
    its translation around the words their words became (`assemble`,
    `inline.py`).

    Args:
        text: the document, a string.
        format: `"text"`, or `"html"`: tags, attributes, comments and the
            contents of `<script>` and `<style>` are kept as written; text
            nodes and the attributes written for readers (`alt`, `title`,
            `placeholder`, `aria-label`, `label`, a button's `value`) are
            translated, except inside elements marked `translate="no"` (or
            `class="notranslate"`); translations are escaped as the
            document escaped its text (`markup.html_pieces`).
        language: the document's language, an ISO 639-1 or 639-3 code or
            a multilingual model's code (`"de"`, `"deu"`, `"deu_Latn"`),
            for the segmenter's rules.
        max_tokens: the most tokens a segment may have (the model's
            limit), or None for no limit. A longer sentence is split at
            clause punctuation (`;`, `:`, `,`), else between words, else
            between characters, into pieces that fit; each piece is a
            segment.
        tokenize: `tokenize(text)`: the number of tokens of `text` as the
            model reads it (its tokenizer's pieces, with any start and end
            tokens). None: whitespace-separated words.
        split_sentences: False: each line (HTML: the text of each run of
            text nodes and inline elements) is one segment, split only
            where longer than `max_tokens`.

    Example:

    >>> text = "  Dr. Smith arrived. He was late!\\n\\nThe end.\\n"
    >>> document = Document(text)
    >>> document.segments
    ['Dr. Smith arrived.', 'He was late!', 'The end.']
    >>> document.assemble([segment.upper() for segment in document.segments])
    '  DR. SMITH ARRIVED. HE WAS LATE!\\n\\nTHE END.\\n'
    >>> page = Document('<p title="A note.">Hello &amp; welcome. <code translate="no">Bye.</code></p>',
    ...                 format="html")
    >>> page.segments
    ['A note.', 'Hello & welcome.']
    >>> page.assemble(["Eine Notiz.", "Hallo & willkommen."])
    '<p title="Eine Notiz.">Hallo &amp; willkommen. <code translate="no">Bye.</code></p>'
    """

    def __init__(self, text, format="text", language="en", max_tokens=None, tokenize=None, split_sentences=True):
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise TypeError(f"A document is a string, got {type(text).__name__}: {text!r:.60}.")
        if format not in FORMATS:
            raise ValueError(f"Unknown format {format!r}; expected one of {FORMATS}.")
        if not isinstance(language, str) or not language.strip():
            raise ValueError(f"language must be a language code such as 'en', got {language!r}.")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}.")
        if tokenize is not None and not callable(tokenize):
            raise TypeError(f"tokenize must be a function of a text that counts its tokens, got {tokenize!r}.")
        self.text, self.format, self.language = text, format, language
        self.max_tokens, self.split_sentences = max_tokens, split_sentences
        self._count = _checked_count(tokenize or _words)
        self._segments, self._parts = [], []
        self._quoted = {}  # segment -> the escape of its attribute value's quote mark
        self._inline = {}  # segment -> its inline tags (`inline.InlineTag`, positions in the segment)
        if format == "html":
            self._add_html(text)
        else:
            self._escape = None
            self._add_lines(text)

    @property
    def segments(self):
        """The non-blank sentences (or pieces of sentences) to translate,
        in order: a list of strings."""
        return list(self._segments)

    @property
    def markup_segments(self):
        """The indices of the segments that inline HTML elements cut
        (`A <b>big</b> dog.`), in order: their translations take the
        elements' tags back where a word alignment says (`assemble`)."""
        return sorted(self._inline)

    def assemble(self, translations, alignments=None):
        """The translated document: `translations` (one string for each
        of `segments`, in order) in the segments' places, everything else
        as it was (HTML: the translations escaped).

        `alignments`: for each of `markup_segments`, in order, the word
        alignment of the segment and its translation
        (`keras_transformer.models.transformer.alignment.alignments`:
        `(target_start, target_end, source_start, source_end, ways)` of
        target and source tokens, `ways` optional), which places the
        inline tags; None: words at the same share of the sentence
        (`inline.proportional_alignment`)."""
        if isinstance(translations, (str, bytes)) or not hasattr(translations, "__len__"):
            raise TypeError(f"translations must be a list of strings, got {type(translations).__name__}.")
        translations = list(translations)
        if len(translations) != len(self._segments):
            raise ValueError(
                f"This document has {len(self._segments)} segments; got {len(translations)} translations."
            )
        for i, translation in enumerate(translations):
            if not isinstance(translation, str):
                raise TypeError(f"translations[{i}] is a {type(translation).__name__}, not a string.")
        escape = self._escape or (lambda text: text)
        written = [escape(translation) for translation in translations]
        for i, quote in self._quoted.items():
            written[i] = quote(written[i])
        markup = self.markup_segments
        if alignments is None:
            alignments = [inline.proportional_alignment(self._segments[i], translations[i]) for i in markup]
        if len(alignments) != len(markup):
            raise ValueError(f"This document has {len(markup)} segments with markup; got {len(alignments)} "
                             "alignments.")
        for i, alignment in zip(markup, alignments):
            written[i] = inline.place_markup(self._segments[i], translations[i], self._inline[i], alignment, escape)
        return "".join(part if isinstance(part, str) else written[part] for part in self._parts)

    def __repr__(self):
        return f"<Document format={self.format!r} language={self.language!r}: {len(self._segments)} segments>"

    def _add_html(self, text):
        """An HTML document's pieces: markup kept, text translated, the
        inline elements' tags read with the text around them (`inline.Run`)."""
        pieces, self._escape = html_pieces(text)
        run = inline.Run()
        for piece in pieces:
            if not isinstance(piece, MarkupPiece) and not piece.quote and not piece.preformatted:
                run.add_text(piece)
                continue
            if isinstance(piece, MarkupPiece):
                for start, end, kind, name in piece.tags:
                    if kind in ("start", "end") and name in inline.INLINE_ELEMENTS:
                        run.add_tag(kind, name, piece[start:end])
                        continue
                    run = self._add_run(run)
                    self._parts.append(piece[start:end])
                continue
            run = self._add_run(run)
            if piece.quote:
                self._add_line(piece, flowing=True, quote=quote_escaper(piece.quote))
            else:
                self._add_lines(piece)
        self._add_run(run)

    def _add_run(self, run):
        """A run's text and inline tags (`inline.Run`), its sentences as
        segments; a new, empty run."""
        text, tags = run.text, run.tags
        if not tags or not run.nested:  # (markup kept between pieces translated each on its own)
            position = 0
            for tag in [*tags, None]:
                end = len(text) if tag is None else tag.position
                if end > position:
                    self._add_line(text[position:end], flowing=True)
                    position = end
                if tag is not None:
                    self._parts.append(tag.markup)
            return inline.Run()
        spans = self._sentence_spans(text)
        owners = inline.tag_owners(tags, spans)
        between = iter([tag for tag, owner in zip(tags, owners) if owner is None] + [None])
        waiting, cursor = next(between), 0
        for j, (first, last) in enumerate(spans + [(len(text), len(text))]):
            while waiting is not None and waiting.position <= first:
                self._literal(text[cursor : waiting.position])
                self._parts.append(waiting.markup)
                cursor, waiting = waiting.position, next(between)
            self._literal(text[cursor:first])
            if j < len(spans):
                before, inside, after = inline.peel_covering(
                    [tag for tag, owner in zip(tags, owners) if owner == j], first, last)
                self._parts.extend(tag.markup for tag in before)
                self._add_sentence(text[first:last], flowing=True, tags=[
                    tag._replace(position=tag.position - first) for tag in inside])
                self._parts.extend(tag.markup for tag in after)
            cursor = last
        return inline.Run()

    def _sentence_spans(self, text):
        """The sentences of a run's text, `(first, last)`, as `_add_line`
        finds a line's; none in blank text."""
        content = text.strip()
        if is_blank(content):
            return []
        start = len(text) - len(text.lstrip())
        if not self.split_sentences:
            return [(start, start + len(content))]
        found = sentences(_HTML_SPACE.sub(lambda m: " " * len(m.group()), content), self.language)
        return [(start + first, start + last) for first, last in found]

    def _literal(self, text, quote=None):
        text = self._escape(text) if self._escape else text
        self._parts.append(quote(text) if quote else text)

    def _add_lines(self, text):
        """Each line of `text` on its own, its line end kept."""
        parts = _LINE_END.split(text)
        for i in range(0, len(parts), 2):
            self._add_line(parts[i])
            if i + 1 < len(parts):
                self._literal(parts[i + 1])

    def _add_line(self, line, flowing=False, quote=None):
        """The sentences of `line` as segments, and what is around and
        between them as it is. `flowing` (HTML's text): line breaks inside
        a sentence are spaces, and a sentence's runs of HTML whitespace
        are one space for the model. `quote`: for an attribute's value,
        the escape of its quote mark (`markup.quote_escaper`)."""
        content = line.strip()
        if is_blank(content):
            self._literal(line, quote)
            return
        start = len(line) - len(line.lstrip())
        self._literal(line[:start], quote)
        end = start + len(content)
        if self.split_sentences:
            spans = sentences(_HTML_SPACE.sub(lambda m: " " * len(m.group()), content) if flowing else content,
                              self.language)
        else:
            spans = [(0, len(content))]
        cursor = 0
        for first, last in spans:
            self._literal(content[cursor:first], quote)
            self._add_sentence(content[first:last], flowing, quote)
            cursor = last
        self._literal(content[cursor:] + line[end:], quote)

    def _add_sentence(self, sentence, flowing=False, quote=None, tags=()):
        """A sentence as a segment (pieces, where longer than the model
        reads); with inline `tags` (positions in `sentence`), one segment
        that carries them, or, where it must be cut into pieces, the text
        between the tags translated piece by piece."""
        if flowing:
            tags = [tag._replace(position=len(_HTML_SPACE.sub(" ", sentence[: tag.position]))) for tag in tags]
            sentence = _HTML_SPACE.sub(" ", sentence)
        pieces = fitting_pieces(sentence, self.max_tokens, self._count)
        if tags and len(pieces) > 1:
            position = 0
            for tag in tags:
                self._add_line(sentence[position : tag.position], flowing=True)
                self._parts.append(tag.markup)
                position = tag.position
            self._add_line(sentence[position:], flowing=True)
            return
        if tags:
            self._inline[len(self._segments)] = list(tags)
        for piece, after in pieces:
            if quote:
                self._quoted[len(self._segments)] = quote
            self._parts.append(len(self._segments))
            self._segments.append(piece)
            self._literal(after, quote)


def _words(text):
    return len(text.split())


def _checked_count(tokenize):
    """`tokenize`, which must give a number of tokens (an integer >= 0)."""

    def count(text):
        tokens = tokenize(text)
        try:
            tokens = operator.index(tokens)
        except TypeError:
            tokens = -1
        if tokens < 0:
            raise TypeError(f"tokenize must give a number of tokens (an integer >= 0), got {tokenize(text)!r}.")
        return tokens

    return count


def segments_of(documents):
    """The segments of `documents`, all in one list, in order."""
    return [segment for document in documents for segment in document.segments]


def markup_pairs(documents, translations):
    """The segments of `documents` that inline markup cuts
    (`Document.markup_segments`) and their translations (from
    `translations`, those of `segments_of(documents)`): two lists, in
    order, for a word aligner (`assembled`'s `alignments`)."""
    sources, targets, start = [], [], 0
    for document in documents:
        for i in document.markup_segments:
            sources.append(document.segments[i])
            targets.append(translations[start + i])
        start += len(document.segments)
    return sources, targets


def assembled(documents, translations, alignments=None):
    """Each of `documents` assembled from its part of `translations` (the
    translations of `segments_of(documents)`, in order) and of
    `alignments` (one for each pair of `markup_pairs`, or None)."""
    translations, start, texts = list(translations), 0, []
    aligned = iter(alignments) if alignments is not None else None
    for document in documents:
        count = len(document.segments)
        own = None if aligned is None else [next(aligned) for _ in document.markup_segments]
        texts.append(document.assemble(translations[start : start + count], own))
        start += count
    return texts

"""HTML as markup to keep and text to translate, with Python's own parser
(`html.parser`).

An HTML document is read as a run of pieces: markup (tags with their
attributes as written, comments, declarations, and the contents of
`<script>` and `<style>`), kept character for character, and text (the
text nodes between tags, their entities and character references decoded,
and the values of the attributes that HTML names as text for readers:
`alt`, `title`, `placeholder`, `aria-label`, `label`, and the `value` of a
button-like `<input>`), which is translated. What an element marks as not
to translate (`translate="no"`, or Google's `class="notranslate"`) is kept
as it is, its contents and attributes too. Text written back is escaped
again: `&`, `<` and `>`, and every character the document itself wrote as
an entity or a character reference, spelled as it spelled it (`&nbsp;`
stays `&nbsp;`, `&#169;` stays `&#169;`), so that text the translation
leaves as it was comes back as it was written; in an attribute's value,
its quote mark too.
"""

import html
import html.parser
import re

# Elements whose text keeps its line breaks (`Document` translates it line
# by line); elsewhere HTML's whitespace is one space to a reader.
PREFORMATTED = ("pre", "textarea", "listing", "plaintext")
# Elements whose contents are not text to read: kept as they are.
RAW_TEXT = ("script", "style")
# Attributes whose values are text for readers (HTML's "translatable
# attributes"), on any element; and `<input>` types whose `value` is a label.
TRANSLATED_ATTRIBUTES = ("alt", "title", "placeholder", "aria-label", "label")
LABELLED_INPUTS = ("button", "submit", "reset")
# Elements without contents (no end tag).
VOID = ("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr")

_ALWAYS_ESCAPED = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# An entity or character reference as `html.parser` reads one.
_REFERENCE = re.compile(r"&(?:#(?:[0-9]+|[xX][0-9a-fA-F]+)|[a-zA-Z][-.a-zA-Z0-9]*);?")


class MarkupPiece(str):
    """Markup of an HTML document, kept as it is, with `tags`: what each
    part of it is, `(start, end, kind, name)` (its characters
    `[start, end)`; `kind` "start", "end" or "void" for an element's tag
    that holds all of it, else None: a comment, a declaration, what an
    element marked not to translate holds, or a start tag cut by an
    attribute's text)."""

    def __new__(cls, markup, tags=()):
        piece = super().__new__(cls, markup)
        piece.tags = tuple(tags)
        return piece

    def __add__(self, other):
        shift = len(self)
        tags = (*self.tags, *((start + shift, end + shift, kind, name) for start, end, kind, name in other.tags))
        return MarkupPiece(str.__add__(self, other), tags)


class TextPiece(str):
    """Text of an HTML document (entities decoded), with `preformatted`:
    whether it sits in an element that keeps its line breaks, and `quote`:
    for an attribute's value, the quote mark around it (else None)."""

    def __new__(cls, text, preformatted=False, quote=None):
        piece = super().__new__(cls, text)
        piece.preformatted, piece.quote = preformatted, quote
        return piece


def html_pieces(document):
    """The `MarkupPiece`s and `TextPiece`s of an HTML `document`, in order,
    and the escape function for text written back into it (`escaper`).

    Example:

    >>> pieces, escape = html_pieces('<p class="x">Tom &amp; Jerry</p><script>a < b</script>')
    >>> [(type(piece).__name__, str(piece)) for piece in pieces]
    [('MarkupPiece', '<p class="x">'), ('TextPiece', 'Tom & Jerry'), ('MarkupPiece', '</p><script>a < b</script>')]
    >>> escape("Tom & Jerry")
    'Tom &amp; Jerry'
    >>> [str(piece) for piece in html_pieces('<img src="d.png" alt="A dog">')[0]]
    ['<img src="d.png" alt="', 'A dog', '">']
    """
    parser = _Parser(document)
    pieces = [_markup_piece(document[: parser.events[0][0]])] if parser.events else [_markup_piece(document)]
    ends = [event[0] for event in parser.events[1:]] + [len(document)]
    for (offset, length, text, preformatted, quote), following in zip(parser.events, ends):
        if length is None:  # markup, up to the next event; `text` is its tag's (kind, name) or None
            _add(pieces, _markup_piece(document[offset:following], text))
            continue
        _add(pieces, TextPiece(text, preformatted, quote))
        if offset + length < following:  # (what the parser passed over without an event)
            _add(pieces, _markup_piece(document[offset + length : following]))
    return [piece for piece in pieces if piece], escaper(parser.references)


def _markup_piece(markup, tag=None):
    """`markup` as a `MarkupPiece`, all of it one part: the tag `tag`
    (`(kind, name)`) or, for None, other markup."""
    kind, name = tag or (None, None)
    return MarkupPiece(markup, [(0, len(markup), kind, name)] if markup else [])


def _add(pieces, piece):
    """Appends `piece`, joined to the last piece where both are markup, or
    both text of the same kind."""
    if pieces and type(pieces[-1]) is type(piece):
        if isinstance(piece, MarkupPiece):
            pieces[-1] = pieces[-1] + piece
            return
        if (pieces[-1].preformatted, pieces[-1].quote) == (piece.preformatted, piece.quote) and piece.quote is None:
            pieces[-1] = TextPiece(pieces[-1] + piece, piece.preformatted)
            return
    pieces.append(piece)


def escaper(references=None):
    """The function that escapes text for an HTML document whose entities
    and character references spelled characters as `references` says
    (`{"\\xa0": "&nbsp;"}`): `&`, `<`, `>` always (as the document spelled
    them, else `&amp;`, `&lt;`, `&gt;`), the others as the document did.

    >>> escaper({"\\xa0": "&nbsp;", "<": "&#60;"})("a\\xa0<\\xa0b & c")
    'a&nbsp;&#60;&nbsp;b &amp; c'
    """
    spelled = {**_ALWAYS_ESCAPED, **(references or {})}
    pattern = re.compile("|".join(re.escape(character) for character in sorted(spelled, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda match: spelled[match.group()], text)


def quote_escaper(quote):
    """The function that escapes the quote mark `quote` (`"` or `'`) of an
    attribute's value, after `escaper`'s escapes.

    >>> quote_escaper('"')('Say "hi"'), quote_escaper("'")("It's")
    ('Say &quot;hi&quot;', 'It&#39;s')
    """
    spelled = {'"': "&quot;", "'": "&#39;"}[quote]
    return lambda text: text.replace(quote, spelled)


class _Parser(html.parser.HTMLParser):
    """`html.parser` that notes where each of its events starts in the
    document: `events` holds `(offset, length, text, preformatted, quote)`
    for text (`length` characters of the document, `text` decoded; `quote`
    the quote mark of an attribute's value, else None) and `(offset, None,
    tag, None, None)` for markup, which runs to the next event: `tag` is
    `(kind, name)` for an element's whole tag (kind "start", "end" or
    "void"), else None."""

    def __init__(self, document):
        super().__init__(convert_charrefs=False)
        self.events, self.references = [], {}
        self._line_starts = [0] + [match.end() for match in re.finditer("\n", document)]
        self._document = document
        self._preformatted = 0
        self._kept = []  # the open elements from one marked not to translate on
        self.feed(document)
        self.close()

    def _offset(self):
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def _markup(self, offset=None, tag=None):
        self.events.append((self._offset() if offset is None else offset, None, tag, None, None))

    def handle_starttag(self, tag, attrs):
        self._start_tag(tag, attrs, void=tag in VOID)
        if tag in PREFORMATTED:
            self._preformatted += 1

    def handle_endtag(self, tag):
        self._markup(tag=None if self._kept else ("end", tag))
        if tag in PREFORMATTED and self._preformatted:
            self._preformatted -= 1
        if tag in self._kept:  # (the elements left open inside it close with it)
            del self._kept[len(self._kept) - 1 - self._kept[::-1].index(tag):]

    def handle_startendtag(self, tag, attrs):
        self._start_tag(tag, attrs, void=True)

    def _start_tag(self, tag, attrs, void):
        """A start tag as markup, the values of its attributes for readers
        as text (quoted, not blank), unless it or an element around it is
        marked not to translate."""
        offset = self._offset()
        values = {name: value or "" for name, value in attrs}
        kept = self._kept or values.get("translate", "").strip().lower() == "no" or (
            "notranslate" in values.get("class", "").split()
        )
        self._markup(offset, None if kept else ("void" if void else "start", tag))
        if kept and not void:
            self._kept.append(tag)
        if kept:
            return
        labelled = tag == "input" and values.get("type", "").strip().lower() in LABELLED_INPUTS
        written = self.get_starttag_text()
        tag_event = len(self.events) - 1
        # (html.parser's own pattern of an attribute, as it read this tag's.)
        for match in html.parser.attrfind_tolerant.finditer(written, 1 + len(tag)):
            name, value = match.group(1).lower(), match.group(3)
            if not (name in TRANSLATED_ATTRIBUTES or (labelled and name == "value")):
                continue
            if value and value[0] in "'\"" and len(value) > 1 and value[1:-1].strip():
                self.events[tag_event] = (offset, None, None, None, None)  # (cut by its text: not whole)
                start = offset + match.start(3) + 1
                for reference in _REFERENCE.finditer(value[1:-1]):
                    self._note_spelling(reference.group())
                self.events.append((start, len(value) - 2, html.unescape(value[1:-1]), False, value[0]))
                self._markup(start + len(value) - 2)

    def handle_comment(self, data):
        self._markup()

    def handle_decl(self, decl):
        self._markup()

    def handle_pi(self, data):
        self._markup()

    def unknown_decl(self, data):
        self._markup()

    def handle_data(self, data):
        if self.cdata_elem in RAW_TEXT or self._kept:
            self._markup()
            return
        # (Decoded too: what the parser leaves undecoded, such as a last
        # "&copy" without its ";", a browser shows decoded.)
        self.events.append((self._offset(), len(data), html.unescape(data), self._preformatted > 0, None))

    def _reference(self):
        if self._kept:
            self._markup()
            return
        offset = self._offset()
        written = _REFERENCE.match(self._document, offset).group()
        self._note_spelling(written)
        self.events.append((offset, len(written), html.unescape(written), self._preformatted > 0, None))

    def _note_spelling(self, written):
        """Notes how the document spelled a character as a reference
        (`written`, as `&nbsp;`), for its text written back."""
        character = html.unescape(written)
        if len(character) == 1 and character != written and not (character.isascii() and character.isalnum()):
            self.references.setdefault(character, written)

    def handle_entityref(self, name):
        self._reference()

    def handle_charref(self, name):
        self._reference()

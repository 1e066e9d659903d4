"""HTML as markup to keep and text to translate, with Python's own parser
(`html.parser`).

An HTML document is read as a run of pieces: markup (tags with their
attributes as written, comments, declarations, and the contents of
`<script>` and `<style>`), kept character for character, and text (the
text nodes between tags, their entities and character references decoded),
which is translated. Text written back is escaped again: `&`, `<` and `>`,
and every character the document itself wrote as an entity or a character
reference, spelled as it spelled it (`&nbsp;` stays `&nbsp;`, `&#169;`
stays `&#169;`), so that text the translation leaves as it was comes back
as it was written.
"""

import html
import html.parser
import re

# Elements whose text keeps its line breaks (`Document` translates it line
# by line); elsewhere HTML's whitespace is one space to a reader.
PREFORMATTED = ("pre", "textarea", "listing", "plaintext")
# Elements whose contents are not text to read: kept as they are.
RAW_TEXT = ("script", "style")

_ALWAYS_ESCAPED = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# An entity or character reference as `html.parser` reads one.
_REFERENCE = re.compile(r"&(?:#(?:[0-9]+|[xX][0-9a-fA-F]+)|[a-zA-Z][-.a-zA-Z0-9]*);?")


class MarkupPiece(str):
    """Markup of an HTML document, kept as it is."""


class TextPiece(str):
    """Text of an HTML document (entities decoded), with `preformatted`:
    whether it sits in an element that keeps its line breaks."""

    def __new__(cls, text, preformatted=False):
        piece = super().__new__(cls, text)
        piece.preformatted = preformatted
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
    """
    parser = _Parser(document)
    pieces = [MarkupPiece(document[: parser.events[0][0]])] if parser.events else [MarkupPiece(document)]
    ends = [event[0] for event in parser.events[1:]] + [len(document)]
    for (offset, length, text, preformatted), following in zip(parser.events, ends):
        if length is None:  # markup, up to the next event
            _add(pieces, MarkupPiece(document[offset:following]))
            continue
        _add(pieces, TextPiece(text, preformatted))
        if offset + length < following:  # (what the parser passed over without an event)
            _add(pieces, MarkupPiece(document[offset + length : following]))
    return [piece for piece in pieces if piece], escaper(parser.references)


def _add(pieces, piece):
    """Appends `piece`, joined to the last piece where both are markup, or
    both text of the same kind."""
    if pieces and type(pieces[-1]) is type(piece):
        if isinstance(piece, MarkupPiece):
            pieces[-1] = MarkupPiece(pieces[-1] + piece)
            return
        if pieces[-1].preformatted == piece.preformatted:
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


class _Parser(html.parser.HTMLParser):
    """`html.parser` that notes where each of its events starts in the
    document: `events` holds `(offset, length, text, preformatted)` for
    text (`length` characters of the document, `text` decoded) and
    `(offset, None, None, None)` for markup, which runs to the next event."""

    def __init__(self, document):
        super().__init__(convert_charrefs=False)
        self.events, self.references = [], {}
        self._line_starts = [0] + [match.end() for match in re.finditer("\n", document)]
        self._document = document
        self._preformatted = 0
        self.feed(document)
        self.close()

    def _offset(self):
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def _markup(self):
        self.events.append((self._offset(), None, None, None))

    def handle_starttag(self, tag, attrs):
        self._markup()
        if tag in PREFORMATTED:
            self._preformatted += 1

    def handle_endtag(self, tag):
        self._markup()
        if tag in PREFORMATTED and self._preformatted:
            self._preformatted -= 1

    def handle_startendtag(self, tag, attrs):
        self._markup()

    def handle_comment(self, data):
        self._markup()

    def handle_decl(self, decl):
        self._markup()

    def handle_pi(self, data):
        self._markup()

    def unknown_decl(self, data):
        self._markup()

    def handle_data(self, data):
        if self.cdata_elem in RAW_TEXT:
            self._markup()
            return
        # (Decoded too: what the parser leaves undecoded, such as a last
        # "&copy" without its ";", a browser shows decoded.)
        self.events.append((self._offset(), len(data), html.unescape(data), self._preformatted > 0))

    def _reference(self):
        offset = self._offset()
        written = _REFERENCE.match(self._document, offset).group()
        character = html.unescape(written)
        if len(character) == 1 and character != written and not (character.isascii() and character.isalnum()):
            self.references.setdefault(character, written)
        self.events.append((offset, len(written), character, self._preformatted > 0))

    def handle_entityref(self, name):
        self._reference()

    def handle_charref(self, name):
        self._reference()

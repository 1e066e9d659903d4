"""Inline markup inside sentences: HTML's phrasing elements (`<b>`, `<a>`,
`<em>`, `<span>`, ...) read with the text around them, so that a sentence
they cut (`A <b>big</b> dog.`) is translated whole, and their tags put
back into its translation around the words their words became.

`Run` collects the text of consecutive text nodes and the inline tags
between them (a block's tag, a line break, an image or a comment ends a
run). `Document` finds the run's sentences; a tag at a sentence's edge
whose element holds the whole sentence stays outside it
(`peel_covering`); the others go with the sentence (`tag_owners`). Once
translated, `place_markup` puts them back where a word alignment says
(`models.transformer.alignment`: the model's encoder-decoder attention;
`proportional_alignment` without a model): an element holds the
translation's words that came from its words, widened to whole words,
kept within the element around it and beside, not across, its sibling
elements (siblings may change order, as words do). An element whose words
left no word in the translation is placed, empty, where its place in the
source says.
"""

import bisect
import re
import unicodedata
from typing import NamedTuple

# HTML's phrasing elements whose tags a sentence's translation carries.
INLINE_ELEMENTS = frozenset(
    "a abbr b bdi bdo cite code data del dfn em font i ins kbd mark q s samp small span strong sub sup time "
    "tt u var".split()
)
# Scripts written without spaces between words: a tag there is placed
# at a token's edge, not widened to a word's.
_UNSPACED_SCRIPTS = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN")


class InlineTag(NamedTuple):
    """An inline element's tag in a run's (or a sentence's) text.

    Attributes:
        position: the character of the text it stands before.
        kind: "start" or "end".
        markup: the tag as the document wrote it.
        element: the element it belongs to (its start and end tags share it).
    """

    position: int
    kind: str
    markup: str
    element: int


class Run:
    """Text nodes and the inline tags between them, in order: `text` (the
    text nodes joined) and `tags` (`InlineTag`s). `nested` is False once an
    end tag closes an element that is not the last one open (`<b><i></b>`):
    such markup is kept as it was, between separately translated pieces."""

    def __init__(self):
        self.pieces, self.tags, self.nested = [], [], True
        self._length, self._open = 0, []  # (name, element) of the elements open in the run

    @property
    def text(self):
        return "".join(self.pieces)

    def add_text(self, text):
        self.pieces.append(text)
        self._length += len(text)

    def add_tag(self, kind, name, markup):
        element = len(self.tags)
        if kind == "start":
            self._open.append((name, element))
        elif self._open and self._open[-1][0] == name:
            element = self._open.pop()[1]
        elif self._open:
            self.nested = False
        self.tags.append(InlineTag(self._length, kind, markup, element))


def tag_owners(tags, spans):
    """For each tag, the index of the sentence (`spans`, `(first, last)`
    in the run's text, in order) it goes with, or None for one between
    sentences: a tag inside a sentence goes with it; at its first
    character, a start tag; after its last, an end tag."""
    firsts = [first for first, _ in spans]
    return [_owner(tag, spans, bisect.bisect_right(firsts, tag.position) - 1) for tag in tags]


def _owner(tag, spans, last_started):
    """The sentence of `tag`: the last one to start at or before it, or, for
    an end tag where the next starts, the one before."""
    for j in (last_started, last_started - 1):
        first, last = spans[j] if j >= 0 else (0, -1)
        if (first < tag.position < last or (tag.position == first and tag.kind == "start")
                or (tag.position == last and tag.kind == "end")):
            return j
    return None


def peel_covering(tags, first, last):
    """A sentence's tags (`tags`, in the run's positions) as `(before,
    inside, after)`: the tags of elements that hold the whole sentence
    (open from its first character or before, closed after its last or
    later) go before or after it, as written; the others stay with it."""
    starts = {tag.element: tag for tag in tags if tag.kind == "start"}
    ends = {tag.element: tag for tag in tags if tag.kind == "end"}
    covering = {
        element for element in {*starts, *ends}
        if (element not in starts or starts[element].position == first)
        and (element not in ends or ends[element].position == last)
    }
    before = [tag for tag in tags if tag.element in covering and tag.kind == "start"]
    after = [tag for tag in tags if tag.element in covering and tag.kind == "end"]
    return before, [tag for tag in tags if tag.element not in covering], after


def proportional_alignment(source, target):
    """An alignment without a model: each word of `target` with the word
    of `source` at the same share of the sentence, as `alignment`s give
    them (`(target_start, target_end, source_start, source_end)`).

    >>> proportional_alignment("A big dog.", "Ein großer Hund.")
    [(0, 3, 0, 1), (4, 10, 2, 5), (11, 16, 6, 10)]
    """
    source_words, target_words = _words(source), _words(target)
    if not source_words:
        return []
    return [
        (*word, *source_words[min(len(source_words) - 1, (2 * k + 1) * len(source_words) // (2 * len(target_words)))])
        for k, word in enumerate(target_words)
    ]


def _words(text):
    return [match.span() for match in re.finditer(r"\S+", text)]


class _Element:
    def __init__(self, start=None, end=None, a=0, b=0):
        self.start, self.end, self.a, self.b = start, end, a, b
        self.children, self.range = [], (0, 0)


def place_markup(source, translation, tags, alignment, escape):
    """The translation of a sentence with its inline tags put back: HTML,
    the translation's text escaped by `escape`.

    Args:
        source: the sentence (a string).
        translation: its translation.
        tags: the sentence's `InlineTag`s, positions in the sentence.
        alignment: `(target_start, target_end, source_start, source_end,
            ways)` for the translation's tokens (`alignment.alignments`;
            without `ways`, each is aligned both ways).
        escape: the document's escape for text.

    >>> tags = [InlineTag(2, "start", "<b>", 0), InlineTag(5, "end", "</b>", 0)]
    >>> place_markup("A big dog.", "Ein großer Hund.", tags,
    ...              proportional_alignment("A big dog.", "Ein großer Hund."), str)
    'Ein <b>großer</b> Hund.'
    """
    root = _tree(tags)
    root.range = (0, len(translation))
    _place_children(root, source, translation, alignment)
    return _written(root, translation, escape)


def _tree(tags):
    """The elements of `tags` as a tree under a root: elements whose start
    tag is in an earlier sentence open at the start, those whose end tag is
    in a later one close at the end."""
    elements = {}
    for tag in tags:
        element = elements.setdefault(tag.element, _Element())
        if tag.kind == "start":
            element.start, element.a = tag, tag.position
        else:
            element.end, element.b = tag, tag.position
    for element in elements.values():
        if element.end is None:  # (open to the sentence's end)
            element.b = float("inf")
    # The elements opened before the sentence, outermost first, then the
    # tags in order, then the elements closed after it, innermost first.
    opened = sorted((e for e in elements.values() if e.start is None), key=lambda e: -e.b)
    closed = sorted((e for e in elements.values() if e.end is None), key=lambda e: -e.a)
    events = [("start", e) for e in opened] + [(tag.kind, elements[tag.element]) for tag in tags]
    events += [("end", e) for e in closed]
    root, stack = _Element(), []
    stack.append(root)
    for kind, element in events:
        if kind == "start":
            stack[-1].children.append(element)
            stack.append(element)
        else:
            stack.pop()
    return root


def _place_children(parent, source, translation, alignment):
    """Gives each child of `parent` its characters of the translation,
    within the parent's, siblings in the translation's order without
    overlap; then theirs."""
    low, high = parent.range
    for child in parent.children:
        child.range = _target_range(child, source, translation, alignment, low, high)
    parent.children.sort(key=lambda child: child.range[0])  # (stable: ties keep the source's order)
    cursor = low
    for child in parent.children:
        start = max(child.range[0], cursor)
        child.range = (start, max(child.range[1], start))
        cursor = child.range[1]
    for child in parent.children:
        _place_children(child, source, translation, alignment)


def _target_range(element, source, translation, alignment, low, high):
    """The characters of the translation an element holds: the tokens
    aligned with its words, the most surely aligned of them (both ways,
    else from its words, else those its words weigh most), whole words,
    within `[low, high)`, without punctuation at an edge where the
    element's own text has none."""
    held = [(entry[4] if len(entry) > 4 else 2, entry[:2]) for entry in alignment
            if entry[2] < element.b and entry[3] > element.a]
    surest = max((ways for ways, _ in held), default=None)
    hits = [span for ways, span in held if ways == surest]
    if hits:
        start = _word_start(translation, min(ts for ts, _ in hits), low)
        end = _word_end(translation, max(te for _, te in hits), high)
        held = source[element.a : min(element.b, len(source))].strip()
        while start < end and _bare(translation[start]) and not (held and _bare(held[0])):
            start += 1
        while end > start and _bare(translation[end - 1]) and not (held and _bare(held[-1])):
            end -= 1
    else:  # no word: where the next source word's translation starts
        following = sorted(entry[0] for entry in alignment if entry[2] >= element.a)
        start = end = _word_start(translation, following[0] if following else high, low)
    if element.start is None:
        start = low
    if element.end is None:
        end = high
    start = min(max(start, low), high)
    return start, min(max(end, start), high)


def _bare(character):
    """Whether a character is punctuation or a space."""
    return unicodedata.category(character)[0] in "PZ" or character.isspace()


def _joined(left, right):
    """Whether two characters are of one word of a script that spaces its words."""
    return _spaced_letter(left) and _spaced_letter(right)


def _spaced_letter(character):
    if not character.isalnum():
        return False
    return not unicodedata.name(character, "").startswith(_UNSPACED_SCRIPTS)


def _word_start(text, position, low):
    while position > low and position < len(text) and _joined(text[position - 1], text[position]):
        position -= 1
    return position


def _word_end(text, position, high):
    while 0 < position < high and _joined(text[position - 1], text[position]):
        position += 1
    return position


def _written(element, translation, escape):
    start, end = element.range
    parts = [element.start.markup if element.start else ""]
    cursor = start
    for child in element.children:
        parts.append(escape(translation[cursor : child.range[0]]))
        parts.append(_written(child, translation, escape))
        cursor = child.range[1]
    parts.append(escape(translation[cursor:end]))
    parts.append(element.end.markup if element.end else "")
    return "".join(parts)

"""What counts as a line and as a blank text, said once for every path
that reads sentences: the command line's input, `generate`, the exported
SavedModel and the tokenizer's training.

A blank text (empty, whitespace, or characters that show nothing: Unicode's
format characters, category Cf, such as the zero-width space U+200B, the
byte order mark U+FEFF and the soft hyphen U+00AD) gets an empty
translation: the model never saw such a source, and its pieces would make
it invent a sentence.
"""

import re

# A line ends at "\n", "\r\n" or "\r" (old Mac files). Not at the form
# feeds and Unicode line separators that `str.splitlines` also splits at:
# they can sit inside a sentence, and splitting there would shift every
# translation after them.
_LINE_END = re.compile(r"\r\n|\r|\n")

# The characters of a blank text, as code point ranges: Python's whitespace
# (`str.isspace`), then the format characters (Cf) of Unicode 15.1. Written
# out rather than asked of `unicodedata` or of `\p{Cf}`, whose tables differ
# between Python versions and TensorFlow's RE2, so that the SavedModel and
# Python agree on every character.
BLANK_RANGES = (
    (0x09, 0x0D), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
    (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F), (0x890, 0x891),
    (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064),
    (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD),
    (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
_BLANK = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in BLANK_RANGES) + "]*")
# `is_blank` as an RE2 pattern, for TensorFlow's `tf.strings.regex_full_match`
# (the SavedModel).
BLANK_PATTERN = "[" + "".join(f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in BLANK_RANGES) + "]*"


def split_lines(text):
    """The lines of `text`, split at "\\n", "\\r\\n" and "\\r", without
    their ends; a last line without an end counts, an empty end does not.

    >>> split_lines("one\\r\\ntwo\\rthree\\nfour")
    ['one', 'two', 'three', 'four']
    >>> split_lines("one\\n\\ntwo\\n")
    ['one', '', 'two']
    >>> split_lines("page\\fbreak\\u2028inside\\r")
    ['page\\x0cbreak\\u2028inside']
    """
    lines = _LINE_END.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def is_blank(text):
    """Whether `text` shows nothing: empty, whitespace, or format
    characters (Unicode category Cf), in any mix.

    >>> [is_blank(t) for t in ["", " \\t", "\\u200b", "\\ufeff\\u00ad ", "\\u200bA"]]
    [True, True, True, True, False]
    """
    return _BLANK.fullmatch(text) is not None

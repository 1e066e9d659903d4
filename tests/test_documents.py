"""Whole documents (`keras_transformer.documents`): paragraphs, whitespace
and markup kept, every sentence translated once and none cut, checked
with translations that are the sentences themselves or reversed; and
`generate(..., split_sentences=True)` on the shipped preset, against its
sentences translated one by one."""

import contextlib
import html.parser
import io

import pytest
from helpers import once

pytest.importorskip("sentencex")

from keras_transformer.documents import Document  # noqa: E402
from keras_transformer.documents.markup import MarkupPiece  # noqa: E402
from keras_transformer.documents.markup import html_pieces  # noqa: E402
from keras_transformer.documents.sentences import fitting_pieces  # noqa: E402

ENGLISH = [
    "Dr. Smith met us at the U.S. border at noon.",
    "He brought food, e.g. bread and cheese, for everyone.",
    "Was it enough?",
    "Mr. Brown thought so!",
]
GERMAN = [
    "Wir brauchen z. B. Brot und Käse.",
    "Dr. Müller kam am 3. Mai an.",  # (English rules end a sentence at "3.")
    "Das ist alles.",
]


def words(text):
    return len(text.split())


def long_paragraph(count=600):
    """Sentences of ten words each, `count` words in all."""
    return [" ".join(f"word{i * 10 + j}" for j in range(9)) + f" end{i}." for i in range(count // 10)]


def reversed_translation(document):
    return document.assemble([segment[::-1] for segment in document.segments])


def with_sentences(template, sentences, translate=lambda s: s):
    """`template` with its `{}` places filled by `sentences`, each through `translate`."""
    return template.format(*[translate(sentence) for sentence in sentences])


@once
def test_paragraphs_whitespace_and_every_sentence_are_kept():
    paragraph = long_paragraph()
    sentences = ENGLISH + paragraph + ["The end."]
    template = (
        "  {} {}  {}\t{}\n\n"  # leading whitespace, two spaces and a tab between sentences
        + " ".join("{}" for _ in paragraph)
        + "\r\n\n\n{}   \n"  # a Windows line end, two blank lines, trailing spaces
    )
    text = with_sentences(template, sentences)
    document = Document(text, language="en")
    assert document.segments == sentences  # each sentence once, in order, abbreviations not split
    assert document.assemble(document.segments) == text  # nothing cut, nothing moved
    assert reversed_translation(document) == with_sentences(template, sentences, lambda s: s[::-1])
    assert reversed_translation(document).count("\n\n") == text.count("\n\n")  # paragraphs
    assert sum(map(words, document.segments)) == words(text) > 600


@once
def test_german_abbreviations_and_single_line_breaks():
    text = with_sentences("{} {}\n{}\n", GERMAN)
    document = Document(text, language="deu")  # (a 639-3 code: the segmenter's German rules)
    assert document.segments == GERMAN
    assert document.assemble(["A.", "B.", "C."]) == "A. B.\nC.\n"


@once
def test_blank_and_empty_documents_have_no_segments():
    for text in ["", "   \n\n\t", "\u200b\n"]:
        document = Document(text)
        assert document.segments == []
        assert document.assemble([]) == text


@once
def test_without_sentence_splitting_a_line_is_one_segment():
    document = Document(" One. Two. \nThree.", split_sentences=False)
    assert document.segments == ["One. Two.", "Three."]
    assert document.assemble(["1", "3"]) == " 1 \n3"


@once
def test_long_sentences_are_split_at_clauses_then_words_and_rejoined():
    clauses = [" ".join(f"w{i}x{j}" for j in range(8)) for i in range(12)]
    sentence = "; ".join(clauses[:6]) + ", " + ", ".join(clauses[6:]) + "."
    document = Document(f"Short one. {sentence} Short two.", max_tokens=20, tokenize=words)
    pieces = document.segments[1:-1]
    assert document.segments[0] == "Short one." and document.segments[-1] == "Short two."
    assert len(pieces) > 1 and all(words(piece) <= 20 for piece in pieces)
    assert all(piece.endswith((";", ",", ".")) for piece in pieces)  # at clause punctuation
    assert " ".join(pieces) == sentence  # every word once, in order
    # A run of words without punctuation: between words; one long word: between characters.
    run = " ".join(f"w{i}" for i in range(50))
    assert fitting_pieces(run, 8, words)[0] == (" ".join(f"w{i}" for i in range(8)), " ")
    assert "".join(piece + after for piece, after in fitting_pieces(run, 8, words)) == run
    assert fitting_pieces("abcdefgh", 3, len) == [("abc", ""), ("def", ""), ("gh", "")]
    with pytest.raises(ValueError, match="alone takes 2 tokens"):
        fitting_pieces("ab", 1, lambda text: 2 * len(text))


@once
def test_html_keeps_markup_and_translates_text_nodes():
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><title>A page. Its title.</title>\n'
        "<style>p.note { color: red } /* Dr. No. */</style></head>\n"
        '<body class="main"><p id="p1" data-x="a &amp; b">Tom &amp; Jerry ran.&nbsp;They hid &lt;here&gt;.</p>\n'
        "<!-- A comment. Two. -->\n<p>Caf&eacute; &#169; 2024. <a href=\"/x?a=1&amp;b=2\">A link.</a></p>\n"
        "<pre>Line one.\n  Line two.</pre>\n"
        '<script>var s = "Not text. <b>x</b>"; if (a < b && c) {}</script>\n</body></html>\n'
    )
    document = Document(page, format="html")
    assert document.segments == [
        "A page.", "Its title.", "Tom & Jerry ran.", "They hid <here>.", "Café © 2024.", "A link.",
        "Line one.", "Line two.",
    ]
    assert document.assemble(document.segments) == page  # entities as the page spelled them
    translated = reversed_translation(document)
    markup = [piece for piece in html_pieces(page)[0] if isinstance(piece, MarkupPiece)]
    assert [piece for piece in html_pieces(translated)[0] if isinstance(piece, MarkupPiece)] == markup
    assert "<style>p.note { color: red } /* Dr. No. */</style>" in translated
    assert '<script>var s = "Not text. <b>x</b>"; if (a < b && c) {}</script>' in translated
    assert ".nar yrreJ &amp; moT&nbsp;.&gt;ereh&lt; dih yehT" in translated
    assert ".4202 &#169; &eacute;faC" in translated
    assert "<pre>.eno eniL\n  .owt eniL</pre>" in translated


@once
def test_html_translates_the_attributes_for_readers_and_keeps_what_is_marked_not_to_translate():
    page = (
        '<p title="A note. For you.">Read it.</p>\n<img src="dog.png" alt=\'A dog&apos;s toy &amp; ball.\'>'
        '<img alt="" title=" "><img alt=unquoted>\n<input type="text" value="Not a label" placeholder="Your name">'
        '<input TYPE="Submit" Value="Send it"><button aria-label="Close">x</button>'
        '<p data-title="kept">A <span translate="no">Keras <i title="kept">3</i> &amp; JAX.</span> B.</p>'
        '<div class="box notranslate"><p>Not this. <img alt="Nor this."></div><p>After.</p>'
    )
    document = Document(page, format="html")
    assert document.segments == [
        "A note.", "For you.", "Read it.", "A dog's toy & ball.", "Your name", "Send it", "Close", "x", "A", "B.",
        "After.",
    ]
    assert document.assemble(document.segments) == page  # references as the page spelled them
    # Translations with both quote marks: the page's parser reads them back.
    translations = [f'"{segment}" \'{i}\'' for i, segment in enumerate(document.segments)]
    translated = document.assemble(translations)

    class Attributes(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.found = []

        def handle_starttag(self, tag, attrs):
            self.found += [(tag, name, value) for name, value in attrs]

    before, after = Attributes(), Attributes()
    before.feed(page)
    after.feed(translated)
    changed = {(tag, name): value for (tag, name, value), old in zip(after.found, before.found) if value != old[2]}
    assert changed == {
        ("p", "title"): f"{translations[0]} {translations[1]}", ("img", "alt"): translations[3],
        ("input", "placeholder"): translations[4], ("input", "value"): translations[5],
        ("button", "aria-label"): translations[6],
    }
    assert [(tag, name) for tag, name, _ in after.found] == [(tag, name) for tag, name, _ in before.found]
    assert '<span translate="no">Keras <i title="kept">3</i> &amp; JAX.</span>' in translated
    assert '<div class="box notranslate"><p>Not this. <img alt="Nor this."></div>' in translated


@once
def test_html_escapes_what_a_translation_writes():
    document = Document("<p>A &lt;b&gt; tag.</p>", format="html")
    assert document.segments == ["A <b> tag."]
    assert document.assemble(["Ein <b> & Tag."]) == "<p>Ein &lt;b&gt; &amp; Tag.</p>"
    flowing = Document("<p>One\n   sentence here.\n  Two.</p>", format="html")
    assert flowing.segments == ["One sentence here.", "Two."]  # HTML's whitespace is one space
    assert flowing.assemble(["1.", "2."]) == "<p>1.\n  2.</p>"


@once
def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="Unknown format"):
        Document("x", format="markdown")
    with pytest.raises(ValueError, match="max_tokens"):
        Document("x", max_tokens=0)
    with pytest.raises(TypeError, match="A document is a string"):
        Document(["x"])
    document = Document("One. Two.")
    with pytest.raises(ValueError, match="2 segments; got 1"):
        document.assemble(["1"])
    with pytest.raises(TypeError, match="not a string"):
        document.assemble(["1", None])
    with pytest.raises(TypeError, match="number of tokens"):
        Document("One.", max_tokens=4, tokenize=lambda text: "four")


# === generate on the shipped preset, every backend ===

SENTENCES = ["A man rides a bicycle down the street.", "Two dogs play in the snow!", "A woman is cooking."]


@pytest.fixture(scope="module")
def preset_model():
    from keras_transformer.models import TransformerSeq2SeqLM

    return TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_ensemble=False)


def test_generate_translates_documents_sentence_by_sentence(preset_model):
    # (Each sentence a source of its own; the documents below search the
    # same three sources, so that JAX and TensorFlow compile one search.)
    each = preset_model.generate(SENTENCES)
    documents = [f"  {SENTENCES[0]} {SENTENCES[1]}\n\n{SENTENCES[2]}\n", "  "]
    found = preset_model.generate(documents, split_sentences=True)
    assert found == [f"  {each[0]} {each[1]}\n\n{each[2]}\n", "  "]
    assert preset_model.generate(documents[0], split_sentences=True) == found[0]
    page = f'<p class="a">{SENTENCES[0]} <b>{SENTENCES[1]}</b></p>\n<p>{SENTENCES[2]}</p>'
    expected = f'<p class="a">{each[0]} <b>{each[1]}</b></p>\n<p>{each[2]}</p>'
    # (An element that holds a whole sentence stays around its translation.)
    assert preset_model.generate(page, format="html", split_sentences=True) == expected


@once
def test_generate_splits_a_sentence_longer_than_the_model_reads(preset_model):
    clause = "a man in a red shirt rides a bicycle down the street"
    sentence = ", ".join([clause] * 30) + "."  # some 360 tokens; the model reads 256
    with pytest.raises(ValueError, match="longer than the model's max_sequence_length"):
        preset_model.generate(sentence, beam_size=1)
    translated = preset_model.generate(sentence, split_sentences=True, sampler="greedy", max_length_offset=0)
    assert translated.count(", ") >= 1 and len(translated.split()) > 100  # pieces, each translated
    with pytest.raises(ValueError, match="one translation a document"):
        preset_model.generate(sentence, split_sentences=True, return_scores=True)
    with pytest.raises(ValueError, match="Unknown format"):
        preset_model.generate(sentence, format="pdf")
    # What generate gives a Document, for those who translate its segments themselves.
    from keras_transformer.models.transformer.generation import document_options

    options = document_options(preset_model)
    assert (options["language"], options["max_tokens"]) == ("en", 256)  # (the preset's metadata.json)
    assert options["tokenize"]("A dog runs.") == len(preset_model.preprocessor.generate_preprocess(["A dog runs."])[0])
    assert document_options(preset_model, source_language="de")["language"] == "de"


@once
def test_the_command_line_translates_documents(preset_model, tmp_path):
    from keras_transformer import cli

    expected = [preset_model.generate(sentence) for sentence in SENTENCES]  # one by one
    path = tmp_path / "in.txt"
    path.write_bytes(f"{SENTENCES[0]} {SENTENCES[1]}\r\n\r\n  {SENTENCES[2]}".encode())

    def translate(*args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main(["translate", "--first-model-only", *args])
        return out.getvalue()

    lines = translate("--split-sentences", "-i", str(path)).splitlines()
    assert lines == [f"{expected[0]} {expected[1]}", "", f"  {expected[2]}"]  # a line for a line
    assert translate("--document", "-i", str(path)) == f"{expected[0]} {expected[1]}\r\n\r\n  {expected[2]}"
    page = f"<p>{SENTENCES[2]}</p>"
    assert translate("--format", "html", page) == f"<p>{expected[2]}</p>\n"

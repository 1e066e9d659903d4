"""Whole documents (`keras_transformer.documents`): paragraphs, whitespace
and markup kept, every sentence translated once and none cut, checked
with translations that are the sentences themselves or reversed; and
`generate(..., split_sentences=True)` on the shipped preset, against its
sentences translated one by one."""

import contextlib
import html
import html.parser
import io
import re

import numpy as np
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


def word_alignment(source, target, pairs):
    """An alignment as `alignment.alignments` gives one, from `(target
    word, source word)` or `(target word, source word, ways)` pairs (each
    word's first occurrence)."""
    return [(target.index(t), target.index(t) + len(t), source.index(w), source.index(w) + len(w), *ways)
            for t, w, *ways in pairs]


class Tags(html.parser.HTMLParser):
    """The start and end tags of a page, in order, and whether they nest."""

    def __init__(self, page):
        super().__init__()
        self.found, self.open, self.nested = [], [], True
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.found.append(("start", tag, tuple(attrs)))
        self.open.append(tag)

    def handle_endtag(self, tag):
        self.found.append(("end", tag))
        self.nested = self.nested and bool(self.open) and self.open.pop() == tag


@once
def test_inline_elements_go_with_their_sentence_and_around_the_words_their_words_became():
    page = ('<p>A <b>big</b> dog <a href="/x">runs</a> home. <i>Two <em>red</em> cats</i> sleep. '
            "One <b>two. Three</b> four. <span>All of it.</span></p>")
    document = Document(page, format="html")
    # Whole sentences; one that an element holds whole takes no markup.
    assert document.segments == ["A big dog runs home.", "Two red cats sleep.", "One two.", "Three four.",
                                 "All of it."]
    assert document.markup_segments == [0, 1, 2, 3]
    assert document.assemble(document.segments) == page  # each word where it was
    # Words that change order take their elements along; elements inside
    # others stay inside; punctuation outside an element stays outside.
    source, target = "A very red car stops.", "Une voiture très rouge s'arrête."
    pairs = [("Une", "A"), ("voiture", "car"), ("très", "very"), ("rouge", "red"), ("s'arrête.", "stops.")]
    document = Document("<p>A <b>very <i>red</i></b> <u>car</u> stops.</p>", format="html")
    assert document.segments == [source]
    found = document.assemble([target], [word_alignment(source, target, pairs)])
    assert found == "<p>Une <u>voiture</u> <b>très <i>rouge</i></b> s'arrête.</p>"
    stop = Document("<p>The car <b>stops</b>.</p>", format="html")
    pairs = [("La", "The"), ("voiture", "car"), ("s'arrête.", "stops")]
    found = stop.assemble(["La voiture s'arrête."], [word_alignment("The car stops.", "La voiture s'arrête.", pairs)])
    assert found == "<p>La voiture <b>s'arrête</b>.</p>"
    # The surest alignment of an element's words: both ways, else from
    # them, else (a word that no target word came from) the word it weighs most.
    big = Document("<p>A <b>big</b> dog.</p>", format="html")
    for pairs, expected in (
        ([("Ein", "big", 1), ("großer", "big", 2), ("Hund", "dog", 2)], "<p>Ein <b>großer</b> Hund.</p>"),
        ([("Ein", "A", 2), ("großer", "big", 1), ("Hund", "dog", 2), ("Hund", "big", 0)],
         "<p>Ein <b>großer</b> Hund.</p>"),
        ([("Ein", "A", 2), ("Hund", "dog", 2), ("Hund", "big", 0)], "<p>Ein <b>Hund</b>.</p>"),
    ):
        german = re.sub("<[^>]*>", "", expected)
        assert big.assemble([german], [word_alignment("A big dog.", german, pairs)]) == expected
    # Elements whose words align alike, or with nothing, still nest, each once.
    for pairs in ([("Une", "A"), ("voiture", "very"), ("très", "very"), ("rouge", "very")], [("Une", "stops.")],
                  [("voiture", "car"), ("s'arrête.", "car"), ("très", "very")],
                  [("très", "very"), ("s'arrête.", "car")]):
        found = document.assemble([target], [word_alignment(source, target, pairs)])
        tags = Tags(found)
        assert tags.nested and not tags.open and sorted(tags.found) == sorted(Tags(document.text).found)
        assert html.unescape(re.sub("<[^>]*>", "", found)) == target


@once
def test_inline_markup_that_does_not_nest_or_a_sentence_too_long_is_kept_between_pieces():
    page = "<p>Bad <b><i>nest</b></i> here. A <b>long</b> sentence of many words.</p>"
    document = Document(page, format="html", max_tokens=4)
    assert document.segments == ["Bad", "nest", "here.", "A", "long", "sentence of many words."]
    assert document.markup_segments == []
    assert document.assemble(document.segments) == page


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


@once  # (the same Keras code on every backend; generate's test below runs it on each)
def test_word_alignments_are_each_pairs_attention_and_find_the_words(preset_model):
    from keras_transformer.models.transformer.alignment import alignments
    from keras_transformer.models.transformer.alignment import token_spans
    from keras_transformer.visualization import attention_maps

    translations = preset_model.generate(SENTENCES)
    found = alignments(preset_model, SENTENCES, translations, batch_size=2)  # (pairs padded together)
    words = set()
    for source, target, pairs in zip(SENTENCES, translations, found):
        # One pair alone, unpadded: each target token with the source token
        # that the attention of the step predicting it weighs most; then
        # each source token that none came from, with the target token
        # whose step weighs it most.
        maps = attention_maps(preset_model, source, target)
        weights = np.mean([layer.mean(axis=0) for layer in maps["cross_attention"]], axis=0)
        source_spans = token_spans(source, maps["source_tokens"])
        readable = [j for j, span in enumerate(source_spans) if span]
        target_spans = token_spans(target, maps["target_tokens"][1:])
        spelled = [k for k, span in enumerate(target_spans) if span]
        expected, came_from = [], set()
        for k in spelled:
            j = max(readable, key=lambda j: weights[k, j])
            mutual = max(spelled, key=lambda other: weights[other, j]) == k  # (both ways)
            expected.append((*target_spans[k], *source_spans[j], 2 if mutual else 1))
            came_from.add(j)
        for j in readable:
            if j not in came_from:
                expected.append((*target_spans[max(spelled, key=lambda k: weights[k, j])], *source_spans[j], 0))
        assert pairs == expected
        words |= {(target[ts:te], source[ss:se]) for ts, te, ss, se, ways in pairs if ways == 2}
    assert {("Fahrrad", "bicycle"), ("Hunde", "dogs"), ("Schnee", "snow"), ("Frau", "woman")} <= words


def test_generate_carries_inline_elements_into_whole_sentences(preset_model):
    each = preset_model.generate(SENTENCES)
    page = (f'<p>A man rides a <b>bicycle</b> down the street. Two <a href="/d">dogs</a> play in the snow!</p>'
            f"<p>{SENTENCES[2]}</p>")
    found = preset_model.generate(page, format="html", split_sentences=True)
    assert re.sub("<[^>]*>", "", found) == f"{each[0]} {each[1]}{each[2]}"  # each sentence translated whole
    assert "<b>Fahrrad</b>" in found and '<a href="/d">Hunde</a>' in found


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

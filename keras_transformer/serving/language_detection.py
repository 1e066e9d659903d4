"""`source: "auto"`: which of the languages served into a target a
request's text is in, with py3langid (langid.py's naive Bayes model of
140 languages, shipped inside the package: works offline; about 30 us a
sentence).

The model scores every language it knows; the detection keeps the
candidates (the sources served into the request's target that it knows),
their probabilities renormalized among them, and answers the most
probable with its probability as a percentage, as LibreTranslate's
`detectedLanguage` gives it.
"""

# Characters of a request's text read to detect its language (enough for
# a confident guess; a long document costs no more).
MAX_DETECTED_CHARS = 2000


class LanguageDetector:
    """py3langid's model, loaded once (about 0.7 s).

    Example:

    >>> detector = LanguageDetector()
    >>> detector.detect("Zwei Hunde spielen im Schnee.", ["de", "fr"])[0]
    'de'
    """

    def __init__(self):
        from py3langid.langid import MODEL_FILE
        from py3langid.langid import LanguageIdentifier

        self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        self.known = frozenset(self._identifier.nb_classes)

    def detect(self, text, candidates):
        """`(language, confidence)`: the most probable of `candidates`
        (codes the model knows: `known`) for `text`, and its probability
        among them in percent (two decimals)."""
        candidates = [code for code in candidates if code in self.known]
        if not candidates:
            raise ValueError("none of the candidate languages is one the detector knows")
        scores = {code: probability for code, probability in self._identifier.rank(text[:MAX_DETECTED_CHARS])
                  if code in candidates}
        total = sum(scores.values())
        language = max(candidates, key=lambda code: scores.get(code, 0.0))
        confidence = 100.0 * scores.get(language, 0.0) / total if total > 0 else 100.0 / len(candidates)
        return language, round(confidence, 2)


def detection_text(request):
    """The text of a checked request (`translate_request.TranslateRequest`)
    that detection reads: its texts, one a line; of HTML, their text
    nodes."""
    texts = request.texts
    if request.format == "html":
        from keras_transformer.documents.markup import TextPiece
        from keras_transformer.documents.markup import html_pieces

        texts = [" ".join(piece for piece in html_pieces(text)[0] if isinstance(piece, TextPiece)) for text in texts]
    return "\n".join(texts)[:MAX_DETECTED_CHARS]


def load_detector():
    """A `LanguageDetector`, or None where py3langid is not installed."""
    try:
        import py3langid  # noqa: F401
    except ImportError:
        return None
    return LanguageDetector()

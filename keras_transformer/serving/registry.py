"""Which served model translates which (source, target) pair.

Each `--preset` of `keras-transformer serve` is one `ServedModel`. A model
of one language pair (the shipped Multi30k presets) serves the pair its
preset's `metadata.json` names (`"languages": {"source": "en", "target":
"de"}`), or the one given after the preset's name (`NAME=en-de`). A
multilingual model (M2M100, NLLB-200: `model.languages`) serves every
ordered pair of its languages, and an opus-mt model with `>>xx<<` target
tokens its source (metadata or `NAME=SRC-...`) into each of its targets.
Languages go by their ISO 639-1 code where the model's own code names
exactly one (`de` for `__de__` or `deu_Latn`), else by the model's code
(`zho_Hans`). Where several presets serve a pair, the first given serves
it. `source: "auto"` is the one source served into the target, or, where
several are, the one of them that the request's text is in
(`language_detection.py`).
"""

import dataclasses

from keras_transformer.serving.language_names import NAMES
from keras_transformer.serving.language_names import language_name

# The `source` of a request that leaves the choice to the server.
AUTO = "auto"


class UnknownPair(ValueError):
    """A request names a pair that no served model translates."""


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """A loaded preset: its name, the model, and `generate`'s keywords.

    `pair`: the (source, target) a model of one pair serves (None for a
    multilingual model), from the preset's metadata or its `NAME=SRC-TGT`.
    """

    name: str
    model: object
    decoding: dict
    pair: tuple = None


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a request goes: the model, the pair as served (public codes),
    and the languages `generate` gets (the model's own codes; None for a
    model of one pair)."""

    served: ServedModel
    pair: tuple
    source_language: str = None
    target_language: str = None
    counted = True  # (its batches are translations, `GET /metrics` counts them)

    @property
    def key(self):
        """Requests of one key are decoded together."""
        return (id(self.served), self.source_language, self.target_language)

    def generate(self, texts):
        """The translations of `texts` (a list), decoded together."""
        return self.served.model.generate(
            list(texts), batch_size=max(1, len(texts)), verbose=0, **self.served.decoding, **self.language_options()
        )

    @property
    def aligner(self):
        """The route that aligns this one's sentences with their
        translations (inline HTML markup), on the same decoding thread."""
        return AlignmentRoute(self)

    def language_options(self):
        """`generate`'s `source_language` and `target_language` for this
        route (none for a model of one pair)."""
        languages = {}
        if self.source_language is not None:
            languages["source_language"] = self.source_language
        if self.target_language is not None:
            languages["target_language"] = self.target_language
        return languages


@dataclasses.dataclass(frozen=True)
class AlignmentRoute:
    """The word alignments of a route's sentences and their translations
    (`generation.markup_alignments`): its `generate` takes `(sentence,
    translation)` pairs. Its batches are not counted as translations'
    (`counted`)."""

    route: Route
    counted = False

    @property
    def key(self):
        return ("align", *self.route.key)

    def generate(self, pairs):
        from keras_transformer.models.transformer.generation import markup_alignments

        sources, targets = zip(*pairs)
        return markup_alignments(self.route.served.model, list(sources), list(targets), **self.route.language_options())


def parse_preset_argument(value):
    """`NAME_OR_DIR` or `NAME_OR_DIR=SRC-TGT` as `(name, (src, tgt) or None)`.

    >>> parse_preset_argument("runs/en-de/model=en-de")
    ('runs/en-de/model', ('en', 'de'))
    >>> parse_preset_argument("transformer_multi30k_de_en")
    ('transformer_multi30k_de_en', None)
    """
    name, sep, pair = value.rpartition("=")
    if not sep or "/" in pair or pair.count("-") != 1 or not all(pair.split("-")):
        return value, None
    source, target = pair.split("-")
    return name, (source.strip(), target.strip())


def metadata_pair(metadata):
    """The (source, target) that a preset's metadata names, or None."""
    languages = (metadata or {}).get("languages") or {}
    source, target = languages.get("source"), languages.get("target")
    if isinstance(source, str) and isinstance(target, str) and source and target:
        return source, target
    return None


class Registry:
    """The served models by (source, target), with the languages they list.

    Args:
        served: `ServedModel`s, in the order of `--preset`.
        detector: a `language_detection.LanguageDetector` for `source:
            "auto"` where several sources are served into a target (None:
            such a request is refused, naming what to install).

    Raises:
        ValueError: a model of one pair whose pair is unknown (neither its
            metadata nor `NAME=SRC-TGT` names it).
    """

    def __init__(self, served, detector=None):
        self.served = list(served)
        self.detector = detector
        self._routes = {}
        for entry in self.served:
            for public, route in _routes_of(entry).items():
                self._routes.setdefault(public, route)
        # Requests name codes in any case (`zho_hans` for `zho_Hans`).
        self._by_lowercase = {(s.lower(), t.lower()): route for (s, t), route in reversed(self._routes.items())}

    @property
    def pairs(self):
        """The served pairs as `["en-de", ...]`."""
        return [f"{source}-{target}" for source, target in self._routes]

    def first_routes(self):
        """A route of each served model that serves one."""
        routes = {}
        for route in self._routes.values():
            routes.setdefault(id(route.served), route)
        return list(routes.values())

    def languages(self):
        """`GET /languages`: LibreTranslate's list of sources with their targets."""
        targets = {}
        for source, target in self._routes:
            targets.setdefault(source, [])
            targets.setdefault(target, [])
            targets[source].append(target)
        return [{"code": code, "name": language_name(code), "targets": sorted(set(found))}
                for code, found in sorted(targets.items())]

    def needs_detection(self):
        """Whether some target is served from several sources (so that
        `source: "auto"` needs a `detector`)."""
        targets = [target for _, target in self._routes]
        return len(targets) != len(set(targets))

    def detect_source(self, target, text=""):
        """`(source, confidence)` of `source: "auto"` into `target`: the one
        source served into it (confidence 100), else the one of them that
        `text` is in, as the detector says.

        Raises:
            UnknownPair: nothing is served into `target`, or several sources
                are and none can be detected (no detector, or one that
                knows none of them).
        """
        target = target.strip().lower()
        sources = sorted({s for s, t in self._routes if t.lower() == target})
        if len(sources) == 1:
            return sources[0], 100.0
        if not sources:
            raise UnknownPair(f"source 'auto': no model translates into {target!r}. Served pairs: "
                              f"{', '.join(self.pairs)}")
        if self.detector is None:
            raise UnknownPair(
                f"source 'auto' into {target!r}, which is served from {', '.join(sources)}, needs language "
                'detection (py3langid: pip install "keras-aiayn[serve]"): give source as a code'
            )
        known = [source for source in sources if source in self.detector.known]
        if not known:
            raise UnknownPair(f"source 'auto' into {target!r}: the language detector knows none of its sources "
                              f"({', '.join(sources)}): give source as a code")
        return self.detector.detect(text, known)

    def route(self, source, target, text=""):
        """The `Route` of a request's `source` (or `"auto"`: see
        `detect_source`, with the request's `text`) and `target`.

        Raises:
            UnknownPair: no served model translates the pair; the message
                lists the pairs served.
        """
        target = target.strip().lower()
        source = source.strip().lower() if source else AUTO
        if source == AUTO:
            source = self.detect_source(target, text)[0]
        found = self._by_lowercase.get((source, target))
        if found is None:
            raise UnknownPair(
                f"{source}-{target} is not served: this server translates {', '.join(self.pairs)} "
                "(GET /languages)"
            )
        return found


def _routes_of(entry):
    """A served model's routes by their public (source, target) codes."""
    codes = list(getattr(entry.model, "languages", None) or [])
    if not codes:
        if entry.pair is None:
            raise ValueError(
                f"the preset {entry.name!r} names no languages (metadata.json has no \"languages\": "
                f"{{\"source\": ..., \"target\": ...}}): give them after its name, as {entry.name}=en-de"
            )
        source, target = (code.lower() for code in entry.pair)
        return {(source, target): Route(entry, (source, target))}
    public = public_codes(codes)
    if codes[0].startswith(">>"):  # opus-mt: the target token starts the source
        if entry.pair is None:
            raise ValueError(
                f"the preset {entry.name!r} (opus-mt, {len(codes)} target languages) names no source "
                f"language: give it after its name, as {entry.name}=en-{public[codes[0]]}"
            )
        source = entry.pair[0].lower()
        return {(source, public[code]): Route(entry, (source, public[code]), None, code) for code in codes
                if public[code] != source}
    return {(public[s], public[t]): Route(entry, (public[s], public[t]), s, t) for s in codes for t in codes if s != t}


def public_codes(codes):
    """The code each of a multilingual model's `codes` is served as: the
    ISO 639-1 code that names it alone, else the code itself.

    >>> public_codes(["__en__", "__de__"])
    {'__en__': 'en', '__de__': 'de'}
    >>> public_codes(["eng_Latn", "zho_Hans", "zho_Hant"])
    {'eng_Latn': 'en', 'zho_Hans': 'zho_Hans', 'zho_Hant': 'zho_Hant'}
    """
    from keras_transformer.models.transformer.languages import resolve_language

    public = {code: code for code in codes}
    claimed = {}
    for iso in NAMES:
        try:
            code = resolve_language(iso, codes)
        except ValueError:  # none of the codes, or several
            continue
        if code.lower() != iso:
            claimed.setdefault(code, []).append(iso)
    for code, isos in claimed.items():
        if len(isos) == 1 and isos[0] not in public.values():
            public[code] = isos[0]
    return public

"""Language codes as the package reads them, below everything that names
languages: ISO 639-1 and 639-3 codes, and the codes of multilingual
checkpoints (fairseq's M2M100 `__de__`, NLLB-200 `deu_Latn`, opus-mt
`>>de<<`). `models/transformer/languages.py` resolves them against a
model's vocabulary; `documents/` tells its sentence segmenter the
language by its ISO 639-1 code.
"""

import re

# ISO 639-1 -> the ISO 639-3 codes that fairseq's and opus-mt's models use
# for it (the macrolanguage first, then the individual languages NLLB names).
_ISO = """
af afr|am amh|ar ara arb|as asm|ast ast|ay aym ayr|az aze azj azb|ba bak|be bel|bg bul|bm bam|bn ben|bo bod|
br bre|bs bos|ca cat|ceb ceb|cs ces|cy cym|da dan|de deu|dz dzo|ee ewe|el ell|en eng|eo epo|es spa|et est|
eu eus|fa fas pes|ff ful fuv|fi fin|fj fij|fo fao|fr fra|fy fry|ga gle|gd gla|gl glg|gn grn|gu guj|ha hau|
he heb|hi hin|hr hrv|ht hat|hu hun|hy hye|id ind|ig ibo|ilo ilo|is isl|it ita|ja jpn|jv jav|ka kat|kg kon|
ki kik|kk kaz|km khm|kn kan|ko kor|kr kau knc|ks kas|ku kur kmr ckb|ky kir|lb ltz|lg lug|li lim|ln lin|
lo lao|lt lit|lv lav lvs|mg mlg plt|mi mri|mk mkd|ml mal|mn mon khk|mr mar|ms msa zsm|mt mlt|my mya|
nb nob|ne nep npi|nl nld|nn nno|no nor nob|ns nso|ny nya|oc oci|om orm gaz|or ori ory|pa pan|pl pol|
ps pus pbt|pt por|qu que quy|rn run|ro ron|ru rus|rw kin|sa san|sc srd|sd snd|sg sag|si sin|sk slk|sl slv|
sm smo|sn sna|so som|sq sqi als|sr srp|ss ssw|st sot|su sun|sv swe|sw swa swh|ta tam|te tel|tg tgk|th tha|
ti tir|tk tuk|tl tgl|tn tsn|tr tur|ts tso|tt tat|tw twi|ug uig|uk ukr|ur urd|uz uzb uzn|vi vie|wo wol|
xh xho|yi yid ydd|yo yor|zh zho|zu zul
"""
ISO_639 = {
    entry.split()[0]: tuple(entry.split()[1:]) for entry in _ISO.replace("\n", "").split("|") if entry.strip()
}

LANGUAGE_CODE = re.compile(r"^(?:__(?P<m2m>[A-Za-z_-]+?)__|>>(?P<opus>[^<>]+)<<|(?P<nllb>[a-z]{2,3})_[A-Z][a-z]{3})$")

# ISO 639-3 -> ISO 639-1, for the codes of `ISO_639` (the first that names it).
_TO_639_1 = {}
for _short, _longs in ISO_639.items():
    for _long in _longs:
        _TO_639_1.setdefault(_long, _short)


def code_core(code):
    """The ISO part of a checkpoint's language code: `de` of `__de__`,
    `deu` of `deu_Latn`; None for another text."""
    match = LANGUAGE_CODE.match(code)
    return None if match is None else next(part for part in match.groups() if part).lower()


def iso_639_1(code):
    """The ISO 639-1 code of a language named by its ISO 639-1 or 639-3
    code or by a checkpoint's code; a code it cannot read, lowercased.

    >>> [iso_639_1(code) for code in ("de", "deu", "__fr__", "ces_Latn", ">>es<<", "DE", "xx")]
    ['de', 'de', 'fr', 'cs', 'es', 'de', 'xx']
    """
    name = code.strip()
    name = code_core(name) or name.lower()
    return _TO_639_1.get(name, name)

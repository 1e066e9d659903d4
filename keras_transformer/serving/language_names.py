"""Languages' English names, as `GET /languages` lists them beside their
codes (LibreTranslate's `{"code": "de", "name": "German", ...}`): the ISO
639-1 codes that `keras_transformer.models.transformer.languages` knows."""

_NAMES = """
af Afrikaans|am Amharic|ar Arabic|as Assamese|ast Asturian|ay Aymara|az Azerbaijani|ba Bashkir|be Belarusian|
bg Bulgarian|bm Bambara|bn Bengali|bo Tibetan|br Breton|bs Bosnian|ca Catalan|ceb Cebuano|cs Czech|cy Welsh|
da Danish|de German|dz Dzongkha|ee Ewe|el Greek|en English|eo Esperanto|es Spanish|et Estonian|eu Basque|
fa Persian|ff Fula|fi Finnish|fj Fijian|fo Faroese|fr French|fy Western Frisian|ga Irish|gd Scottish Gaelic|
gl Galician|gn Guarani|gu Gujarati|ha Hausa|he Hebrew|hi Hindi|hr Croatian|ht Haitian Creole|hu Hungarian|
hy Armenian|id Indonesian|ig Igbo|ilo Ilocano|is Icelandic|it Italian|ja Japanese|jv Javanese|ka Georgian|
kg Kongo|ki Kikuyu|kk Kazakh|km Khmer|kn Kannada|ko Korean|kr Kanuri|ks Kashmiri|ku Kurdish|ky Kyrgyz|
lb Luxembourgish|lg Ganda|li Limburgish|ln Lingala|lo Lao|lt Lithuanian|lv Latvian|mg Malagasy|mi Maori|
mk Macedonian|ml Malayalam|mn Mongolian|mr Marathi|ms Malay|mt Maltese|my Burmese|nb Norwegian Bokmal|
ne Nepali|nl Dutch|nn Norwegian Nynorsk|no Norwegian|ns Northern Sotho|ny Chichewa|oc Occitan|om Oromo|
or Odia|pa Punjabi|pl Polish|ps Pashto|pt Portuguese|qu Quechua|rn Kirundi|ro Romanian|ru Russian|
rw Kinyarwanda|sa Sanskrit|sc Sardinian|sd Sindhi|sg Sango|si Sinhala|sk Slovak|sl Slovenian|sm Samoan|
sn Shona|so Somali|sq Albanian|sr Serbian|ss Swati|st Southern Sotho|su Sundanese|sv Swedish|sw Swahili|
ta Tamil|te Telugu|tg Tajik|th Thai|ti Tigrinya|tk Turkmen|tl Tagalog|tn Tswana|tr Turkish|ts Tsonga|
tt Tatar|tw Twi|ug Uyghur|uk Ukrainian|ur Urdu|uz Uzbek|vi Vietnamese|wo Wolof|xh Xhosa|yi Yiddish|
yo Yoruba|zh Chinese|zu Zulu
"""
NAMES = dict(entry.split(" ", 1) for entry in _NAMES.replace("\n", "").split("|") if entry.strip())


def language_name(code):
    """The English name of an ISO 639-1 code, else the code itself.

    >>> language_name("de"), language_name("deu_Latn")
    ('German', 'deu_Latn')
    """
    return NAMES.get(code, code)

"""report.html's fonts: a stack naming a face for every script of the built-in corpora before the generic family,
and the language of a chatterbot group's text, so that a browser draws Han characters in their Japanese, Korean
or traditional Chinese forms and right-to-left scripts in their direction."""

from __future__ import annotations

#: Latin, Greek and Cyrillic (English, the European languages, Turkish, Yoruba, Russian, Ukrainian)
LATIN = ('system-ui', '-apple-system', '"Segoe UI"', '"Noto Sans"', 'Roboto', 'Helvetica', 'Arial')
#: the other scripts of chatterbot (Devanagari: Hindi, Marathi; Bengali; Odia; Tamil; Telugu; Arabic: Persian,
#: Urdu; Hebrew; Thai), as Linux (Noto), Windows and macOS name their faces
SCRIPTS = ('"Noto Sans Devanagari"', '"Noto Sans Bengali"', '"Noto Sans Oriya"', '"Noto Sans Tamil"',
           '"Noto Sans Telugu"', '"Nirmala UI"', '"Kohinoor Devanagari"', '"Kohinoor Bangla"', '"Tamil Sangam MN"',
           '"Telugu Sangam MN"', '"Oriya Sangam MN"', '"Noto Sans Arabic"', '"Noto Naskh Arabic"',
           '"Segoe UI Arabic"', '"Geeza Pro"', '"Noto Sans Hebrew"', '"Arial Hebrew"', '"Noto Sans Thai"',
           '"Leelawadee UI"', 'Thonburi')
#: Han, kana and Hangul by language: the first listed wins for a character they share, so each language's own first
HAN = {"zh-Hans": ('"Noto Sans CJK SC"', '"Noto Sans SC"', '"PingFang SC"', '"Microsoft YaHei"'),
       "zh-Hant": ('"Noto Sans CJK TC"', '"Noto Sans TC"', '"PingFang TC"', '"Microsoft JhengHei"'),
       "ja": ('"Noto Sans CJK JP"', '"Noto Sans JP"', '"Hiragino Sans"', '"Yu Gothic"'),
       "ko": ('"Noto Sans CJK KR"', '"Noto Sans KR"', '"Apple SD Gothic Neo"', '"Malgun Gothic"')}


def stack(first: str = "zh-Hans") -> str:
    """The font-family list with the Han faces of language `first` ahead of the other Han faces."""
    han = [*HAN[first], *(f for lang, faces in HAN.items() if lang != first for f in faces)]
    return ",".join([*LATIN, *SCRIPTS, *han, "sans-serif"])


FONTS = stack()
#: CSS giving text marked with a CJK language its own Han forms
LANG_RULES = "".join(f":lang({lang}){{font-family:{stack(lang)}}}" for lang in HAN if lang != "zh-Hans")

#: the BCP 47 tag of each chatterbot language (a group is named `language` or `language/topic`)
LANGUAGE_TAGS = {"bengali": "bn", "chinese": "zh-Hans", "dutch": "nl", "english": "en", "french": "fr", "german": "de",
                 "hebrew": "he", "hindi": "hi", "hinglish": "hi-Latn", "indonesian": "id", "italian": "it",
                 "japanese": "ja", "korean": "ko", "marathi": "mr", "oriya": "or", "persian": "fa",
                 "portuguese": "pt", "russian": "ru", "spanish": "es", "swedish": "sv", "tamil": "ta", "telugu": "te",
                 "thai": "th", "traditionalchinese": "zh-Hant", "turkish": "tr", "ukrainian": "uk", "urdu": "ur",
                 "yoruba": "yo"}


def lang_of(group: object) -> str | None:
    """The language tag of a group named after a chatterbot language (`japanese`, `japanese/food`), else None."""
    return LANGUAGE_TAGS.get(str(group).split("/", 1)[0].strip().lower()) if group else None

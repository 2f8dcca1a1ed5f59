"""Extractive question answering over real country facts, from ``countryinfo``.

Passages are made from templates over the records of the ``countryinfo``
package (1.0.1, MIT; ``pip install countryinfo``): one passage states up to
twelve facts of one country, one sentence each, and every question is
answered by a span of its passage (SQuAD-style: the answer texts and the
character start of the first one, in the sentence that states the fact).

Fields (`FIELDS`), each skipped for a country whose value is missing, empty
or unusable (the counts are in the notes):

* ``capital``: a non-empty string (the Vatican's is a list: skipped).
* ``region`` ("Europe", "the Americas": the answer is "Americas") and
  ``subregion`` ("Western Europe").
* ``area``: "640,679 square kilometres"; "640,679" is a second gold answer.
* ``population``: "66,078,000".
* ``borders``: ISO alpha-3 codes mapped to the neighbours' names through the
  package's own records; up to `MAX_NEIGHBOURS` of them, chosen per passage,
  are listed, and each listed one is a gold answer. Codes no record has
  (``KOS``, ``XKX``, the Vatican's alpha-2 ``IT``) are dropped.
* ``calling_code``: "+33"; several are joined by "or", each a gold answer.
* ``demonym``: "French"; values joining two by "," or "/" are skipped.
* ``timezone``: "UTC+01:00", only for countries with exactly one time zone
  (the package's "−" is written "-").
* ``native_name``: "Deutschland", skipped when equal to the English name.
* ``official_name``: "French Republic" (written "the French Republic"): the
  first of the alternative spellings that is ASCII, not inverted ("Moldova,
  Republic of") and has a word such as "Republic", "Kingdom" or "State".
* ``tld``: ".fr", the first one that starts with ".".

Languages and currencies are not used: the package gives ISO codes only
("fr", "EUR"), no names. Invisible format characters (the right-to-left
marks in some native names) are removed from every value. Records sharing an
ISO alpha-3 code with an earlier one (Burma after Myanmar, the second Vatican
record, Wales) are dropped, and so are those with fewer than `MIN_FACTS`
facts (territories with a capital and a region only).

One passage: every fact of the country, in an order and with a phrasing of
each statement (`STATEMENTS`) drawn from a seed; the first sentence names the
country, later ones may say "it". Names such as "United States" are written
with "the". With the defaults, 37 to 128 words, median 77; answers are 1.6
words long on average (1 to 10).

Questions (`QUESTIONS`): four phrasings per field are seen in training; one
more per field (`HELD_OUT_QUESTIONS`, in a frame no seen one has, mostly the
country first: "France has which city as its capital?") is asked only in the
test split, so a model that memorised templates rather than reading is caught
out. Each
`SpanExample` records its phrasing and whether it is a seen one.

Splits are by country (`split_countries`): countries sharing a capital
(Jamaica and Norfolk Island, both "Kingston") go to the same split, so no
test capital is a training answer. Training asks one seen phrasing per fact
(drawn per passage) of ``passages_per_country`` passages; validation every
seen phrasing, and test every seen and held-out phrasing, of
``eval_passages_per_country`` passages of their countries.

Example:

>>> import textwrap
>>> train, valid, test, notes = load_countries()
>>> len(train), len(valid), len(test), notes["test_held_out_examples"]
(14288, 988, 2530, 506)
>>> asked = [e for e in test if e.country == "Japan" and e.field == "capital"]
>>> print(textwrap.fill(asked[0].context, 76))
The internet domain of Japan is .jp. Japan has a population of 127,080,000.
The area of Japan is 377,930 square kilometres. Its region is Asia. The
demonym for Japan is Japanese. The capital of Japan is Tokyo. The native name
of Japan is 日本. Its calling code is +81. The subregion of Japan is Eastern
Asia. Its time zone is UTC+09:00.
>>> for example in asked[-2:]:
...     print(example.question, example.answers, example.phrasing_seen)
What is Japan's capital city? ('Tokyo',) True
Japan has which city as its capital? ('Tokyo',) False
>>> start = asked[0].answer_start
>>> asked[0].context[start : start + len("Tokyo")]
'Tokyo'
"""

from __future__ import annotations

import functools
import json
import random
import re
import string
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import MissingDataError, PipelineError
from pipelines.data.user_files import field_error, jsonl_objects, shown

FIELDS = (
    "capital",
    "region",
    "subregion",
    "area",
    "population",
    "borders",
    "calling_code",
    "demonym",
    "timezone",
    "native_name",
    "official_name",
    "tld",
)

MIN_FACTS = 7
"""Countries with fewer usable facts than this are left out."""

MAX_NEIGHBOURS = 4
"""At most this many neighbours are listed in one passage."""

# {name}: the country ("France", "the United States"); {names}: its possessive
# ("France's"); {value}: the fact, which holds the answer span(s). Every field
# has at least one statement naming the country (one is needed first).
STATEMENTS: dict[str, tuple[str, ...]] = {
    "capital": (
        "The capital of {name} is {value}.",
        "{value} is the capital of {name}.",
        "Its capital is {value}.",
        "{names} capital city is {value}.",
    ),
    "region": (
        "{name} lies in the region of {value}.",
        "Its region is {value}.",
        "By region, {name} is part of {value}.",
    ),
    "subregion": (
        "Its subregion is {value}.",
        "{name} belongs to the subregion of {value}.",
        "The subregion of {name} is {value}.",
    ),
    "area": (
        "{name} covers an area of {value}.",
        "Its area is {value}.",
        "The area of {name} is {value}.",
    ),
    "population": (
        "{name} has a population of {value}.",
        "Its population is {value}.",
        "{name} is home to {value} inhabitants.",
    ),
    "borders": (
        "{name} borders {value}.",
        "Its neighbours include {value}.",
        "{name} shares a land border with {value}.",
    ),
    "calling_code": (
        "The international calling code of {name} is {value}.",
        "Its calling code is {value}.",
        "To phone {name} from abroad, dial {value}.",
    ),
    "demonym": (
        "People from {name} are called {value}.",
        "The demonym for {name} is {value}.",
        "Its people are described as {value}.",
    ),
    "timezone": (
        "{name} is in the {value} time zone.",
        "Its time zone is {value}.",
        "The time zone of {name} is {value}.",
    ),
    "native_name": (
        "In its own language, {name} is called {value}.",
        "Its native name is {value}.",
        "The native name of {name} is {value}.",
    ),
    "official_name": (
        "The official name of {name} is {value}.",
        "Officially, {name} is {value}.",
        "Its official name is {value}.",
    ),
    "tld": (
        "The internet domain of {name} is {value}.",
        "Its top-level domain is {value}.",
        "Websites in {name} end in {value}.",
    ),
}

QUESTIONS: dict[str, tuple[str, ...]] = {
    "capital": (
        "What is the capital of {name}?",
        "Which city is the capital of {name}?",
        "Name the capital of {name}.",
        "What is {names} capital city?",
    ),
    "region": (
        "In which region is {name}?",
        "Which region does {name} belong to?",
        "What region is {name} part of?",
        "Name the region of {name}.",
    ),
    "subregion": (
        "What is the subregion of {name}?",
        "Which subregion is {name} in?",
        "In which subregion does {name} lie?",
        "Name the subregion of {name}.",
    ),
    "area": (
        "What is the area of {name}?",
        "How large is {name}?",
        "How big is {name} in square kilometres?",
        "What area does {name} cover?",
    ),
    "population": (
        "What is the population of {name}?",
        "How many people live in {name}?",
        "How many inhabitants does {name} have?",
        "What is {names} population?",
    ),
    "borders": (
        "Which country borders {name}?",
        "Name a country that borders {name}.",
        "What is a neighbour of {name}?",
        "Which country shares a border with {name}?",
    ),
    "calling_code": (
        "What is the calling code of {name}?",
        "Which code do you dial to phone {name}?",
        "What is {names} international calling code?",
        "Name the telephone country code of {name}.",
    ),
    "demonym": (
        "What is the demonym for {name}?",
        "What are people from {name} called?",
        "How is a person from {name} described?",
        "What do you call someone from {name}?",
    ),
    "timezone": (
        "What time zone is {name} in?",
        "Which time zone does {name} use?",
        "What is the time zone of {name}?",
        "Name the time zone of {name}.",
    ),
    "native_name": (
        "What is the native name of {name}?",
        "What is {name} called in its own language?",
        "What is {names} name in its own language?",
        "Give the native name of {name}.",
    ),
    "official_name": (
        "What is the official name of {name}?",
        "What is {name} officially called?",
        "Give the official name of {name}.",
        "What is {names} full official name?",
    ),
    "tld": (
        "What is the internet domain of {name}?",
        "Which top-level domain does {name} use?",
        "What do websites in {name} end in?",
        "What is the top-level domain of {name}?",
    ),
}
"""The seen phrasings: asked in every split."""

HELD_OUT_QUESTIONS: dict[str, str] = {
    "capital": "{name} has which city as its capital?",
    "region": "{name} lies in what region?",
    "subregion": "{name} belongs to which subregion?",
    "area": "{name} covers how many square kilometres?",
    "population": "{name} has how many inhabitants?",
    "borders": "{name} has a land border with which country?",
    "calling_code": "{name} can be phoned with which calling code?",
    "demonym": "Someone from {name} is called what?",
    "timezone": "{name} keeps time in which zone?",
    "native_name": "{name} goes by what name in its own language?",
    "official_name": "{name} is officially known as what?",
    "tld": "{name} uses which internet domain?",
}
"""The held-out phrasings: asked in the test split only."""


@dataclass(frozen=True)
class SpanExample:
    """One question whose answer is a span of its context.

    Attributes:
        context: the passage.
        question: "What is the capital of France?".
        answers: the gold answers, each a substring of ``context``; the first
            is the one at ``answer_start``.
        answer_start: the character offset of ``answers[0]`` in ``context``,
            in the sentence that states the fact.
        country: the country's name in ``countryinfo`` ("" for user data).
        field: a key of `FIELDS` ("" for user data).
        phrasing: the question's template ("What is the capital of
            {name}?"; "" for user data).
        phrasing_seen: False for a held-out phrasing (test split only).
    """

    context: str
    question: str
    answers: tuple[str, ...]
    answer_start: int
    country: str = ""
    field: str = ""
    phrasing: str = ""
    phrasing_seen: bool = True


# --- the package's records ----------------------------------------------------

_INVISIBLE = {"Cf"}  # format characters: bidi marks, zero-width joiners


def _clean(text: object) -> str:
    """A string value with format characters removed and space collapsed."""
    if not isinstance(text, str):
        return ""
    kept = "".join(c for c in text if unicodedata.category(c) not in _INVISIBLE)
    return " ".join(kept.split())


def _number(value: object) -> str:
    """``640679`` as "640,679", ``0.49`` as "0.49"; "" when not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}"


def _records() -> list[dict]:
    """The raw records of ``countryinfo``, in its order."""
    try:
        from countryinfo import CountryInfo
    except ImportError:
        raise MissingDataError(
            "the country facts come from the `countryinfo` package, which is not "
            "installed; get it with `pip install countryinfo==1.0.1` (MIT, its "
            "data ships in the wheel), or install the `pipelines` extra."
        ) from None
    return list(CountryInfo.all().values())


# An English official name among the alternative spellings ("French Republic",
# "Kingdom of Spain"); not the inverted ones ("Moldova, Republic of").
_OFFICIAL = re.compile(
    r"\b(?:Republic|Kingdom|State|States|Commonwealth|Federation"
    r"|Principality|Union|Sultanate|Emirates?|Grand Duchy|Territory|Democratic"
    r"|Federal|Federated|Islamic|Socialist|Plurinational|Bolivarian|Oriental"
    r"|Confederation|Independent)\b"
)


@dataclass(frozen=True)
class _Country:
    name: str
    facts: dict  # field -> str, or a tuple of str for borders and calling_code


def _facts(record: dict, names: dict[str, str], notes: dict[str, int]) -> dict:
    """The usable facts of one record; ``names``: alpha-3 code -> name."""
    name = _clean(record.get("name"))
    facts: dict[str, object] = {}
    for field in ("capital", "region", "subregion", "demonym"):
        value = _clean(record.get(field))
        if field == "demonym" and re.search(r"[,/]", value):
            value = ""
        if value:
            facts[field] = value
    facts["area"] = _number(record.get("area")) if record.get("area") else ""
    population = record.get("population")
    facts["population"] = _number(population) if population else ""
    neighbours = []
    for code in record.get("borders") or ():
        if isinstance(code, str) and code.upper() in names:
            neighbours.append(names[code.upper()])
        else:
            notes["unresolved_border_codes"] += 1
    facts["borders"] = tuple(dict.fromkeys(n for n in neighbours if n != name))
    codes = []
    for code in record.get("callingCodes") or ():
        code = _clean(str(code)).lstrip("+")
        if code:
            codes.append("+" + code)
    facts["calling_code"] = tuple(dict.fromkeys(codes))
    zones = [
        _clean(zone).replace("\u2212", "-") for zone in record.get("timezones") or ()
    ]
    zones = [zone for zone in zones if zone]
    facts["timezone"] = zones[0] if len(zones) == 1 else ""
    native = _clean(record.get("nativeName"))
    facts["native_name"] = native if native.casefold() != name.casefold() else ""
    official = (_clean(s) for s in record.get("altSpellings") or ())
    facts["official_name"] = next(
        (
            s.removeprefix("the ")
            for s in official
            if s.isascii() and "," not in s and _OFFICIAL.search(s)
        ),
        "",
    )
    tlds = [_clean(tld) for tld in record.get("tld") or ()]
    facts["tld"] = next((tld for tld in tlds if re.fullmatch(r"\.\S+", tld)), "")
    return {field: facts[field] for field in FIELDS if facts.get(field)}


@functools.cache
def _countries() -> tuple[tuple[_Country, ...], tuple[tuple[str, int], ...]]:
    """The usable countries, by name, and the counts of what was left out."""
    records = [r for r in _records() if _clean(r.get("name"))]
    notes = {"records": len(records), "skipped_duplicate": 0}
    notes |= {"skipped_few_facts": 0, "unresolved_border_codes": 0}
    notes |= {f"skipped_{field}": 0 for field in FIELDS}
    names: dict[str, str] = {}  # alpha-3 -> the first record's name
    unique = []
    for record in records:
        code = str((record.get("ISO") or {}).get("alpha3") or "").upper()
        if code and code in names:
            notes["skipped_duplicate"] += 1
            continue
        if code:
            names[code] = _clean(record["name"])
        unique.append(record)
    countries = []
    for record in unique:
        facts = _facts(record, names, notes)
        if len(facts) < MIN_FACTS:
            notes["skipped_few_facts"] += 1
            continue
        for field in FIELDS:
            notes[f"skipped_{field}"] += field not in facts
        countries.append(_Country(_clean(record["name"]), facts))
    notes["countries"] = len(countries)
    countries.sort(key=lambda country: country.name)
    return tuple(countries), tuple(notes.items())


def country_facts() -> dict[str, dict[str, str | tuple[str, ...]]]:
    """The facts the passages state, by country name and field.

    Values are the texts written in the passages ("640,679" for an area);
    ``borders`` and ``calling_code`` are tuples (all neighbours, not only
    the ones a passage lists). Raises `MissingDataError` naming ``pip install
    countryinfo`` when the package is absent.
    """
    return {country.name: dict(country.facts) for country in _countries()[0]}


# --- prose ----------------------------------------------------------------------

_THE = re.compile(
    r"(?:United|Republic|Democratic|Federated|Isle|Holy See|Central African"
    r"|Dominican|Czech)\b.*"
    r"|(?:Netherlands|Philippines|Maldives|Comoros|Seychelles)"
    r"|.*\b(?:Islands|Republic|States|Kingdom|Emirates|Lands|Territory)"
    r"(?: \(.*\))?"
)


def _prose_name(name: str) -> str:
    """The name as written mid-sentence: "the United States", "the Gambia"."""
    if name.startswith("The "):
        return "the " + name[4:]
    return "the " + name if _THE.fullmatch(name) else name


def _possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def _render(template: str, name: str, value: str = "") -> tuple[str, int]:
    """The sentence and the offset of ``{value}`` in it (-1 when absent).

    ``name`` is the country's prose name; it is capitalised at the start.
    """
    slots = {"name": name, "names": _possessive(name), "value": value}
    parts: list[str] = []
    start = -1
    for literal, key, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if key is None:
            continue
        text = slots[key]
        if not "".join(parts) and key != "value":
            text = text[:1].upper() + text[1:]
        if key == "value":
            start = len("".join(parts))
        parts.append(text)
    sentence = "".join(parts)
    if sentence.endswith(".."):  # "... Washington D.C.."
        sentence = sentence[:-1]
    return sentence, start


def _value(
    field: str, fact: str | tuple[str, ...], rng: random.Random
) -> tuple[str, list[tuple[str, int]]]:
    """The ``{value}`` text of a fact and its gold answers with their offsets."""
    if field == "borders":
        chosen = sorted(rng.sample(range(len(fact)), min(len(fact), MAX_NEIGHBOURS)))
        shown = [_prose_name(fact[i]) for i in chosen]  # "the Gambia": "Gambia"
        items = [(text, text.removeprefix("the ")) for text in shown]
        joiner = " and "
    elif field == "calling_code":
        items = [(code, code) for code in fact]
        joiner = " or "
    elif field == "region" and fact == "Americas":
        items = [("the Americas", "Americas")]
        joiner = ""
    elif field == "official_name":
        items = [("the " + fact, fact)]
        joiner = ""
    elif field == "area":
        text = f"{fact} square kilometres"
        return text, [(text, 0), (fact, 0)]
    else:
        return str(fact), [(str(fact), 0)]
    shown = [text for text, _ in items]
    value = (", ".join(shown[:-1]) + joiner + shown[-1]) if len(shown) > 1 else shown[0]
    golds, offset = [], 0
    for index, (text, gold) in enumerate(items):
        golds.append((gold, offset + text.index(gold)))
        offset += len(text) + (len(joiner) if index == len(items) - 2 else 2)
    return value, golds


def _passage(
    country: _Country, rng: random.Random
) -> tuple[str, dict[str, tuple[tuple[str, ...], int]]]:
    """A passage and, per field, its gold answers and the first one's start."""
    name = _prose_name(country.name)
    fields = list(country.facts)
    rng.shuffle(fields)
    sentences: list[str] = []
    spans: dict[str, tuple[tuple[str, ...], int]] = {}
    position = 0
    for index, field in enumerate(fields):
        templates = STATEMENTS[field]
        if index == 0:
            templates = tuple(t for t in templates if "{name" in t)
        value, golds = _value(field, country.facts[field], rng)
        sentence, start = _render(rng.choice(templates), name, value)
        spans[field] = (
            tuple(gold for gold, _ in golds),
            position + start + golds[0][1],
        )
        sentences.append(sentence)
        position += len(sentence) + 1
    return " ".join(sentences), spans


def _question(template: str, country: str) -> str:
    return _render(template, _prose_name(country))[0]


# --- splits ---------------------------------------------------------------------


def _check_fraction(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < 1
    ):
        raise ValueError(f"`{name}` must be a number in [0, 1), received {value!r}")
    return float(value)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, received {value!r}")
    return value


def split_countries(
    valid_fraction: float = 0.1, test_fraction: float = 0.2, seed: int = 0
) -> tuple[list[str], list[str], list[str]]:
    """The names of the training, validation and test countries.

    Countries sharing a capital form one group, and groups are shuffled
    with ``seed``; test takes groups until it has ``round(n *
    test_fraction)`` countries or more, validation likewise, training the
    rest. Each list is sorted.

    Raises:
        ValueError: a fraction outside [0, 1), or the two leaving no
            training country.
    """
    _check_fraction("valid_fraction", valid_fraction)
    _check_fraction("test_fraction", test_fraction)
    countries = _countries()[0]
    groups: dict[str, list[str]] = {}
    for country in countries:
        key = country.facts.get("capital", "") or "country:" + country.name
        groups.setdefault(str(key).casefold(), []).append(country.name)
    order = [groups[key] for key in sorted(groups)]
    random.Random(f"countries:seed {seed}:split").shuffle(order)
    wanted = [round(len(countries) * test_fraction), 0]
    wanted[1] = round(len(countries) * valid_fraction)
    test: list[str] = []
    valid: list[str] = []
    train: list[str] = []
    for group in order:
        if len(test) < wanted[0]:
            test += group
        elif len(valid) < wanted[1]:
            valid += group
        else:
            train += group
    if not train:
        raise ValueError(
            f"`valid_fraction` {valid_fraction} and `test_fraction` "
            f"{test_fraction} leave no training country"
        )
    return sorted(train), sorted(valid), sorted(test)


def load_countries(
    passages_per_country: int = 8,
    eval_passages_per_country: int = 1,
    valid_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[list[SpanExample], list[SpanExample], list[SpanExample], dict[str, int]]:
    """Training, validation and test questions, split by country.

    Each passage is drawn from its own seed stream (``seed``, the country
    and the passage's number), so a country's passages do not depend on the
    other countries or on the fractions.

    Args:
        passages_per_country: passages per training country; each asks one
            seen phrasing, drawn, per fact.
        eval_passages_per_country: passages per validation and test
            country; validation asks every seen phrasing per fact, test
            every seen and every held-out one.
        valid_fraction: the share of countries for validation, in [0, 1).
        test_fraction: the share of countries for test, in [0, 1).
        seed: any int.

    Returns:
        ``(train, valid, test, notes)``: the examples, country by country
        (sorted by name), passage by passage, fact by fact in `FIELDS`
        order; ``notes`` counts: ``records`` in the package, ``countries``
        used, ``skipped_duplicate`` and ``skipped_few_facts`` records,
        ``skipped_<field>`` (used countries without that fact),
        ``unresolved_border_codes``, and per split ``<split>_countries``,
        ``<split>_passages`` and ``<split>_examples``, plus
        ``test_held_out_examples``.

    Raises:
        ValueError: a bad argument, naming it and what was received.
        MissingDataError: ``countryinfo`` is not installed.
    """
    _check_count("passages_per_country", passages_per_country)
    _check_count("eval_passages_per_country", eval_passages_per_country)
    names = split_countries(valid_fraction, test_fraction, seed)
    countries, counts = _countries()
    by_name = {country.name: country for country in countries}
    notes = dict(counts)
    splits: list[list[SpanExample]] = []
    for split, members in zip(("train", "valid", "test"), names, strict=True):
        passages = (
            passages_per_country if split == "train" else eval_passages_per_country
        )
        examples: list[SpanExample] = []
        for country_name in members:
            country = by_name[country_name]
            for number in range(passages):
                rng = random.Random(f"countries:seed {seed}:{country_name}:{number}")
                examples += _examples(country, split, rng)
        splits.append(examples)
        notes[f"{split}_countries"] = len(members)
        notes[f"{split}_passages"] = len(members) * passages
        notes[f"{split}_examples"] = len(examples)
    notes["test_held_out_examples"] = sum(not e.phrasing_seen for e in splits[2])
    return splits[0], splits[1], splits[2], notes


def _examples(country: _Country, split: str, rng: random.Random) -> list[SpanExample]:
    """The questions of one passage of ``country``."""
    context, spans = _passage(country, rng)
    examples = []
    for field in FIELDS:
        if field not in spans:
            continue
        answers, start = spans[field]
        if split == "train":
            asked = [(rng.choice(QUESTIONS[field]), True)]
        else:
            asked = [(template, True) for template in QUESTIONS[field]]
            if split == "test":
                asked.append((HELD_OUT_QUESTIONS[field], False))
        for template, seen in asked:
            examples.append(
                SpanExample(
                    context,
                    _question(template, country.name),
                    answers,
                    start,
                    country.name,
                    field,
                    template,
                    seen,
                )
            )
    return examples


# --- the user's own data --------------------------------------------------------


def read_span_jsonl(path: str | Path) -> list[SpanExample]:
    """Span questions from the user's JSON Lines file, one object a line.

    Each object has ``"context"`` and ``"question"``: non-blank strings;
    ``"answer"``: a non-blank string or a non-empty list of them (the gold
    answers, outer whitespace stripped), each found in the context; and
    optionally ``"answer_start"``: the character offset of the first answer
    in the context. Without it, the first answer's first occurrence is
    taken. The context is kept as written (offsets count in it). Blank lines
    are skipped.

    Raises:
        PipelineError: the file is missing or unreadable, or a line is not
            such an object; the message names the file, the line (from 1),
            the field, what was expected and what was received.
    """
    expected = 'a JSON object with "context", "question" and "answer"'
    return [_span_row(where, row) for where, row in jsonl_objects(path, expected)]


def _span_row(where: str, row: dict) -> SpanExample:
    """The example of one object of `read_span_jsonl`'s file."""

    def bad(field: str, expected: str, received: str | None = None) -> PipelineError:
        return field_error(where, row, field, expected, received)

    for field in ("context", "question"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise bad(field, "a non-blank string")
    context, question = row["context"], row["question"].strip()
    answer = row.get("answer")
    if isinstance(answer, str):
        given = [("answer", answer)]
    elif isinstance(answer, list) and answer:
        given = [(f"answer[{i}]", text) for i, text in enumerate(answer)]
    else:
        raise bad("answer", "a non-blank string or a non-empty list of them")
    answers = []
    for field, text in given:
        if not isinstance(text, str) or not text.strip():
            raise bad(field, "a non-blank string", shown(text))
        if text.strip() not in context:
            raise bad(
                field, "a span of the context (its text found there)", shown(text)
            )
        answers.append(text.strip())
    first = answers[0]
    start = row.get("answer_start")
    if start is None:
        start = context.index(first)
    elif (
        isinstance(start, bool)
        or not isinstance(start, int)
        or start < 0
        or context[start : start + len(first)] != first
    ):
        found = [m.start() for m in re.finditer(re.escape(first), context)][:5]
        raise bad(
            "answer_start",
            f"the character offset of {json.dumps(first, ensure_ascii=False)} in "
            f"the context (it occurs at {', '.join(map(str, found))})",
        )
    return SpanExample(context, question, tuple(answers), start)

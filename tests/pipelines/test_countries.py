"""The country-facts span questions, checked against countryinfo's own records."""

from __future__ import annotations

import json
import re
import statistics
import sys
import unicodedata
from collections import defaultdict
from pathlib import Path

import countryinfo
import pytest

from pipelines.core.errors import MissingDataError, PipelineError
from pipelines.extractive import countries as countries_module
from pipelines.extractive.countries import (
    FIELDS,
    HELD_OUT_QUESTIONS,
    QUESTIONS,
    SpanExample,
    load_countries,
    read_span_jsonl,
    split_countries,
)

# --- an independent reader of the passages -------------------------------------

# Each sentence states one fact; these words tell which (one field's only).
KEYWORDS = {
    "capital": r"\bcapital\b",
    "region": r"\bregion\b",
    "subregion": r"\bsubregion\b",
    "area": r"\bsquare kilometres\b",
    "population": r"\bpopulation\b|\binhabitants\b",
    "borders": r"\bborder|\bneighbours\b",
    "calling_code": r"\bcalling code\b|\bdial\b",
    "demonym": r"\bdemonym\b|\b[Pp]eople (?:from|are)\b",
    "timezone": r"\btime zone\b",
    "native_name": r"\bnative name\b|\bown language\b",
    "official_name": r"\b[Oo]fficial",
    "tld": r"\bdomain\b|\bWebsites\b",
}
# A sentence ends at ". " before a capital, except after "St." (St. George's).
SENTENCE_END = re.compile(r"(?<!\bSt\.)(?<=\.) (?=[^\W\d_])")


def sentences(context: str) -> list[tuple[int, str]]:
    """(start, sentence) pairs."""
    out, start = [], 0
    for match in SENTENCE_END.finditer(context):
        if context[match.end()].isupper():
            out.append((start, context[start : match.start()]))
            start = match.end()
    out.append((start, context[start:]))
    return out


def field_of(sentence: str) -> str:
    fields = [f for f, pattern in KEYWORDS.items() if re.search(pattern, sentence)]
    assert len(fields) == 1, (sentence, fields)
    return fields[0]


def visible(text: str) -> str:
    kept = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return " ".join(kept.split())


def grouping(number) -> str:
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    return f"{number:,}"


@pytest.fixture(scope="module")
def records():
    """countryinfo's records by name; and every name of each alpha-3 code."""
    by_name = {r["name"]: r for r in countryinfo.CountryInfo.all().values()}
    names = defaultdict(set)
    for record in by_name.values():
        code = (record.get("ISO") or {}).get("alpha3")
        if code:
            names[code].add(record["name"])
    return by_name, names


def golds(field: str, record: dict, names: dict) -> set[str]:
    """Every answer the record's ``field`` allows."""
    if field in ("capital", "region", "subregion", "demonym"):
        return {record[field]}
    if field == "area":
        return {f"{grouping(record['area'])} square kilometres"}
    if field == "population":
        return {grouping(record["population"])}
    if field == "borders":
        listed = set().union(*(names.get(code, set()) for code in record["borders"]))
        return {name.removeprefix("The ") for name in listed}
    if field == "calling_code":
        return {"+" + code.lstrip("+") for code in record["callingCodes"]}
    if field == "timezone":
        (zone,) = record["timezones"]
        return {zone.replace("\u2212", "-")}
    if field == "native_name":
        return {visible(record["nativeName"])} - {record["name"]}
    if field == "official_name":
        return set(record["altSpellings"])
    if field == "tld":
        return set(record["tld"])
    raise AssertionError(field)


@pytest.fixture(scope="module")
def splits():
    return load_countries()


def test_every_answer_is_the_span_of_the_sentence_stating_it(splits, records):
    by_name, names = records
    train, valid, test, _ = splits
    checked = 0
    read = {}  # context -> its sentences and their fields
    for example in train + valid + test:
        context, start, first = (
            example.context,
            example.answer_start,
            example.answers[0],
        )
        assert context[start : start + len(first)] == first, example
        assert all(answer in context for answer in example.answers), example
        assert len(set(example.answers)) == len(example.answers)
        if context not in read:
            told = sentences(context)
            read[context] = told, [field_of(s) for _, s in told]
            assert len(set(read[context][1])) == len(told), context
        told, fields = read[context]
        # The sentence holding the start states this field ...
        index = max(i for i, (offset, _) in enumerate(told) if offset <= start)
        offset, sentence = told[index]
        assert start + len(first) <= offset + len(sentence), example
        assert fields[index] == example.field, (sentence, example)
        # ... with the record's value, every gold answer in it.
        record = by_name[example.country]
        allowed = golds(example.field, record, names)
        for answer in example.answers:
            assert answer in sentence
            if example.field == "area":
                assert answer in allowed | {a.split()[0] for a in allowed}
            else:
                assert answer in allowed, (answer, allowed, example)
        if example.field == "area":
            assert example.answers[1] == first.split()[0]
        prose = example.country.removeprefix("The ")
        assert prose in example.question and prose in told[0][1]
        checked += 1
    assert checked == len(train) + len(valid) + len(test)


def test_passages_state_each_fact_once_first_naming_the_country(splits):
    train, valid, test, _ = splits
    fields_of = defaultdict(set)
    for example in train + valid + test:
        fields_of[example.context].add(example.field)
    lengths = []
    for context, fields in fields_of.items():
        told = sentences(context)
        assert {field_of(s) for _, s in told} == fields
        assert not re.match(r"Its? ", told[0][1])
        lengths.append(len(context.split()))
    assert 30 <= min(lengths) and max(lengths) <= 150
    assert 60 <= statistics.median(lengths) <= 100
    # Borders list at most four neighbours, each a gold answer.
    borders = [e for e in train if e.field == "borders"]
    assert max(len(e.answers) for e in borders) == countries_module.MAX_NEIGHBOURS
    assert any(len(e.answers) == 1 for e in borders)


def test_records_read_as_documented(splits, records):
    by_name, _ = records
    train, valid, test, notes = splits
    used = {e.country for e in train + valid + test}
    assert {"France", "Myanmar", "Scotland"} <= used
    # Second records of a code, and territories with a few facts only.
    assert not {"Burma", "Wales", "Curaçao", "Antarctica"} & used
    assert notes["records"] == len(by_name) and notes["countries"] == len(used)
    assert notes["skipped_duplicate"] >= 3 and notes["skipped_few_facts"] >= 10
    facts = {
        (e.country, e.field): e.answers for e in train + valid + test if e.phrasing_seen
    }
    skipped = {
        field: sum((country, field) not in facts for country in used)
        for field in FIELDS
    }
    assert {f"skipped_{field}": n for field, n in skipped.items()} == {
        key: value
        for key, value in notes.items()
        if key.startswith("skipped_")
        if key not in ("skipped_duplicate", "skipped_few_facts")
    }
    assert ("Vatican City State", "capital") not in facts  # a list in the data
    assert ("France", "timezone") not in facts  # twelve zones
    assert ("France", "native_name") not in facts  # the same as the name
    france = countries_module.country_facts()["France"]
    assert france["capital"] == "Paris" and france["area"] == "640,679"
    assert "Spain" in france["borders"] and france["calling_code"] == ("+33",)
    assert france["official_name"] == "French Republic"


def test_split_by_country_and_capital(splits):
    train, valid, test, notes = splits
    train_countries = {e.country for e in train}
    valid_countries = {e.country for e in valid}
    test_countries = {e.country for e in test}
    assert not test_countries & (train_countries | valid_countries)
    assert not valid_countries & train_countries
    sizes = [len(train_countries), len(valid_countries), len(test_countries)]
    assert sizes == [notes[f"{s}_countries"] for s in ("train", "valid", "test")]
    assert sum(sizes) == notes["countries"]
    assert sizes[2] == pytest.approx(0.2 * sum(sizes), abs=2)
    assert sizes[1] == pytest.approx(0.1 * sum(sizes), abs=2)

    def capitals(examples):
        return {e.answers[0] for e in examples if e.field == "capital"}

    assert not capitals(test) & capitals(train + valid)
    assert not capitals(valid) & capitals(train)
    # Countries sharing a capital share a split.
    names = split_countries()
    for pair in (("Jamaica", "Norfolk Island"), ("Serbia", "Serbia and Montenegro")):
        assert [sum(n in split for n in pair) for split in names].count(2) == 1
    assert split_countries(0.0, 0.0)[1:] == ([], [])


def test_held_out_phrasings_only_in_test(splits):
    train, valid, test, notes = splits
    held_out = set(HELD_OUT_QUESTIONS.values())
    seen = {template for templates in QUESTIONS.values() for template in templates}
    assert not held_out & seen
    assert all(len(QUESTIONS[field]) >= 4 for field in FIELDS)
    assert set(HELD_OUT_QUESTIONS) == set(QUESTIONS) == set(FIELDS)
    patterns = [
        re.compile(re.escape(t).replace(r"\{name\}", ".+").replace(r"\{names\}", ".+"))
        for t in held_out
    ]
    for example in train + valid:
        assert example.phrasing_seen and example.phrasing in QUESTIONS[example.field]
        assert not any(p.fullmatch(example.question) for p in patterns), example
    assert {e.phrasing for e in train} == seen
    assert {e.phrasing for e in test if not e.phrasing_seen} == held_out
    for example in test:
        assert example.phrasing_seen == (
            example.phrasing != HELD_OUT_QUESTIONS[example.field]
        )
    # Test asks every phrasing of every fact: each seen one once, then the
    # held-out one, about the same passage and answer.
    asked = defaultdict(list)
    for example in test:
        asked[example.context, example.field].append(example)
    for group in asked.values():
        assert [e.phrasing for e in group] == [
            *QUESTIONS[group[0].field],
            HELD_OUT_QUESTIONS[group[0].field],
        ]
        assert len({(e.answers, e.answer_start) for e in group}) == 1
    assert notes["test_held_out_examples"] == len(asked) == len(test) // 5
    # Validation asks every seen phrasing; training one per fact and passage.
    assert len(valid) % 4 == 0
    assert len({(e.context, e.field) for e in train}) == len(train)


def test_sizes_and_notes(splits):
    train, valid, test, notes = splits
    assert [len(train), len(valid), len(test)] == [
        notes["train_examples"],
        notes["valid_examples"],
        notes["test_examples"],
    ]
    assert len({e.context for e in train}) == notes["train_passages"]
    assert notes["train_passages"] == 8 * notes["train_countries"]
    assert len({e.context for e in test}) == notes["test_passages"]
    assert notes["test_passages"] == notes["test_countries"]
    assert len(train) > 10_000 and len(test) > 2000


def test_deterministic_in_the_seed():
    first = load_countries(passages_per_country=1, seed=3)
    assert load_countries(passages_per_country=1, seed=3) == first
    other = load_countries(passages_per_country=1, seed=4)
    assert other[2] != first[2]
    assert {e.country for e in other[2]} != {e.country for e in first[2]}
    # A country's passages do not depend on the split fractions.
    wider = load_countries(passages_per_country=1, seed=3, test_fraction=0.3)
    kept = {e.country for e in wider[0]} & {e.country for e in first[0]}
    assert kept and [e for e in wider[0] if e.country in kept] == [
        e for e in first[0] if e.country in kept
    ]
    # Passages of one country differ from each other.
    two = load_countries(passages_per_country=2, seed=3)[0]
    country = first[0][0].country
    assert len({e.context for e in two if e.country == country}) == 2


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"passages_per_country": 0}, ["`passages_per_country`", "received 0"]),
        ({"eval_passages_per_country": 1.5}, ["`eval_passages", "received 1.5"]),
        ({"valid_fraction": 1.0}, ["`valid_fraction`", "[0, 1)", "1.0"]),
        ({"test_fraction": -0.1}, ["`test_fraction`", "-0.1"]),
        ({"test_fraction": True}, ["`test_fraction`", "True"]),
        ({"valid_fraction": 0.5, "test_fraction": 0.5}, ["no training country"]),
    ],
)
def test_load_countries_rejects_bad_arguments(kwargs, words):
    with pytest.raises(ValueError) as error:
        load_countries(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_missing_package_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "countryinfo", None)
    countries_module._countries.cache_clear()
    try:
        with pytest.raises(MissingDataError, match="pip install countryinfo"):
            load_countries()
    finally:
        countries_module._countries.cache_clear()


# --- the user's own data ---------------------------------------------------------


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "spans.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_span_jsonl(tmp_path):
    rows = [
        {
            "context": "Paris is in France. Paris is big.",
            "question": "Q?",
            "answer": "Paris",
        },
        {
            "context": "Paris is in France. Paris is big.",
            "question": " Q2? ",
            "answer": [" Paris ", "France"],
            "answer_start": 20,
        },
        {"context": "a b", "question": "Q?", "answer": "b", "answer_start": None},
    ]
    path = _write(tmp_path, *(json.dumps(r) for r in rows[:2]), "", json.dumps(rows[2]))
    first, second, third = read_span_jsonl(path)
    assert first == SpanExample(
        "Paris is in France. Paris is big.", "Q?", ("Paris",), 0
    )
    assert second.answers == ("Paris", "France") and second.answer_start == 20
    assert second.question == "Q2?" and second.phrasing_seen
    assert third.answer_start == 2


GOOD = {"context": "The sky is blue.", "question": "Sky?", "answer": "blue"}


@pytest.mark.parametrize(
    "line, words",
    [
        ("{not json", ["not JSON", "column"]),
        ("[1]", ["expected a JSON object", "received array [1]"]),
        (
            json.dumps({"question": "Q?", "answer": "a"}),
            ['field "context"', "non-blank string", "received nothing"],
        ),
        (json.dumps({**GOOD, "context": ["a"]}), ['field "context"', 'array ["a"]']),
        (json.dumps({**GOOD, "question": " "}), ['field "question"', 'string " "']),
        (json.dumps({**GOOD, "answer": []}), ['field "answer"', "non-empty list"]),
        (json.dumps({**GOOD, "answer": 3}), ['field "answer"', "received number 3"]),
        (
            json.dumps({**GOOD, "answer": "green"}),
            ['field "answer"', "a span of the context", 'received string "green"'],
        ),
        (
            json.dumps({**GOOD, "answer": ["blue", "red"]}),
            ['field "answer[1]"', "a span of the context", 'string "red"'],
        ),
        (
            json.dumps({**GOOD, "answer": ["blue", None]}),
            ['field "answer[1]"', "non-blank string", "received null"],
        ),
        (
            json.dumps({**GOOD, "answer_start": 3}),
            ['field "answer_start"', 'offset of "blue"', "occurs at 11", "number 3"],
        ),
        (
            json.dumps({**GOOD, "answer_start": -5}),
            ['field "answer_start"', "received number -5"],
        ),
        (
            json.dumps({**GOOD, "answer_start": "11"}),
            ['field "answer_start"', 'received string "11"'],
        ),
    ],
)
def test_read_span_jsonl_errors_name_line_and_field(tmp_path, line, words):
    path = _write(tmp_path, json.dumps(GOOD), "", line)
    with pytest.raises(PipelineError) as error:
        read_span_jsonl(path)
    message = str(error.value)
    assert message.startswith(f"{path}, line 3: ")
    for word in words:
        assert word in message


def test_read_span_jsonl_missing_file(tmp_path):
    with pytest.raises(PipelineError, match="absent.jsonl: no such file"):
        read_span_jsonl(tmp_path / "absent.jsonl")

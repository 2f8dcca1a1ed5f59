"""The data layer of the pipelines: corpora, user files, filters and splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.core.errors import MissingDataError, PipelineError
from pipelines.data import (
    Splits,
    filter_length,
    read_parallel,
    read_tsv,
    split_pairs,
    summarize,
)
from pipelines.translation.bible import load_bible, load_bible_rows
from pipelines.translation.corpus import load_corpus
from pipelines.translation.dates import generate_dates
from pipelines.translation.ding import DING_PATH, load_ding, parse_ding_line


@pytest.fixture(scope="module")
def bible() -> list[tuple[str, str]]:
    return load_bible()


def test_bible_size_and_genesis(bible):
    assert 30000 < len(bible) < 31200
    assert bible[0] == (
        "in the beginning, god created the heavens and the earth.",
        "en el principio crió dios los cielos y la tierra.",
    )
    assert all(en and es and "\t" not in en + es for en, es in bible)


def test_bible_alignment_spot_checks():
    rows = {ref: (en, es) for ref, en, es in load_bible_rows()}
    en, es = rows["John 3:16"]
    assert en.startswith("for god so loved the world")
    assert es.startswith("porque de tal manera amó dios al mundo")
    en, es = rows["Revelation 22:21"]
    assert "grace" in en and "gracia" in es
    assert "[" not in "".join(en + es for en, es in rows.values())


PAIRS = [(f"source sentence number {i}", f"target {i}") for i in range(2000)]


def test_split_deterministic_disjoint_and_stable():
    first = split_pairs(PAIRS, 0.1, 0.1, seed=3)
    assert isinstance(first, Splits)
    assert first == split_pairs(PAIRS, 0.1, 0.1, seed=3)
    assert sum(map(len, first)) == len(PAIRS)
    sets = [{s for s, _ in part} for part in first]
    assert not sets[0] & sets[1] and not sets[0] & sets[2] and not sets[1] & sets[2]
    assert 100 < len(first.test) < 300 and 100 < len(first.valid) < 300
    more = PAIRS + [(f"another {i}", "x") for i in range(500)]
    grown = split_pairs(more, 0.1, 0.1, seed=3)
    for old, new in zip(first, grown, strict=True):
        assert set(old) <= set(new)
    assert split_pairs(PAIRS, 0.1, 0.1, seed=4) != first


def test_split_keeps_identical_sources_together():
    pairs = [(f"s{i % 50}", f"t{i}") for i in range(1000)]
    splits = split_pairs(pairs, 0.2, 0.2)
    where = {}
    for name, part in zip(Splits._fields, splits, strict=True):
        for source, _ in part:
            assert where.setdefault(source, name) == name


def test_split_by_groups():
    pairs = [(f"s{i}", f"t{i}") for i in range(1000)]
    groups = [f"g{i % 40}" for i in range(1000)]
    splits = split_pairs(pairs, 0.2, 0.2, groups=groups)
    where = {}
    for name, part in zip(Splits._fields, splits, strict=True):
        for source, _ in part:
            group = groups[int(source[1:])]
            assert where.setdefault(group, name) == name
    assert len(set(where.values())) == 3
    with pytest.raises(ValueError, match="2 groups for 1000 pairs"):
        split_pairs(pairs, groups=["a", "b"])


def test_split_fixed_sizes():
    splits = split_pairs(PAIRS, 0.0, 0.0, valid_size=100, test_size=50)
    assert (len(splits.valid), len(splits.test)) == (100, 50)
    grown = split_pairs(
        PAIRS + [(f"new {i}", "x") for i in range(10)],
        0.0,
        0.0,
        valid_size=100,
        test_size=50,
    )
    assert len(set(grown.test) & set(splits.test)) >= 40


def test_dates_disjoint_by_target():
    pairs = generate_dates(3000, seed=1)
    assert pairs == generate_dates(3000, seed=1)
    assert len({iso for _, iso in pairs}) == 3000
    assert all(
        "1950" <= iso[:4] <= "2049" and len(iso) == 10 and text == text.lower()
        for text, iso in pairs
    )
    splits = split_pairs(pairs, 0.1, 0.1, key="target")
    train = {iso for _, iso in splits.train}
    assert not train & {iso for _, iso in splits.test}
    assert not train & {iso for _, iso in splits.valid}


def test_filter_length():
    pairs = [("a b c", "x"), ("a", ""), ("", "x"), ("a b", "x y z w"), ("a", "x")]
    assert filter_length(pairs, 3, 3) == [("a b c", "x"), ("a", "x")]
    assert filter_length(pairs, 2, 4) == [("a b", "x y z w"), ("a", "x")]


def test_read_tsv(tmp_path: Path):
    path = tmp_path / "pairs.tsv"
    path.write_text('id\tde\ten\n1\tHallo "Welt"\tHello "world"\n\n2\tJa\tYes\n')
    assert read_tsv(path, 1, 2, skip_header=True) == [
        ('Hallo "Welt"', 'Hello "world"'),
        ("Ja", "Yes"),
    ]
    with pytest.raises(PipelineError, match=r"pairs.tsv, line 2: 3 column\(s\)"):
        read_tsv(path, 0, 3, skip_header=True)


def test_read_parallel(tmp_path: Path):
    source, target = tmp_path / "a.de", tmp_path / "a.en"
    source.write_text("Hallo\nJa\n")
    target.write_text("Hello\nYes\n")
    assert read_parallel(source, target) == [("Hallo", "Hello"), ("Ja", "Yes")]
    target.write_text("Hello\nYes\nNo\n")
    with pytest.raises(PipelineError, match=r"a\.de has 2 lines.*a\.en has 3"):
        read_parallel(source, target)
    source.write_bytes(b"ok\n\xff bad\n")
    with pytest.raises(PipelineError, match=r"a\.de, line 2: not valid UTF-8"):
        read_parallel(source, target)


def test_load_corpus_specs(tmp_path: Path):
    (tmp_path / "p.tsv").write_text("a\tb\n")
    (tmp_path / "s.txt").write_text("a\n")
    (tmp_path / "t.txt").write_text("b\n")
    assert load_corpus(f"tsv:{tmp_path / 'p.tsv'}") == [("a", "b")]
    assert load_corpus(f"parallel:{tmp_path / 's.txt'},{tmp_path / 't.txt'}") == [
        ("a", "b")
    ]
    assert load_corpus("dates:50") == generate_dates(50, 0)
    assert len(load_corpus("bible")) > 30000
    for bad in ("bibel", "dates:x", "parallel:one", "tsv:"):
        with pytest.raises(ValueError, match="valid forms: bible; ding"):
            load_corpus(bad)


SAMPLE = """\
# Version :: test
Haus {n} | Häuser {pl} :: house | houses
etw. machen {vt} | Ich mache das jetzt (sofort). | Er macht es [ugs.]. :: to do sth. | I'll do it now (at once). | He does it.
abgehen {vi} | Das Schiff geht um acht Uhr ab.; Es fährt um acht. :: to leave | The ship leaves at eight.; It sails at eight.
Kurz. | Nur ein Satz. :: Short. | Just one sentence. | extra
"""  # noqa: E501


def test_ding_parsing_sample(tmp_path: Path):
    assert parse_ding_line("# comment :: x") == []
    assert parse_ding_line("Haus {n} | Häuser {pl} :: house | houses") == []
    path = tmp_path / "de-en"
    path.write_text(SAMPLE + SAMPLE)  # duplicates are kept once
    assert load_ding(path) == [
        ("Ich mache das jetzt.", "I'll do it now."),
        ("Das Schiff geht um acht Uhr ab.", "The ship leaves at eight."),
    ]


def test_ding_missing(tmp_path: Path):
    with pytest.raises(MissingDataError, match="apt-get install trans-de-en"):
        load_ding(tmp_path / "nowhere")
    assert issubclass(MissingDataError, FileNotFoundError)


@pytest.mark.skipif(
    not Path(DING_PATH).is_file(), reason="needs the Debian package trans-de-en"
)
def test_ding_real_file():
    pairs = load_ding()
    assert 18000 < len(pairs) < 21000
    assert all(de.endswith((".", "!", "?")) and len(de.split()) >= 4 for de, _ in pairs)
    assert not any("{" in de or "[" in de + en for de, en in pairs)


def test_summarize(bible):
    text = summarize(split_pairs(bible[:500], 0.1, 0.1))
    assert "train:" in text and "valid:" in text and "test:" in text
    assert "train target words:" in text and "distinct" in text and "median" in text


def test_summarize_counts_what_a_character_model_reads():
    """A character model's report counts characters, not the whitespace
    words (every distinct date a 'word') that read as a vocabulary."""
    dates = [(f"{d} march 1987", f"1987-03-{d:02d}") for d in range(1, 29)]
    splits = split_pairs(dates, 0.1, 0.1)
    chars = summarize(splits, unit="char")
    target = {c for _, t in splits.train for c in t}
    assert (
        "train target characters: mean 10.0, median 10, p95 10, max 10; "
        f"{len(target)} distinct" in chars
    )
    assert len(target) <= 11  # digits and "-"
    words = summarize(splits)
    assert (
        "train target words: mean 1.0, median 1, p95 1, max 1; "
        f"{len(splits.train)} distinct" in words
    )

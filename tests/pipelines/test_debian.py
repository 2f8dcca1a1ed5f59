"""The Debian descriptions reader: parsing, grouping, splits, cache, errors."""

from __future__ import annotations

import gzip
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from pipelines.core.errors import MissingDataError
from pipelines.data import Splits
from pipelines.summarization import debian
from pipelines.summarization.debian import (
    DebianDescription,
    group_descriptions,
    load_debian_descriptions,
    parse_packages,
    read_debian_descriptions,
    read_lists,
    split_descriptions,
)

TRANSLATION = """\
Package: foo
Description-md5: 0123456789abcdef0123456789abcdef
Description-en: Frobnicate   the widgets
 Foo frobnicates widgets quickly,
   and   well.
 .
 A second paragraph:
  * a verbatim list item
 .
 The end.

Package: foo-doc
Description-md5: 1123456789abcdef0123456789abcdef
Description-en: Documentation for foo
 This package holds the manual of foo.

Package: empty
Description-md5: 2123456789abcdef0123456789abcdef
Description-en: Nothing below this line

Package: copy
Description-md5: 3123456789abcdef0123456789abcdef
Description-en: A copy of foo's body
 Foo frobnicates widgets quickly, and well.
 .
 A second paragraph: * a verbatim list item
 .
 The end.

Package: bar
Description-md5: 4123456789abcdef0123456789abcdef
Description-en: Bar the door
 Bar bars doors.
"""

PACKAGES = """\
Package: foo
Version: 1.0-1
Source: foo-src (1.0-1)
Description: Frobnicate the widgets

Package: foo-doc
Version: 1.0-1
Source: foo-src
Architecture: all

Package: bar
Version: 2.0
"""


def write_lists(folder: Path, translation: str, packages: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "deb.debian.org_debian_dists_bookworm_main_"
    (folder / f"{prefix}i18n_Translation-en").write_text(translation, "utf-8")
    if packages is not None:
        (folder / f"{prefix}binary-amd64_Packages").write_text(packages, "utf-8")
    return folder


def test_parsing(tmp_path: Path):
    records = read_lists(write_lists(tmp_path, TRANSLATION, PACKAGES))
    assert records == [
        DebianDescription(
            "foo",
            "foo-src",
            "Frobnicate the widgets",
            "Foo frobnicates widgets quickly, and well. A second paragraph: "
            "* a verbatim list item The end.",
        ),
        DebianDescription(
            "foo-doc",
            "foo-src",
            "Documentation for foo",
            "This package holds the manual of foo.",
        ),
        DebianDescription("bar", "bar", "Bar the door", "Bar bars doors."),
    ]  # "empty" has no body; "copy" repeats foo's body


def test_packages_without_list_or_entry(tmp_path: Path):
    records = read_lists(write_lists(tmp_path, TRANSLATION))
    assert [record.source for record in records] == ["", "", ""]
    assert parse_packages(PACKAGES.splitlines(keepends=True)) == {
        "foo": "foo-src",
        "foo-doc": "foo-src",
        "bar": "bar",
    }


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(n))


def stanza(package: str, synopsis: str, body: str) -> str:
    return f"Package: {package}\nDescription-en: {synopsis}\n {body}\n\n"


def split_of(splits: Splits) -> dict[str, str]:
    """Body -> the split it is in."""
    return {
        body: name
        for name, part in zip(Splits._fields, splits, strict=True)
        for body, _ in part
    }


def test_two_binaries_of_one_source_share_a_split(tmp_path: Path):
    translation = packages = ""
    for i in range(300):
        translation += stanza(f"lib{i}", f"library {i}", words(i, 30))
        translation += stanza(f"lib{i}-dev", f"headers {i}", words(1000 + i, 30))
        packages += f"Package: lib{i}\nSource: src{i} (1.0)\n\n"
        packages += f"Package: lib{i}-dev\nSource: src{i}\n\n"
    write_lists(tmp_path, translation, packages)
    records = read_lists(tmp_path)
    splits = split_descriptions(records, 0.2, 0.2)
    where = split_of(splits)
    for i in range(300):
        assert where[words(i, 30)] == where[words(1000 + i, 30)]
    assert all(len(part) > 60 for part in splits)  # groups do spread


def test_shared_prefix_across_sources_shares_a_split():
    records = []
    for i in range(300):
        opening = words(i, debian.PREFIX_WORDS)
        records.append(DebianDescription(f"a{i}", f"a{i}", "s", opening + " one"))
        records.append(DebianDescription(f"b{i}", f"b{i}", "s", opening + " two"))
    groups = group_descriptions(records)
    assert groups[0::2] == groups[1::2]
    where = split_of(split_descriptions(records, 0.2, 0.2))
    for i in range(300):
        opening = words(i, debian.PREFIX_WORDS)
        assert where[opening + " one"] == where[opening + " two"]
    # a chain: a0 ~ b0 by prefix, b0 ~ c by source, so c joins them too
    chained = [*records[:2], DebianDescription("c", "b0", "s", "other words")]
    assert len(set(group_descriptions(chained))) == 1
    # differing within the first 25 words: separate groups
    apart = [
        DebianDescription("x", "x", "s", words(1, 24) + " left tail"),
        DebianDescription("y", "y", "s", words(1, 24) + " right tail"),
    ]
    assert len(set(group_descriptions(apart))) == 2


def test_splits_deterministic_and_independent_of_order():
    records = [
        DebianDescription(f"p{i}", f"s{i // 3}", f"synopsis {i}", words(i, 30))
        for i in range(600)
    ]
    first = split_descriptions(records)
    assert first == split_descriptions(records)
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    assert split_of(split_descriptions(shuffled)) == split_of(first)
    assert split_of(split_descriptions(records, seed=1)) != split_of(first)
    assert sum(map(len, first)) == len(records)


def test_cache_written_atomically_and_reused(tmp_path: Path):
    lists = write_lists(tmp_path / "lists", TRANSLATION, PACKAGES)
    cache = tmp_path / "cache" / "descriptions.tsv.gz"
    first = read_debian_descriptions(lists, cache)
    assert [path.name for path in cache.parent.iterdir()] == [cache.name]
    text = gzip.decompress(cache.read_bytes()).decode()
    assert text.startswith(debian.CACHE_MAGIC + "\n# file ")
    assert "i18n_Translation-en size " in text and "_Packages size " in text
    # the lists change (or vanish): the cache is used until refresh
    write_lists(lists, stanza("new", "New synopsis", "A new body."), PACKAGES)
    assert read_debian_descriptions(lists, cache) == first
    assert read_debian_descriptions(tmp_path / "gone", cache) == first
    refreshed = read_debian_descriptions(lists, cache, refresh=True)
    assert refreshed == [DebianDescription("new", "", "New synopsis", "A new body.")]
    assert read_debian_descriptions(tmp_path / "gone", cache) == refreshed
    splits = load_debian_descriptions(
        tmp_path / "gone", cache, valid_fraction=0.0, test_fraction=1.0
    )
    assert splits == Splits([], [], [("A new body.", "New synopsis")])


def test_cache_crash_leaves_old_cache(tmp_path: Path, monkeypatch):
    lists = write_lists(tmp_path / "lists", TRANSLATION, PACKAGES)
    cache = tmp_path / "descriptions.tsv.gz"
    read_debian_descriptions(lists, cache)
    before = cache.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)  # the atomic write fails
    with pytest.raises(OSError, match="disk full"):
        read_debian_descriptions(lists, cache, refresh=True)
    assert cache.read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == [cache.name, "lists"]


def test_missing_lists_name_the_command(tmp_path: Path):
    cache = tmp_path / "cache.tsv.gz"
    with pytest.raises(MissingDataError) as error:
        load_debian_descriptions(tmp_path / "lists", cache)
    message = str(error.value)
    assert "`sudo apt-get update -o Acquire::Languages=en`" in message
    assert "plain `apt-get update` deletes them" in message
    assert str(cache) in message
    assert not cache.exists()


def test_damaged_cache(tmp_path: Path):
    cache = tmp_path / "cache.tsv.gz"
    cache.write_bytes(gzip.compress(b"package\tsource\n"))
    with pytest.raises(ValueError, match="not a Debian descriptions cache"):
        read_debian_descriptions(tmp_path, cache)


@pytest.mark.parametrize("compression", ["gz", "lz4"])
def test_compressed_lists(tmp_path: Path, compression: str):
    plain = read_lists(write_lists(tmp_path / "plain", TRANSLATION, PACKAGES))
    folder = write_lists(tmp_path / "packed", TRANSLATION, PACKAGES)
    for path in list(folder.iterdir()):
        if compression == "gz":
            path.with_name(path.name + ".gz").write_bytes(
                gzip.compress(path.read_bytes())
            )
        elif shutil.which("lz4") is None:
            pytest.skip("the lz4 program is not installed")
        else:
            subprocess.run(["lz4", "-q", str(path), str(path) + ".lz4"], check=True)
        path.unlink()
    assert read_lists(folder) == plain

"""Debian package long descriptions paired with their one-line synopsis.

The descriptions are read at run time from apt's English translation lists,
``/var/lib/apt/lists/*_i18n_Translation-en`` (plain, or compressed with lz4,
gzip or xz); each package keeps its own licence, so no extract is stored in
this repository. Fetch the lists with::

    sudo apt-get update -o Acquire::Languages=en

Images that set ``Acquire::Languages "none"`` delete them again on a plain
``apt-get update``, so the first read copies the pairs into a cache (a gzip
TSV in the user's cache directory) and later reads use it.

A Translation-en file is a list of stanzas::

    Package: 0ad-data
    Description-md5: 26581e685027d5ae84824362a4ba59ee
    Description-en: Real-time strategy game of ancient warfare (data files)
     0 A.D. (pronounced "zero ey-dee") is a free, open-source, ...
     .
     This package contains the main data files required by 0 A.D.

The rule used here:

* the synopsis is the ``Description-en:`` line; the body is the long
  description below it, its paragraphs (separated by `` .`` lines) joined with
  a space; whitespace is collapsed in both, so verbatim lines and lists become
  running text;
* stanzas with an empty body or synopsis are dropped;
* a body seen before (in file order; files sorted by name) is dropped, so each
  body appears once.

Splits: the Translation files name binary packages only; the ``Packages``
lists beside them (``*_Packages``) map each binary package to its source
package (``Source:``, without a version; absent means the package is its own
source). A package the lists do not name counts as its own source. Pairs are
grouped by source package and by the first `PREFIX_WORDS` words of their body
(templated descriptions such as ``-dev`` / ``-doc`` packages share openings
across sources), taking the union of both (connected components), and whole
groups are split by a stable hash of the group, so near-copies never straddle
splits.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import re
import shutil
import statistics
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, NamedTuple

from pipelines.core.errors import MissingDataError
from pipelines.core.run_dir import cache_dir, write_bytes
from pipelines.data.splits import Splits, split_pairs

APT_LISTS = Path("/var/lib/apt/lists")
FETCH_COMMAND = "sudo apt-get update -o Acquire::Languages=en"
CACHE_NAME = "debian-descriptions.tsv.gz"
CACHE_MAGIC = "# attention-pipelines debian descriptions v1"
COLUMNS = ("package", "source", "synopsis", "body")
PREFIX_WORDS = 25
COMPRESSED = ("", ".lz4", ".gz", ".xz")
TRANSLATION_SUFFIX = "_i18n_Translation-en"
PACKAGES_SUFFIX = "_Packages"


class DebianDescription(NamedTuple):
    """One pair: ``source`` is ``""`` when no Packages list names ``package``."""

    package: str
    source: str
    synopsis: str
    body: str


def default_cache_path() -> Path:
    """``<cache_dir>/debian-descriptions.tsv.gz`` (see `run_dir.cache_dir`)."""
    return cache_dir() / CACHE_NAME


def list_files(lists_dir: str | Path, suffix: str) -> list[Path]:
    """Files of ``lists_dir`` named ``*<suffix>`` plain or compressed, sorted."""
    lists_dir = Path(lists_dir)
    if not lists_dir.is_dir():
        return []
    return sorted(
        path
        for path in lists_dir.iterdir()
        if path.is_file()
        and any(path.name.endswith(suffix + end) for end in COMPRESSED)
    )


@contextlib.contextmanager
def open_list(path: str | Path) -> Iterator[IO[str]]:
    """The text of an apt list, decompressed by its suffix.

    ``.lz4`` uses the ``lz4`` Python package when installed, else the
    ``lz4cat`` program; an error names the file.
    """
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
            yield handle
    elif path.suffix == ".xz":
        with lzma.open(path, "rt", encoding="utf-8", errors="replace") as handle:
            yield handle
    elif path.suffix == ".lz4":
        try:
            import lz4.frame  # type: ignore[import-not-found]
        except ImportError:
            with _lz4cat(path) as handle:
                yield handle
        else:
            with lz4.frame.open(path, "rb") as raw:
                yield io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
    else:
        with open(path, encoding="utf-8", errors="replace") as handle:
            yield handle


@contextlib.contextmanager
def _lz4cat(path: Path) -> Iterator[IO[str]]:
    binary = shutil.which("lz4cat")
    if binary is None:
        raise MissingDataError(
            f"{path} is lz4-compressed and neither the lz4 Python package nor the "
            "lz4cat program is installed; install it with `apt-get install lz4`"
        )
    process = subprocess.Popen(
        [binary, str(path.resolve())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        yield io.TextIOWrapper(process.stdout, encoding="utf-8", errors="replace")
    except BaseException:
        process.kill()
        process.wait()
        raise
    process.stdout.close()
    error = process.stderr.read().decode("utf-8", "replace").strip()
    if process.wait() != 0:
        raise ValueError(f"{path}: lz4cat failed ({error or process.returncode})")


def normalize(text: str) -> str:
    """``text`` with runs of whitespace collapsed to one space, stripped."""
    return " ".join(text.split())


def parse_translation(lines: Iterable[str]) -> Iterator[tuple[str, str, str]]:
    """``(package, synopsis, body)`` of each stanza of a Translation-en text.

    Body lines start with a space; a `` .`` line separates paragraphs. Nothing
    is dropped here (empty bodies included); see `read_lists`.
    """
    package, in_description = "", False
    synopsis: str | None = None
    body: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line.strip():
            if synopsis is not None:
                yield package, normalize(synopsis), normalize(" ".join(body))
            package, synopsis, body, in_description = "", None, [], False
        elif line[0] in " \t":
            if in_description:
                text = line[1:]
                body.append("" if text.strip() == "." else text)
        else:
            field, _, value = line.partition(":")
            in_description = field == "Description-en"
            if field == "Package":
                package = value.strip()
            elif in_description:
                synopsis = value
    if synopsis is not None:
        yield package, normalize(synopsis), normalize(" ".join(body))


def parse_packages(lines: Iterable[str]) -> dict[str, str]:
    """``{binary package: source package}`` of a Packages list.

    ``Source: foo (1.2-3)`` gives ``foo``; a stanza without ``Source:`` is its
    own source. The first stanza of a package wins.
    """
    sources: dict[str, str] = {}
    package, source = "", ""

    def flush() -> None:
        if package:
            sources.setdefault(package, source or package)

    for line in lines:
        if line.startswith("Package:"):
            package = line[8:].strip()
        elif line.startswith("Source:"):
            source = line[7:].split("(")[0].strip()
        elif not line.strip():
            flush()
            package, source = "", ""
    flush()
    return sources


def read_lists(lists_dir: str | Path = APT_LISTS) -> list[DebianDescription]:
    """The pairs of the Translation-en and Packages lists in ``lists_dir``.

    Raises `MissingDataError` with the command that fetches them when
    ``lists_dir`` has no Translation-en file.
    """
    translations = list_files(lists_dir, TRANSLATION_SUFFIX)
    if not translations:
        raise _missing(lists_dir, None)
    sources: dict[str, str] = {}
    for path in list_files(lists_dir, PACKAGES_SUFFIX):
        with open_list(path) as handle:
            for package, source in parse_packages(handle).items():
                sources.setdefault(package, source)
    seen: set[str] = set()
    records = []
    for path in translations:
        with open_list(path) as handle:
            for package, synopsis, body in parse_translation(handle):
                if not body or not synopsis or body in seen:
                    continue
                seen.add(body)
                records.append(
                    DebianDescription(package, sources.get(package, ""), synopsis, body)
                )
    return records


def _missing(lists_dir: str | Path, cache_path: Path | None) -> MissingDataError:
    cache = f" and there is no cache at {cache_path}" if cache_path else ""
    return MissingDataError(
        f"no Debian package descriptions: {lists_dir} has no *{TRANSLATION_SUFFIX} "
        f"list{cache}. Fetch the lists with `{FETCH_COMMAND}` (a plain "
        "`apt-get update` deletes them again on images that set "
        'Acquire::Languages "none"; the first read copies them into the cache).'
    )


def write_cache(
    path: str | Path, records: Sequence[DebianDescription], files: Sequence[Path]
) -> Path:
    """Write ``records`` as a gzip TSV at ``path``, atomically (temporary file,
    fsync, rename). Comment lines name each source file with its size and
    modification time; then the header `COLUMNS`, one pair a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [CACHE_MAGIC]
    for file in files:
        stat = file.stat()
        mtime = datetime.fromtimestamp(stat.st_mtime, timezone.utc)
        lines.append(
            f"# file {file} size {stat.st_size} "
            f"mtime {mtime.isoformat(timespec='seconds')}"
        )
    lines.append("\t".join(COLUMNS))
    lines.extend("\t".join(record) for record in records)
    text = "\n".join(lines) + "\n"
    return write_bytes(path, gzip.compress(text.encode("utf-8"), mtime=0))


def read_cache(path: str | Path) -> list[DebianDescription]:
    """The pairs of a cache written by `write_cache`; a damaged one raises
    `ValueError` naming it."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
            lines = handle.read().split("\n")
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is damaged ({error}); delete it") from None
    if lines[0] != CACHE_MAGIC:
        raise ValueError(f"{path} is not a Debian descriptions cache; delete it")
    rows = [line for line in lines[1:] if line and not line.startswith("# ")]
    if not rows or rows[0] != "\t".join(COLUMNS):
        raise ValueError(f"{path}: no column header {COLUMNS}; delete it")
    records = []
    for number, row in enumerate(rows[1:], start=2):
        fields = row.split("\t")
        if len(fields) != len(COLUMNS):
            raise ValueError(f"{path}: row {number} has {len(fields)} fields")
        records.append(DebianDescription(*fields))
    return records


def read_debian_descriptions(
    lists_dir: str | Path = APT_LISTS,
    cache_path: str | Path | None = None,
    *,
    refresh: bool = False,
) -> list[DebianDescription]:
    """The pairs, from the cache when there is one, else from the lists.

    Reading the lists writes the cache (``cache_path``, default
    `default_cache_path`). The cache is used even when the lists have changed
    since, until ``refresh=True`` reads the lists again. Raises
    `MissingDataError` with the fetch command when neither exists (or, with
    ``refresh``, when the lists are gone; the cache is then left as it is).
    """
    cache = Path(cache_path) if cache_path is not None else default_cache_path()
    if cache.is_file() and not refresh:
        return read_cache(cache)
    files = list_files(lists_dir, TRANSLATION_SUFFIX)
    if not files:
        raise _missing(lists_dir, None if refresh else cache)
    files += list_files(lists_dir, PACKAGES_SUFFIX)
    records = read_lists(lists_dir)
    write_cache(cache, records, files)
    return records


def body_prefix(body: str, words: int = PREFIX_WORDS) -> str:
    """The first ``words`` whitespace-separated words of ``body``."""
    return " ".join(body.split()[:words])


def group_descriptions(records: Sequence[DebianDescription]) -> list[str]:
    """A group name for each record: records of one source package, or with
    the same `body_prefix`, get the same name, transitively.

    The name is the smallest key of the group, so it depends on the group's
    members only, not on their order.
    """
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        root = key
        while parent[root] != root:
            root = parent[root]
        while parent[key] != root:  # path compression
            parent[key], key = root, parent[key]
        return root

    def union(a: str, b: str) -> None:
        for key in (a, b):
            parent.setdefault(key, key)
        root_a, root_b = find(a), find(b)
        if root_a != root_b:  # the smaller key stays the root
            low, high = sorted((root_a, root_b))
            parent[high] = low

    keys = [
        (
            f"source:{record.source or record.package}",
            f"prefix:{body_prefix(record.body)}",
        )
        for record in records
    ]
    for source_key, prefix_key in keys:
        union(source_key, prefix_key)
    return [find(source_key) for source_key, _ in keys]


def split_descriptions(
    records: Sequence[DebianDescription],
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    seed: int = 0,
) -> Splits:
    """``(body, synopsis)`` pairs split by `group_descriptions` with
    `split_pairs` (``groups=``): whole groups go to one split."""
    pairs = [(record.body, record.synopsis) for record in records]
    return split_pairs(
        pairs,
        valid_fraction,
        test_fraction,
        seed=seed,
        groups=group_descriptions(records),
    )


def load_debian_descriptions(
    lists_dir: str | Path = APT_LISTS,
    cache_path: str | Path | None = None,
    *,
    refresh: bool = False,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    seed: int = 0,
) -> Splits:
    """``(long description, synopsis)`` pairs in `Splits`, grouped by source
    package and body prefix; see `read_debian_descriptions` for the cache."""
    records = read_debian_descriptions(lists_dir, cache_path, refresh=refresh)
    return split_descriptions(records, valid_fraction, test_fraction, seed)


_WORD = re.compile(r"\w+")


def absent_share(pairs: Iterable[tuple[str, str]]) -> float:
    """The share of synopsis words (lowercased ``\\w+`` runs) absent from the
    body of their pair: what a model must write rather than copy."""
    absent = total = 0
    for body, synopsis in pairs:
        words = set(_WORD.findall(body.lower()))
        tokens = _WORD.findall(synopsis.lower())
        total += len(tokens)
        absent += sum(token not in words for token in tokens)
    return absent / total if total else 0.0


def describe(records: Sequence[DebianDescription], splits: Splits) -> str:
    """Pairs, median words, absent synopsis words, groups and split sizes."""
    pairs = [(record.body, record.synopsis) for record in records]
    if not pairs:
        return "0 pairs"
    groups = group_descriptions(records)
    sources = {record.source or record.package for record in records}
    prefixes = {body_prefix(record.body) for record in records}
    unmapped = sum(not record.source for record in records)
    return "\n".join(
        [
            f"{len(pairs)} pairs; body median "
            f"{statistics.median(len(b.split()) for b, _ in pairs):g} words, "
            f"synopsis median {statistics.median(len(s.split()) for _, s in pairs):g}",
            f"{absent_share(pairs):.1%} of synopsis words absent from the body",
            f"{len(sources)} source packages ({unmapped} pairs not in a Packages "
            f"list), {len(prefixes)} distinct {PREFIX_WORDS}-word prefixes, "
            f"{len(set(groups))} groups",
            "splits: "
            + ", ".join(
                f"{name} {len(part)}"
                for name, part in zip(Splits._fields, splits, strict=True)
            ),
        ]
    )

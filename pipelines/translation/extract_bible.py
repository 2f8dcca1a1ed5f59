"""Extract the English-Spanish Bible verse pairs from the Debian SWORD modules.

Needs the Debian packages ``sword-text-web`` (World English Bible),
``sword-text-sparv`` (Reina-Valera 1909) and ``diatheke``::

    apt-get install -y sword-text-web sword-text-sparv diatheke
    python -m pipelines.translation.extract_bible

For every book of the 66-book canon, ``diatheke -b MODULE -o f -f plain -k BOOK``
prints ``Book c:v: text`` lines; verse text may continue on the following lines.
Notes in square brackets (footnotes, nested ones included) and Strong's numbers
(``<G5547>``) are removed, whitespace is collapsed and both sides are lowercased
(the Reina-Valera capitalises whole first words: ``EN el principio``). Psalm
superscriptions, which the WEB prints as headings above the verse, are put at the
start of the verse they head, as the Reina-Valera (KJV versification) counts them
in verse 1. Verses are joined by reference; pairs with an empty side are dropped.
The two modules do not number a few passages alike (Numbers 13, 1 Samuel 24 and
Jonah 2 follow the Hebrew numbering in the Reina-Valera module), so pairs that
look misaligned by their lengths are dropped (see ``misaligned``).
The output is a gzip TSV ``ref<TAB>en<TAB>es`` in canonical book order, written
byte-for-byte reproducibly.
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import math
import re
import statistics
import subprocess
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ENGLISH_MODULE = "engWEB2015eb"
SPANISH_MODULE = "spaRV1909eb"
DEFAULT_OUTPUT = Path(__file__).with_name("bible_en_es.tsv.gz")

# The 66-book canon in order; names as ``diatheke`` accepts them and as the
# ``ref`` column spells them.
BOOKS: tuple[str, ...] = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua",
    "Judges", "Ruth", "1 Samuel", "2 Samuel", "1 Kings", "2 Kings",
    "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah",
    "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai",
    "Zechariah", "Malachi",
    "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
    "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus",
    "Philemon", "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John",
    "3 John", "Jude", "Revelation",
)  # fmt: skip

# "Genesis 1:1: text", "I Samuel 3:4: text", "  Psalms 3:1: text" (indented when
# a heading line precedes it).
REFERENCE = re.compile(
    r"^(?P<indent>\s*)(?P<book>(?:[1-4]|I{1,3}) ?)?(?P<name>[A-Z][A-Za-z]*"
    r"(?: [a-zA-Z]+)*) (?P<chapter>\d+):(?P<verse>\d+):(?: (?P<text>.*))?$"
)
STRONGS = re.compile(r"<[GH]\d+>")
# Lines after this many blank lines in a row are not verse text: the WEB appends
# its glossary after Revelation 22:21 this way; within verses at most two occur.
APPENDIX_BLANK_LINES = 3


@dataclass
class Verse:
    """One verse as printed: chapter, verse, raw text and the heading above it."""

    chapter: int
    verse: int
    lines: list[str]
    heading: str | None = None

    @property
    def raw(self) -> str:
        return "\n".join(self.lines)


def strip_notes(text: str) -> str:
    """Remove ``[...]`` notes, nested ones included, and unmatched brackets."""
    out, depth = [], 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(char)
    return "".join(out)


def clean(text: str) -> str:
    """Notes, Strong's numbers and extra whitespace removed; NFC; lowercase."""
    text = STRONGS.sub(" ", strip_notes(text))
    text = unicodedata.normalize("NFC", text)
    return " ".join(text.split()).lower()


def parse(output: str, module: str) -> list[Verse]:
    """Parse ``diatheke -f plain`` output into verses in printed order.

    A line that starts with a reference starts a verse; other lines continue the
    current verse until the next reference. A reference printed indented has a
    heading on the line just above it, which is taken out of the previous
    verse's text. The closing ``(module)`` line and anything after a run of
    ``APPENDIX_BLANK_LINES`` blank lines are ignored.
    """
    # A placeholder collects what comes before the first reference (a heading).
    verses: list[Verse] = [Verse(0, 0, [])]
    blank_run = 0
    appendix = False
    for line in output.splitlines():
        if line.strip() == f"({module})":
            continue
        if not line.strip():
            blank_run += 1
            if blank_run >= APPENDIX_BLANK_LINES:
                appendix = True
            if not appendix:
                verses[-1].lines.append("")
            continue
        blank_run = 0
        match = REFERENCE.match(line)
        if match is None:
            if not appendix:
                verses[-1].lines.append(line)
            continue
        appendix = False
        heading = None
        if match["indent"]:
            previous = verses[-1].lines
            while previous and not previous[-1].strip():
                previous.pop()
            if previous:
                heading = previous.pop()
        verses.append(
            Verse(
                int(match["chapter"]),
                int(match["verse"]),
                [match["text"] or ""],
                heading,
            )
        )
    return verses[1:]


def run_diatheke(diatheke: str, module: str, key: str) -> str:
    result = subprocess.run(
        [diatheke, "-b", module, "-o", "f", "-f", "plain", "-k", key],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def read_book(diatheke: str, module: str, book: str) -> dict[tuple[int, int], str]:
    """``{(chapter, verse): cleaned text}`` for one book of one module.

    When the book has headings, the renderer repeats the last heading above
    every later verse (even into the next, untitled, psalm), so the book is read
    again chapter by chapter: a heading counts for a verse when it is the first
    one printed in the chapter or differs from the one above the verse before.
    """
    verses = parse(run_diatheke(diatheke, module, book), module)
    if not any(v.heading for v in verses):
        return {(v.chapter, v.verse): clean(v.raw) for v in verses}
    texts: dict[tuple[int, int], str] = {}
    for chapter in sorted({v.chapter for v in verses}):
        key = f"{book} {chapter}"
        previous = None
        for verse in parse(run_diatheke(diatheke, module, key), module):
            heading = clean(verse.heading) if verse.heading else None
            text = clean(verse.raw)
            if heading and heading != previous:
                text = f"{heading} {text}".strip()
            previous = heading
            texts[(verse.chapter, verse.verse)] = text
    return texts


# Length-based alignment checks on log character lengths (see ``misaligned``).
MAX_LENGTH_RATIO = 3.0
CHAPTER_SHIFT_GAIN = 0.75
WINDOW = 2
WINDOW_SHIFT_GAIN = 0.5
WINDOW_MIN_COST = 0.35


def _cost(en: list[float], es: list[float], indices: Iterable[int], off: int) -> float:
    gaps = [abs(en[j] - es[j + off]) for j in indices if 0 <= j + off < len(es)]
    return sum(gaps) / len(gaps) if len(gaps) >= 3 else math.inf


def misaligned(rows: list[tuple[str, str, str]]) -> tuple[set[str], list[str]]:
    """References of pairs whose two sides do not look like the same verse.

    Three rules on the log character lengths of each side, chapter by chapter:
    a whole chapter is dropped when pairing each English verse with the next or
    previous Spanish verse fits its lengths clearly better (mean gap below
    ``CHAPTER_SHIFT_GAIN`` of the unshifted gap): the modules number it
    differently. A verse is dropped when the same holds in a window of
    ``WINDOW`` verses either side (gap below ``WINDOW_SHIFT_GAIN`` of an unshifted
    gap above ``WINDOW_MIN_COST``). A pair is dropped when one side is more than
    ``MAX_LENGTH_RATIO`` times longer (merged verses, appended subscriptions).
    Returns the references and the names of the chapters dropped whole.
    """
    refs: set[str] = set()
    chapters: list[str] = []
    for chapter, group in itertools.groupby(rows, key=lambda r: r[0].rsplit(":")[0]):
        verses = list(group)
        en = [math.log(len(r[1])) for r in verses]
        es = [math.log(len(r[2])) for r in verses]
        everything = range(len(verses))
        aligned = _cost(en, es, everything, 0)
        shifted = min(_cost(en, es, everything, 1), _cost(en, es, everything, -1))
        if len(verses) >= 4 and shifted < CHAPTER_SHIFT_GAIN * aligned:
            chapters.append(chapter)
            refs.update(r[0] for r in verses)
            continue
        for i, row in enumerate(verses):
            window = range(i - WINDOW, i + WINDOW + 1)
            window = range(max(window.start, 0), min(window.stop, len(verses)))
            aligned = _cost(en, es, window, 0)
            shifted = min(_cost(en, es, window, 1), _cost(en, es, window, -1))
            too_long = abs(en[i] - es[i]) > math.log(MAX_LENGTH_RATIO)
            if too_long or (
                WINDOW_MIN_COST < aligned < math.inf
                and shifted < WINDOW_SHIFT_GAIN * aligned
            ):
                refs.add(row[0])
    return refs, chapters


@dataclass
class Extraction:
    rows: list[tuple[str, str, str]]
    english_only: int
    spanish_only: int
    empty: int
    misaligned: int = 0
    misaligned_chapters: tuple[str, ...] = ()


def extract(
    diatheke: str = "diatheke",
    books: Iterable[str] = BOOKS,
    english: str = ENGLISH_MODULE,
    spanish: str = SPANISH_MODULE,
) -> Extraction:
    rows: list[tuple[str, str, str]] = []
    english_only = spanish_only = empty = 0
    for book in books:
        en = read_book(diatheke, english, book)
        es = read_book(diatheke, spanish, book)
        english_only += len(en.keys() - es.keys())
        spanish_only += len(es.keys() - en.keys())
        for chapter, verse in sorted(en.keys() & es.keys()):
            en_text, es_text = en[chapter, verse], es[chapter, verse]
            if not en_text or not es_text:
                empty += 1
                continue
            rows.append((f"{book} {chapter}:{verse}", en_text, es_text))
    bad, chapters = misaligned(rows)
    rows = [row for row in rows if row[0] not in bad]
    return Extraction(
        rows, english_only, spanish_only, empty, len(bad), tuple(chapters)
    )


def write_tsv(rows: list[tuple[str, str, str]], path: Path) -> None:
    """Gzip TSV with a header; fixed mtime so the bytes are reproducible."""
    text = io.StringIO()
    text.write("ref\ten\tes\n")
    for row in rows:
        if any("\t" in field or "\n" in field for field in row):
            raise ValueError(f"tab or newline in {row[0]}")
        text.write("\t".join(row) + "\n")
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(text.getvalue().encode("utf-8"))


def summary(extraction: Extraction, path: Path) -> str:
    rows = extraction.rows
    lines = [
        f"wrote {len(rows)} verse pairs to {path} ({path.stat().st_size:,} bytes)",
        f"dropped: {extraction.english_only} English-only, "
        f"{extraction.spanish_only} Spanish-only, {extraction.empty} with an "
        f"empty side, {extraction.misaligned} misaligned (whole chapters: "
        f"{', '.join(extraction.misaligned_chapters) or 'none'})",
    ]
    for side, index in (("en", 1), ("es", 2)):
        words = sorted(len(row[index].split()) for row in rows)
        p95 = words[int(0.95 * (len(words) - 1))]
        lines.append(
            f"{side} words per verse: mean {statistics.fmean(words):.1f}, "
            f"median {statistics.median(words):g}, p95 {p95}, max {words[-1]}"
        )
    by_ref = {row[0]: row for row in rows}
    for ref in ("Genesis 1:1", "Psalms 3:1", "John 3:16", "Revelation 22:21"):
        if ref in by_ref:
            lines += [ref, f"  en: {by_ref[ref][1]}", f"  es: {by_ref[ref][2]}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--diatheke", default="diatheke", help="diatheke binary")
    parser.add_argument("--english-module", default=ENGLISH_MODULE)
    parser.add_argument("--spanish-module", default=SPANISH_MODULE)
    args = parser.parse_args(argv)
    try:
        extraction = extract(
            args.diatheke, BOOKS, args.english_module, args.spanish_module
        )
    except (OSError, subprocess.CalledProcessError) as error:
        print(
            f"diatheke failed ({error}); install it with: apt-get install -y "
            "sword-text-web sword-text-sparv diatheke",
            file=sys.stderr,
        )
        return 1
    write_tsv(extraction.rows, args.output)
    print(summary(extraction, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())

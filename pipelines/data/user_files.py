"""Parallel data in the user's own files.

Two formats, both UTF-8:

* TSV: one pair a line, fields separated by tabs; the source and target columns
  are chosen by index. No quoting: a field is everything between two tabs.
  Blank lines are skipped; an optional first header line can be skipped.
* Parallel text: two plain-text files, one sentence a line, line ``i`` of the
  source file translating line ``i`` of the target file. Both must have the
  same number of lines.
"""

from __future__ import annotations

from pathlib import Path


def _lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 file without line ends; errors name the file and line."""
    path = Path(path)
    lines = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid UTF-8 ({error.reason} at "
                    f"byte {error.start})"
                ) from None
            lines.append(
                line.rstrip("\r\n").lstrip("\ufeff")
                if number == 1
                else line.rstrip("\r\n")
            )
    return lines


def read_tsv(
    path: str | Path,
    source_column: int = 0,
    target_column: int = 1,
    skip_header: bool = False,
) -> list[tuple[str, str]]:
    """``(source, target)`` pairs from the given columns of a tab-separated file."""
    lines = _lines(path)
    needed = max(source_column, target_column)
    pairs = []
    for number, line in enumerate(lines, start=1):
        if (skip_header and number == 1) or not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) <= needed:
            raise ValueError(
                f"{path}, line {number}: {len(fields)} column(s), need column "
                f"{needed} (counting from 0)"
            )
        pairs.append((fields[source_column].strip(), fields[target_column].strip()))
    return pairs


def read_parallel(
    source_path: str | Path, target_path: str | Path
) -> list[tuple[str, str]]:
    """``(source, target)`` pairs from two line-aligned plain-text files."""
    sources, targets = _lines(source_path), _lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"line counts differ: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    return [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]


def read_jsonl(
    path: str | Path, source_field: str = "document", target_field: str = "summary"
) -> list[tuple[str, str]]:
    """``(source, target)`` pairs from a JSON Lines file of objects.

    Each non-blank line is an object with string fields ``source_field`` and
    ``target_field``; errors name the file, the line and the field.
    """
    import json

    pairs = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}, line {number}: expected an object with `{source_field}` "
                f"and `{target_field}`, received {type(row).__name__}"
            )
        for field in (source_field, target_field):
            if not isinstance(row.get(field), str):
                raise ValueError(
                    f"{path}, line {number}: expected a string field `{field}`, "
                    f"received {type(row.get(field)).__name__}"
                )
        pairs.append((row[source_field].strip(), row[target_field].strip()))
    return pairs

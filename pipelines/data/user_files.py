"""The user's own data files: text lines, TSV, parallel text, JSON Lines.

Every reader takes UTF-8 (a byte-order mark on the first line is dropped) and
raises `PipelineError` naming the file, the line (from 1) and what was
expected and received. A file must be a regular file of at most
`pipelines.core.files.max_bytes` bytes (2 GiB unless
``ATTENTION_PIPELINES_MAX_FILE_BYTES`` says otherwise): a FIFO, a device
such as ``/dev/zero`` or a larger file is refused before it is read.

* TSV: one pair a line, fields separated by tabs; the source and target columns
  are chosen by index. No quoting: a field is everything between two tabs.
  Blank lines are skipped; an optional first header line can be skipped.
* Parallel text: two plain-text files, one sentence a line, line ``i`` of the
  source file translating line ``i`` of the target file. Both must have the
  same number of lines.
* JSON Lines: one JSON object a line (`jsonl_objects`); blank lines are
  skipped. Each task reads its own fields from the objects (`field_error`
  words what is wrong with one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pipelines.core.errors import PipelineError
from pipelines.core.files import read_file


def read_lines(path: str | Path, what: str = "a UTF-8 text file") -> list[str]:
    """The lines of a UTF-8 file, without line ends.

    Raises:
        PipelineError: the file is missing, unreadable, not a regular file or
            too large (the message says it should be ``what``), or a line is
            not valid UTF-8.
    """
    path = Path(path)
    try:
        data = read_file(path, what)
    except FileNotFoundError:
        raise PipelineError(f"{path}: no such file (expected {what})") from None
    except OSError as error:
        raise PipelineError(f"{path}: cannot be read ({error.strerror})") from None
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the line end of the last line
    out = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as error:
            raise PipelineError(
                f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte "
                f"{error.start})"
            ) from None
        out.append(line.lstrip("\ufeff") if number == 1 else line)
    return out


def read_tsv(
    path: str | Path,
    source_column: int = 0,
    target_column: int = 1,
    skip_header: bool = False,
) -> list[tuple[str, str]]:
    """``(source, target)`` pairs from the given columns of a tab-separated file."""
    needed = max(source_column, target_column)
    pairs = []
    for number, line in enumerate(read_lines(path, "a TSV file"), start=1):
        if (skip_header and number == 1) or not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) <= needed:
            raise PipelineError(
                f"{path}, line {number}: {len(fields)} column(s), need column "
                f"{needed} (counting from 0)"
            )
        pairs.append((fields[source_column].strip(), fields[target_column].strip()))
    return pairs


def read_parallel(
    source_path: str | Path, target_path: str | Path
) -> list[tuple[str, str]]:
    """``(source, target)`` pairs from two line-aligned plain-text files."""
    sources = read_lines(source_path, "a text file, one sentence a line")
    targets = read_lines(target_path, "a text file, one sentence a line")
    if len(sources) != len(targets):
        raise PipelineError(
            f"line counts differ: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    return [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]


def shown(value: object) -> str:
    """A JSON value for an error message: its type and at most 60 characters."""
    text = json.dumps(value, ensure_ascii=False)
    kinds = {type(None): "null", bool: "boolean", int: "number", float: "number"}
    kinds.update({str: "string", list: "array", dict: "object"})
    kind = kinds.get(type(value), "object")
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


def jsonl_objects(path: str | Path, expected: str) -> list[tuple[str, dict]]:
    """``(where, object)`` for every non-blank line of a JSON Lines file;
    ``where`` is ``"PATH, line N"`` for messages (`field_error`).

    Raises:
        PipelineError: the file is missing or unreadable, a line is not valid
            UTF-8, not JSON, or not a JSON object (``expected`` says which
            object, e.g. 'a JSON object with "document" and "summary"').
    """
    rows = []
    for number, line in enumerate(read_lines(path, "a JSON Lines file"), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise PipelineError(
                f"{where}: expected {expected}, received text that is not JSON "
                f"({error.msg} at column {error.colno})"
            ) from None
        if not isinstance(row, dict):
            raise PipelineError(f"{where}: expected {expected}, received {shown(row)}")
        rows.append((where, row))
    return rows


def field_error(
    where: str, row: dict, field: str, expected: str, received: str | None = None
) -> PipelineError:
    """The error of one field of a JSON Lines object: what was expected, and
    what the field holds (or ``received``, or that it is absent)."""
    if received is None:
        received = shown(row[field]) if field in row else "nothing (no such field)"
    return PipelineError(
        f'{where}: field "{field}": expected {expected}, received {received}'
    )


def read_examples(read: Callable[[str], list], path: str) -> list:
    """``read(path)``: a task's examples of a user file, refused with
    `PipelineError` when it holds none."""
    examples = read(path)
    if not examples:
        raise PipelineError(f"data: no examples in {path}.")
    return examples


def read_jsonl(
    path: str | Path, source_field: str = "document", target_field: str = "summary"
) -> list[tuple[str, str]]:
    """``(source, target)`` pairs from a JSON Lines file of objects with string
    fields ``source_field`` and ``target_field`` (stripped)."""
    expected = f'a JSON object with "{source_field}" and "{target_field}"'
    pairs = []
    for where, row in jsonl_objects(path, expected):
        for field in (source_field, target_field):
            if not isinstance(row.get(field), str):
                raise field_error(where, row, field, "a string")
        pairs.append((row[source_field].strip(), row[target_field].strip()))
    return pairs

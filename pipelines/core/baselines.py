"""Trivial baselines: what a task's scores mean beside answers that need no model.

Each task's ``evaluate`` scores, with the metrics and on the examples it
scores its model with, answers any reader could write without one: copying
the source, the first sentence of the document (lead-1), the most common
answer or caption of the **training** split. ``metrics.json`` holds them under
``baselines``, one entry per baseline, ``{"what": <one line>, <metric>:
<value>, ...}``; `table` prints them beside the model's scores, and
`in_brief` in the one line that ends ``demo``.

Example:

>>> most_common(["b", "a", "b", "a", "c"])  # a tie goes to the first seen
'b'
>>> lead("It reads files. It writes them.")
'It reads files.'
>>> print(table({"greedy": {"bleu": 91.5}},
...             {"copy_source": {"what": "the source", "bleu": 3.25}},
...             [("BLEU", "bleu", ".2f")]))
  metric greedy | copy source
  BLEU    91.50 |        3.25
  copy source: the source
>>> in_brief({"baselines": {"lead_1": {"what": "", "rouge1": 38.68}}},
...          [("ROUGE-1", "rouge1", ".1f")])
' (baseline: lead-1 ROUGE-1 38.7)'
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def most_common(values: Iterable[str]) -> str:
    """The most frequent value; a tie goes to the value seen first.

    Raises `ValueError` when there is none (an empty training split).
    """
    counts = Counter(values)
    if not counts:
        raise ValueError("baselines: no values to pick the most common from.")
    return counts.most_common(1)[0][0]


def lead(text: str) -> str:
    """The first sentence of ``text``: up to its first ``.``, ``!`` or ``?``
    that whitespace follows (the whole text, stripped, when none does)."""
    return _SENTENCE_END.split(str(text).strip(), maxsplit=1)[0]


def label(name: str) -> str:
    """A baseline's column heading: its ``metrics.json`` key in words
    (``lead_1`` is ``lead-1``)."""
    return re.sub(r"_(?=\d)", "-", name).replace("_", " ")


def table(
    models: Mapping[str, Mapping],
    baselines: Mapping[str, Mapping],
    rows: Sequence[tuple[str, str, str]],
) -> str:
    """The model's scores beside the baselines', one metric a row.

    ``models``: a column per decoding (``{"greedy": scores}``); ``baselines``:
    ``metrics.json``'s entries; ``rows``: ``(heading, key, format spec)`` per
    metric. A cell whose column lacks the key shows ``-``. Each baseline's
    ``what`` follows, one line each.
    """
    columns = [(name, scores) for name, scores in models.items()]
    columns += [(label(name), entry) for name, entry in baselines.items()]
    first = max(len("metric"), *(len(heading) for heading, _, _ in rows))
    body = [
        [heading] + [
            "-" if scores.get(key) is None else format(scores[key], spec)
            for _, scores in columns
        ]
        for heading, key, spec in rows
    ]  # fmt: skip
    widths = [
        max(len(name), *(len(cells[k + 1]) for cells in body))
        for k, (name, _) in enumerate(columns)
    ]

    def line(cells: list[str]) -> str:
        parts = [f"{c:>{w}}" for c, w in zip(cells[1:], widths, strict=True)]
        split = len(models)
        model_part, baseline_part = "  ".join(parts[:split]), "  ".join(parts[split:])
        return f"  {cells[0]:<{first}} {model_part} | {baseline_part}".rstrip()

    lines = [line(["metric", *(name for name, _ in columns)])]
    lines += [line(cells) for cells in body]
    lines += [f"  {label(name)}: {entry['what']}" for name, entry in baselines.items()]
    return "\n".join(lines)


def in_brief(metrics: Mapping, rows: Sequence[tuple[str, str, str]]) -> str:
    """``metrics``' baselines in a parenthesis for a one-line summary (``rows``
    as in `table`); empty when ``metrics`` has none (an older run's)."""
    entries = metrics.get("baselines") or {}
    parts = []
    for name, entry in entries.items():
        scores = ", ".join(
            f"{heading} {format(entry[key], spec)}"
            for heading, key, spec in rows
            if entry.get(key) is not None
        )
        parts.append(f"{label(name)} {scores}")
    if not parts:
        return ""
    noun = "baseline" if len(parts) == 1 else "baselines"
    return f" ({noun}: {'; '.join(parts)})"

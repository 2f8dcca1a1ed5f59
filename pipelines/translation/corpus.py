"""Corpora by name: ``load_corpus("bible")``, ``load_corpus("tsv:pairs.tsv")``."""

from __future__ import annotations

from pipelines.data.user_files import read_parallel, read_tsv
from pipelines.translation.bible import load_bible
from pipelines.translation.dates import generate_dates
from pipelines.translation.ding import load_ding

DEFAULT_DATES = 20000
DATES_SEED = 0
SPECS = (
    "bible",
    "ding",
    f"dates or dates:N (default N={DEFAULT_DATES})",
    "tsv:PATH (source in column 0, target in column 1)",
    "parallel:SOURCE_PATH,TARGET_PATH",
)


def load_corpus(spec: str) -> list[tuple[str, str]]:
    """``(source, target)`` pairs named by ``spec``; see `SPECS` for the forms."""
    name, _, argument = spec.partition(":")
    if name == "bible" and not argument:
        return load_bible()
    if name == "ding" and not argument:
        return load_ding()
    if name == "dates":
        if not argument:
            return generate_dates(DEFAULT_DATES, DATES_SEED)
        if argument.isdigit():
            return generate_dates(int(argument), DATES_SEED)
    if name == "tsv" and argument:
        return read_tsv(argument)
    if (
        name == "parallel"
        and argument.count(",") == 1
        and "" not in argument.split(",")
    ):
        source, target = argument.split(",")
        return read_parallel(source, target)
    raise ValueError(f"unknown corpus {spec!r}; valid forms: " + "; ".join(SPECS))

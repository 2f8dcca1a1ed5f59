"""The tasks' shared data toolbox: splits, filters, user files, the split report.

A task's own corpora and generators live in its folder
(``pipelines/<task>/``); what more than one task uses lives here.
"""

from pipelines.data.filters import filter_length
from pipelines.data.split_report import pair_summary, summarize
from pipelines.data.splits import Splits, split_by_key, split_pairs
from pipelines.data.user_files import (
    field_error,
    jsonl_objects,
    read_examples,
    read_jsonl,
    read_lines,
    read_parallel,
    read_tsv,
)

__all__ = [
    "Splits",
    "field_error",
    "filter_length",
    "jsonl_objects",
    "pair_summary",
    "read_examples",
    "read_jsonl",
    "read_lines",
    "read_parallel",
    "read_tsv",
    "split_by_key",
    "split_pairs",
    "summarize",
]

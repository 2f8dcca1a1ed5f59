"""Corpora, Debian descriptions, user files, length filtering and splits."""

from .bible import BIBLE_PATH, load_bible
from .corpus import load_corpus
from .dates import generate_dates
from .debian import load_debian_descriptions, read_debian_descriptions
from .ding import DING_PATH, load_ding
from .errors import MissingDataError
from .filters import filter_length
from .splits import Splits, split_pairs
from .summary import summarize
from .user_files import read_parallel, read_tsv

__all__ = [
    "BIBLE_PATH",
    "DING_PATH",
    "MissingDataError",
    "Splits",
    "filter_length",
    "generate_dates",
    "load_bible",
    "load_corpus",
    "load_debian_descriptions",
    "load_ding",
    "read_debian_descriptions",
    "read_parallel",
    "read_tsv",
    "split_pairs",
    "summarize",
]

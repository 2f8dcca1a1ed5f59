"""Read the Debian descriptions into the cache and print their numbers.

``python -m pipelines.summarization.debian_cache [--lists DIR] [--cache FILE]
[--refresh]``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pipelines.core.errors import MissingDataError
from pipelines.summarization.debian import (
    APT_LISTS,
    describe,
    read_debian_descriptions,
    split_descriptions,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.summarization.debian_cache",
        description="Read the Debian descriptions (into the cache) and describe them.",
    )
    parser.add_argument("--lists", default=str(APT_LISTS), help="apt lists folder")
    parser.add_argument("--cache", default=None, help="cache file (default: user's)")
    parser.add_argument("--refresh", action="store_true", help="reread the lists")
    args = parser.parse_args(argv)
    try:
        records = read_debian_descriptions(args.lists, args.cache, refresh=args.refresh)
    except MissingDataError as error:
        raise SystemExit(str(error)) from None
    print(describe(records, split_descriptions(records)))


if __name__ == "__main__":
    main()

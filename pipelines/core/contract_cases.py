"""What a task gives the pipeline contract (``tests/pipelines/contract.py``).

Each task's `ContractCases` (``pipelines/<task>/contract.py``, the task's
``contract``) lists serving requests that cover every input and option,
requests that must be refused with a clear error or answered with a defined
result, and bad data for the typed-error clauses. A task added with these
passes the contract with no new test code.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class BadRequest:
    """A serving request that must be answered with an error or a defined result.

    ``error`` is a substring of the ``InvalidArgument`` message (it should name
    the input); with ``error=None`` the request must succeed and ``check``
    (``outputs -> None``, raising on failure) states the defined result.
    ``python=False`` marks requests that only a C client can send (a wrong
    rank: Python's signature wrapper refuses it before the graph runs).
    """

    name: str
    feed: dict
    error: str | None = None
    check: Any = None
    python: bool = True


@dataclass
class DataCase:
    """Overrides that point a task's config at bad data, for the contract."""

    overrides: list[str]
    path: str = ""


class ContractCases(abc.ABC):
    """One task's cases of the pipeline contract.

    ``main_inputs`` names the inputs of the export's ``serving_default``: a
    request that holds them alone is answered on every path (per-request
    options go to the ``with_options`` signature).
    """

    main_inputs: tuple[str, ...] = ()
    # The user-file format (``data.source=<format>:<path>``) of the default
    # `data` cases.
    source_format = "jsonl"

    @abc.abstractmethod
    def requests(self, config) -> list[dict]:
        """Feeds that cover every input and option (those with options are
        sent to ``with_options``)."""

    @abc.abstractmethod
    def bad_requests(self, config) -> list[BadRequest]:
        """Feeds that must give a clear ``InvalidArgument`` or a defined result."""

    def data(self, folder) -> dict[str, DataCase]:
        """Bad data in ``folder``: ``"empty_file"`` (an empty user file, its
        path in the case) and ``"empty_valid"`` (a split with no validation
        examples). By default an empty ``source_format`` file and
        ``data.valid_fraction=0.0``."""
        empty = Path(folder) / f"empty.{self.source_format}"
        empty.write_text("")
        return {
            "empty_file": DataCase(
                [f"data.source={self.source_format}:{empty}"], str(empty)
            ),
            "empty_valid": DataCase(["data.valid_fraction=0.0"]),
        }


def strings(*rows) -> np.ndarray:
    """A ``[B]`` string feed of ``rows`` (str or bytes)."""
    return np.array(list(rows), dtype=object)


def paired_feed(names: tuple[str, str], pairs) -> dict:
    """The feed of two string inputs ``names`` from ``(first, second)`` pairs."""
    return {
        name: strings(*(pair[side] for pair in pairs))
        for side, name in enumerate(names)
    }


def string_input_cases(samples: dict[str, str], empty_batch) -> list[BadRequest]:
    """The cases every export of string inputs answers alike.

    ``samples`` maps each input, in signature order, to a valid string. An
    empty batch is answered (``empty_batch`` checks the outputs); invalid
    UTF-8 in any input, a rank-2 first input and a rank-0 last input are
    refused naming the input, as are inputs whose batch sizes differ.
    """
    names = list(samples)
    first, last = names[0], names[-1]

    def feed(**rows) -> dict:
        return {
            name: rows.get(name, strings(samples[name], samples[name]))
            for name in names
        }

    def one(**rows) -> dict:
        return {name: rows.get(name, strings(samples[name])) for name in names}

    cases = [BadRequest("empty batch", one(**{n: strings() for n in names}),
                        check=empty_batch)]  # fmt: skip
    if len(names) > 1:
        cases.append(
            BadRequest(
                "batch sizes differ",
                one(**{first: strings(samples[first], samples[first])}),
                "must have the same batch size",
            )
        )
    for name in names:
        invalid = {name: strings(samples[name], b"ok\xff\xfe")}
        cases.append(
            BadRequest(
                f"invalid utf-8 {name}",
                feed(**invalid),
                f"serving input `{name}` must be valid UTF-8",
            )
        )
    return cases + [
        BadRequest("rank 2", one(**{first: np.array([[samples[first]]], object)}),
                   f"serving input `{first}` must be a vector", python=False),
        BadRequest("rank 0", one(**{last: np.array(samples[last], object)}),
                   f"serving input `{last}` must be a vector", python=False),
    ]  # fmt: skip


def blank_input_cases(samples: dict[str, str], unanswered) -> list[BadRequest]:
    """For each input, a request whose first row is blank there (spaces and a
    line break in the first input, nothing in the others) and whose second
    row is ``samples``: ``unanswered`` checks the defined result."""
    cases = []
    for index, name in enumerate(samples):
        blank = " \n " if index == 0 else ""
        feed = {n: strings(samples[n], samples[n]) for n in samples}
        feed[name] = strings(blank, samples[name])
        cases.append(BadRequest(f"empty {name}", feed, check=unanswered))
    return cases


def search_requests(feed: dict, max_beam_width: int, **widest) -> list[dict]:
    """Requests of a searching export: ``feed`` alone, greedy with no length
    penalty, and its first row at ``max_beam_width`` with the ``widest``
    options."""
    first = {name: rows[:1] for name, rows in feed.items()}
    greedy = {"beam_width": np.int32(1), "length_penalty": np.float32(0)}
    return [
        dict(feed),
        {**feed, **greedy},
        {**first, "beam_width": np.int32(max_beam_width), **widest},
    ]


def search_option_cases(feed: dict, max_beam_width: int) -> list[BadRequest]:
    """``length_penalty`` NaN, infinite or negative and ``beam_width`` 0,
    over ``max_beam_width`` or a vector, each refused naming the option."""
    penalty = "serving input `length_penalty`"
    beams = "serving input `beam_width`"

    def options(**values):
        return {**feed, **values}

    return [
        BadRequest("nan", options(length_penalty=np.float32("nan")), penalty),
        BadRequest("inf", options(length_penalty=np.float32("inf")), penalty),
        BadRequest("negative", options(length_penalty=np.float32(-1)), penalty),
        BadRequest("beam 0", options(beam_width=np.int32(0)), beams),
        BadRequest("too wide", options(beam_width=np.int32(max_beam_width + 1)), beams),
        BadRequest(
            "beam vector",
            options(beam_width=np.array([1, 2], np.int32)),
            beams,
            python=False,
        ),
    ]

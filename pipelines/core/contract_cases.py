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
from typing import Any


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

    @abc.abstractmethod
    def requests(self, config) -> list[dict]:
        """Feeds that cover every input and option (those with options are
        sent to ``with_options``)."""

    @abc.abstractmethod
    def bad_requests(self, config) -> list[BadRequest]:
        """Feeds that must give a clear ``InvalidArgument`` or a defined result."""

    @abc.abstractmethod
    def data(self, folder) -> dict[str, DataCase]:
        """Bad data in ``folder``: ``"empty_file"`` (an empty user file, its
        path in the case) and ``"empty_valid"`` (a split with no validation
        examples)."""

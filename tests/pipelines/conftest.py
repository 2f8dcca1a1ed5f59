"""Shared pipeline fixtures: each task is trained once per test run."""

from __future__ import annotations

import pytest

from tests.pipelines import contract

_CASES: dict[str, contract.Case] = {}


@pytest.fixture(scope="session")
def pipeline_case(tmp_path_factory):
    """``pipeline_case(name)``: the task's tiny ``demo`` run, made on first use.

    The root conftest.py schedules the tests of one task's case on one xdist
    worker, so the case is made once.
    """

    def get(name: str) -> contract.Case:
        if name not in _CASES:
            _CASES[name] = contract.train_case(name, tmp_path_factory.mktemp(name))
        return _CASES[name]

    return get

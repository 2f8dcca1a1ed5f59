"""Task name -> `Task`, imported only when a task is used.

Built-in tasks are listed here; a task from another package registers itself
with `register`, with an entry point in the group ``attention_pipelines.tasks``
(``name = "package.module:TASK"``), or, for one shell, with the variable
``ATTENTION_PIPELINES_TASKS="name=package.module:TASK,..."``. The core
(`pipelines.core`) never imports a task: the CLI asks this registry.

Example:

>>> from pipelines import registry
>>> "translation" in registry.names()
True
>>> registry.get("translation").default_preset
'dates'
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata

from pipelines.core.task import Task

# name -> (module:attribute, one-line description for --help)
BUILTIN = {
    "translation": (
        "pipelines.translation.task:TASK",
        "machine translation: RNN with attention or Transformer, strings in",
    ),
    "summarization": (
        "pipelines.summarization.task:TASK",
        "summarization: pointer-generator with coverage, strings in",
    ),
    "extractive": (
        "pipelines.extractive.task:TASK",
        "extractive question answering: BiDAF span pointer, passage and question in",
    ),
    "qa": (
        "pipelines.qa.task:TASK",
        "question answering: multi-hop memory network, story and question in",
    ),
    "captioning": (
        "pipelines.captioning.task:TASK",
        "image captioning: CNN encoder, attention decoder, image bytes in",
    ),
}
_REGISTERED: dict[str, tuple[str | Task, str]] = {}
ENTRY_POINTS = "attention_pipelines.tasks"
ENVIRONMENT = "ATTENTION_PIPELINES_TASKS"


def _check_name(name: str, where: str) -> str:
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(
            f"{where}: a task name is a word (letters, digits, - and _), received "
            f"{name!r}"
        )
    return name


def register(name: str, target: str | Task, description: str = "") -> None:
    """Register a task object, or ``"module:attribute"`` to import when used."""
    _REGISTERED[_check_name(name, "registry")] = (target, description)


def _from_environment() -> dict[str, tuple[str, str]]:
    found = {}
    for item in filter(None, os.environ.get(ENVIRONMENT, "").split(",")):
        name, sep, target = item.partition("=")
        if not sep or ":" not in target:
            raise ValueError(
                f"{ENVIRONMENT}: expected name=module:attribute items, received "
                f"{item!r}"
            )
        found[_check_name(name.strip(), ENVIRONMENT)] = (target.strip(), "")
    return found


def _from_entry_points() -> dict[str, tuple[str, str]]:
    return {ep.name: (ep.value, "") for ep in metadata.entry_points(group=ENTRY_POINTS)}


def _all() -> dict[str, tuple[str | Task, str]]:
    return {
        **_from_entry_points(),
        **BUILTIN,
        **_from_environment(),
        **_REGISTERED,
    }


def names() -> list[str]:
    return sorted(_all())


def description(name: str) -> str:
    return _all()[name][1]


def _import(name: str, target: str):
    """``module:attribute``, imported with the current folder on the path (as
    ``python -m`` and uvicorn do), so a task beside the user's data is found."""
    import sys

    module, _, attribute = target.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"registry: task {name!r} ({target}): {error}") from None


def get(name: str) -> Task:
    """The task named ``name`` (imported now if registered by its path)."""
    tasks = _all()
    if name not in tasks:
        raise ValueError(f"unknown task {name!r}; registered: {', '.join(names())}")
    target = tasks[name][0]
    if isinstance(target, str):
        target = _import(name, target)
    if isinstance(target, type):
        target = target()
    if not isinstance(target, Task):
        raise ValueError(
            f"registry: task {name!r} is {type(target).__name__}, not a "
            "pipelines.core.task.Task (or a subclass of it)"
        )
    return target

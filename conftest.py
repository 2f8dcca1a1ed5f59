"""Test set-up: two logical CPU devices for tf.distribute, quiet TensorFlow, and
the xdist groups that let each pipeline task train once per test run."""

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The task of docs/pipelines/adding_a_task.md, registered as a user would (in
# the environment, so the CLI subprocesses see it too): the pipeline contract
# runs on it like on every built-in task. A user's own tasks in the variable
# join it (`pytest tests/pipelines -k NAME`).
_OWN_TASKS = os.environ.get("ATTENTION_PIPELINES_TASKS")
os.environ["ATTENTION_PIPELINES_TASKS"] = ",".join(
    filter(None, ["locale=examples.locale_task:TASK", _OWN_TASKS])
)

from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import pytest  # noqa: E402

PIPELINES = Path(__file__).resolve().parent / "pipelines"

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    _cpus = tf.config.list_physical_devices("CPU")
    # Must happen before TensorFlow initialises its devices.
    tf.config.set_logical_device_configuration(
        _cpus[0],
        [
            tf.config.LogicalDeviceConfiguration(),
            tf.config.LogicalDeviceConfiguration(),
        ],
    )


# Tasks whose pipeline contract runs in `make test-slow` only: the example
# task of adding_a_task.md proves that a new task needs no new test code;
# summarization's contract (a two-phase demo run, beam search over the
# extended vocabulary in every clause) would take `make test` past its
# 12 minutes on two cores, and so would question answering's (memory
# network and extractive), and so would captioning's (a CNN traced in every
# process). Their own tests (test_summarization_task.py, test_qa_task.py,
# test_extractive_task.py, test_captioning_task.py) run in `make test`;
# translation proves the contract there.
SLOW_TASKS = {"captioning", "extractive", "locale", "qa", "summarization"}

# On JAX, `make test` runs the shared layer contract and the layers' own
# tests (on PyTorch the contract; the Makefile names the files); these run in
# `make test-slow` (marker `jax_slow`, on PyTorch too), as they did in
# the TensorFlow half of `make test`: the docs and docstring examples, and
# the integration tests of the decoding loops, the Transformer stacks and the
# multi-head kernels' equivalence grids (JAX compiles each of their loops),
# and the hand-computed cases and decoding loops of the pointer-generator,
# coverage, memory and span layers (the layer contract runs them on JAX in
# `make test`; their own modules took 130 s of its JAX half on two workers),
# and Keras' own MultiHeadAttention tests and the parity grid against it (the
# TensorFlow half of `make test` runs the grid).
JAX_SLOW_MODULES = {
    "test_keras_parity.py",
    "test_keras_suite.py",
    "test_coverage.py",
    "test_decoding.py",
    "test_memory.py",
    "test_multi_head.py",
    "test_pointer_generator.py",
    "test_span.py",
    "test_transformer.py",
}

# Layer contract clauses that compile or replicate every layer (about 220 s
# of the 1,150 s a TensorFlow `make test` spends on two workers), and the
# docs pages' python blocks (110 s): `make test-slow` runs them, on both
# backends, which keeps `make test` under its 12 minutes on two cores.
SLOW_LAYER_CLAUSES = {
    "test_jit_compiled_training",
    "test_mirrored_strategy_equals_one_device",
}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    # The longest tests (`make demo`, about 150 s; the crash points, 1-5 min
    # each) go first, so that no worker runs one alone at the end of the slow
    # session.
    first = ("test_demo.py", "test_crash_points.py")
    items.sort(key=lambda item: item.path.name not in first)
    for item in items:
        if pipeline_group(item.nodeid) in SLOW_TASKS:
            item.add_marker(pytest.mark.slow)
    if keras.backend.backend() == "tensorflow":
        for item in items:
            if _is_slow_layer_clause(item) or "test_python_blocks_run[" in item.nodeid:
                item.add_marker(pytest.mark.slow)
        return
    skip = pytest.mark.skip(reason="needs the TensorFlow backend")
    for item in items:
        # The pipelines are TensorFlow programs (tf.data, tf-text, SavedModels):
        # their doctests and pages run once, in the TensorFlow half.
        pipeline_docs = "test_python_blocks_run[pipelines/" in item.nodeid
        if "tf_only" in item.keywords or pipeline_docs or _in_pipelines(item):
            item.add_marker(skip)
        elif (
            _is_example(item)
            or item.path.name in JAX_SLOW_MODULES
            or _is_slow_layer_clause(item)
        ):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.jax_slow)


def _is_slow_layer_clause(item) -> bool:
    name = getattr(item, "originalname", item.name)
    return item.nodeid.startswith("tests/test_contract.py::") and (
        name in SLOW_LAYER_CLAUSES
    )


def _is_example(item) -> bool:
    """A docs page's python blocks or a docstring's doctest."""
    return (
        "test_python_blocks_run[" in item.nodeid or type(item).__name__ == "DoctestItem"
    )


def _in_pipelines(item) -> bool:
    path = getattr(item, "path", None)
    return path is not None and path.is_relative_to(PIPELINES)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends in float32 with a fixed seed."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


@functools.cache
def _task_names() -> list[str]:
    """Registered task names, longest first (one registry read per session)."""
    from pipelines import registry

    return sorted(registry.names(), key=len, reverse=True)


def pipeline_group(nodeid: str) -> str | None:
    """The task whose shared pipeline case a test uses, or None.

    ``tests/pipelines/test_contract.py::test_x[<task>...]`` and the tests of
    ``tests/pipelines/test_<task>.py`` use that task's case.
    """
    import re

    path, _, rest = nodeid.partition("::")
    names = _task_names()
    if path.endswith("tests/pipelines/test_contract.py"):
        match = re.search(r"\[(.*)\]$", rest)
        for name in names:
            if match and re.match(rf"{re.escape(name)}(\]|-|$)", match.group(1) + "]"):
                return name
    match = re.search(r"tests/pipelines/test_(\w+)\.py$", path)
    if match and match.group(1) in names:
        return match.group(1)
    return None


# Tests that share one expensive module fixture, by node id prefix.
SHARED_FIXTURES = {
    "tests/test_contract.py::test_saved_model_without_library[": "layer-saved-models",
    "tests/test_contract.py::test_distribution_api[": "layer-distribution",
}


def xdist_unit(nodeid: str) -> str:
    """The scheduling unit of a test: its shared fixture's group, or itself."""
    group = pipeline_group(nodeid)
    if group:
        return f"pipeline-case-{group}"
    for prefix, name in SHARED_FIXTURES.items():
        if prefix in nodeid:
            return name
    return nodeid


def pytest_xdist_make_scheduler(config, log):
    """Schedule the tests that share an expensive fixture on one worker.

    Each pipeline task's tests share one trained case, and the layer
    contract's SavedModel tests one fresh process. xdist's ``--dist
    loadgroup`` renames node ids to group them, which pytest 9.2 no longer
    lets a plugin do; a scheduler that reads the group off the node id does
    the same. Every other test is its own unit, as with ``--dist load``.
    Other ``--dist`` modes keep xdist's own scheduler.
    """
    if config.getoption("dist", "load") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtures(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return SharedFixtures(config, log)

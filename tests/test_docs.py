"""The documentation is tested: its examples run and the site builds strictly.

Every ```python block of a page under docs/ runs in order, in one fresh
namespace per page, in this process (so on the backend under test: the
Makefile runs this module on TensorFlow, JAX and PyTorch). Getting started,
the first page a newcomer runs, runs in `make test` on each backend; the
other pages in `make test-slow` (conftest.py). The mkdocs build needs the
docs extra (``pip install ".[docs]"``).
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import types

import keras
import pytest

import attention_layers

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# A fenced block opened by ```python (any indentation), closed by ``` at the
# same indentation.
FENCE = re.compile(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


def python_blocks(page):
    """``(first_line, source)`` of every ```python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start(2)) + 1, textwrap.dedent(m.group(2)))
        for m in FENCE.finditer(text)
    ]


PAGES = sorted(DOCS.rglob("*.md"))
PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p)]
# Run by test_getting_started_runs, in `make test` on every backend.
FIRST_PAGE = DOCS / "getting_started.md"
# Pages whose examples are real training runs: `make test-slow` runs them.
# (examples/dates.md trains the dates model for 4 epochs; `make test` runs the
# same script, examples/dates_demo.py, through tests/test_demo.py.)
SLOW_PAGES = {"examples/dates.md"}
# Pages whose examples use Keras' distribution API, which runs on JAX.
JAX_PAGES = {"distribution.md"}


def page_id(page):
    return page.relative_to(DOCS).as_posix()


def page_param(page):
    marks = [pytest.mark.slow] if page_id(page) in SLOW_PAGES else []
    if page_id(page) in JAX_PAGES:
        marks.append(
            pytest.mark.skipif(
                keras.backend.backend() != "jax",
                reason="Keras' distribution API runs on JAX (test-slow's JAX half)",
            )
        )
    return pytest.param(page, id=page_id(page), marks=marks)


def run_page(page):
    """Runs the page's blocks in order, as one module (importable while it
    runs: torch.compile imports the module of a layer the page defines)."""
    module = types.ModuleType(f"docs_{page.stem}")
    sys.modules[module.__name__] = module
    try:
        for first_line, source in python_blocks(page):
            # Pad with blank lines so tracebacks give the line number in the page.
            code = compile("\n" * (first_line - 1) + source, str(page), "exec")
            exec(code, module.__dict__)
    finally:
        del sys.modules[module.__name__]


@pytest.mark.parametrize(
    "page", [page_param(p) for p in PAGES_WITH_CODE if p != FIRST_PAGE]
)
def test_python_blocks_run(page):
    run_page(page)


def test_getting_started_runs():
    """Getting started's blocks, on the backend under test (all three run it)."""
    run_page(FIRST_PAGE)


def test_every_layer_page_has_an_example():
    pages = {page_id(p) for p in PAGES_WITH_CODE}
    for name in ("bahdanau", "luong", "scaled_dot_product", "pooling"):
        assert f"layers/{name}.md" in pages
    assert {"index.md", "masking.md", "contract.md"} <= pages


def test_api_page_lists_every_public_name():
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: attention_layers\.(\w+)$", text, re.M))
    assert documented == set(attention_layers.__all__)


@pytest.mark.tf_only
def test_mkdocs_build_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(pathlib.Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip('mkdocs is not installed next to python: pip install ".[docs]"')
    site = tmp_path / "site"
    proc = subprocess.run(
        [
            mkdocs,
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in attention_layers.__all__:
        assert f'id="attention_layers.{name}"' in api, name

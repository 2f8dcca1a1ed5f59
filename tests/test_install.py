"""``pip install .`` gives the layers with Keras and NumPy only.

The layers run on any Keras backend, so a JAX or PyTorch user must not need
TensorFlow. The test builds that environment from what is installed here:
a folder holding only the distributions that the package's own requirements
(no extras) and JAX pull in, resolved from their metadata, and runs the
layers there in a fresh interpreter that sees nothing else.
"""

import ast
import importlib.metadata as metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

# The checks do not depend on the backend under test: they run once, in the
# TensorFlow half of `make test` (the JAX run is the subprocess's own).
pytestmark = pytest.mark.tf_only

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def install_requires():
    """The package's requirements without extras, from setup.py itself (the
    installed metadata may predate the checkout)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [Requirement(r) for r in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no install_requires")


def closure(requirements):
    """Every installed distribution that ``requirements`` need, by name."""
    seen, todo = {}, list(requirements)
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _normal(req.name)
        if name in seen:
            continue
        seen[name] = dist = metadata.distribution(req.name)
        todo.extend(Requirement(r) for r in dist.requires or ())
    return seen


def test_the_layers_need_neither_tensorflow_nor_tensorflow_text():
    names = set(closure(install_requires()))
    assert {"keras", "numpy"} <= names
    assert not {n for n in names if n.startswith("tensorflow")}, sorted(names)


@pytest.mark.slow  # a fresh interpreter on a bare site
def test_the_layers_run_on_jax_where_tensorflow_is_absent(tmp_path):
    pytest.importorskip("jax")
    dists = closure(install_requires() + [Requirement("jax")])
    site = tmp_path / "site-packages"
    site.mkdir()
    for dist in dists.values():
        base = pathlib.Path(dist.locate_file(""))
        tops = {pathlib.PurePath(f).parts[0] for f in dist.files or ()}
        for top in tops - {"..", "__pycache__"}:
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    (site / "attention_layers").symlink_to(ROOT / "attention_layers")
    code = """
import sys
sys.path[:0] = [SITE]
try:
    import tensorflow
except ImportError:
    pass
else:
    raise SystemExit("tensorflow is importable: the test environment leaks")
import numpy as np
import keras
import attention_layers as al
assert keras.backend.backend() == "jax"
x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
for layer in (al.BahdanauAttention(4), al.MultiHeadAttention(2, 4),
              al.TransformerEncoderBlock(2, 16)):
    y = layer(x, x) if not isinstance(layer, al.TransformerEncoderBlock) else layer(x)
    assert np.isfinite(np.asarray(y)).all(), type(layer).__name__
assert not [m for m in sys.modules if m.split(".")[0] == "tensorflow"]
print("ok")
""".replace("SITE", repr(str(site)))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
    }
    # -S: not even the standard site-packages; -E: no PYTHON* variables.
    proc = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        proc.stdout + proc.stderr
    )

"""Keras' own MultiHeadAttention tests, run against ours.

`prepare` takes ``keras/src/layers/attention/multi_head_attention_test.py``
from the source distribution of the installed Keras (``pip download
keras==VERSION --no-binary :all:``, cached in ``KERAS_SUITE_CACHE`` or a
folder of the test run), and writes it beside a module ``shim_layers`` whose
``layers`` is Keras' ``keras.src.layers`` with one name changed:
``MultiHeadAttention`` is ``attention_layers.MultiHeadAttention``. The test
file's one line ``from keras.src import layers`` then imports the shim; not
one assertion changes. `run` runs it with pytest in a fresh process on a
backend and returns each test's outcome.
"""

import os
import pathlib
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET

import keras

TEST_FILE = "keras/src/layers/attention/multi_head_attention_test.py"
IMPORT_LINE = "from keras.src import layers\n"
SHIM = '''"""keras.src.layers, with attention_layers.MultiHeadAttention in it."""

import keras.src.layers as _layers

import attention_layers


class _Layers:
    def __getattr__(self, name):
        if name == "MultiHeadAttention":
            return attention_layers.MultiHeadAttention
        return getattr(_layers, name)


layers = _Layers()
'''
# Tests of Keras' file that cannot pass against our class, with the reason
# (none today: ours keeps Keras' private names for its sublayers and options).
EXPECTED_FAILURES = {}


def sdist(cache):
    """The installed Keras version's source distribution, downloaded once."""
    cache = pathlib.Path(cache)
    name = f"keras-{keras.__version__}.tar.gz"
    if not (cache / name).exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"keras=={keras.__version__}",
             "--no-binary", ":all:", "--no-deps", "--quiet", "-d", str(cache)],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    return cache / name


def prepare(folder, cache):
    """Write Keras' test file, its import swapped for the shim, into ``folder``."""
    folder = pathlib.Path(folder)
    with tarfile.open(sdist(cache)) as archive:
        member = f"keras-{keras.__version__}/{TEST_FILE}"
        text = archive.extractfile(member).read().decode("utf-8")
    assert text.count(IMPORT_LINE) == 1, "Keras' test file changed its imports"
    text = text.replace(IMPORT_LINE, "from shim_layers import layers\n")
    (folder / "shim_layers.py").write_text(SHIM)
    (folder / "multi_head_attention_test.py").write_text(text)
    return folder / "multi_head_attention_test.py"


def run(test_file, backend, root):
    """``{test name: "passed" | "skipped" | "failed: ..."}`` of one pytest run."""
    folder = pathlib.Path(test_file).parent
    report = folder / f"report-{backend}.xml"
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(folder)])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-W", "ignore", f"--junitxml={report}",
         f"--rootdir={folder}"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            outcomes[case.get("name")] = (
                "failed: " + (failure.get("message") or "")[:300]
            )
        elif case.find("skipped") is not None:
            outcomes[case.get("name")] = "skipped"
        else:
            outcomes[case.get("name")] = "passed"
    return outcomes

"""`python -m pipelines.cloader`, the serving smoke tool's command line.

It runs against a tiny `tf.Module` export (no training): ``serving_default``
takes a string batch and an optional int32 option checked in the graph,
``with_options`` a string batch and two scalar options.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf_only

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m pipelines.cloader"


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    import tensorflow as tf

    once = tf.constant(1)  # a default in the SignatureDef (PlaceholderWithDefault)

    class Echo(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec(None, tf.string, name="text"),
                tf.TensorSpec(None, tf.int32, name="repeat"),
            ]
        )
        def serving_default(self, text, repeat=once):
            check = tf.debugging.assert_less_equal(
                repeat, 4, message="repeat must be at most 4"
            )
            with tf.control_dependencies([check]):
                joined = tf.strings.reduce_join(text, separator="|")
            return {
                "joined": tf.strings.reduce_join(
                    tf.fill([repeat], joined), separator="+"
                ),
                "length": tf.strings.length(text),
            }

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.string, name="text"),
                tf.TensorSpec([], tf.int32, name="beam_width"),
                tf.TensorSpec([], tf.float32, name="length_penalty"),
            ]
        )
        def with_options(self, text, beam_width, length_penalty):
            return {
                "beams": beam_width * 2,
                "penalty": length_penalty + 0.5,
                "count": tf.size(text),
            }

    module = Echo()
    path = tmp_path_factory.mktemp("cloader_cli") / "echo" / "1"
    signatures = {
        "serving_default": module.serving_default,
        "with_options": module.with_options,
    }
    tf.saved_model.save(module, str(path), signatures=signatures)
    return path


@pytest.fixture(scope="module")
def png(tmp_path_factory) -> Path:
    import tensorflow as tf

    pixels = tf.constant([[[0], [255]]], tf.uint8)
    path = tmp_path_factory.mktemp("cloader_cli_image") / "pixel.png"
    path.write_bytes(tf.io.encode_png(pixels).numpy())
    return path


def _cli(*args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cloader", *map(str, args)],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    proc.stdout = proc.stdout.decode()
    proc.stderr = proc.stderr.decode()
    return proc


def _one_error_line(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_serves_text_file_bytes_and_an_int_option(export, png):
    data = png.read_bytes()
    assert b"\x00" in data  # the file's bytes travel as bytes, NULs included
    proc = _cli(
        export,
        f"text=@{png}",
        "text=@@at",
        "text=@-",
        "text=plain",
        "repeat=2",
        stdin=b"from stdin",
    )
    assert proc.returncode == 0, proc.stderr
    # Nothing else on stderr: the Python process does not import TensorFlow.
    assert proc.stderr == ""
    joined = b"|".join([data, b"@at", b"from stdin", b"plain"])
    joined_line, length_line = proc.stdout.splitlines()
    assert joined_line == f"joined: {joined + b'+' + joined!r}"
    assert length_line.startswith("length: [") and length_line.endswith("]")
    lengths = [int(n) for n in length_line[len("length: [") : -1].split(",")]
    assert lengths == [len(data), 3, 10, 5]


def test_a_failed_request_exits_1_with_one_line(export):
    proc = _cli(export, "text=a", "repeat=9")
    line = _one_error_line(proc, 1)
    assert line.startswith(f"{PROG}: INVALID_ARGUMENT: assertion failed: ")
    assert "repeat must be at most 4" in line


def test_signature_with_scalar_options(export):
    proc = _cli(
        "--signature",
        "with_options",
        export,
        "text=a",
        "text=b",
        "beam_width=3",
        "length_penalty=0.25",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["beams: 6", "count: 2", "penalty: 0.75"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["text=@{tmp}/no.png"], "text=@{tmp}/no.png: cannot read {tmp}/no.png: No"),
        (["txt=a"], "no input 'txt'; its inputs: repeat (int32), text (string)"),
        (["repeat=2.5"], "repeat=2.5: repeat is int32; give an integer from"),
        (["repeat=3000000000"], "repeat is int32; give an integer from"),
        (["--signature", "nope"], "has no signature 'nope'; it has ['serving_def"),
        (
            ["--signature", "with_options", "beam_width=1", "beam_width=2"],
            "beam_width is a scalar; give it once, not 2 times",
        ),
        (
            ["--signature", "with_options", "length_penalty=high"],
            "length_penalty=high: length_penalty is float32; give a number",
        ),
        # Bytes that are not UTF-8 reach Python as lone surrogates.
        (["text=\udcff\udcfe"], "the argument b'text=\\xff\\xfe' is not UTF-8 text"),
    ],
    ids=[
        "missing-file",
        "unknown-key",
        "not-an-int",
        "int32-range",
        "unknown-signature",
        "scalar-twice",
        "not-a-float",
        "not-utf8",
    ],
)
def test_a_command_line_that_does_not_fit_exits_2(export, tmp_path, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    options = [a for a in args if "=" not in a]
    inputs = [a for a in args if "=" in a]
    line = _one_error_line(_cli(*options, export, *inputs), 2)
    assert line.startswith(f"{PROG}: error: ")
    assert message.format(tmp=tmp_path) in line


def test_not_a_savedmodel_exits_2(tmp_path):
    line = _one_error_line(_cli(tmp_path, "text=a"), 2)
    assert line == f"{PROG}: error: {tmp_path} is not a SavedModel (no saved_model.pb)."


def test_usage():
    bare = _cli()
    assert bare.returncode == 2
    assert bare.stderr.startswith(f"usage: {PROG} ")
    assert "KEY=@FILE" in bare.stderr and "--signature NAME" in bare.stderr

    helped = _cli("--help")
    assert helped.returncode == 0
    assert helped.stdout == bare.stderr

    for wrong in (["--bogus", "x"], ["export", "no-equals-sign"]):
        proc = _cli(*wrong)
        assert proc.returncode == 2
        assert proc.stderr.startswith(f"usage: {PROG} ")
        assert f"{PROG}: error: " in proc.stderr
        assert "Traceback" not in proc.stderr


def test_signature_def_names_dtypes_and_shapes(export):
    from pipelines import cloader

    inputs, _ = cloader.signature_def(export)
    assert {k: (v.dtype_name, v.shape) for k, v in inputs.items()} == {
        "text": ("string", None),
        "repeat": ("int32", None),
    }
    inputs, outputs = cloader.signature_def(export, "with_options")
    assert {k: (v.dtype_name, v.shape) for k, v in inputs.items()} == {
        "text": ("string", (-1,)),
        "beam_width": ("int32", ()),
        "length_penalty": ("float32", ()),
    }
    assert sorted(outputs) == ["beams", "count", "penalty"]

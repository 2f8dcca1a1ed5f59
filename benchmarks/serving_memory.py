"""Peak memory of a serving process under the largest images the limits let in.

A captioning export (``--export DIR``, or one built from ``--preset``'s
untrained model, which decodes like a trained one) is loaded in a fresh
process with ``tf.saved_model.load`` alone (no project code), warmed up with
one small image, and sent one request: an image at exactly
``export.max_image_pixels`` (PNG and JPEG; 1 and ``--rows`` rows), or the
389 kB PNG whose header declares 20000 x 20000 pixels. Each request runs in
its own process: ``VmHWM`` (``/proc/self/status``) is reset with
``clear_refs`` just before the call, so the peak is the call's own (a
child's ``ru_maxrss`` would start at its parent's peak). With
``--unlimited`` the same PNG is also sent to an export whose pixel limit is
lifted, which decodes it (what every export did before the limit).

Usage: ``python -m benchmarks.serving_memory [--export DIR] [--preset
digits-quick] [--set image.channels=3] [--rows 4] [--unlimited] [--json
out.json]`` (about 2 minutes on 2 cores; ``--unlimited`` needs about 3 GB
free, 7 GB with ``image.channels=3``).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import paired  # noqa: E402

WORKER = "--worker"


def png_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """An all-zero gray PNG of ``width x height``, compressed (389 kB here)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    deflate, row = zlib.compressobj(9), bytes(width + 1)
    body = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", body)
        + chunk(b"IEND", b"")
    )


def image_at(pixels: int, format: str, folder: Path) -> Path:
    """An RGB gradient of at most ``pixels`` pixels (about 8:5), as a file."""
    import numpy as np
    from PIL import Image

    width = int(round((pixels * 1.6) ** 0.5))
    height = pixels // width
    ramp = np.linspace(0, 255, width, dtype="float32").astype("uint8")
    rgb = np.broadcast_to(ramp[None, :, None], (height, width, 3))
    path = folder / f"limit-{height}x{width}.{format.lower()}"
    Image.fromarray(np.ascontiguousarray(rgb)).save(path, format=format)
    return path


def build_export(preset: str, folder: Path, overrides: list[str]) -> Path:
    """An untrained ``preset`` captioning model, exported as `export_run`
    would (limited signatures, ``limits.json``)."""
    from pipelines.captioning.task import TASK
    from pipelines.core.config import apply_overrides
    from pipelines.core.export import publish
    from pipelines.core.serving import served_signatures

    config = apply_overrides(TASK.presets()[preset](), overrides)
    data = TASK.load_data(TASK.presets()[preset]())  # its words (gray strips)
    tokenizer = TASK.preprocessors(None, data, config, create=False)
    module = TASK.serving_module(TASK.build_model(config, tokenizer), tokenizer, config)
    signatures, files = served_signatures(module, config.export)
    return publish(module, signatures, folder, preset, extra_files=files, audit=False)


def worker(export: str, path: str, rows: int) -> None:
    """In a fresh process: load, warm up, then measure one request."""
    import tensorflow as tf

    try:
        import tensorflow_text  # noqa: F401
    except ImportError:
        pass
    fn = tf.saved_model.load(export).signatures["serving_default"]
    small = tf.io.encode_png(tf.zeros([16, 48, 1], tf.uint8))
    fn(image=tf.stack([small]))
    batch = tf.constant([Path(path).read_bytes()] * rows)
    result = {"file_bytes": Path(path).stat().st_size, "rows": rows}

    def call():
        start = time.perf_counter()
        try:
            fn(image=batch)
            result["answer"] = "served"
        except tf.errors.InvalidArgumentError as error:
            lines = [x for x in error.message.splitlines() if "serving input" in x]
            result["answer"] = "INVALID_ARGUMENT: " + (lines or ["?"])[0][-160:]
        result["seconds"] = time.perf_counter() - start

    result.update(paired.measure_peak(call, calls=1))
    result["vmhwm_bytes"] = paired.peak_rss()
    paired.emit(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export", help="a captioning export's version folder")
    parser.add_argument("--preset", default="digits-quick")
    parser.add_argument(
        "--set", action="append", default=[], help="config overrides of the export"
    )
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--unlimited", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="serving-memory-"))
    export = Path(args.export) if args.export else build_export(
        args.preset, folder / "limited", args.set
    )  # fmt: skip
    limits = json.loads((export / "assets.extra" / "limits.json").read_text())
    pixels = limits["max_image_pixels"]
    png, jpeg = image_at(pixels, "PNG", folder), image_at(pixels, "JPEG", folder)
    bomb = folder / "bomb-20000x20000.png"
    bomb.write_bytes(png_bomb())
    cases = [
        (f"PNG {png.stem[6:]} (at the limit)", export, png, 1),
        (f"PNG {png.stem[6:]} x {args.rows} rows", export, png, args.rows),
        (f"JPEG {jpeg.stem[6:]} (at the limit)", export, jpeg, 1),
        ("PNG 20000x20000, 389 kB (refused)", export, bomb, 1),
    ]
    if args.unlimited:
        lifted = build_export(
            args.preset,
            folder / "unlimited",
            [*args.set, "export.max_image_pixels=1000000000"],
        )
        cases.append(("PNG 20000x20000, no pixel limit", lifted, bomb, 1))
    print(f"limits: {limits}")
    rows = []
    for name, where, path, count in cases:
        out = paired.run_worker(
            "benchmarks.serving_memory", [WORKER, str(where), str(path), str(count)],
            timeout=900,
        )  # fmt: skip
        out["case"] = name
        rows.append(out)
        print(
            f"{name}: {out['answer'][:60]}; {out['seconds']:.2f} s; peak "
            f"{paired.mib(out['peak_bytes']):.0f} MiB above the loaded model "
            f"({paired.mib(out['baseline_bytes']):.0f} MiB), VmHWM "
            f"{paired.mib(out['vmhwm_bytes']):.0f} MiB",
            flush=True,
        )
    print(
        paired.markdown_table(
            ["request", "file", "answer", "time", "peak above loaded", "VmHWM"],
            [
                (
                    r["case"],
                    f"{r['file_bytes'] / 1e3:.0f} kB",
                    r["answer"].split(":")[0],
                    f"{r['seconds']:.2f} s",
                    f"{paired.mib(r['peak_bytes']):.0f} MiB",
                    f"{paired.mib(r['vmhwm_bytes']):.0f} MiB",
                )
                for r in rows
            ],
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == WORKER:
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()

"""Serving latency of an export through TensorFlow's C++ loader (TF Serving's path).

Each configuration sends the same request ``--requests`` times from each of
``--threads`` threads to one session in a C process (`pipelines.cloader`:
the C API of the TensorFlow wheel, no Python in the process), as TF Serving
does with concurrent requests, and reports the latency percentiles and the
throughput. This is a figure for the docs, not a test.

    python -m benchmarks.bench_serving --export runs/dates/serving/dates/1
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from pipelines import cloader
from pipelines.core.serving import resolve_export, signature_defaults


def options_signature(export_dir) -> str:
    """``with_options``, or ``serving_default`` for an export that took the
    options there (made before ``with_options`` existed) or has none."""
    from tensorflow.python.tools import saved_model_utils

    meta = saved_model_utils.get_meta_graph_def(str(export_dir), "serve")
    return "with_options" if "with_options" in meta.signature_def else "serving_default"


def configurations(export_dir, texts: list[str]) -> dict[str, dict]:
    defaults = signature_defaults(export_dir, options_signature(export_dir))
    one = np.array(texts[:1], dtype=object)
    many = np.array((texts * 64)[:64], dtype=object)
    out = {}
    if "beam_width" in defaults:
        out["greedy, batch 1"] = {"source": one, "beam_width": np.int32(1)}
        beams = int(defaults["beam_width"])
        out[f"beam {beams} (default), batch 1"] = {"source": one}
        out["greedy, batch 64"] = {"source": many, "beam_width": np.int32(1)}
    else:
        key = next(iter(cloader.signature_tensors(export_dir)[0]))
        out["batch 1"] = {key: one}
        out["batch 64"] = {key: many}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", required=True, help="a version or model folder")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000, help="per thread")
    parser.add_argument(
        "--text", action="append", help="request text (default: a date in French)"
    )
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    export_dir = resolve_export(args.export)
    texts = args.text or ["9 mars 1987"]
    rows = []
    print(f"{export_dir}: {args.threads} threads x {args.requests} requests each, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    for name, request in configurations(export_dir, texts).items():
        t0 = time.time()
        result = cloader.bench(
            export_dir, request, args.threads, args.requests,
            signature=options_signature(export_dir),
        )  # fmt: skip
        rows.append({"configuration": name, **result, "seconds": time.time() - t0})
        print(
            f"| {name} | {result['p50_ms']:.2f} | {result['p99_ms']:.2f} | "
            f"{result['requests_per_s']:.0f} | {int(result['failures'])} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""BLEU by source length for several evaluated runs: a markdown table and a plot.

    python docs/scripts/plot_bleu_by_length.py runs/bible runs/bible-none \
        --decoding beam4 --out docs/images/bible_bleu_by_length.png

Each run folder must hold the ``metrics.json`` of
``attention-pipelines translation evaluate``.
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from pipelines.core.plots import bleu_by_length_plot  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders with metrics.json")
    parser.add_argument("--decoding", default="beam4", help="greedy, beam4, ...")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)

    rows_by_model = {}
    for run in args.runs:
        metrics = json.loads((pathlib.Path(run) / "metrics.json").read_text())
        scores = metrics["decoding"][args.decoding]
        name = metrics["run"]
        rows_by_model[name] = scores["by_source_length"]
        print(
            f"{name}: BLEU {scores['bleu']}, chrF {scores['chrf']} "
            f"({scores['sentences']} sentences, {args.decoding})"
        )
    buckets = [r["bucket"] for r in next(iter(rows_by_model.values()))]
    names = list(rows_by_model)
    print("\n| source words | sentences | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for i, bucket in enumerate(buckets):
        cells = [f"{rows_by_model[n][i]['bleu']:.2f}" for n in names]
        count = rows_by_model[names[0]][i]["sentences"]
        print(f"| {bucket} | {count} | " + " | ".join(cells) + " |")
    bleu_by_length_plot(rows_by_model, args.out)
    print(f"\nWrote {args.out}")


if __name__ == "__main__":
    main()

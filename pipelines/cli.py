"""The ``attention-pipelines`` console script.

    attention-pipelines translation train     --config dates --run-dir runs/dates
    attention-pipelines translation evaluate  --run-dir runs/dates
    attention-pipelines translation export    --run-dir runs/dates --base runs/serving
    attention-pipelines translation translate --export runs/serving/dates "9 mars 1987"
    attention-pipelines translation demo      (all four, as `make demo` runs them)

Each command has ``--help``. ``translate`` imports TensorFlow and
tensorflow-text only, like any client of the SavedModel.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _config(args):
    from pipelines.core import config as config_lib

    config = config_lib.load(args.config)
    return config_lib.apply_overrides(config, args.set or [])


def cmd_train(args) -> None:
    from pipelines.translation.run import train

    config = _config(args)
    train(config, args.run_dir or f"runs/{config.name}")


def cmd_evaluate(args) -> None:
    from pipelines.translation.evaluate import evaluate

    widths = tuple(args.beam_width) if args.beam_width else None
    result = evaluate(args.run_dir, args.split, widths, args.limit, args.heatmaps)
    print(
        f"Metrics: {Path(args.run_dir) / 'metrics.json'}; plots: {result['heatmaps']}"
    )


def cmd_export(args) -> None:
    from pipelines.translation.serving import export

    path = export(args.run_dir, args.base, args.name, args.version)
    print(f"SavedModel ready for TF Serving: {path}")


def cmd_translate(args) -> None:
    from pipelines.translation.serving import translate_with_export

    texts = list(args.text)
    if args.file:
        texts += Path(args.file).read_text(encoding="utf-8").splitlines()
    if not texts:
        raise SystemExit("translate: give sentences as arguments or with --file.")
    out = translate_with_export(
        args.export, texts, args.beam_width, args.length_penalty
    )
    for text, translation, score in zip(
        texts, out["translation"], out["score"], strict=True
    ):
        print(f"{text}\n  -> {translation.decode('utf-8')}   (score {score:.3f})")
    if args.plot:
        from pipelines.core.plots import alignment_heatmap

        first = out["translation"][0].decode("utf-8")
        path = alignment_heatmap(
            out["source_tokens"][0],
            out["target_tokens"][0],
            out["alignment"][0],
            args.plot,
            title=f"{texts[0][:60]!r} -> {first[:60]!r}",
        )
        print(f"Alignment heatmap: {path}")


def cmd_demo(args) -> None:
    """Train, evaluate, export, then translate with the export in a new process."""
    from pipelines.translation.evaluate import evaluate
    from pipelines.translation.run import train
    from pipelines.translation.serving import export, samples_for

    t0 = time.time()
    config = _config(args)
    run_dir = Path(args.run_dir or f"runs/{config.name}")
    train(config, run_dir)
    result = evaluate(run_dir, "test")
    path = export(run_dir, run_dir / "serving", config.name)
    print("\nTranslating with the exported SavedModel in a fresh process:")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "translation",
            "translate",
            "--export",
            str(path),
            "--plot",
            str(run_dir / "alignment.png"),
            *samples_for(config),
        ],
        check=True,
    )
    best = max(result["decoding"].values(), key=lambda s: s["bleu"])
    print(
        f"\nDemo done in {time.time() - t0:.0f} s: BLEU {best['bleu']:.2f}, "
        f"exact match {best['exact_match']:.2%} on the test split; "
        f"export {path}; heatmap {run_dir / 'alignment.png'}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attention-pipelines",
        description="Reference pipelines of attention-layers.",
    )
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    translation = tasks.add_parser("translation", help="machine translation")
    commands = translation.add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )

    def with_config(p):
        p.add_argument(
            "--config",
            default="dates",
            help="a preset (dates, bible, bible-none, ding, tiny) or a YAML file",
        )
        p.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override one setting, e.g. --set model.attention=none (repeatable)",
        )
        p.add_argument("--run-dir", help="where the run lives (default runs/<name>)")

    p = commands.add_parser("train", help="train (or resume) a model")
    with_config(p)
    p.set_defaults(func=cmd_train)

    p = commands.add_parser("evaluate", help="BLEU, chrF and heatmaps on a split")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument(
        "--beam-width",
        type=int,
        action="append",
        help="decode with this many beams (repeatable; 1 = greedy)",
    )
    p.add_argument("--limit", type=int, help="score only the first N pairs")
    p.add_argument("--heatmaps", type=int, default=3, help="alignment plots to draw")
    p.set_defaults(func=cmd_evaluate)

    p = commands.add_parser("export", help="SavedModel in TF Serving layout")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--base", required=True, help="TF Serving model base folder")
    p.add_argument("--name", default="translation", help="model name (a folder)")
    p.add_argument("--version", type=int, help="default: the next free version")
    p.set_defaults(func=cmd_export)

    p = commands.add_parser("translate", help="translate with an exported SavedModel")
    p.add_argument(
        "--export",
        required=True,
        help="a version folder, or a model folder (latest version)",
    )
    p.add_argument("text", nargs="*", help="sentences to translate")
    p.add_argument("--file", help="one sentence per line")
    p.add_argument("--beam-width", type=int)
    p.add_argument("--length-penalty", type=float)
    p.add_argument("--plot", help="write the first sentence's alignment heatmap here")
    p.set_defaults(func=cmd_translate)

    p = commands.add_parser("demo", help="train, evaluate, export and translate")
    with_config(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.environ.get("ATTENTION_PIPELINES_CPU_DEVICES"):
        from pipelines.core.strategy import split_cpu

        split_cpu(int(os.environ["ATTENTION_PIPELINES_CPU_DEVICES"]))
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        # Errors that say what to fix: no traceback needed.
        if os.environ.get("ATTENTION_PIPELINES_DEBUG"):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

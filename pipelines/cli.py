"""The ``attention-pipelines`` console script: one set of verbs for every task.

    attention-pipelines --help                       (lists the tasks)
    attention-pipelines TASK train    --config tiny --run-dir runs/mine
    attention-pipelines TASK evaluate --run-dir runs/mine
    attention-pipelines TASK export   --run-dir runs/mine --base serving
    attention-pipelines TASK predict  --export serving/mine INPUT...
    attention-pipelines TASK demo     (all four, as `make demo` runs them)

The verbs and their flags (``--config``, ``--set``, ``--run-dir``,
``--overwrite``, ``--base``, ``--name``, ``--version``, ``--export``) are the
same for every registered task (`pipelines.registry`); a task adds its own
options (beam widths, plots). ``predict`` imports TensorFlow and
tensorflow-text only, like any client of the SavedModel. A failure prints
one line saying what to fix (``ATTENTION_PIPELINES_DEBUG=1`` shows the
traceback).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VERBS = ("train", "evaluate", "export", "predict", "demo")
DEBUG = "ATTENTION_PIPELINES_DEBUG"
VERBOSE = "--verbose"


# -- the verbs ------------------------------------------------------------------


def _config(task, args):
    from pipelines.core import config as config_lib

    config = config_lib.load(args.config, task.presets(), task.default_preset)
    return config_lib.apply_overrides(config, args.set or [])


def _run_dir(task, args, config) -> Path:
    """``--run-dir``, or ``runs/<task>/<preset>``: each task's runs apart, so
    two tasks' ``tiny`` runs never meet. A run made where runs went before
    (``runs/<preset>``) is pointed out in one line."""
    if args.run_dir:
        return Path(args.run_dir)
    from pipelines.core.run_dir import RunDir

    earlier = RunDir(Path("runs") / config.name)
    if earlier.task_name() == task.name:
        print(
            f"note: {earlier.root} holds a {task.name} run made where runs went "
            f"before; this one goes to runs/{task.name}/{config.name} (give "
            f"--run-dir {earlier.root} to go on with that one)."
        )
    return Path("runs") / task.name / config.name


def _trained_config(task, run_dir, overrides):
    """The run's configuration with ``--set`` overrides that keep its fingerprint."""
    from pipelines.core import config as config_lib
    from pipelines.core.errors import PipelineError
    from pipelines.core.recovery import require_trained
    from pipelines.core.run_dir import RunDir
    from pipelines.core.run_guard import run_config

    run = RunDir(run_dir)
    require_trained(task, run)
    config = run_config(task, run)
    changed = config_lib.apply_overrides(config, overrides or [])
    if config_lib.fingerprint(changed) != config_lib.fingerprint(config):
        raise PipelineError(
            f"--set {' '.join(overrides)} changes what {run.root} was trained with "
            f"({config_lib.differences(config, changed)}); only settings outside the "
            "fingerprint (decode, export) apply to a trained run."
        )
    return changed


def smoke_test_note(task, config) -> str | None:
    """The line ``train`` and ``demo`` print first for a smoke-test preset
    (``tiny``, ``tiny-*``), which runs every stage but learns nothing; None
    for any other configuration."""
    name = config.name
    if name != "tiny" and not name.startswith("tiny-"):
        return None
    return (
        f"{name} is a smoke test: too small and too short to learn the task; "
        f"`attention-pipelines {task.name} demo` (no --config) gives a "
        "meaningful result."
    )


def _say_if_smoke_test(task, config) -> None:
    note = smoke_test_note(task, config)
    if note:
        print(note, flush=True)


def cmd_train(task, args) -> None:
    config = _config(task, args)
    _say_if_smoke_test(task, config)
    run_dir = _run_dir(task, args, config)
    if args.workers and os.environ.get("TF_CONFIG"):
        raise ValueError(
            "train: --workers starts local workers itself; it cannot be given "
            "where TF_CONFIG is set (a worker of a cluster). Leave one of them out."
        )
    if args.workers and args.workers > 1:
        from pipelines.core.launcher import launch_workers

        launch_workers(
            task, config, run_dir, args.workers, _without_workers(args.argv),
            overwrite=args.overwrite,
        )  # fmt: skip
        return
    from pipelines.core.trainer import train

    train(task, config, run_dir, overwrite=args.overwrite)


def _without_workers(argv: list[str]) -> list[str]:
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--workers":
            skip = True
        elif not item.startswith("--workers=") and item != "--overwrite":
            out.append(item)
    return out


def evaluate_run(task, run_dir, args) -> dict:
    """Load the run, score ``args.split`` with the task, write metrics.json."""
    from pipelines.core.run_dir import RunDir, write_json
    from pipelines.core.trainer import load_trained

    config = _trained_config(task, run_dir, args.set)
    config, preprocessors, model = load_trained(task, run_dir, config=config)
    examples = task.load_data(config).split(args.split)
    if args.limit:
        examples = examples[: args.limit]
    if not examples:
        from pipelines.core.errors import PipelineError

        raise PipelineError(f"evaluate: the {args.split} split is empty.")
    run = RunDir(run_dir)
    metrics = task.evaluate(run, model, preprocessors, config, examples, args)
    write_json(run.metrics, metrics)
    print(f"Metrics: {run.metrics}")
    return metrics


def cmd_evaluate(task, args) -> None:
    evaluate_run(task, args.run_dir, args)


def export_run(task, run_dir, base, name, version, overrides) -> Path:
    """Export a trained run under ``export.dtype``; returns the version folder."""
    from pipelines.core.errors import PipelineError
    from pipelines.core.export import publish
    from pipelines.core.serving import served_signatures
    from pipelines.core.trainer import dtype_policy, load_trained

    config = _trained_config(task, run_dir, overrides)
    config, preprocessors, model = load_trained(task, run_dir, config=config)
    with dtype_policy(config.export.dtype):
        module = task.serving_module(model, preprocessors, config)
        if config.export.jit_compile and not module.compiles_decoding:
            raise PipelineError(
                f"export: `export.jit_compile=true` needs a decoding loop to "
                f"compile; the {task.name} task's export has none that does. "
                "Leave it false."
            )
        requests = module.warmup_requests() if config.export.warmup else []
        warmup = ("serving_default", requests) if requests else None
        # The signatures behind the request limits, and limits.json.
        signatures, files = served_signatures(module, config.export)
        path = publish(
            module,
            signatures,
            base,
            name if name is not None else Path(run_dir).resolve().name,
            version=version,
            warmup=warmup,
            extra_files=files,
        )
    audit = (path / "assets.extra" / "op_audit.json").read_text()
    import json

    report = json.loads(audit)
    print(
        f"Exported {path} ({config.export.dtype}): {len(report['core'])} core op "
        f"types, TF Text ops {report['tf_text']}, unknown {report['unknown']}"
    )
    return path


def cmd_export(task, args) -> None:
    path = export_run(task, args.run_dir, args.base, args.name, args.version, args.set)
    print(f"SavedModel ready for TF Serving: {path}")


def _export_path(args) -> Path:
    from pipelines.core.serving import resolve_export

    if args.export:
        return resolve_export(args.export)
    if not args.base:
        raise ValueError("predict: give --export PATH, or --base and --name.")
    if args.name is not None:
        from pipelines.core.export_check import check_model_name

        check_model_name(args.name, args.command)
    model_dir = Path(args.base) / (args.name or "")
    return resolve_export(model_dir / str(args.version) if args.version else model_dir)


def cmd_predict(task, args) -> None:
    from pipelines.core.errors import ConfigError, PipelineError

    inputs = list(args.inputs)
    if args.file:
        from pipelines.data.user_files import read_lines

        inputs += read_lines(args.file, "a UTF-8 text file, one input a line")
    if not inputs:
        raise ValueError(f"{args.command}: give inputs as arguments or with --file.")
    path = _export_path(args)
    try:
        task.client.predict(path, inputs, args)
    except (PipelineError, ConfigError):
        raise
    except Exception as error:
        # Loading or calling failed: a damaged export is named as such.
        from pipelines.core.export_check import damaged_export_error

        damaged = damaged_export_error(path, task.name)
        if damaged is None:
            raise
        raise damaged from error


def cmd_demo(task, args) -> None:
    """Train, evaluate, export, then predict with the export in a new process."""
    from pipelines.core.trainer import train

    t0 = time.time()
    config = _config(task, args)
    _say_if_smoke_test(task, config)
    run_dir = _run_dir(task, args, config)
    train(task, config, run_dir, overwrite=args.overwrite)
    args.split, args.limit, args.set = "test", None, []
    metrics = evaluate_run(task, run_dir, args)
    base = Path(args.base) if args.base else run_dir / "serving"
    path = export_run(task, run_dir, base, args.name, args.version, [])
    print("\nPredicting with the exported SavedModel in a fresh process:")
    predicted = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", task.name, "predict",
         "--export", str(path), *task.client.demo_arguments(run_dir),
         *([VERBOSE] if args.verbose else []), *task.samples(config)],
        stderr=sys.stderr,
    )  # fmt: skip
    if predicted.returncode:
        from pipelines.core.errors import PipelineError

        raise PipelineError(
            f"demo: predicting with {path} failed (exit {predicted.returncode}; "
            "its error is above); the run and the export are kept."
        )
    print_examples(task, config, run_dir, metrics.get("split", "test"))
    summary = task.client.evaluation_summary(metrics)
    print(
        f"\nDemo done in {time.time() - t0:.0f} s: {summary}; export {path}"
        + "".join(f"; {line}" for line in task.client.demo_notes(run_dir))
    )


DEMO_EXAMPLES = 4  # evaluated examples the demo shows


def print_examples(task, config, run_dir, split: str) -> None:
    """The first evaluated examples, truth beside prediction, then what the
    model was trained to know."""
    from pipelines.core.client import format_examples

    examples = task.client.demo_examples(Path(run_dir), DEMO_EXAMPLES)
    lines = [format_examples(examples, f"{split} split")] if examples else []
    lines += [f"The model was {fact}." for fact in task.client.demo_facts(config)]
    if lines:
        print("\n" + "\n".join(lines))


# -- the parser ---------------------------------------------------------------


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_config(parser, task) -> None:
    presets = ", ".join(sorted(task.presets()))
    parser.add_argument(
        "--config",
        default=task.default_preset,
        help=f"a preset ({presets}) or a YAML file (default {task.default_preset})",
    )
    _add_set(parser)
    parser.add_argument(
        "--run-dir", help="where the run lives (default runs/<task>/<preset>)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="clear a run folder trained with another configuration and start afresh",
    )


def _add_set(parser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override one setting, e.g. --set train.epochs=5 (repeatable)",
    )


def _add_export_target(parser, required: bool) -> None:
    parser.add_argument(
        "--base", required=required, help="TF Serving model base folder"
    )
    parser.add_argument(
        "--name", help="model name, a folder (default: the run folder's name)"
    )
    parser.add_argument(
        "--version", type=positive_int, help="default: the next free version"
    )


def _verb_parser(add_parser, name: str, **kwargs) -> argparse.ArgumentParser:
    """A verb's parser, with the ``--verbose`` every verb takes."""
    parser = add_parser(name, allow_abbrev=False, **kwargs)
    parser.add_argument(
        VERBOSE,
        action="store_true",
        help="show TensorFlow's own start-up and C++ log lines (by default "
        "they go to ~/.cache/attention-pipelines/tensorflow-native.log)",
    )
    return parser


def task_parser(task, prog: str = "attention-pipelines") -> argparse.ArgumentParser:
    """The parser of one task's verbs."""
    parser = argparse.ArgumentParser(
        prog=f"{prog} {task.name}", description=task.description, allow_abbrev=False
    )
    verbs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verbs.add_parser = functools.partial(_verb_parser, verbs.add_parser)

    p = verbs.add_parser("train", help="train (or resume) a model")
    _add_config(p, task)
    p.add_argument(
        "--workers",
        type=positive_int,
        help="train with MultiWorkerMirroredStrategy over N local processes",
    )
    p.set_defaults(func=cmd_train)

    p = verbs.add_parser("evaluate", help="score a trained run on a split")
    p.add_argument("--run-dir", required=True)
    _add_set(p)
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--limit", type=positive_int, help="score only the first N examples")
    task.client.add_evaluate_arguments(p)
    p.set_defaults(func=cmd_evaluate)

    p = verbs.add_parser("export", help="SavedModel in TF Serving layout")
    p.add_argument("--run-dir", required=True)
    _add_set(p)
    _add_export_target(p, required=True)
    p.set_defaults(func=cmd_export)

    for verb in ("predict", *task.client.predict_aliases):
        p = verbs.add_parser(
            verb,
            help="predict with an exported SavedModel"
            + (" (an alias of predict)" if verb != "predict" else ""),
        )
        p.add_argument("--export", help="a version folder, or a model folder (latest)")
        _add_export_target(p, required=False)
        p.add_argument("inputs", nargs="*", help="inputs to predict", metavar="INPUT")
        p.add_argument("--file", help="one input per line")
        task.client.add_predict_arguments(p)
        p.set_defaults(func=cmd_predict)

    p = verbs.add_parser("demo", help="train, evaluate, export and predict")
    _add_config(p, task)
    _add_export_target(p, required=False)
    task.client.add_evaluate_arguments(p)
    p.set_defaults(func=cmd_demo)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: one sub-command per registered task."""
    from pipelines import registry

    parser = argparse.ArgumentParser(
        prog="attention-pipelines",
        description="Reference pipelines of attention-layers. Every task has the "
        f"verbs {', '.join(VERBS)}; see `attention-pipelines TASK --help`.",
    )
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    for name in registry.names():
        tasks.add_parser(name, help=registry.description(name) or name, add_help=False)
    return parser


def parse(argv: list[str]):
    """``(task, args)`` for ``argv`` (the task's parser only is built)."""
    from pipelines import registry

    top = build_parser()
    if not argv or argv[0].startswith("-") or argv[0] not in registry.names():
        top.parse_args(argv)  # prints help or the error, and exits
    task = registry.get(argv[0])
    args = task_parser(task).parse_args(argv[1:])
    args.argv = list(argv)
    return task, args


# TensorFlow's graph and node noise around an error's own text.
_TF_NOISE = re.compile(
    r"^(Graph execution error:|Detected at node .*|<stack traces unavailable>|"
    r"File \".*|\[\[\{\{node .*)$"
)
_TF_SUFFIX = re.compile(r"\s*(\[\[\{\{node [^}]*\}\}\]\]|\[Op:[^\]]*\])")
_ASSERTION = "assertion failed:"


def _one_line(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    # An in-graph assertion's own text (tf.debugging.Assert's data, in
    # brackets), without the node that raised it.
    for line in lines:
        if line.startswith(_ASSERTION):
            text = line[len(_ASSERTION) :].strip()
            text = _TF_SUFFIX.sub("", text).strip()
            if text.startswith("[") and text.endswith("]"):
                text = text[1:-1].strip()
            if text:
                return text
    kept = [line for line in lines if not _TF_NOISE.match(line)]
    kept = [_TF_SUFFIX.sub("", line).strip() for line in kept]
    kept = [line for line in kept if line] or lines
    if not kept:
        return type(error).__name__
    # TensorFlow's errors from a traced function open with "in user code:"
    # and end with the error itself.
    return kept[-1] if kept[0].endswith(":") else kept[0]


def native_log() -> Path:
    """Where TensorFlow's C++ messages go unless ``--verbose``."""
    from pipelines.core.run_dir import cache_dir

    return cache_dir() / "tensorflow-native.log"


def console() -> int:
    """The ``attention-pipelines`` command: `main`, with TensorFlow's C++
    start-up lines sent to `native_log` unless ``--verbose`` (or the debug
    variable) is given."""
    if VERBOSE not in sys.argv[1:] and not os.environ.get(DEBUG):
        from pipelines.core.quiet import native_stderr_to

        native_stderr_to(native_log())
    return main()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get(DEBUG):
        import keras

        keras.config.disable_traceback_filtering()
    try:
        _split_cpu_from_env()
        task, args = parse(argv)
        args.func(task, args)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print(
            "interrupted; rerun the same command to resume training.", file=sys.stderr
        )
        return 130
    except Exception as error:
        if os.environ.get(DEBUG):
            raise
        print(f"error: {describe(error)}", file=sys.stderr)
        return 2
    return 0


def _split_cpu_from_env() -> None:
    """``ATTENTION_PIPELINES_CPU_DEVICES=N``: N logical CPU devices (tests)."""
    value = os.environ.get("ATTENTION_PIPELINES_CPU_DEVICES")
    if not value:
        return
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            "ATTENTION_PIPELINES_CPU_DEVICES must be a positive integer, received "
            f"{value!r}."
        )
    from pipelines.core.strategy import split_cpu

    split_cpu(int(value))


def describe(error: Exception) -> str:
    """One line for the user: the message, and what kind of failure it was;
    a full disk, a refused permission, a read-only file system or too many
    open files (found anywhere in the error's chain or text) says what to
    do. At most a few hundred characters (`pipelines.core.errors.capped`)."""
    from pipelines.core.errors import ConfigError, PipelineError, capped, os_advice

    if not isinstance(error, (PipelineError, ConfigError)):
        advice = os_advice(error)
        if advice:
            return advice
    line = capped(_one_line(error))
    if isinstance(error, (PipelineError, ConfigError)):
        return line
    if isinstance(error, (ValueError, FileNotFoundError, FileExistsError)):
        return line
    if isinstance(error, OSError):
        return f"{line} (check the path and its permissions)"
    name = type(error).__name__
    if type(error).__module__.startswith("tensorflow"):
        return f"TensorFlow {name}: {line}"
    return (
        f"{name}: {line} (unexpected; rerun with {DEBUG}=1 for the traceback and "
        "report it)"
    )


if __name__ == "__main__":
    sys.exit(console())

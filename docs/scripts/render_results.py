"""Render each task's recorded runs (docs/results/<task>.json) into its page.

A results file holds, for every recorded run, its metrics, the command, the
commit, the machine and its core count and the wall time. This script
rewrites the block between the markers below in
docs/pipelines/<task>.md with a table of those runs; tests/test_docs.py
checks that every block is up to date and that the README and the task
pages quote no figure a results file does not hold.

Usage, from the root of a checkout: ``python docs/scripts/render_results.py``
(``--check``: exit 1 if a page is out of date, write nothing).
"""

import argparse
import json
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent.parent
RESULTS = DOCS / "results"
TASKS = ("translation", "summarization", "qa", "extractive", "captioning")
BEGIN = "<!-- results:begin (docs/scripts/render_results.py writes this table) -->"
END = "<!-- results:end -->"


def load(task):
    """The parsed results file of ``task``."""
    return json.loads((RESULTS / f"{task}.json").read_text(encoding="utf-8"))


def _value(value):
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(task):
    """The markdown table of ``task``'s recorded runs."""
    rows = [
        f"Recorded runs (from `docs/results/{task}.json`; percentages in percent,"
        " times in seconds of the wall clock):",
        "",
        "| run | metrics | time | machine | commit |",
        "|---|---|---|---|---|",
    ]
    for run in load(task)["runs"]:
        metrics = ", ".join(f"{k} {_value(v)}" for k, v in run["metrics"].items())
        rows.append(
            f"| {run['name']} (`{run['command']}`) | {metrics or '-'} "
            f"| {run['wall_s']:,} s ({run['wall_measures']}) "
            f"| {run['cores']} core{'s' * (run['cores'] != 1)}: {run['machine']} "
            f"| {run['commit']} |"
        )
    return "\n".join(rows)


def render(text, task):
    """``text`` with its results block rewritten; ValueError without one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{task}: no results block ({BEGIN} ... {END})")
    return text[: start + len(BEGIN)] + "\n" + table(task) + "\n" + text[end:]


def page(task):
    return DOCS / "pipelines" / f"{task}.md"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for task in TASKS:
        text = page(task).read_text(encoding="utf-8")
        new = render(text, task)
        if new != text:
            stale.append(task)
            if not args.check:
                page(task).write_text(new, encoding="utf-8")
    if stale:
        print(("out of date: " if args.check else "rewrote: ") + ", ".join(stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

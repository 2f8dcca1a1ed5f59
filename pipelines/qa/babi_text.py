"""bAbI's own text format: read the original files, write ours in it.

The format of Weston et al. (2015)'s released files (``qa2_two-supporting-
facts_train.txt``): one line per statement or question, each numbered from 1
within its story; a question line holds the question, a tab, the answer and a
tab, then the numbers of its supporting lines (which count question lines
too)::

    1 Mary moved to the bathroom.
    2 John went to the hallway.
    3 Where is Mary? \tbathroom\t1

Reading gives `QAExample`\\ s whose ``story`` is the statements before the
question (not the earlier questions), as `pipelines.qa.babi` makes them;
writing groups consecutive examples whose stories extend one another into
one story. So our generated tasks can be given to any bAbI code (MemN2N's
reference implementations take a folder of such files), and the original
files, where a user has them, to our pipeline (``data.source=babi-text:DIR``).

Example:

>>> import tempfile
>>> from pipelines.qa.babi import generate_task
>>> examples = generate_task(1, 2, seed=0)
>>> print(to_babi_text(examples).replace("\\t", " | "), end="")
1 Sandra journeyed to the kitchen.
2 Sandra went to the hallway.
3 Where is Sandra? | hallway | 2
4 Mary moved to the bedroom.
5 Daniel travelled to the bathroom.
6 Where is Mary? | bedroom | 4
>>> with tempfile.TemporaryDirectory() as folder:
...     paths = write_babi_files(folder, [1, 2], size=20, test_size=10)
...     print(paths[0].name)
...     load_babi_files(folder)[:3] == load_babi([1, 2], size=20, test_size=10)[:3]
qa1_single-supporting-fact_train.txt
True
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from pipelines.core.errors import PipelineError
from pipelines.core.files import read_file
from pipelines.qa.babi import QAExample, load_babi, parse_babi_spec

TASK_NAMES: dict[int, str] = {
    1: "single supporting fact",
    2: "two supporting facts",
    3: "three supporting facts",
    4: "two argument relations",
    5: "three argument relations",
    6: "yes/no questions",
    7: "counting",
    8: "lists/sets",
    9: "simple negation",
    10: "indefinite knowledge",
    11: "basic coreference",
    12: "conjunction",
    13: "compound coreference",
    14: "time reasoning",
    15: "basic deduction",
    16: "basic induction",
    17: "positional reasoning",
    18: "size reasoning",
    19: "path finding",
    20: "agent's motivations",
}
"""The twenty bAbI tasks (the released files name them the same way)."""

_FILE = re.compile(r"qa(\d+)_.*_(train|test)\.txt")


def file_name(task: int, split: str) -> str:
    """bAbI's file name: ``file_name(2, "train")`` is
    ``"qa2_two-supporting-facts_train.txt"``."""
    name = TASK_NAMES[task].replace("argument", "arg").replace("'", "")
    slug = re.sub(r"[^a-z]+", "-", name.lower())
    return f"qa{task}_{slug}_{split}.txt"


def to_babi_text(examples: Sequence[QAExample]) -> str:
    """The examples as bAbI text; an example continues the story before it
    when its story starts with that story's statements (same task)."""
    lines: list[str] = []
    told: tuple[str, ...] = ()
    numbers: list[int] = []  # the line number of each statement told
    task = None
    for example in examples:
        if example.task != task or example.story[: len(told)] != told:
            told, numbers, task, lines_in_story = (), [], example.task, 0
        for sentence in example.story[len(told) :]:
            _check_line(sentence, "statement")
            lines_in_story += 1
            numbers.append(lines_in_story)
            lines.append(f"{lines_in_story} {sentence}")
        told = example.story
        _check_line(example.question, "question")
        _check_line(example.answer, "answer")
        lines_in_story += 1
        support = " ".join(str(numbers[i]) for i in example.supporting)
        lines.append(
            f"{lines_in_story} {example.question}\t{example.answer}\t{support}"
        )
    return "".join(line + "\n" for line in lines)


def _check_line(text: str, what: str) -> None:
    if not text.strip() or "\t" in text or "\n" in text:
        raise ValueError(
            f"bAbI text: a {what} must be non-blank text without tabs or "
            f"newlines, received {text!r}"
        )


def read_babi_text(path: str | Path, task: int = 0) -> list[QAExample]:
    """The questions of one bAbI text file, in order, with ``task`` set.

    Raises:
        PipelineError: the file is missing or unreadable, or a line is not
            bAbI text; the message names the file, the line and what was
            expected.
    """
    path = Path(path)
    try:
        text = read_file(path, "a bAbI text file").decode("utf-8")
    except FileNotFoundError:
        raise PipelineError(
            f"{path}: no such file (expected a bAbI text file)"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise PipelineError(f"{path}: cannot be read ({error})") from None
    examples: list[QAExample] = []
    story: list[str] = []
    statement_of: dict[int, int] = {}  # line number -> index into story
    last = 0
    for row, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {row}"
        match = re.fullmatch(r"\s*(\d+) (.*)", line)
        if match is None:
            raise PipelineError(
                f"{where}: expected a line number, a space and a statement or "
                f"question, received {line[:60]!r}"
            )
        number, body = int(match[1]), match[2]
        if number == 1:
            story, statement_of = [], {}
        elif number != last + 1:
            raise PipelineError(
                f"{where}: expected line number 1 (a new story) or {last + 1}, "
                f"received {number}"
            )
        last = number
        if "\t" not in body:
            if not body.strip():
                raise PipelineError(f"{where}: expected a statement, received nothing")
            statement_of[number] = len(story)
            story.append(body.strip())
            continue
        question, answer, *rest = (part.strip() for part in body.split("\t"))
        if not question or not answer or len(rest) > 1:
            raise PipelineError(
                f"{where}: expected a question, a tab, the answer and optionally "
                f"a tab and supporting line numbers, received {body[:60]!r}"
            )
        supporting = []
        for item in (rest[0] if rest else "").split():
            if not item.isdigit() or int(item) not in statement_of:
                raise PipelineError(
                    f"{where}: a supporting fact must be the number of a "
                    f"statement before the question, received {item!r}"
                )
            supporting.append(statement_of[int(item)])
        examples.append(
            QAExample(
                tuple(story), question, answer, tuple(sorted(set(supporting))), task
            )
        )
    return examples


def _task_files(directory: Path) -> dict[int, dict[str, Path]]:
    """``{task: {"train": path, "test": path}}`` of the folder's bAbI files."""
    found: dict[int, dict[str, Path]] = {}
    for path in sorted(directory.iterdir()):
        match = _FILE.fullmatch(path.name)
        if match:
            split = found.setdefault(int(match[1]), {})
            if match[2] in split:
                raise PipelineError(
                    f"{directory}: two {match[2]} files for task {match[1]}: "
                    f"{split[match[2]].name} and {path.name}"
                )
            split[match[2]] = path
    return dict(sorted(found.items()))


def load_babi_files(
    directory: str | Path, valid_fraction: float = 0.1
) -> tuple[list[QAExample], list[QAExample], list[QAExample], list[str]]:
    """Training, validation and test questions of a folder of bAbI files.

    Every task with a ``qaN_*_train.txt`` and a ``qaN_*_test.txt`` (bAbI's
    names, e.g. its ``en/`` or ``en-10k/`` folder) is read, in task order;
    the last ``valid_fraction`` of each training file's questions is held
    out for validation, as MemN2N's reference code does.

    Returns:
        ``(train, valid, test, notes)`` as `pipelines.qa.babi.load_babi`.

    Raises:
        PipelineError: no such folder, no task with both files, or a file that
            is not bAbI text.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise PipelineError(
            f"{directory}: no such folder (expected a folder of bAbI files, "
            "qaN_*_train.txt and qaN_*_test.txt)"
        )
    files = {t: f for t, f in _task_files(directory).items() if len(f) == 2}
    if not files:
        raise PipelineError(
            f"{directory}: no bAbI task with both files (expected qaN_*_train.txt "
            "and qaN_*_test.txt, e.g. qa1_single-supporting-fact_train.txt)"
        )
    train: list[QAExample] = []
    valid: list[QAExample] = []
    test: list[QAExample] = []
    notes = []
    for task, paths in files.items():
        questions = read_babi_text(paths["train"], task)
        task_test = read_babi_text(paths["test"], task)
        held = round(len(questions) * valid_fraction)
        train += questions[: len(questions) - held]
        valid += questions[len(questions) - held :]
        test += task_test
        name = TASK_NAMES.get(task, "unknown task")
        notes.append(
            f"task {task} ({name}): {len(questions) - held} train, {held} valid "
            f"(the last of {paths['train'].name}), {len(task_test)} test"
        )
    return train, valid, test, notes


def write_babi_files(
    directory: str | Path,
    tasks: Sequence[int],
    size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
) -> list[Path]:
    """Write generated tasks as bAbI files, a training and a test file each.

    The training file holds `load_babi`'s training questions and then its
    validation ones, so `load_babi_files` (and MemN2N's code, which holds
    out the last 10%) splits them as `load_babi` does.

    Returns:
        The paths written, train then test for each task.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in tasks:
        train, valid, test, _ = load_babi(
            [task], size=size, test_size=test_size, seed=seed
        )
        for split, examples in (("train", train + valid), ("test", test)):
            path = directory / file_name(task, split)
            partial = path.with_name(path.name + ".partial")
            partial.write_text(to_babi_text(examples), encoding="utf-8")
            partial.replace(path)
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.qa.babi_text babi:1-3@1k FOLDER``: write
    generated tasks as bAbI files."""
    parser = argparse.ArgumentParser(
        description="Write generated bAbI-style tasks in bAbI's text format."
    )
    parser.add_argument("spec", help='the tasks and size, e.g. "babi:1-3@1k"')
    parser.add_argument("directory", help="the folder to write the files in")
    parser.add_argument(
        "--test-size", type=int, default=1000, help="test questions per task"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        tasks, size = parse_babi_spec(args.spec)
    except ValueError as error:
        parser.error(str(error))
    if args.test_size < 1:
        parser.error(f"--test-size must be positive, received {args.test_size}")
    for path in write_babi_files(
        args.directory, tasks, size, args.test_size, args.seed
    ):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

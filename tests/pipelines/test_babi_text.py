"""bAbI's text format (`pipelines.qa.babi_text`): the original files' layout
read by hand, our generated tasks written and read back unchanged, and the
errors a malformed file gets."""

from __future__ import annotations

import pytest

from pipelines.core.config import apply_overrides
from pipelines.core.errors import PipelineError
from pipelines.qa.babi import TASKS, QAExample, load_babi
from pipelines.qa.babi_text import (
    TASK_NAMES,
    file_name,
    load_babi_files,
    main,
    read_babi_text,
    to_babi_text,
    write_babi_files,
)

# The layout of the released files: questions numbered with the statements,
# a space before the tab after some questions, supporting facts that skip
# the question lines, a second story starting again at 1.
ORIGINAL = (
    "1 Mary moved to the bathroom.\n"
    "2 John went to the hallway.\n"
    "3 Where is Mary? \tbathroom\t1\n"
    "4 Daniel went back to the hallway.\n"
    "5 Sandra moved to the garden.\n"
    "6 Where is Daniel? \thallway\t4\n"
    "1 Mary got the milk there.\n"
    "2 John moved to the bedroom.\n"
    "3 Where is the milk?\tbathroom\t1 2\n"
)


def test_reads_the_original_layout(tmp_path):
    path = tmp_path / "qa1_single-supporting-fact_train.txt"
    path.write_text(ORIGINAL)
    first, second, third = read_babi_text(path, task=1)
    statements = ("Mary moved to the bathroom.", "John went to the hallway.")
    assert first == QAExample(statements, "Where is Mary?", "bathroom", (0,), 1)
    # The story is the statements before the question, not the earlier question.
    assert second.story == (
        *statements,
        "Daniel went back to the hallway.",
        "Sandra moved to the garden.",
    )
    assert second.supporting == (2,)  # line 4 is the third statement
    assert third.story == ("Mary got the milk there.", "John moved to the bedroom.")
    assert (third.answer, third.supporting) == ("bathroom", (0, 1))


def test_writing_regroups_the_stories(tmp_path):
    path = tmp_path / "qa1_single-supporting-fact_train.txt"
    path.write_text(ORIGINAL)
    examples = read_babi_text(path, task=1)
    assert to_babi_text(examples) == ORIGINAL.replace("? \t", "?\t")


@pytest.mark.parametrize("tasks", [[1, 2, 3], [6, 7, 8, 11, 15]])
def test_generated_tasks_round_trip(tmp_path, tasks):
    """Written as bAbI files and read back, the generated splits are those
    of `load_babi`: the same questions, stories, answers, supporting facts,
    tasks and order; validation is the last tenth of each training file."""
    paths = write_babi_files(tmp_path, tasks, size=60, test_size=30, seed=3)
    assert [p.name for p in paths[:2]] == [
        file_name(tasks[0], "train"),
        file_name(tasks[0], "test"),
    ]
    train, valid, test, notes = load_babi_files(tmp_path)
    assert (train, valid, test) == load_babi(tasks, 60, 30, seed=3)[:3]
    assert len(notes) == len(tasks)
    assert "54 train, 6 valid" in notes[0]
    # Stories are grouped: fewer question-free story starts than questions.
    text = paths[0].read_text()
    assert text.count("\n1 ") + 1 < len(
        [line for line in text.split("\n") if "?" in line]
    )


def test_file_names_are_babis():
    assert file_name(2, "train") == "qa2_two-supporting-facts_train.txt"
    assert file_name(4, "test") == "qa4_two-arg-relations_test.txt"
    assert file_name(6, "train") == "qa6_yes-no-questions_train.txt"
    assert file_name(8, "test") == "qa8_lists-sets_test.txt"
    assert file_name(20, "train") == "qa20_agents-motivations_train.txt"
    assert set(TASKS) <= set(TASK_NAMES) and len(TASK_NAMES) == 20
    assert all(TASK_NAMES[task] == name for task, name in TASKS.items())


@pytest.mark.parametrize(
    "text, words",
    [
        ("1 A.\nB went.\n", ["line 2", "expected a line number", "'B went.'"]),
        ("1 A.\n3 B.\n", ["line 2", "expected line number 1 (a new story) or 2", "3"]),
        ("1 A.\n2 Where?\t\t1\n", ["line 2", "a question, a tab, the answer"]),
        ("1 A.\n2 Where?\ta\t1\textra\n", ["line 2", "a question, a tab"]),
        ("1 A.\n2 Q?\ta\t1\n3 Where?\ta\t2\n", ["line 3", "received '2'"]),
        ("1 A.\n2 Where?\ta\t5\n", ["line 2", "a statement before", "'5'"]),
        ("1 A.\n2 Where?\ta\tx\n", ["line 2", "received 'x'"]),
    ],
)
def test_malformed_lines_name_the_line(tmp_path, text, words):
    path = tmp_path / "qa1_x_train.txt"
    path.write_text(text)
    with pytest.raises(PipelineError) as error:
        read_babi_text(path)
    message = str(error.value)
    assert message.startswith(str(path))
    for word in words:
        assert word in message


def test_folder_errors(tmp_path):
    with pytest.raises(PipelineError, match="no such folder"):
        load_babi_files(tmp_path / "absent")
    (tmp_path / "qa1_x_train.txt").write_text(ORIGINAL)
    with pytest.raises(PipelineError, match="no bAbI task with both files"):
        load_babi_files(tmp_path)  # no test file
    (tmp_path / "qa1_y_train.txt").write_text(ORIGINAL)
    (tmp_path / "qa1_x_test.txt").write_text(ORIGINAL)
    with pytest.raises(PipelineError, match="two train files for task 1"):
        load_babi_files(tmp_path)
    with pytest.raises(PipelineError, match="absent.txt: no such file"):
        read_babi_text(tmp_path / "absent.txt")


def test_text_that_cannot_be_written():
    example = QAExample(("A\tB.",), "Where?", "a", (0,), 1)
    with pytest.raises(ValueError, match="statement must be non-blank text without"):
        to_babi_text([example])
    with pytest.raises(ValueError, match="answer"):
        to_babi_text([QAExample(("A.",), "Where?", "a\nb", (0,), 1)])


def test_command_line(tmp_path, capsys):
    assert main(["babi:1,6@40", str(tmp_path), "--test-size", "10"]) == 0
    printed = capsys.readouterr().out.split()
    assert [p.rsplit("/", 1)[-1] for p in printed] == [
        "qa1_single-supporting-fact_train.txt",
        "qa1_single-supporting-fact_test.txt",
        "qa6_yes-no-questions_train.txt",
        "qa6_yes-no-questions_test.txt",
    ]
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(SystemExit):
        main(["babi:4", str(tmp_path)])
    assert "task 4 is not available" in capsys.readouterr().err


@pytest.mark.tf_only
def test_qa_pipeline_reads_a_folder(tmp_path):
    """``data.source=babi-text:FOLDER`` gives the pipeline the same splits as
    the generated source, and its export's sample stories come from the
    test file."""
    from pipelines.qa.config import preset
    from pipelines.qa.task import TASK

    write_babi_files(tmp_path, [1, 6], size=100, test_size=20)
    generated = TASK.load_data(
        apply_overrides(
            preset("tiny"), ["data.source=babi:1,6@100", "data.test_size=20"]
        )
    )
    config = apply_overrides(preset("tiny"), [f"data.source=babi-text:{tmp_path}"])
    read = TASK.load_data(config)
    assert (read.train, read.valid, read.test) == (
        generated.train,
        generated.valid,
        generated.test,
    )
    samples = TASK.samples(config)
    first = read.test[0]
    assert samples[0] == "\n".join((*first.story, first.question))
    bad = apply_overrides(preset("tiny"), [f"data.source=babi-text:{tmp_path}/none"])
    with pytest.raises(PipelineError, match="no such folder"):
        TASK.load_data(bad)

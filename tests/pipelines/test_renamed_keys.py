"""Renamed names keep loading: config keys (`RunConfig.RENAMED`) and the QA
file's story field, each with one deprecation line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import yaml

from pipelines import registry
from pipelines.core import config as config_lib
from pipelines.core.config import RunConfig, apply_overrides, from_dict
from pipelines.core.errors import ConfigError
from pipelines.core.run_dir import RunDir
from pipelines.core.run_guard import check_run, run_config
from pipelines.qa.babi import QAExample, read_qa_jsonl

pytestmark = pytest.mark.tf_only  # a TensorFlow pipeline: its tests run once

RENAMED_TASKS = ("translation", "summarization")
CORPUS_WARNING = (
    "warning: config key `data.corpus` is deprecated, use `data.source` (from {})."
)


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    """Each test starts as a new process would: no notice printed yet."""
    monkeypatch.setattr(config_lib, "_NOTICED", set())


def warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("name", RENAMED_TASKS)
def test_set_old_key_is_read_as_the_new_and_warns_once(name, capsys):
    task = registry.get(name)
    base = config_lib.preset(task.presets(), "tiny")
    config = apply_overrides(base, ["data.corpus=tsv:pairs.tsv"])
    assert config.data.source == "tsv:pairs.tsv"
    again = apply_overrides(config, ["data.corpus=tsv:other.tsv", "data.seed=3"])
    assert (again.data.source, again.data.seed) == ("tsv:other.tsv", 3)
    assert warnings(capsys.readouterr().err) == [
        CORPUS_WARNING.format("--set data.corpus=tsv:pairs.tsv")
    ]
    assert "corpus" not in config_lib.to_dict(config)["data"]
    fresh = apply_overrides(base, ["data.source=tsv:pairs.tsv"])
    assert fresh == config
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", RENAMED_TASKS)
def test_old_run_folder_config_loads_and_keeps_its_fingerprint(name, tmp_path, capsys):
    task = registry.get(name)
    config = apply_overrides(
        config_lib.preset(task.presets(), "tiny"), ["data.source=tsv:pairs.tsv"]
    )
    old = config_lib.to_dict(config)
    old["data"] = {"corpus": old["data"].pop("source"), **old["data"]}
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.config_path.write_text(yaml.safe_dump(old, sort_keys=False))
    run.write_state(task=name, fingerprint="from an older version", status="finished")
    assert run_config(task, run) == config
    assert check_run(task, config, run)["status"] == "finished"  # not refused
    assert warnings(capsys.readouterr().err) == [CORPUS_WARNING.format(run.config_path)]
    config_lib.save(config, run.config_path)  # a rerun writes the new name
    assert "source:" in run.config_path.read_text()
    assert run_config(task, run) == config


def test_old_and_new_key_together_are_refused(tmp_path):
    task = registry.get("translation")
    values = {"preset": "tiny", "data": {"corpus": "bible", "source": "ding"}}
    with pytest.raises(ConfigError, match=r"`data.corpus` is the old name of `data"):
        from_dict(values, task.presets(), origin="old.yaml")


@pytest.mark.parametrize(
    "name, item",
    [
        ("translation", "data.corpse=bible"),
        ("summarization", "data.corpora=debian"),
        ("qa", "data.corpus=babi:1"),  # qa never had the old name
        ("translation", "corpus=bible"),
    ],
)
def test_unknown_keys_still_error(name, item, capsys):
    task = registry.get(name)
    key = item.split("=")[0]
    with pytest.raises(ConfigError, match=f"unknown key `{key}`, from --set {item}"):
        apply_overrides(config_lib.preset(task.presets(), "tiny"), [item])
    assert capsys.readouterr().err == ""


@dataclass
class ToyModel:
    units: int = 8


@dataclass
class ToyConfig(RunConfig):
    model: ToyModel = field(default_factory=ToyModel)
    RENAMED: ClassVar[dict[str, str]] = {"units": "model.units"}


def test_a_key_may_move_to_another_section(capsys):
    config = from_dict(
        {"units": 16}, {"toy": ToyConfig}, origin="toy.yaml", default="toy"
    )
    assert config.model.units == 16
    assert warnings(capsys.readouterr().err) == [
        "warning: config key `units` is deprecated, use `model.units` (from toy.yaml)."
    ]


def _qa_file(tmp_path, field_name: str):
    path = tmp_path / f"{field_name}.jsonl"
    rows = [
        {field_name: ["Mary went to the garden."], "question": "Where is Mary?"},
        {field_name: "John took the milk.\nJohn went home.", "question": "Where?"},
    ]
    lines = [json.dumps({**row, "answer": "garden"}) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_qa_file_with_context_loads_with_one_warning(tmp_path, capsys):
    new = read_qa_jsonl(_qa_file(tmp_path, "story"))
    assert capsys.readouterr().err == ""
    path = _qa_file(tmp_path, "context")
    assert read_qa_jsonl(path) == new
    assert read_qa_jsonl(path) == new  # read again: no second line
    assert warnings(capsys.readouterr().err) == [
        f'warning: field "context" is deprecated, use "story" (from {path}).'
    ]
    assert new[1] == QAExample(
        ("John took the milk.", "John went home."), "Where?", "garden", ()
    )

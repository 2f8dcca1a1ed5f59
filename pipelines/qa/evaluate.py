"""Scoring a question-answering export: accuracy, and whether the attention found
the supporting facts.

* ``accuracy`` overall and per bAbI task (``task_N``), beside the published
  MemN2N error of that task (1k, 3 hops, PE LS RN; Sukhbaatar et al. 2015,
  table 1). Our stories come from our own generator, not the original data.
* ``attention_hit``: per hop, the share of questions with supporting facts
  whose most-attended sentence is one of them (and per task), plus
  ``attention_hit_any``: the share where some hop's peak is on one.
* ``baselines``: ``most_common_answer``, the training split's most common
  answer given to every question, its ``accuracy`` over the split (and in
  each task's entry, over that task's questions).
* ``answers.tsv`` (every question, its answer, the prediction and each
  hop's most-attended sentence) and ``plots/attention_*.png``.

Example:

>>> import numpy as np
>>> attention = np.array([[[0.1, 0.9], [0.8, 0.2]]])  # 1 question, 2 hops
>>> attention_hits(attention, [(1,)])
array([[ True, False]])
>>> baseline = most_common_answer(["garden", "yes", "garden"], ["garden", "no"])
>>> baseline["answer"], baseline["accuracy"]
('garden', 0.5)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# MemN2N test error (%) on the 1k bAbI tasks: 3 hops, PE LS RN (table 1).
MEMN2N_1K_ERROR = {1: 0.1, 2: 8.2, 3: 41.8, 6: 7.9, 7: 20.3, 8: 11.7, 11: 0.7, 15: 0.0}


def most_common_answer(train_answers: Sequence[str], truth: Sequence[str]) -> dict:
    """The ``most_common_answer`` baseline: the most common of
    ``train_answers`` (the training split's) for every question, and the
    share of ``truth`` it gets right (as ``accuracy`` counts the model's)."""
    from pipelines.core.baselines import most_common

    answer = most_common(train_answers)
    right = sum(answer == t for t in truth)
    return {
        "what": f"the most common training answer ({answer!r}) for every question",
        "answer": answer,
        "accuracy": right / len(truth) if truth else 0.0,
    }


def attention_hits(attention: np.ndarray, supporting: Sequence[Sequence[int]]):
    """``[N, hops]`` bool: is hop ``h``'s most-attended sentence a supporting
    fact? (False where a question has none, or a hop attends to nothing.)"""
    attention = np.asarray(attention)
    if not attention.shape[-1]:
        return np.zeros(attention.shape[:2], bool)
    peaks = attention.argmax(axis=-1)
    hits = np.zeros(attention.shape[:2], bool)
    for i, facts in enumerate(supporting):
        if facts:
            hits[i] = np.isin(peaks[i], list(facts)) & (attention[i].max(-1) > 0)
    return hits


def memory_attention_plot(
    sentences, attention, path, supporting=(), title: str = "", columns=None
) -> Path:
    """The story's sentences (rows) by hops (columns; or the encoder-decoder's
    steps, named by ``columns``), the attention as colour (and as numbers, up
    to 40 sentences); supporting facts are starred."""
    from pipelines.core.plots import _pyplot, _save

    plt = _pyplot()
    sentences = [
        s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in sentences
    ]
    sentences = [s for s in sentences if s]
    attention = np.asarray(attention)
    if columns is not None:
        attention = attention[: len(columns)]
    weights = attention[:, : len(sentences)].T  # [S, hops]
    labels = [("* " if i in supporting else "") + s for i, s in enumerate(sentences)]
    height = min(18.0, max(2.5, 0.28 * len(sentences) + 1.3))
    fig, ax = plt.subplots(figsize=(7.5, height), dpi=110)
    ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    columns = columns or [f"hop {h + 1}" for h in range(weights.shape[1])]
    ax.set_xticks(range(weights.shape[1]), columns, rotation=20, fontsize=8)
    for i in range(len(labels)):
        if i in supporting:
            ax.get_yticklabels()[i].set_fontweight("bold")
        if len(labels) <= 40:
            for hop, value in enumerate(weights[i]):
                colour = "black" if value > 0.6 else "white"
                ax.text(hop, i, f"{value:.2f}", ha="center", va="center",
                        fontsize=7, color=colour)  # fmt: skip
    if title:
        ax.set_title(title, fontsize=9)
    return _save(plt, fig, path)


def plot_attention(answerer, config, examples, folder) -> list[Path]:
    """``attention_{i}.png``: each example's story by hops (or written
    steps), the attention the export gives, supporting facts starred."""
    import tensorflow as tf

    from pipelines.qa.babi import format_story
    from pipelines.qa.serving import step_labels

    if not examples:
        return []
    out = answerer.traced_answer()(
        tf.constant([format_story(e) for e in examples]),
        tf.constant([e.question for e in examples]),
    )
    out = {k: v.numpy() for k, v in out.items()}
    labels = step_labels(out)
    return [
        memory_attention_plot(
            list(example.story),
            out["attention"][i],
            Path(folder) / f"attention_{i}.png",
            supporting=set(example.supporting),
            title=f"{example.question} -> {out['answer'][i].decode('utf-8')} "
            f"(truth: {example.answer})",
            columns=labels[i],
        )  # fmt: skip
        for i, example in enumerate(examples)
    ]


def evaluate(run_root, answerer, config, examples, split: str, heatmaps: int = 3,
             train_answers: Sequence[str] | None = None):  # fmt: skip
    """Answer ``examples`` with a `StoryAnswerer`; returns metrics.json's body.

    ``train_answers`` (the training split's answers, loaded from ``config``
    when not given) give the ``most_common_answer`` baseline.
    """
    import tensorflow as tf

    from pipelines.core.run_dir import write_text
    from pipelines.qa.babi import format_story
    from pipelines.qa.babi_text import TASK_NAMES
    from pipelines.qa.serving import attention_rows

    fn = answerer.traced_answer()
    size = config.model.eval_batch_size
    predicted, scores, hits, peaks = [], [], [], []
    for start in range(0, len(examples), size):
        chunk = examples[start : start + size]
        out = fn(
            story=tf.constant([format_story(e) for e in chunk]),
            question=tf.constant([e.question for e in chunk]),
        )
        attention = out["attention"].numpy()
        predicted += [a.decode("utf-8") for a in out["answer"].numpy()]
        scores += out["score"].numpy().tolist()
        hits.append(attention_hits(attention, [e.supporting for e in chunk]))
        # Each hop's (or written step's) most-attended sentence; none for a
        # row that attends to nothing (after [END], or an unanswerable row).
        peaks += [
            [int(r.argmax()) for r in row if r.size and r.max() > 0]
            for row in attention
        ]
    shape = (0, attention_rows(config))
    hits = np.concatenate(hits) if hits else np.zeros(shape, bool)
    truth = [e.answer for e in examples]
    correct = np.array([p == t for p, t in zip(predicted, truth, strict=True)])
    has_facts = np.array([bool(e.supporting) for e in examples])
    metrics: dict = {"split": split, "run": config.name, "questions": len(examples)}
    metrics["attention_rows"] = (
        "step" if config.model.architecture == "encoder_decoder" else "hop"
    )
    metrics["accuracy"] = float(correct.mean()) if len(correct) else 0.0
    if train_answers is None:
        from pipelines.qa.data import load_data

        train_answers = [e.answer for e in load_data(config).train]
    baseline = most_common_answer(train_answers, truth)
    metrics["baselines"] = {"most_common_answer": baseline}
    metrics.update(_attention_metrics(hits, has_facts))
    by_task = defaultdict(list)
    for i, e in enumerate(examples):
        by_task[e.task].append(i)
    tasks = {}
    for task, rows in sorted(by_task.items()):
        rows = np.array(rows)
        right = [examples[i].answer == baseline["answer"] for i in rows]
        entry = {
            "questions": len(rows),
            "accuracy": float(correct[rows].mean()),
            "baselines": {"most_common_answer": {"accuracy": float(np.mean(right))}},
            **_attention_metrics(hits[rows], has_facts[rows]),
        }
        if task in MEMN2N_1K_ERROR:
            entry["memn2n_1k_error"] = MEMN2N_1K_ERROR[task]
        tasks[str(task)] = entry
    metrics["tasks"] = tasks
    root = Path(run_root)
    rows = ["task\tstory\tquestion\tanswer\tpredicted\tscore\tsupporting\tpeaks"]
    for e, p, s, peak in zip(examples, predicted, scores, peaks, strict=True):
        story = " / ".join(e.story).replace("\t", " ")
        facts = ",".join(map(str, e.supporting))
        rows.append(
            f"{e.task}\t{story}\t{e.question}\t{e.answer}\t{p}\t{s:.4f}\t{facts}\t"
            + ",".join(map(str, peak))
        )
    write_text(root / "answers.tsv", "\n".join(rows) + "\n")
    plot_attention(answerer, config, examples[:heatmaps], root / "plots")
    print(
        f"Scores on the {len(examples)} {split} questions, beside a trivial "
        f"baseline:\n{report(metrics, TASK_NAMES)}"
    )
    return metrics


def _attention_metrics(hits: np.ndarray, has_facts: np.ndarray) -> dict:
    if not has_facts.any():
        return {}
    graded = hits[has_facts]
    return {
        "attention_hit": [float(v) for v in graded.mean(axis=0)],
        "attention_hit_any": float(graded.any(axis=1).mean()),
    }


def _baseline_accuracy(entry: dict) -> str:
    """The ``most_common_answer`` accuracy of a metrics entry, or ``-``."""
    baseline = entry.get("baselines", {}).get("most_common_answer")
    return "-" if baseline is None else f"{baseline['accuracy']:.1%}"


def report(metrics: dict, names: dict[int, str]) -> str:
    """The per-task table ``evaluate`` prints: the model's accuracy beside
    the ``most_common_answer`` baseline's, and the published error."""
    lines = [
        f"{'task':<28} {'questions':>9} {'accuracy':>9} {'most common':>11} "
        f"{'error':>7} {'MemN2N 1k':>9}  attention on a supporting fact, per "
        + metrics.get("attention_rows", "hop")
    ]
    for task, entry in metrics["tasks"].items():
        name = f"{task} {names.get(int(task), 'user data')}"
        reference = entry.get("memn2n_1k_error")
        reference = "-" if reference is None else f"{reference:.1f}%"
        hit = entry.get("attention_hit")
        hit = " ".join(f"{v:.1%}" for v in hit) if hit else "-"
        lines.append(
            f"{name:<28} {entry['questions']:>9} {entry['accuracy']:>9.1%} "
            f"{_baseline_accuracy(entry):>11} {1 - entry['accuracy']:>7.1%} "
            f"{reference:>9}  {hit}"
        )
    lines.append(
        f"{'all':<28} {metrics['questions']:>9} {metrics['accuracy']:>9.1%} "
        f"{_baseline_accuracy(metrics):>11} {1 - metrics['accuracy']:>7.1%}"
    )
    baseline = metrics.get("baselines", {}).get("most_common_answer")
    if baseline is not None:
        lines.append(f"most common: {baseline['what']}")
    return "\n".join(lines)

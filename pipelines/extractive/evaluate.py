"""Scoring an extractive export: SQuAD exact match and F1, and span heatmaps.

* ``exact_match`` and ``f1``: SQuAD's scores (`pipelines.core.metrics`:
  lowercase, no punctuation or articles, best over the gold answers), over
  the split, and by group: ``by_phrasing`` (``seen`` questions are worded as
  in training, ``held_out`` in wordings only the test split has) and
  ``by_field`` (capital, borders, ...).
* ``baselines``: ``most_common_answer``, the training split's most common
  answer given to every question, with the same exact match and F1.
* ``answers.tsv``: every question, its gold answers, the prediction, its
  score and F1; ``plots/span_*.png``: the passage with each token shaded by
  the model's start and end probabilities, the gold answer boxed.

Example:

>>> group_scores(["Paris", "x"], [["Paris"], ["Rome"]], ["capital", "capital"])
{'capital': {'count': 2, 'exact_match': 50.0, 'f1': 50.0}}
>>> baseline = most_common_answer(["Africa", "Paris", "Africa"],
...                               [["Africa"], ["Europe", "Africa"], ["Rome"]])
>>> baseline["answer"], baseline["exact_match"]
('Africa', 66.67)
"""

from __future__ import annotations

import csv
import io
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipelines.core.run_dir import write_text

ROWS = (("exact match", "exact_match", ".2f"), ("F1", "f1", ".2f"))


def group_scores(predictions, golds, groups) -> dict:
    """SQuAD exact match and F1 of each group of questions."""
    from pipelines.core import metrics

    members = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    out = {}
    for group, rows in sorted(members.items()):
        scores = metrics.score(
            ["squad_exact_match", "squad_f1"],
            [predictions[i] for i in rows],
            [golds[i] for i in rows],
        )
        out[group] = {
            "count": len(rows),
            "exact_match": scores["squad_exact_match"],
            "f1": scores["squad_f1"],
        }
    return out


def most_common_answer(train_answers: Sequence[str], golds: Sequence) -> dict:
    """The ``most_common_answer`` baseline: the most common of
    ``train_answers`` (the training split's first gold answers) for every
    question, scored against ``golds`` as the model's answers are."""
    from pipelines.core.baselines import most_common

    answer = most_common(train_answers)
    scores = group_scores([answer] * len(golds), golds, ["all"] * len(golds))
    scores = scores.get("all", {"exact_match": 0.0, "f1": 0.0})
    return {
        "what": f"the most common training answer ({answer!r}) for every question",
        "answer": answer,
        "exact_match": scores["exact_match"],
        "f1": scores["f1"],
    }


def span_heatmap(
    tokens, start_p, end_p, path, gold=None, title: str = "",
    shade: str = "p(start) + p(end)",
) -> Path:  # fmt: skip
    """The passage's tokens, wrapped, each shaded by ``p(start) + p(end)``
    (what the legend calls ``shade``);
    the gold span's tokens boxed in green (``gold``: first and last index).
    The legend names the green box only when one is drawn: not without
    ``gold`` (``predict`` knows no gold answer), nor when the gold span lies
    past the tokens shown (a passage cut at ``max_context_tokens``)."""
    from pipelines.core.plots import _pyplot, _save

    plt = _pyplot()
    tokens = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in tokens]
    weight = np.clip(np.asarray(start_p) + np.asarray(end_p), 0.0, 1.0)
    width, margin, gap, line_height = 9.0, 0.2, 0.06, 0.3  # inches
    fig = plt.figure(figsize=(width, 2.0), dpi=110)
    renderer = fig.canvas.get_renderer()
    places, x, line = [], margin, 0
    for token in tokens:  # lay out in inches, wrapping at the right margin
        probe = fig.text(0, 0, token, fontsize=8)
        size = probe.get_window_extent(renderer).width / fig.dpi
        probe.remove()
        if x + size > width - margin and x > margin:
            x, line = margin, line + 1
        places.append((x, line))
        x += size + gap
    height = line_height * (line + 1) + 0.9
    fig.set_size_inches(width, height)
    cmap = plt.get_cmap("OrRd")
    boxed_any = False
    for i, (token, (x, line)) in enumerate(zip(tokens, places, strict=True)):
        boxed = gold is not None and gold[0] <= i <= gold[1]
        boxed_any = boxed_any or boxed
        fig.text(
            x, height - 0.75 - line * line_height, token, fontsize=8,
            va="center", transform=fig.dpi_scale_trans,
            bbox={
                "facecolor": cmap(0.85 * weight[i]),
                "edgecolor": "green" if boxed else "none",
                "linewidth": 1.2, "pad": 1.0,
            },
        )  # fmt: skip
    fig.suptitle(
        (title + "\n" if title else "")
        + f"shade: {shade}"
        + ("; green box: the gold answer" if boxed_any else ""),
        fontsize=8,
    )
    return _save(plt, fig, path)


def _heatmap(answerer, example, path, gold_span, prediction) -> Path:
    import tensorflow as tf

    features, _ = answerer.inputs(
        tf.constant([example.context]), tf.constant([example.question])
    )
    out = answerer.scorer(features, training=False)
    start_p = tf.nn.softmax(tf.cast(out["start"][0], tf.float32)).numpy()
    end_p = tf.nn.softmax(tf.cast(out["end"][0], tf.float32)).numpy()
    tokens = answerer.tokenizer.split([example.context])[0][0].numpy()
    tokens = tokens[: answerer.max_context]
    return span_heatmap(
        tokens, start_p[: len(tokens)], end_p[: len(tokens)], path,
        gold=gold_span if gold_span[0] >= 0 else None,
        title=f"{example.question} -> {prediction!r} (gold {example.answers[0]!r})",
    )  # fmt: skip


def evaluate(
    root, answerer, config, examples: Sequence, split: str, heatmaps: int = 3,
    train_answers: Sequence[str] | None = None,
) -> dict:  # fmt: skip
    """Answer ``examples`` with ``answerer`` (a `SpanAnswerer`); write
    ``answers.tsv`` and the heatmaps in ``root``; print the scores beside
    the baseline's; return the metrics.

    ``train_answers`` (the training split's first gold answers, loaded from
    ``config`` when not given) give the ``most_common_answer`` baseline.
    """
    import tensorflow as tf

    from pipelines.core.baselines import table

    serve = answerer.traced_answer()
    t0 = time.time()
    predictions, scores = [], []
    size = config.model.eval_batch_size
    for i in range(0, len(examples), size):
        chunk = examples[i : i + size]
        out = serve(
            tf.constant([e.context for e in chunk]),
            tf.constant([e.question for e in chunk]),
        )
        predictions += [a.decode("utf-8") for a in out["answer"].numpy()]
        scores += out["score"].numpy().tolist()
    print(f"Answered {len(examples)} questions in {time.time() - t0:.1f} s")
    golds = [list(e.answers) for e in examples]
    overall = group_scores(predictions, golds, ["all"] * len(examples)).get(
        "all", {"count": 0, "exact_match": 0.0, "f1": 0.0}
    )
    phrasing = ["seen" if e.phrasing_seen else "held_out" for e in examples]
    metrics = {
        "split": split,
        "questions": len(examples),
        "exact_match": overall["exact_match"],
        "f1": overall["f1"],
        "by_phrasing": group_scores(predictions, golds, phrasing),
        "by_field": group_scores(
            predictions, golds, [e.field or "-" for e in examples]
        ),
    }
    if train_answers is None:
        from pipelines.extractive.data import load_data

        train_answers = [e.answers[0] for e in load_data(config).train]
    baseline = most_common_answer(train_answers, golds)
    metrics["baselines"] = {"most_common_answer": baseline}
    phrasings = "; ".join(
        f"{'held-out' if name == 'held_out' else name} phrasings ({group['count']}): "
        f"exact match {group['exact_match']:.2f}, F1 {group['f1']:.2f}"
        for name, group in metrics["by_phrasing"].items()
    )
    print(
        f"Scores on the {len(examples)} {split} questions (SQuAD exact match and "
        "F1, 0-100), beside a trivial baseline:\n"
        + table({"model": metrics}, metrics["baselines"], ROWS)
        + (f"\n  by phrasing: {phrasings}" if phrasings else "")
    )
    root = Path(root)
    _write_answers(root / "answers.tsv", examples, predictions, scores)
    plot_attention(answerer, config, examples[:heatmaps], root / "plots",
                   predictions[:heatmaps])  # fmt: skip
    return metrics


def plot_attention(answerer, config, examples, folder, predictions=None) -> list[Path]:
    """``span_{k}.png``: each example's passage shaded by the span scores,
    its gold answer boxed (`span_heatmap`); ``predictions`` (the answers)
    are asked of the export where not given."""
    import tensorflow as tf

    from pipelines.extractive.data import token_span

    if not examples:
        return []
    if predictions is None:
        out = answerer.traced_answer()(
            tf.constant([e.context for e in examples]),
            tf.constant([e.question for e in examples]),
        )
        predictions = [a.decode("utf-8") for a in out["answer"].numpy()]
    paths = []
    for k, example in enumerate(examples):
        tokens = answerer.tokenizer.split([example.context])
        begins, ends = (t[0].numpy()[: answerer.max_context] for t in tokens[1:])
        paths.append(_heatmap(
            answerer, example, Path(folder) / f"span_{k}.png",
            token_span(example, begins, ends), predictions[k],
        ))  # fmt: skip
    return paths


def _write_answers(path: Path, examples, predictions, scores) -> None:
    from pipelines.core.metrics import answer_f1

    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(
        ["question", "gold", "prediction", "score", "f1", "field", "phrasing_seen"]
    )
    for example, prediction, score in zip(examples, predictions, scores, strict=True):
        f1 = max(answer_f1(prediction, gold) for gold in example.answers)
        writer.writerow([
            example.question, " | ".join(example.answers), prediction,
            f"{score:.4f}", f"{f1:.3f}", example.field, example.phrasing_seen,
        ])  # fmt: skip
    write_text(path, out.getvalue())

"""Score a trained translator on a held-out split: BLEU, chrF, length buckets, heatmaps.

Beside each decoding's scores, two trivial baselines scored the same way on
the same sentences (``baselines`` in ``metrics.json``): ``copy_source``, the
source sentence itself (lowercased, as the references are) as its
translation, and ``most_common_target``, the training split's most common
target sentence for every source. Writes ``translations.tsv`` (the source,
the reference and one column per decoding) and ``plots/alignment_*.png`` in
the run folder; returns the body of ``metrics.json``.

Example:

>>> out = baselines(["le 5 mai 2001", "2002"], ["2001-05-05", "2002"],
...                 ["2002", "1999-01-01", "2002"])
>>> out["copy_source"]["exact_match"], out["most_common_target"]["answer"]
(0.5, '2002')
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipelines.core.baselines import most_common, table
from pipelines.core.metrics import bleu_by_length, corpus_scores
from pipelines.core.plots import alignment_heatmap
from pipelines.core.run_dir import write_text
from pipelines.core.search import check_beam_widths

TRANSLATIONS = "translations.tsv"
ROWS = (("BLEU", "bleu", ".2f"), ("chrF", "chrf", ".2f"),
        ("exact match", "exact_match", ".2%"))  # fmt: skip


def decode_strings(values) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def translate_texts(
    translator,
    texts: list[str],
    beam_width: int,
    batch_size: int,
    progress: bool = True,
) -> dict[str, np.ndarray]:
    """Translate in batches with one traced graph; outputs as numpy arrays."""
    fn = translator.traced_translate()
    alpha = tf.constant(translator.default_length_penalty, tf.float32)
    bar = None
    if progress:  # a live bar on a terminal, one line at the end otherwise
        verbose = 1 if sys.stdout.isatty() else 2
        bar = keras.utils.Progbar(len(texts), verbose=verbose, unit_name="sentence")
    parts: dict[str, list] = {}
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        out = fn(tf.constant(batch), tf.constant(beam_width, tf.int32), alpha)
        for key in ("translation", "score", "length"):
            parts.setdefault(key, []).append(out[key].numpy())
        if bar is not None:
            bar.add(len(batch))
    return {k: np.concatenate(v) for k, v in parts.items()}


def baselines(
    sources: list[str], references: list[str], train_targets: list[str]
) -> dict:
    """``copy_source`` and ``most_common_target`` (of ``train_targets``),
    scored as `corpus_scores` scores a decoding, against ``references``."""
    common = most_common(t.lower() for t in train_targets)
    answers = {
        "copy_source": (
            "the source sentence itself, lowercased, as its translation",
            [s.lower() for s in sources],
        ),
        "most_common_target": (
            f"the most common training target ({common!r}) for every source",
            [common] * len(references),
        ),
    }
    out = {}
    for name, (what, hypotheses) in answers.items():
        scores = corpus_scores(hypotheses, references)
        out[name] = {"what": what, **{key: scores[key] for _, key, _ in ROWS}}
    out["most_common_target"]["answer"] = common
    return out


def training_targets(config) -> list[str]:
    """The target side of the training split ``config`` loads."""
    from pipelines.translation.data import load_data

    return [target for _, target in load_data(config).train]


def evaluate(
    run_dir: Path,
    translator,
    config,
    pairs: list[tuple[str, str]],
    split: str,
    beam_widths: tuple[int, ...] | None = None,
    heatmaps: int = 3,
    train_targets: list[str] | None = None,
) -> dict:
    """Translate ``pairs`` greedily and with beams; write the TSV and plots.

    ``train_targets`` (the training split's targets, loaded from ``config``
    when not given) give the ``most_common_target`` baseline.
    """
    run_dir = Path(run_dir)
    sources = [s for s, _ in pairs]
    references = [t.lower() for _, t in pairs]  # the models write lowercase
    beam_widths = check_beam_widths(beam_widths, config.decode)
    results: dict = {"split": split, "run": config.name, "decoding": {}}
    columns: dict[str, list[str]] = {}
    for width in beam_widths:
        name = "greedy" if width == 1 else f"beam{width}"
        print(f"Translating {len(sources)} {split} sentences ({name})")
        t0 = time.time()
        out = translate_texts(translator, sources, width, config.decode.eval_batch_size)
        hypotheses = decode_strings(out["translation"])
        scores = corpus_scores(hypotheses, references)
        scores["seconds"] = round(time.time() - t0, 1)
        scores["by_source_length"] = bleu_by_length(sources, hypotheses, references)
        results["decoding"][name] = scores
        columns[name] = hypotheses
        print(f"  {name} done in {scores['seconds']} s")
    if train_targets is None:
        train_targets = training_targets(config)
    results["baselines"] = baselines(sources, references, train_targets)
    print(
        f"Scores on the {len(sources)} {split} sentences, beside trivial baselines:\n"
        + table(results["decoding"], results["baselines"], ROWS)
    )
    lines = ["\t".join(["source", "reference", *columns])]
    for i, (source, reference) in enumerate(zip(sources, references, strict=True)):
        row = [source, reference] + [column[i] for column in columns.values()]
        lines.append("\t".join(x.replace("\t", " ") for x in row))
    write_text(run_dir / TRANSLATIONS, "\n".join(lines) + "\n")
    results["heatmaps"] = [
        str(p) for p in plot_samples(translator, sources[:heatmaps], run_dir / "plots")
    ]
    return results


def plot_samples(translator, texts: list[str], folder: Path) -> list[Path]:
    """One alignment heatmap per text (the model's default decoding)."""
    if not texts:
        return []
    out = translator.traced_translate()(
        tf.constant(texts),
        tf.constant(translator.default_beam_width, tf.int32),
        tf.constant(translator.default_length_penalty, tf.float32),
    )
    paths = []
    for i, text in enumerate(texts):
        translation = out["translation"][i].numpy().decode("utf-8")
        paths.append(
            alignment_heatmap(
                out["source_tokens"][i].numpy(),
                out["target_tokens"][i].numpy(),
                np.asarray(out["alignment"][i]),
                folder / f"alignment_{i}.png",
                title=f"{text[:60]!r} -> {translation[:60]!r}",
            )
        )
    return paths

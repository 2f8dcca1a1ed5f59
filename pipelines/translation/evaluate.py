"""Score a trained translator on a held-out split: BLEU, chrF, length buckets, heatmaps.

Writes ``translations.tsv`` (the source, the reference and one column per
decoding) and ``plots/alignment_*.png`` in the run folder; returns the body
of ``metrics.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipelines.core.metrics import bleu_by_length, corpus_scores
from pipelines.core.plots import alignment_heatmap
from pipelines.core.run_dir import write_text
from pipelines.core.search import check_beam_widths

TRANSLATIONS = "translations.tsv"


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


def evaluate(
    run_dir: Path,
    translator,
    config,
    pairs: list[tuple[str, str]],
    split: str,
    beam_widths: tuple[int, ...] | None = None,
    heatmaps: int = 3,
) -> dict:
    """Translate ``pairs`` greedily and with beams; write the TSV and plots."""
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
        print(
            f"  {name}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  "
            f"exact match {scores['exact_match']:.2%}  ({scores['seconds']} s)"
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

"""Score a trained run on its held-out split: BLEU, chrF, length buckets, heatmaps."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipelines.core.metrics import bleu_by_length, corpus_scores
from pipelines.core.plots import alignment_heatmap
from pipelines.translation.run import (
    decode_strings,
    load_splits,
    load_translator,
    translate_texts,
    write_json,
)


def evaluate(
    run_dir: str | Path,
    split: str = "test",
    beam_widths: tuple[int, ...] | None = None,
    limit: int | None = None,
    heatmaps: int = 3,
) -> dict:
    """Translate ``split`` greedily and with beams; write metrics.json and plots."""
    run_dir = Path(run_dir)
    translator, config = load_translator(run_dir)
    pairs = getattr(load_splits(config), split)
    if limit:
        pairs = pairs[:limit]
    sources = [s for s, _ in pairs]
    references = [t.lower() for _, t in pairs]  # the models write lowercase
    if beam_widths is None:
        beam_widths = tuple(sorted({1, config.decode.default_beam_width}))
    results: dict = {"split": split, "run": config.name, "decoding": {}}
    rows = []
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
        print(
            f"  {name}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  "
            f"exact match {scores['exact_match']:.2%}  ({scores['seconds']} s)"
        )
        rows = list(zip(sources, references, hypotheses, strict=True))
    with open(run_dir / "translations.tsv", "w", encoding="utf-8") as f:
        f.write("source\treference\ttranslation\n")
        for row in rows:
            f.write("\t".join(x.replace("\t", " ") for x in row) + "\n")
    results["heatmaps"] = [
        str(p) for p in plot_samples(translator, sources[:heatmaps], run_dir / "plots")
    ]
    write_json(run_dir / "metrics.json", results)
    return results


def plot_samples(translator, texts: list[str], folder: Path) -> list[Path]:
    """One alignment heatmap per text (the model's default decoding)."""
    if not texts:
        return []
    out = translator.translate(tf.constant(texts))
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

"""Plots people would rather look at than read: alignments and BLEU by length."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.core.run_dir import partial_name


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(partial_name(path.name) + path.suffix)
    try:
        fig.savefig(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
    return path


def _clean(tokens) -> list[str]:
    out = []
    for t in tokens:
        t = t.decode("utf-8") if isinstance(t, bytes) else str(t)
        out.append("␣" if t == " " else t)
    return out


def alignment_heatmap(
    source_tokens, target_tokens, weights, path: str | Path, title: str = ""
) -> Path:
    """Source tokens (x) by target tokens (y), the attention weights as colour.

    Padding (``[PAD]``) columns and everything after ``[END]`` are cut.
    """
    plt = _pyplot()
    source = [t for t in _clean(source_tokens) if t != "[PAD]"]
    target = _clean(target_tokens)
    if "[END]" in target:
        target = target[: target.index("[END]") + 1]
    weights = np.asarray(weights)[: len(target), : len(source)]
    width = max(4.0, 0.32 * len(source) + 1.5)
    height = max(3.0, 0.3 * len(target) + 1.2)
    fig, ax = plt.subplots(figsize=(min(width, 24), min(height, 18)), dpi=110)
    ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(source)), source, rotation=90)
    ax.set_yticks(range(len(target)), target)
    ax.set_xlabel("source tokens")
    ax.set_ylabel("output tokens")
    if title:
        ax.set_title(title, fontsize=9)
    return _save(plt, fig, path)


def bleu_by_length_plot(rows_by_model: dict[str, list[dict]], path: str | Path) -> Path:
    """One line per model: BLEU against the source-length bucket."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name, rows in rows_by_model.items():
        ax.plot(
            [r["bucket"] for r in rows],
            [r["bleu"] for r in rows],
            marker="o",
            label=name,
        )
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("BLEU")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)

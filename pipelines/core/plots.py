"""Plots people would rather look at than read: alignments (with ``p_gen``),
attention over an image, and BLEU by length."""

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
    source_tokens,
    target_tokens,
    weights,
    path: str | Path,
    title: str = "",
    p_gen=None,
) -> Path:
    """Source tokens (x) by target tokens (y), the attention weights as colour.

    Padding (``[PAD]`` or ``""``) columns and everything after ``[END]`` are cut. With
    ``p_gen`` (one value per target token: the pointer-generator's
    probability of generating rather than copying), a bar beside each row
    shows it, so a copied word reads as a short bar and a bright cell.
    """
    plt = _pyplot()
    source = [t for t in _clean(source_tokens) if t not in ("[PAD]", "")]
    target = _clean(target_tokens)
    if "[END]" in target:
        target = target[: target.index("[END]") + 1]
    weights = np.asarray(weights)[: len(target), : len(source)]
    width = max(4.0, 0.32 * len(source) + 1.5) + (1.4 if p_gen is not None else 0)
    height = max(3.0, 0.3 * len(target) + 1.2)
    size = (min(width, 24), min(height, 18))
    if p_gen is None:
        fig, ax = plt.subplots(figsize=size, dpi=110)
    else:
        fig, (ax, bars) = plt.subplots(
            1,
            2,
            figsize=size,
            dpi=110,
            sharey=True,
            gridspec_kw={"width_ratios": [max(len(source), 1), 3]},
        )
    ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(source)), source, rotation=90)
    ax.set_yticks(range(len(target)), target)
    ax.set_xlabel("source tokens")
    ax.set_ylabel("output tokens")
    if p_gen is not None:
        values = np.asarray(p_gen, dtype=float)[: len(target)]
        bars.barh(range(len(values)), values, color="tab:orange")
        bars.set_xlim(0.0, 1.0)
        bars.set_xlabel("p_gen")
        bars.tick_params(axis="y", left=False)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(plt, fig, path)


def image_attention(
    image,
    words,
    attention,
    path: str | Path,
    title: str = "",
    boxes=None,
) -> Path:
    """One panel per written word: its attention map over the image.

    ``image`` is ``[H, W]`` or ``[H, W, C]`` in ``[0, 1]``; ``attention`` is
    ``[T, h, w]`` over a grid that tiles the image (each cell ``H / h`` by
    ``W / w`` pixels), drawn as a translucent overlay with the peak cell
    outlined. Rows after ``[END]`` (and empty words) are left out. With
    ``boxes`` (``(top, left, bottom, right)`` per word), each word's true
    object is drawn as a dashed box.
    """
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    image = np.asarray(image, dtype=float)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    words = [w for w in _clean(words) if w]
    if "[END]" in words:
        words = words[: words.index("[END]") + 1]
    attention = np.asarray(attention, dtype=float)[: len(words)]
    height, width = image.shape[:2]
    rows, cols = attention.shape[1:] if attention.ndim == 3 else (1, 1)
    cell_h, cell_w = height / rows, width / cols
    panels = max(len(words), 1)
    aspect = height / width
    fig, axes = plt.subplots(
        panels, 1, figsize=(4.2, min(18, 0.6 + panels * (4.2 * aspect + 0.35))),
        dpi=110, squeeze=False,
    )  # fmt: skip
    for k, ax in enumerate(axes[:, 0]):
        ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        if k >= len(words):
            continue
        weights = attention[k]
        ax.imshow(weights, cmap="magma", alpha=0.55, extent=(0, width, height, 0),
                  interpolation="nearest", vmin=0.0)  # fmt: skip
        r, c = np.unravel_index(int(np.argmax(weights)), weights.shape)
        peak = Rectangle((c * cell_w, r * cell_h), cell_w, cell_h, fill=False,
                         edgecolor="cyan", linewidth=1.2)  # fmt: skip
        ax.add_patch(peak)
        if boxes is not None and k < len(boxes) and boxes[k] is not None:
            top, left, bottom, right = boxes[k]
            truth = Rectangle((left, top), right - left, bottom - top,
                              fill=False, edgecolor="lime", linestyle="--")  # fmt: skip
            ax.add_patch(truth)
        ax.set_ylabel(words[k], rotation=0, ha="right", va="center", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=9)
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

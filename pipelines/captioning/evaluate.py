"""Score a trained captioner on a held-out split: BLEU-4, exact match, localisation.

* **BLEU-4**: sacrebleu's corpus BLEU, lowercased, 13a tokenization, against
  every reference caption of an image (its signature is stored).
* **CIDEr-D** (Vedantam et al. 2015), if ``pycocoevalcap`` is installed
  (``pip install 'attention-layers[cider]'``): its scorer over the same
  lowercased captions, split by sacrebleu's 13a tokenizer (the COCO
  toolkit's PTB tokenizer needs Java).
* **Exact match**: the share of images whose caption equals one of its
  references (lowercase, whitespace collapsed).
* **Localisation** (images with boxes: digit strips, scenes): over the
  written words that are right at their position (word ``k`` equals the
  reference's word ``k``) and name an object, the share whose attention
  peaks in a grid cell whose centre lies inside that object's box
  (``localised_words`` is how many were graded). ``peak_cell_overlaps_box``,
  a looser diagnostic that is not the localisation, also counts a peak cell
  that only shares some area with the box.
* **Baselines** (``baselines``): ``most_common_caption``, the training
  split's most common caption written for every image, scored with the same
  BLEU-4, CIDEr-D and exact match.

Writes ``captions.tsv`` (image, references, one column per decoding, the
words whose peak missed their box) and ``plots/attention_*.png`` (each
word's attention over the image) in the run folder; returns the body of
``metrics.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipelines.core.plots import image_attention
from pipelines.core.run_dir import write_text
from pipelines.core.search import check_beam_widths

CAPTIONS = "captions.tsv"
# One line where localisation is printed: what it counts.
LOCALISATION = (
    "localisation: of the written words right at their position that name an "
    "object, the share whose attention peaks in a cell centred inside its box"
)


def normalize(caption: str) -> str:
    return " ".join(caption.lower().split())


def caption_bleu(hypotheses: list[str], references: list[tuple[str, ...]]) -> dict:
    """sacrebleu corpus BLEU-4 over every reference of each image.

    sacrebleu wants as many reference streams for every image: an image with
    fewer captions repeats its first, which changes no n-gram count's clip
    (a maximum over the references) nor the closest reference length.
    """
    from sacrebleu.metrics import BLEU

    most = max(len(r) for r in references)
    padded = [list(r) + [r[0]] * (most - len(r)) for r in references]
    metric = BLEU(lowercase=True)
    streams = [list(s) for s in zip(*padded, strict=True)]
    result = metric.corpus_score(hypotheses, streams)
    return {
        "bleu": round(result.score, 2),
        "bleu_signature": str(metric.get_signature()),
    }


def caption_cider(hypotheses: list[str], references: list[tuple[str, ...]]) -> dict:
    """``{"cider": CIDEr-D}`` over every reference of each image, or ``{}``
    without ``pycocoevalcap`` (an optional extra: its scorer is the COCO
    caption toolkit's, idf taken from these references)."""
    try:
        from pycocoevalcap.cider.cider import Cider
    except ImportError:
        return {}
    if not references:
        return {}
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    split = Tokenizer13a()
    references_ = {i: [split(r.lower()) for r in refs]
                   for i, refs in enumerate(references)}  # fmt: skip
    hypotheses_ = {i: [split(h.lower())] for i, h in enumerate(hypotheses)}
    score, _ = Cider().compute_score(references_, hypotheses_)
    return {"cider": round(float(score), 4)}


def peak_hits(
    attention, words, references, boxes, image_size, rule: str = "centre"
) -> list[bool | None]:
    """Per written word: whether its attention peak lies in its box (None
    where the word is wrong at its position, or has no box: no boxes for the
    image, or a word that names no object).

    ``rule="centre"`` (the metric): the peak cell's centre is inside the box.
    ``rule="overlap"`` (a diagnostic): the peak cell shares some area with
    the box, which also counts a peak on the box's edge.
    """
    if boxes is None:
        return [None] * len(words)
    height, width = image_size
    rows, cols = attention.shape[1:]
    cell_h, cell_w = height / rows, width / cols
    hits: list[bool | None] = []
    for k, word in enumerate(words):
        if k >= len(references) or word != references[k] or boxes[k] is None:
            hits.append(None)
            continue
        r, c = np.unravel_index(int(np.argmax(attention[k])), (rows, cols))
        top, left, bottom, right = boxes[k]
        if rule == "overlap":
            y0, x0 = r * cell_h, c * cell_w
            hit = (
                y0 < bottom and y0 + cell_h > top and x0 < right and x0 + cell_w > left
            )
        else:
            y, x = (r + 0.5) * cell_h, (c + 0.5) * cell_w
            hit = top <= y < bottom and left <= x < right
        hits.append(bool(hit))
    return hits


def caption_images(server, pixels, beam_width: int, batch_size: int,
                   progress: bool = True) -> dict:  # fmt: skip
    """Caption decoded images in batches with one traced graph (numpy out)."""
    fn = server.traced_caption()
    alpha = tf.constant(server.default_length_penalty, tf.float32)
    verbose = (1 if sys.stdout.isatty() else 2) if progress else 0
    bar = keras.utils.Progbar(len(pixels), verbose=verbose, unit_name="image")
    parts: dict[str, list] = {}
    for start in range(0, len(pixels), batch_size):
        batch = pixels[start : start + batch_size]
        out = fn(tf.constant(batch), tf.constant(beam_width, tf.int32), alpha)
        for key in ("caption", "score", "length", "attention", "words"):
            parts.setdefault(key, []).append(out[key].numpy())
        bar.add(len(batch))
    return {k: np.concatenate(v) for k, v in parts.items()}


def plot_attention(server, config, examples, folder) -> list[Path]:
    """``attention_{i}.png``: each example's caption (the export's default
    decoding), one panel per word with its attention over the image and the
    word's true box (`image_attention`)."""
    from pipelines.captioning.images import decode_images

    if not examples:
        return []
    pixels = decode_images(tf.constant([e.image for e in examples]), config.image)
    out = server.traced_caption()(
        pixels,
        tf.constant(server.default_beam_width, tf.int32),
        tf.constant(server.default_length_penalty, tf.float32),
    )
    paths = []
    for i, example in enumerate(examples):
        caption = out["caption"][i].numpy().decode("utf-8")
        paths.append(image_attention(
            pixels[i].numpy(), out["words"][i].numpy(), out["attention"][i].numpy(),
            Path(folder) / f"attention_{i}.png",
            title=f"{caption!r} (true: {example.captions[0]!r})", boxes=example.boxes,
        ))  # fmt: skip
    return paths


def decoded(examples, config) -> np.ndarray:
    """The examples' images as the export decodes them, ``[B, H, W, C]``."""
    from pipelines.captioning.images import decode_images

    if not examples:
        image = config.image
        return np.zeros((0, image.height, image.width, image.channels), "float32")
    return np.concatenate([
        decode_images(tf.constant([e.image for e in examples[i : i + 512]]),
                      config.image).numpy()
        for i in range(0, len(examples), 512)
    ])  # fmt: skip


def score_captions(out, examples, config) -> tuple[dict, list[str], list[str]]:
    """BLEU-4 (CIDEr-D), exact match and localisation of ``caption_images``'
    answers ``out`` for ``examples``; also the written captions and, per
    image, the words whose peak missed their box."""
    references = [tuple(normalize(c) for c in e.captions) for e in examples]
    size = (config.image.height, config.image.width)
    hypotheses = [normalize(c.decode("utf-8")) for c in out["caption"]]
    scores = caption_bleu(hypotheses, references)
    scores.update(caption_cider(hypotheses, references))
    exact = [h in r for h, r in zip(hypotheses, references, strict=True)]
    scores["exact_match"] = round(float(np.mean(exact)), 4)
    checked = hit = touched = 0
    missed = []
    for i, example in enumerate(examples):
        words = hypotheses[i].split()
        args = (out["attention"][i], words, references[i][0].split(),
                example.boxes, size)  # fmt: skip
        hits = peak_hits(*args)
        checked += sum(h is not None for h in hits)
        hit += sum(h is True for h in hits)
        touched += sum(h is True for h in peak_hits(*args, rule="overlap"))
        missed.append(" ".join(w for w, h in zip(words, hits, strict=True)
                               if h is False))  # fmt: skip
    if checked:
        scores["localisation"] = round(hit / checked, 4)
        scores["localised_words"] = checked
        scores["peak_cell_overlaps_box"] = round(touched / checked, 4)
    return scores, hypotheses, missed


def most_common_caption(
    train_captions: list[str], references: list[tuple[str, ...]]
) -> dict:
    """The ``most_common_caption`` baseline: the most common of
    ``train_captions`` (normalised) for every image, scored against
    ``references`` (normalised) as the model's captions are."""
    from pipelines.core.baselines import most_common

    caption = most_common(normalize(c) for c in train_captions)
    hypotheses = [caption] * len(references)
    scores = caption_bleu(hypotheses, references)
    del scores["bleu_signature"]
    scores.update(caption_cider(hypotheses, references))
    exact = [caption in r for r in references]
    scores["exact_match"] = round(float(np.mean(exact)), 4)
    what = f"the most common training caption ({caption!r}) for every image"
    return {"what": what, "caption": caption, **scores}


def evaluate(run_dir, server, config, examples, split, beam_widths=None, plots=3,
             robustness=False, train_captions=None):  # fmt: skip
    """Caption ``examples`` greedily and with beams; write the TSV and plots;
    with ``robustness``, score the layouts of `robustness_rows` too.

    ``train_captions`` (every caption of the training split, loaded from
    ``config`` when not given) give the ``most_common_caption`` baseline.
    """
    from pipelines.core.baselines import table

    run_dir = Path(run_dir)
    beam_widths = check_beam_widths(beam_widths, config.decode)
    pixels = decoded(examples, config)
    references = [tuple(normalize(c) for c in e.captions) for e in examples]
    results: dict = {"split": split, "run": config.name, "images": len(examples),
                     "decoding": {}}  # fmt: skip
    columns: dict[str, list[str]] = {}
    misses: dict[str, list[str]] = {}
    first = None
    for width in beam_widths:
        name = "greedy" if width == 1 else f"beam{width}"
        print(f"Captioning {len(examples)} {split} images ({name})")
        t0 = time.time()
        out = caption_images(server, pixels, width, config.decode.eval_batch_size)
        scores, columns[name], misses[name] = score_captions(out, examples, config)
        scores["seconds"] = round(time.time() - t0, 1)
        results["decoding"][name] = scores
        first = first or out
        print(f"  {name} done in {scores['seconds']} s")
    if train_captions is None:
        from pipelines.captioning.data import load_data

        train_captions = [c for e in load_data(config).train for c in e.captions]
    baseline = most_common_caption(train_captions, references)
    results["baselines"] = {"most_common_caption": baseline}
    rows = _rows(results["decoding"])
    print(
        f"Scores on the {len(examples)} {split} images, beside a trivial baseline:\n"
        + table(results["decoding"], results["baselines"], rows)
    )
    if any(key == "localisation" for _, key, _ in rows):
        print(f"  {LOCALISATION}")
    header = ["image", "references"]
    for name in columns:
        header += [name, f"{name}_missed_box"]
    lines = ["\t".join(header)]
    for i, example in enumerate(examples):
        row = [example.name or str(i), " | ".join(references[i])]
        for name in columns:
            row += [columns[name][i], misses[name][i]]
        lines.append("\t".join(x.replace("\t", " ") for x in row))
    write_text(run_dir / CAPTIONS, "\n".join(lines) + "\n")
    paths = []
    for i in range(min(plots, len(examples))):
        caption = first["caption"][i].decode("utf-8")
        paths.append(str(image_attention(
            pixels[i], first["words"][i], first["attention"][i],
            run_dir / "plots" / f"attention_{i}.png",
            title=f"{caption!r} (true: {references[i][0]!r})",
            boxes=examples[i].boxes,
        )))  # fmt: skip
    results["plots"] = paths
    if robustness:  # after the split's files are written
        results["robustness"] = robustness_rows(server, config, examples)
    return results


def _rows(decodings: dict) -> list[tuple[str, str, str]]:
    """The rows of the scores table: CIDEr-D where it was computed, the
    localisation where the images have boxes."""
    rows = [("BLEU-4", "bleu", ".2f")]
    if any("cider" in s for s in decodings.values()):
        rows.append(("CIDEr-D", "cider", ".3f"))
    rows.append(("exact match", "exact_match", ".2%"))
    if any("localisation" in s for s in decodings.values()):
        rows += [("localisation", "localisation", ".2%"),
                 ("localised words", "localised_words", "d")]  # fmt: skip
    return rows


def robustness_rows(server, config, examples, layouts=None) -> dict:
    """``{layout: scores}`` for each of ``layouts`` (by default
    `pipelines.captioning.robustness.layouts_for` the config; as many images
    as ``examples``, decoded as the export decodes by default), printed as a
    table."""
    from pipelines.captioning.robustness import layouts_for, make_examples

    width = server.default_beam_width
    rows: dict = {}
    print(f"Robustness: {len(examples)} test images per layout, "
          f"beam width {width} (the export's default)")  # fmt: skip
    print(f"  {'layout':<16} {'exact':>7} {'localisation':>12}  what changed")
    for layout in layouts or layouts_for(config):
        changed = make_examples(layout, config, len(examples), examples)
        out = caption_images(server, decoded(changed, config), width,
                             config.decode.eval_batch_size, progress=False)  # fmt: skip
        scores, _, _ = score_captions(out, changed, config)
        row = {"what": layout.what, "images": len(changed)}
        row.update({k: scores[k] for k in ("exact_match", "bleu")})
        where = ""
        if "localisation" in scores:
            row["localisation"] = scores["localisation"]
            where = f"{scores['localisation']:.2%}"
        rows[layout.name] = row
        print(f"  {layout.name:<16} {scores['exact_match']:>7.2%} {where:>12}  "
              f"{layout.what}")  # fmt: skip
    return rows

"""Score a trained summarizer: ROUGE, repetition, novelty, copying, heatmaps.

Writes ``summaries.tsv`` (document, reference, summary, mean ``p_gen``) and
``plots/attention_*.png`` (the attention with ``p_gen`` beside each output
word) in the run folder; returns the body of ``metrics.json``:

* ``rouge1/rouge2/rougeL``: F1 ×100 from ``rouge-score`` with Porter
  stemming (its tokenizer drops non-ASCII characters);
* ``repeated_trigram_rate``: repeated trigrams within each summary, pooled
  (the references' own rate beside it);
* ``novel_1gram_rate`` / ``novel_2gram_rate``: summary n-grams absent from
  the document;
* ``mean_p_gen``: over the summary tokens, ``[END]`` included (pointer
  variants; ``None`` for the baseline, which only generates);
* ``oov_copied``: of the reference words out of the vocabulary, the share
  the summary contains (only a copy can write them); ``oov_in_source`` is
  the share of them found in the document (the most copying can reach);
* ``baselines``: ``lead_1``, the document's first sentence as its summary
  (`pipelines.core.baselines.lead`), scored with the same ROUGE on the same
  documents.

Example:

>>> baselines(["It parses YAML. It is fast."], ["parses YAML"])["lead_1"]["rouge1"]
80.0
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipelines.core.baselines import lead, table
from pipelines.core.metrics import (
    ROUGE_TYPES,
    novel_ngram_rate,
    repeated_trigram_rate,
    score,
)
from pipelines.core.plots import alignment_heatmap
from pipelines.core.run_dir import write_text

SUMMARIES = "summaries.tsv"
ROWS = tuple((f"ROUGE-{name[5:]}", name, ".2f") for name in ROUGE_TYPES)


def baselines(documents: list[str], references: list[str]) -> dict:
    """``lead_1``: each document's first sentence as its summary, with the
    ROUGE F1 scores the model's summaries get."""
    scores = score(["rouge"], [lead(d) for d in documents], references)
    what = "the first sentence of the document as its summary"
    return {"lead_1": {"what": what, **{name: scores[name] for name in ROUGE_TYPES}}}


def _strings(values) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def summarize_texts(
    summarizer, texts: list[str], beam_width: int, min_length: int, batch_size: int
) -> dict[str, list]:
    """Summaries, lengths and per-summary mean ``p_gen``, in batches, one graph."""
    fn = summarizer.traced_summarize()
    alpha = tf.constant(summarizer.default_length_penalty, tf.float32)
    verbose = 1 if sys.stdout.isatty() else 2  # one line at the end off a tty
    bar = keras.utils.Progbar(len(texts), verbose=verbose, unit_name="document")
    out: dict[str, list] = {"summary": [], "p_gen_sum": [], "length": [], "words": []}
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        result = fn(
            tf.constant(batch),
            tf.constant(beam_width, tf.int32),
            alpha,
            tf.constant(min_length, tf.int32),
        )
        out["summary"] += _strings(result["summary"].numpy())
        out["p_gen_sum"] += list(result["p_gen"].numpy().sum(axis=1))
        out["length"] += list(result["length"].numpy())
        out["words"] += [set(_strings(row)) for row in result["summary_tokens"].numpy()]
        bar.add(len(batch))
    return out


def oov_shares(tokenizer, documents, references, summary_words) -> dict:
    """``oov_copied`` and ``oov_in_source`` (see the module docstring), pooled."""
    vocabulary = set(tokenizer.words)
    total = copied = in_source = 0
    for start in range(0, len(references), 4096):
        refs = tokenizer.split(tf.constant(references[start : start + 4096]))
        docs = tokenizer.split(tf.constant(documents[start : start + 4096]))
        for ref, doc, made in zip(
            refs.to_list(), docs.to_list(), summary_words[start : start + 4096],
            strict=True,
        ):  # fmt: skip
            source = set(_strings(doc))
            for word in _strings(ref):
                if word in vocabulary:
                    continue
                total += 1
                in_source += word in source
                copied += word in made
    return {
        "oov_reference_words": total,
        "oov_copied": round(copied / total, 4) if total else 0.0,
        "oov_in_source": round(in_source / total, 4) if total else 0.0,
    }


def evaluate(
    run_dir: Path,
    summarizer,
    config,
    pairs: list[tuple[str, str]],
    split: str,
    beam_width: int | None = None,
    min_length: int | None = None,
    heatmaps: int = 3,
) -> dict:
    """Summarize ``pairs``' documents; score them; write the TSV and plots."""
    run_dir = Path(run_dir)
    beam_width = config.decode.default_beam_width if beam_width is None else beam_width
    min_length = config.decode.min_length if min_length is None else min_length
    if not 1 <= beam_width <= config.decode.beam_width:
        raise ValueError(
            f"evaluate: --beam-width must be in [1, decode.beam_width="
            f"{config.decode.beam_width}], received {beam_width}."
        )
    if not 0 <= min_length <= config.tokenizer.max_target_tokens:
        raise ValueError(
            "evaluate: --min-length must be in [0, tokenizer.max_target_tokens="
            f"{config.tokenizer.max_target_tokens}], received {min_length}."
        )
    documents = [d for d, _ in pairs]
    references = [s for _, s in pairs]
    print(
        f"Summarizing {len(documents)} {split} documents (beam {beam_width}, "
        f"min length {min_length})"
    )
    t0 = time.time()
    out = summarize_texts(
        summarizer, documents, beam_width, min_length, config.decode.eval_batch_size
    )
    seconds = round(time.time() - t0, 1)
    summaries = out["summary"]
    results: dict = {"split": split, "run": config.name, "examples": len(pairs)}
    results.update(
        {
            "variant": config.model.variant,
            "beam_width": beam_width,
            "min_length": min_length,
            "length_penalty": config.decode.length_penalty,
            "seconds": seconds,
        }
    )
    results.update(score(["rouge"], summaries, references))
    results["repeated_trigram_rate"] = repeated_trigram_rate(summaries)
    results["reference_repeated_trigram_rate"] = repeated_trigram_rate(references)
    for n in (1, 2):
        results[f"novel_{n}gram_rate"] = novel_ngram_rate(summaries, documents, n)
    tokens = int(np.sum(out["length"]))
    pointer = config.model.variant != "baseline"
    results["mean_p_gen"] = (
        round(float(np.sum(out["p_gen_sum"])) / tokens, 4)
        if pointer and tokens
        else None
    )
    results.update(
        oov_shares(summarizer.tokenizer, documents, references, out["words"])
    )
    results["mean_summary_words"] = (
        round(float(np.mean([len(s.split()) for s in summaries])), 2)
        if summaries
        else 0.0
    )
    results["baselines"] = baselines(documents, references)
    print(
        f"Scores on the {len(documents)} {split} documents ({seconds} s), beside "
        "a trivial baseline:\n"
        + table({"model": results}, results["baselines"], ROWS)
        + f"\n  repeated trigrams {results['repeated_trigram_rate']:.2%}  OOV "
        f"copied {results['oov_copied']:.2%}"
    )
    lines = ["\t".join(["document", "reference", "summary", "mean_p_gen"])]
    for i, (document, reference) in enumerate(pairs):
        length = out["length"][i]
        p_gen = out["p_gen_sum"][i] / length if pointer and length else float("nan")
        row = [document, reference, summaries[i], f"{p_gen:.3f}"]
        lines.append("\t".join(x.replace("\t", " ") for x in row))
    write_text(run_dir / SUMMARIES, "\n".join(lines) + "\n")
    results["heatmaps"] = [
        str(p)
        for p in plot_samples(summarizer, documents[:heatmaps], run_dir / "plots")
    ]
    return results


def plot_samples(summarizer, texts: list[str], folder: Path) -> list[Path]:
    """One attention heatmap, with ``p_gen`` beside it, per text."""
    if not texts:
        return []
    out = summarizer.traced_summarize()(
        tf.constant(texts),
        tf.constant(summarizer.default_beam_width, tf.int32),
        tf.constant(summarizer.default_length_penalty, tf.float32),
        tf.constant(summarizer.default_min_length, tf.int32),
    )
    pointer = summarizer.model.pointer  # the baseline only generates: no p_gen
    paths = []
    for i, text in enumerate(texts):
        summary = out["summary"][i].numpy().decode("utf-8")
        paths.append(
            alignment_heatmap(
                out["source_tokens"][i].numpy(),
                out["summary_tokens"][i].numpy(),
                np.asarray(out["attention"][i]),
                folder / f"attention_{i}.png",
                title=f"{text[:50]!r}... -> {summary[:60]!r}",
                p_gen=np.asarray(out["p_gen"][i]) if pointer else None,
            )
        )
    return paths

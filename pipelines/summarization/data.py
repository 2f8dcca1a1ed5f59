"""The summarization task's data: (document, summary) pairs, split, and batches.

Corpora (`SPECS`): the Debian package descriptions and their synopsis
(`pipelines.summarization.debian`, split by source package and body prefix so that
templated near-copies stay in one split), generated package blurbs
(`pipelines.summarization.blurbs`, offline, for the ``tiny`` preset and CI), or the
user's TSV or JSON Lines file.

Example:

>>> from pipelines.summarization.config import preset
>>> data = load_data(preset("tiny"))
>>> len(data.train) > len(data.test) > 0, data.notes[0]
(True, 'read 300 pairs from blurbs:300')
"""

from __future__ import annotations

from pipelines.core.errors import PipelineError
from pipelines.core.task import Data
from pipelines.data import read_tsv, split_pairs
from pipelines.data.user_files import read_jsonl

SPECS = (
    "debian (apt's Translation-en lists, cached; see pipelines.summarization.debian)",
    "blurbs or blurbs:N (generated, offline; default N=6000)",
    "tsv:PATH (document in column 0, summary in column 1)",
    "jsonl:PATH (objects with `document` and `summary`)",
    "aclsum or aclsum:ASPECT (`pip install aclsum`: abstracts to their "
    "challenge, approach or outcome summary; out of domain, for evaluate)",
)
ACLSUM_ASPECTS = ("challenge", "approach", "outcome")


def read_aclsum(aspect: str = "challenge") -> list[tuple[str, str]]:
    """ACLSum's (abstract, ``aspect`` summary) pairs: its 250 papers, all splits.

    Read from the JSON Lines files in the installed ``aclsum`` wheel
    (without importing it: its reader needs ``sienna``). Raises
    `MissingDataError` with the install command when it is absent.
    """
    import importlib.util
    import json
    from pathlib import Path

    from pipelines.core.errors import MissingDataError

    if aspect not in ACLSUM_ASPECTS:
        raise ValueError(
            f"aclsum: the aspect must be one of {', '.join(ACLSUM_ASPECTS)}, "
            f"received {aspect!r}"
        )
    spec = importlib.util.find_spec("aclsum")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            "ACLSum is not installed; get it with `pip install aclsum` (MIT, its "
            "data ships in the wheel)."
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "dataset"
    pairs = []
    for split in ("train", "val", "test"):
        with open(folder / f"{split}.jsonl", encoding="utf-8") as handle:
            for line in filter(str.strip, handle):
                paper = json.loads(line)
                abstract = " ".join(paper["sentences"]["abstract"])
                pairs.append((abstract, paper["summary"][aspect]))
    return pairs


def read_corpus(spec: str, config) -> tuple[list, list[str] | None]:
    """``(pairs, groups)`` of ``spec``: groups (one per pair) keep related
    pairs in one split; ``None`` splits by the document text."""
    name, _, argument = spec.partition(":")
    if name == "debian" and not argument:
        from pipelines.summarization.debian import (
            group_descriptions,
            read_debian_descriptions,
        )

        records = read_debian_descriptions()
        return [(r.body, r.synopsis) for r in records], group_descriptions(records)
    if name == "blurbs" and (not argument or argument.isdigit()):
        from pipelines.summarization.blurbs import generate_blurbs

        return generate_blurbs(int(argument or 6000), config.data.seed), None
    if name == "tsv" and argument:
        return read_tsv(argument), None
    if name == "jsonl" and argument:
        return read_jsonl(argument), None
    if name == "aclsum":
        return read_aclsum(argument or "challenge"), None
    raise PipelineError(
        f"data: unknown corpus {spec!r}; valid forms: " + "; ".join(SPECS)
    )


def load_data(config) -> Data:
    """Pairs of ``config.data.source``: limited, length-filtered, split.

    Raises `PipelineError` when the corpus holds no pairs, or none survive
    the filters.
    """
    data = config.data
    try:
        pairs, groups = read_corpus(data.source, config)
    except (OSError, ValueError) as error:
        raise PipelineError(f"data: {error}") from None
    where = data.source.partition(":")[2] or data.source
    if not pairs:
        raise PipelineError(f"data: no examples in {where}.")
    groups = groups or [document for document, _ in pairs]
    notes = [f"read {len(pairs)} pairs from {data.source}"]
    if data.limit and len(pairs) > data.limit:
        notes.append(f"kept the first {data.limit} (data.limit)")
        pairs, groups = pairs[: data.limit], groups[: data.limit]
    kept, kept_groups, empty, long = [], [], 0, 0
    for pair, group in zip(pairs, groups, strict=True):
        document, summary = (len(side.split()) for side in pair)
        if not document or not summary:
            empty += 1
        elif document > data.max_source_words or summary > data.max_target_words:
            long += 1
        else:
            kept.append(pair)
            kept_groups.append(group)
    if empty:
        notes.append(f"dropped {empty} pairs with an empty side")
    if long:
        notes.append(
            f"dropped {long} pairs over {data.max_source_words} document / "
            f"{data.max_target_words} summary words "
            "(data.max_source_words, data.max_target_words)"
        )
    if not kept:
        raise PipelineError(
            f"data: no pairs of {where} are left after the filters "
            f"({'; '.join(notes[1:])})."
        )
    splits = split_pairs(
        kept,
        data.valid_fraction,
        data.test_fraction,
        seed=data.seed,
        groups=kept_groups,
    )
    return Data(splits.train, splits.valid, splits.test, notes)


def _words(tokenizer, texts: list[str], limit: int):
    """Ragged ids and words of ``texts``, cut at ``limit``."""
    import tensorflow as tf

    ids, words = [], []
    for start in range(0, len(texts), 4096):
        i, w = tokenizer.tokenize_words(tf.constant(texts[start : start + 4096]))
        ids.append(i[:, :limit])
        words.append(w[:, :limit])
    if not ids:
        empty = tf.ragged.constant([], dtype=tf.int32, ragged_rank=1)
        return empty, tf.ragged.constant([], dtype=tf.string, ragged_rank=1)
    return tf.concat(ids, 0), tf.concat(words, 0)


def make_dataset(pairs, tokenizer, config, training: bool, replicas: int = 1):
    """Teacher-forcing batches ``({"source", "source_ext", "target_in"}, target_out)``.

    ``source_ext`` gives each out-of-vocabulary source word its copy id
    (`attention_layers.extended_source_ids`); ``target_out`` is the summary
    over the extended vocabulary (`attention_layers.extended_target_ids`: an
    OOV summary word found in the document is its copy id) with ``[END]``,
    or over the vocabulary alone for the baseline; ``target_in`` is
    ``[START]`` and the summary's vocabulary ids (copies are fed as
    ``[UNK]``). Batches are bucketed by document length, cut to a multiple
    of ``replicas`` rows, and static-shaped with ``train.jit_compile``.
    """
    import tensorflow as tf

    import attention_layers as al
    from pipelines.core.datasets import example_order, teacher_forcing_batches
    from pipelines.core.text import END, START, UNK

    tok = config.tokenizer
    pointer = config.model.variant != "baseline"
    vocab = tokenizer.vocab_size
    source, source_words = _words(
        tokenizer, [s for s, _ in pairs], tok.max_source_tokens
    )
    target, target_words = _words(
        tokenizer, [t for _, t in pairs], tok.max_target_tokens
    )
    source_keys = tf.ragged.map_flat_values(tokenizer.keys, source_words)
    target_keys = tf.ragged.map_flat_values(tokenizer.keys, target_words)
    lengths = source.row_lengths().numpy()
    order = example_order(len(pairs), config, training)

    def example(i):
        s, keys, t = source[i][None], source_keys[i][None], target[i][None]
        ext = al.extended_source_ids(s, keys, UNK, vocab)
        out = t
        if pointer:
            out = al.extended_target_ids(t, target_keys[i][None], keys, ext, UNK, vocab)
        return (
            s[0],
            tf.cast(ext[0], tf.int32),
            tf.concat([[START], t[0]], 0),
            tf.concat([tf.cast(out[0], tf.int32), [END]], 0),
        )

    data = order.map(example, num_parallel_calls=tf.data.AUTOTUNE)
    return teacher_forcing_batches(
        data, lengths, config, replicas, ("source", "source_ext")
    )

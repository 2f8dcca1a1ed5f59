"""Tokenizers that run inside the TensorFlow graph, so a SavedModel takes raw text.

Both tokenizers map a batch of strings to ragged int32 ids and back, using
only ops that TF Serving links: core TensorFlow string ops, a
``tf.lookup.StaticHashTable`` (characters) and tensorflow-text's
``FastWordpieceTokenizer`` (subwords; its ops are in TF Text's ``ops_lib``).

Ids 0-3 are reserved in both: ``[PAD]``, ``[UNK]``, ``[START]``, ``[END]``.

Example:

>>> from pipelines.core.text import CharTokenizer
>>> tok = CharTokenizer.learn(["9 mars 1987"])
>>> ids = tok.tokenize(["mars"])
>>> [t.decode() for t in tok.detokenize(ids.to_tensor()).numpy()]
['mars']
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import tensorflow as tf

from pipelines.core.run_dir import read_json, write_text

RESERVED = ["[PAD]", "[UNK]", "[START]", "[END]"]
PAD, UNK, START, END = 0, 1, 2, 3


def normalize(strings: tf.Tensor) -> tf.Tensor:
    """Lowercase (Unicode-aware) and collapse whitespace: the text both sides see."""
    strings = tf.strings.lower(strings, encoding="utf-8")
    strings = tf.strings.regex_replace(strings, r"\s+", " ")
    return tf.strings.strip(strings)


def _keep_content(ids: tf.Tensor) -> tf.RaggedTensor:
    """Drop reserved ids and cut at the first ``[END]``: ``[B, L]`` to ragged."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    before_end = tf.math.cumsum(tf.cast(ids == END, tf.int32), axis=1) == 0
    keep = before_end & (ids >= len(RESERVED))
    return tf.ragged.boolean_mask(ids, keep)


class CharTokenizer(tf.Module):
    """Character-level tokenizer: one id per Unicode character.

    Unknown characters map to ``[UNK]``.
    """

    kind = "char"

    def __init__(self, symbols: list[str]):
        super().__init__(name="char_tokenizer")
        self.symbols = list(symbols)
        vocab = RESERVED + self.symbols
        self.vocab = tf.constant(vocab)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.symbols),
                tf.range(len(RESERVED), len(vocab), dtype=tf.int32),
            ),
            default_value=UNK,
        )

    @classmethod
    def learn(cls, texts: list[str], min_count: int = 1) -> CharTokenizer:
        counts = Counter(c for t in texts for c in t.lower())
        return cls(sorted(c for c, n in counts.items() if n >= min_count))

    @property
    def vocab_size(self) -> int:
        return len(RESERVED) + len(self.symbols)

    def tokenize(self, strings) -> tf.RaggedTensor:
        chars = tf.strings.unicode_split(normalize(strings), "UTF-8")
        return tf.ragged.map_flat_values(self.table.lookup, chars)

    def detokenize(self, ids) -> tf.Tensor:
        pieces = tf.gather(self.vocab, _keep_content(ids))
        return tf.strings.reduce_join(pieces, axis=-1)

    def id_to_token(self, ids) -> tf.Tensor:
        return tf.gather(self.vocab, ids)

    def save(self, path: Path) -> None:
        write_text(path, json.dumps({"kind": self.kind, "symbols": self.symbols}))


class SubwordTokenizer(tf.Module):
    """WordPiece subwords learned from the training text with tensorflow-text.

    Text is lowercased (accents kept) and split on whitespace and punctuation
    by ``FastWordpieceTokenizer``; detokenizing joins words with spaces and
    then removes the space before closing and after opening punctuation.
    """

    kind = "subword"

    def __init__(self, vocab: list[str]):
        import tensorflow_text as text

        super().__init__(name="subword_tokenizer")
        if vocab[: len(RESERVED)] != RESERVED:
            raise ValueError(
                f"SubwordTokenizer: the vocabulary must start with {RESERVED}, "
                f"received {vocab[: len(RESERVED)]}."
            )
        self.pieces = list(vocab)
        self.vocab = tf.constant(self.pieces)
        self.wordpiece = text.FastWordpieceTokenizer(
            self.pieces,
            token_out_type=tf.int32,
            unknown_token="[UNK]",
            support_detokenization=True,
        )

    @classmethod
    def learn(cls, texts: list[str], vocab_size: int) -> SubwordTokenizer:
        """Learn a WordPiece vocabulary of about ``vocab_size`` from ``texts``."""
        from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

        data = tf.data.Dataset.from_tensor_slices(tf.constant(texts)).batch(1024)
        vocab = bert_vocab_from_dataset.bert_vocab_from_dataset(
            data.map(normalize),
            vocab_size=vocab_size,
            reserved_tokens=RESERVED,
            # Lowercasing here would also strip accents: normalize() did it.
            bert_tokenizer_params={"lower_case": False},
        )
        return cls(list(vocab))

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def tokenize(self, strings) -> tf.RaggedTensor:
        return self.wordpiece.tokenize(normalize(strings))

    def detokenize(self, ids) -> tf.Tensor:
        words = self.wordpiece.detokenize(_keep_content(ids))
        words = tf.strings.regex_replace(words, r" ([.,;:!?)\]»])", r"\1")
        return tf.strings.regex_replace(words, r"([¿¡(\[«]) ", r"\1")

    def id_to_token(self, ids) -> tf.Tensor:
        return tf.gather(self.vocab, ids)

    def save(self, path: Path) -> None:
        write_text(path, json.dumps({"kind": self.kind, "vocab": self.pieces}))


def load_tokenizer(path: Path) -> CharTokenizer | SubwordTokenizer:
    spec = read_json(path)
    if spec["kind"] == "char":
        return CharTokenizer(spec["symbols"])
    return SubwordTokenizer(spec["vocab"])


def learn_tokenizer(kind: str, texts: list[str], vocab_size: int):
    if kind == "char":
        return CharTokenizer.learn(texts)
    return SubwordTokenizer.learn(texts, vocab_size)

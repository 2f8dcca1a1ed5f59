"""Tokenizers that run inside the TensorFlow graph, so a SavedModel takes raw text.

The tokenizers map a batch of strings to ragged int32 ids and back, using
only ops that TF Serving links: core TensorFlow string ops, a
``tf.lookup.StaticHashTable`` (characters, words) and tensorflow-text's
``FastWordpieceTokenizer`` (subwords; its ops are in TF Text's ``ops_lib``).
`WordTokenizer` also gives each word a key and writes out the extended ids
of a copy mechanism (`attention_layers.PointerGenerator`): a copied
out-of-vocabulary word comes out as the source's own string.

Ids 0-3 are reserved in all: ``[PAD]``, ``[UNK]``, ``[START]``, ``[END]``.

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

import numpy as np
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


# Punctuation and symbols are words of their own; letters, digits and marks
# (RE2's Unicode classes: "café" and "naïve" stay whole) make up the others.
_SYMBOL = r"([^\pL\pN\pM\s])"


class WordTokenizer(tf.Module):
    """Words and punctuation, the vocabulary of a copy mechanism.

    Text is normalised (`normalize`) and split into runs of letters, digits
    and marks, and single other characters; the ``vocab_size - 4`` most
    frequent words of the training text (ties by first appearance) get ids,
    the others are ``[UNK]``. Detokenizing joins words with spaces and
    removes the space before closing and after opening punctuation.

    Example:

    >>> tok = WordTokenizer.learn(["the cat sat.", "the dog sat."], vocab_size=7)
    >>> tok.vocab_size, list(tok.words)
    (7, ['the', 'sat', '.'])
    >>> ids, words = tok.tokenize_words(["The zorp sat."])
    >>> ids.to_list()
    [[4, 1, 5, 6]]
    >>> # Extended id 4 + 3 = 7 is "the source word at position 1".
    >>> out = tok.detokenize_extended([[4, 8, 5, 3]], words.to_tensor())
    >>> [t.decode() for t in out.numpy()]
    ['the zorp sat']
    """

    kind = "word"

    def __init__(self, words: list[str]):
        super().__init__(name="word_tokenizer")
        self.words = list(words)
        self.vocab = tf.constant(RESERVED + self.words)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.words, tf.string),
                tf.range(len(RESERVED), self.vocab_size, dtype=tf.int32),
            ),
            default_value=UNK,
        )

    @staticmethod
    def split(strings) -> tf.RaggedTensor:
        """``[B]`` strings to ragged ``[B, None]`` words (the ids' positions)."""
        spaced = tf.strings.regex_replace(normalize(strings), _SYMBOL, r" \1 ")
        return tf.strings.split(tf.strings.strip(spaced))

    @classmethod
    def learn(cls, texts: list[str], vocab_size: int) -> WordTokenizer:
        """The ``vocab_size - 4`` most frequent words of ``texts``."""
        if vocab_size <= len(RESERVED):
            raise ValueError(
                f"WordTokenizer: vocab_size must be more than {len(RESERVED)} (the "
                f"reserved ids), received {vocab_size}."
            )
        counts: Counter = Counter()
        for start in range(0, len(texts), 4096):
            words = cls.split(tf.constant(texts[start : start + 4096]))
            counts.update(w.decode("utf-8") for w in words.flat_values.numpy())
        ranked = sorted(counts, key=lambda w: -counts[w])  # stable: first seen
        return cls(ranked[: vocab_size - len(RESERVED)])

    @property
    def vocab_size(self) -> int:
        return len(RESERVED) + len(self.words)

    def tokenize_words(self, strings) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
        """Ragged ids and the words they stand for, position by position."""
        words = self.split(strings)
        return tf.ragged.map_flat_values(self.table.lookup, words), words

    def tokenize(self, strings) -> tf.RaggedTensor:
        return self.tokenize_words(strings)[0]

    @staticmethod
    def keys(words) -> tf.Tensor:
        """An int64 key per word, equal for equal words (a 63-bit hash): the
        ``token_keys`` of `attention_layers.extended_source_ids`."""
        return tf.strings.to_hash_bucket_fast(words, 2**63 - 1)

    def id_to_token(self, ids) -> tf.Tensor:
        return tf.gather(self.vocab, ids)

    def extended_id_to_token(self, ids, source_words) -> tf.Tensor:
        """Words of extended ids ``[B, L]``: id ``V + j`` is ``source_words[b, j]``.

        ``source_words`` is ``[B, S]`` (dense, padded with ``""``); an id past
        the source gives ``""``.
        """
        ids = tf.convert_to_tensor(ids, tf.int32)
        source_words = tf.convert_to_tensor(source_words, tf.string)
        v = self.vocab_size
        in_vocab = tf.gather(self.vocab, tf.clip_by_value(ids, 0, v - 1))
        padded = tf.pad(source_words, [[0, 0], [0, 1]])  # column S: ""
        s = tf.shape(source_words)[1]
        position = tf.where((ids >= v) & (ids < v + s), ids - v, s)
        copied = tf.gather(padded, position, batch_dims=1)
        return tf.where(ids < v, in_vocab, copied)

    def _join(self, words: tf.RaggedTensor) -> tf.Tensor:
        text = tf.strings.reduce_join(words, axis=-1, separator=" ")
        text = tf.strings.regex_replace(text, r" ([.,;:!?)\]»])", r"\1")
        return tf.strings.regex_replace(text, r"([¿¡(\[«]) ", r"\1")

    def detokenize(self, ids) -> tf.Tensor:
        return self._join(tf.gather(self.vocab, _keep_content(ids)))

    def detokenize_extended(self, ids, source_words) -> tf.Tensor:
        """`detokenize` for extended ids (see `extended_id_to_token`)."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        before_end = tf.math.cumsum(tf.cast(ids == END, tf.int32), axis=1) == 0
        words = self.extended_id_to_token(ids, source_words)
        keep = before_end & (ids >= len(RESERVED)) & (words != "")
        return self._join(tf.ragged.boolean_mask(words, keep))

    def save(self, path: Path) -> None:
        write_text(path, json.dumps({"kind": self.kind, "words": self.words}))


def load_tokenizer(path: Path) -> CharTokenizer | SubwordTokenizer | WordTokenizer:
    spec = read_json(path)
    if spec["kind"] == "char":
        return CharTokenizer(spec["symbols"])
    if spec["kind"] == "word":
        return WordTokenizer(spec["words"])
    return SubwordTokenizer(spec["vocab"])


def learn_tokenizer(kind: str, texts: list[str], vocab_size: int):
    if kind == "char":
        return CharTokenizer.learn(texts)
    if kind == "word":
        return WordTokenizer.learn(texts, vocab_size)
    return SubwordTokenizer.learn(texts, vocab_size)


def token_lengths(tokenizer, texts: list[str]) -> np.ndarray:
    """Tokens per text (int64), tokenized in chunks of 4096."""
    lengths = []
    for start in range(0, len(texts), 4096):
        ids = tokenizer.tokenize(tf.constant(texts[start : start + 4096]))
        lengths.append(ids.row_lengths().numpy())
    return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)

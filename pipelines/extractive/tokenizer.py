"""Words with their byte offsets, in the graph: what a span model points at.

`SpanTokenizer` splits text into runs of letters, digits and marks, and
single other characters (the split of `pipelines.core.text.WordTokenizer`),
keeping each token's byte offsets in the original string, so that a span
of tokens maps back to the exact text it covers. It uses tensorflow-text's
``RegexSplitWithOffsets`` (an op TF Serving links) and core string ops.

Ids: 0 pads, 1-3 are reserved as in `pipelines.core.text`, the
``vocab_size - 4`` most frequent lowercased training words follow, and
every other word gets one of ``oov_buckets`` ids after them by a hash of
the lowercased word. A name never seen in training ("Tuvalu") thus gets
the same id in the question and in the passage; a word-level vocabulary
would map both to one ``[UNK]`` and lose the match.

Example:

>>> tok = SpanTokenizer.learn(["Paris is the capital."], vocab_size=9, oov_buckets=4)
>>> tokens, begins, ends = tok.split(["Rome is the capital."])
>>> [t.decode() for t in tokens[0].numpy()], begins[0].numpy().tolist()
(['Rome', 'is', 'the', 'capital', '.'], [0, 5, 8, 12, 19])
>>> ids = tok.ids(tokens)[0].numpy().tolist()
>>> ids[1:], 9 <= ids[0] < 13  # "rome" is hashed into a bucket
([5, 6, 7, 8], True)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import tensorflow as tf

from pipelines.core.run_dir import read_json, write_text
from pipelines.core.text import RESERVED

# Whitespace separates; a character that is not a letter, digit or mark is a
# token of its own (RE2's Unicode classes: "Zürich" and "km²" stay whole).
_DELIMITER = r"\s+|[^\pL\pN\pM\s]"
_KEPT = r"[^\pL\pN\pM\s]"


class SpanTokenizer(tf.Module):
    """Tokens with byte offsets, and their ids (known words or hash buckets)."""

    kind = "span_words"

    def __init__(self, words: list[str], oov_buckets: int):
        super().__init__(name="span_tokenizer")
        if oov_buckets < 1:
            raise ValueError(
                f"SpanTokenizer: oov_buckets must be at least 1, received {oov_buckets}"
            )
        self.words = list(words)
        self.oov_buckets = int(oov_buckets)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.words, tf.string),
                tf.range(
                    len(RESERVED), len(RESERVED) + len(self.words), dtype=tf.int64
                ),
            ),
            default_value=-1,
        )

    @property
    def vocab_size(self) -> int:
        """Every id the model embeds: reserved, words and buckets."""
        return len(RESERVED) + len(self.words) + self.oov_buckets

    @staticmethod
    def split(strings) -> tuple[tf.RaggedTensor, tf.RaggedTensor, tf.RaggedTensor]:
        """``[B]`` strings to ragged ``(tokens, begins, ends)``: each token, and
        its byte offsets (``end`` exclusive) in its string."""
        import tensorflow_text as tf_text

        return tf_text.regex_split_with_offsets(
            tf.convert_to_tensor(strings, tf.string),
            delim_regex_pattern=_DELIMITER,
            keep_delim_regex_pattern=_KEPT,
        )

    @staticmethod
    def normalize(tokens):
        """Tokens as the vocabulary holds them: lowercased (Unicode-aware)."""
        return tf.strings.lower(tokens, encoding="utf-8")

    def ids(self, tokens: tf.RaggedTensor) -> tf.RaggedTensor:
        """int32 ids of ragged tokens (from `split`)."""
        words = self.normalize(tokens.flat_values)
        known = self.table.lookup(words)
        hashed = tf.strings.to_hash_bucket_fast(words, self.oov_buckets) + (
            len(RESERVED) + len(self.words)
        )
        ids = tf.cast(tf.where(known >= 0, known, hashed), tf.int32)
        return tokens.with_flat_values(ids)

    def encode(self, context, question, max_context: int, max_question: int) -> dict:
        """What the model reads of ``[B]`` passages and questions.

        Returns ragged ``[B, None]`` tensors: ``context`` and ``question``
        ids (cut at ``max_context`` and ``max_question`` tokens), ``match``
        (float32, 1.0 where the lowercased passage word is one of the
        question's), and the passage tokens' byte ``begins`` and ``ends``.
        Training and serving both call this, so they read alike.
        """
        c_tokens, begins, ends = self.split(context)
        c_tokens, begins, ends = (t[:, :max_context] for t in (c_tokens, begins, ends))
        q_tokens = self.split(question)[0][:, :max_question]
        c_words = self.normalize(c_tokens).to_tensor("")
        q_words = self.normalize(q_tokens).to_tensor("")
        same = (c_words[:, :, None] == q_words[:, None, :]) & (
            q_words[:, None, :] != ""
        )
        match = tf.cast(tf.reduce_any(same, axis=2), tf.float32)
        match = tf.RaggedTensor.from_tensor(match, lengths=c_tokens.row_lengths())
        return {
            "context": self.ids(c_tokens),
            "match": match,
            "question": self.ids(q_tokens),
            "begins": begins,
            "ends": ends,
        }

    @classmethod
    def learn(cls, texts: list[str], vocab_size: int, oov_buckets: int):
        """The ``vocab_size - 4`` most frequent lowercased words of ``texts``."""
        if vocab_size <= len(RESERVED):
            raise ValueError(
                f"SpanTokenizer: vocab_size must be more than {len(RESERVED)} (the "
                f"reserved ids), received {vocab_size}."
            )
        counts: Counter = Counter()
        for start in range(0, len(texts), 4096):
            tokens, _, _ = cls.split(tf.constant(texts[start : start + 4096]))
            words = cls.normalize(tokens.flat_values).numpy()
            counts.update(w.decode("utf-8") for w in words)
        ranked = sorted(counts, key=lambda w: -counts[w])  # stable: first seen
        return cls(ranked[: vocab_size - len(RESERVED)], oov_buckets)

    def save(self, path: Path) -> None:
        write_text(
            path,
            json.dumps(
                {
                    "kind": self.kind,
                    "words": self.words,
                    "oov_buckets": self.oov_buckets,
                }
            ),
        )

    @classmethod
    def load(cls, path: Path) -> SpanTokenizer:
        spec = read_json(path)
        if spec.get("kind") != cls.kind:
            raise ValueError(
                f"{path}: expected a {cls.kind} tokenizer, received kind "
                f"{spec.get('kind')!r}"
            )
        return cls(spec["words"], spec["oov_buckets"])

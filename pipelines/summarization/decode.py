"""Strings in, summaries out: tokenization, the copy ids, beam search, words.

`summarize` runs inside one graph (a ``tf.function`` or a SavedModel
signature): the `WordTokenizer` splits the text into words and ids, the
extended ids of the copy mechanism are made from the words' keys
(`attention_layers.extended_source_ids`), beam search decodes over the
extended vocabulary, and every output id is written back as a word, a copied
out-of-vocabulary word as the source's own string.

Example:

>>> import tensorflow as tf
>>> from pipelines.core.text import WordTokenizer
>>> from pipelines.summarization.model import PointerSeq2Seq
>>> tok = WordTokenizer.learn(["the cat sat on the mat ."], vocab_size=10)
>>> model = PointerSeq2Seq(tok.vocab_size, 4, 4, 4, pointer=True)
>>> out = summarize(model, tok, tf.constant(["the zorp sat ."]),
...                 max_source_tokens=8, max_length=5, max_beam_width=2, min_length=1)
>>> out["summary"].shape, out["attention"].shape, out["p_gen"].shape
(TensorShape([1]), TensorShape([1, 5, 4]), TensorShape([1, 5]))
"""

from __future__ import annotations

import tensorflow as tf

import attention_layers as al
from attention_layers.decoding import beam_search, tile_beams
from pipelines.core.text import END, PAD, START, UNK
from pipelines.summarization.model import split_p_gen


def source_inputs(tokenizer, strings, max_source_tokens: int) -> dict:
    """``ids``, ``ext`` (extended ids) and ``words``, ``[B, S]``, cut at
    ``max_source_tokens`` and padded, and ``source_length [B]``: the words of
    each text before the cut.

    An all-empty batch still gets one (padding) column.
    """
    ids, words = tokenizer.tokenize_words(strings)
    source_length = tf.cast(ids.row_lengths(), tf.int32)
    ids = ids[:, :max_source_tokens].to_tensor(default_value=PAD)
    words = words[:, :max_source_tokens].to_tensor(default_value="")
    width = tf.maximum(tf.shape(ids)[1], 1)
    ids = tf.pad(ids, [[0, 0], [0, 1]])[:, :width]
    words = tf.pad(words, [[0, 0], [0, 1]])[:, :width]
    mask = tf.not_equal(ids, PAD)
    ext = al.extended_source_ids(
        ids, tokenizer.keys(words), UNK, tokenizer.vocab_size, mask=mask
    )
    return {
        "ids": ids,
        "ext": tf.cast(ext, tf.int32),
        "words": words,
        "source_length": source_length,
    }


def summarize(
    model,
    tokenizer,
    strings,
    *,
    max_source_tokens: int,
    max_length: int,
    max_beam_width: int,
    beam_width=None,
    length_penalty=0.0,
    min_length=0,
) -> dict:
    """The best beam's summary of each string, and what explains it.

    ``max_beam_width`` (a Python int) sizes the buffers; ``beam_width`` (the
    live beams, at most ``max_beam_width``; None: all), ``length_penalty``
    and ``min_length`` may be tensors (serving inputs).
    Returns ``summary [B]`` strings, ``score [B]`` (``log P / lp``),
    ``length [B]`` (end token included), ``attention [B, T, S]``, ``p_gen
    [B, T]`` (zeros after the end), ``source_tokens [B, S]`` (the words
    read), ``source_length [B]`` (the words of the text), ``truncated [B]``
    (true where the text had more words than ``max_source_tokens`` and its
    end was not read) and ``summary_tokens [B, T]`` (words; copies as the
    source's words).
    """
    source = source_inputs(tokenizer, strings, max_source_tokens)
    encoded = tile_beams(model.encode(source["ids"], source["ext"]), max_beam_width)
    batch = tf.shape(source["ids"])[0]
    out = beam_search(
        model.step_fn(encoded),
        model.initial_state(encoded),
        tf.fill([batch], START),
        end_id=END,
        max_length=max_length,
        beam_width=max_beam_width,  # the layer's names
        length_penalty=length_penalty,
        num_beams=beam_width,
        min_length=min_length,
    )
    tokens = out["tokens"][:, 0]
    attention, p_gen = split_p_gen(out["alignments"][:, 0])
    return {
        "summary": tokenizer.detokenize_extended(tokens, source["words"]),
        "score": out["scores"][:, 0],
        "length": out["lengths"][:, 0],
        "attention": attention,
        "p_gen": p_gen,
        "source_tokens": source["words"],
        "source_length": source["source_length"],
        "truncated": source["source_length"] > max_source_tokens,
        "summary_tokens": tokenizer.extended_id_to_token(tokens, source["words"]),
    }

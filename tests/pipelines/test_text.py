"""The word tokenizer of the copy mechanism: splitting, keys, extended ids."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import attention_layers as al
from pipelines.core.text import END, UNK, WordTokenizer, load_tokenizer

pytestmark = pytest.mark.tf_only


def strings(tensor) -> list:
    return [x.decode("utf-8") for x in np.asarray(tensor).ravel()]


def test_words_keep_unicode_letters_and_split_off_punctuation():
    words = WordTokenizer.split(tf.constant(["  Café, naïve   Zoë's!"]))
    assert strings(words.flat_values) == ["café", ",", "naïve", "zoë", "'", "s", "!"]


def test_vocabulary_is_the_most_frequent_words_and_survives_a_save(tmp_path):
    tok = WordTokenizer.learn(["b a b", "c b a"], vocab_size=6)
    assert list(tok.words) == ["b", "a"]  # c is cut: 4 reserved + 2
    ids = tok.tokenize(tf.constant(["a c b"])).to_list()
    assert ids == [[5, UNK, 4]]
    tok.save(tmp_path / "tok.json")
    loaded = load_tokenizer(tmp_path / "tok.json")
    assert isinstance(loaded, WordTokenizer)
    assert loaded.tokenize(tf.constant(["a c b"])).to_list() == ids
    assert strings(loaded.detokenize([[5, 4, END, 5]])) == ["a b"]
    with pytest.raises(ValueError, match="vocab_size must be more than 4"):
        WordTokenizer.learn(["a"], vocab_size=4)


def test_copied_words_come_out_as_the_source_strings():
    tok = WordTokenizer.learn(["the cat sat ."], vocab_size=8)
    v = tok.vocab_size

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def extended(texts):
        ids, words = tok.tokenize_words(texts)
        ids, words = ids.to_tensor(), words.to_tensor()
        keys = tok.keys(words)
        ext = al.extended_source_ids(ids, keys, UNK, v, mask=ids != 0)
        return ext, words

    ext, words = extended(tf.constant(["the zorp sat zorp .", "blix"]))
    # Both "zorp"s take the id of the first: V + 1; "blix" is V + 0.
    assert ext.numpy().tolist() == [[4, v + 1, 6, v + 1, 7], [v, 0, 0, 0, 0]]
    summary = [[v + 1, 6, v + 4, 7, END, v + 1], [v, v + 3, END, END, END, END]]
    # v + 4 is position 4 of the first source ("."), v + 3 in the second is
    # padding (""): left out. Nothing after END is written.
    assert strings(tok.detokenize_extended(summary, words)) == ["zorp sat..", "blix"]
    tokens = tok.extended_id_to_token([[v + 1, 4, v + 9]], words[:1])
    assert strings(tokens) == ["zorp", "the", ""]
    keys = tok.keys(tf.constant(["zorp", "zorp", "blix"])).numpy()
    assert keys[0] == keys[1] != keys[2]

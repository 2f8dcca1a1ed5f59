"""What the decoders return converts to NumPy on every backend.

Its own module (not test_decoding.py, whose integration tests run in `make
test-slow` off TensorFlow) so that `make test` runs it on PyTorch (the
Makefile's TORCH_TESTS), where a decoder's outputs could carry an autograd
graph, and on TensorFlow.
"""

import keras
import numpy as np
import pytest
from keras import ops

from attention_layers.decoding import (
    beam_search,
    greedy_search,
    rnn_step_fn,
    sample,
    tile_beams,
)
from tests.test_decoding import make_rnn


# JAX compiles each decoding loop (80 s here on two cores) and its arrays
# carry no autograd graph: test_decoding.py's loops run on JAX in test-slow.
@pytest.mark.skipif(
    keras.backend.backend() == "jax", reason="JAX: in test_decoding.py (test-slow)"
)
def test_decoders_return_what_converts_to_numpy():
    """The step runs trainable layers (on PyTorch their outputs carry
    gradients); every decoder's outputs still convert with ``np.asarray``
    and ``keras.ops.convert_to_numpy``, on every backend."""
    embedding, decoder, projection, memory, mask = make_rnn()
    starts = np.array([1, 2], "int32")
    step = rnn_step_fn(embedding, decoder.cell, projection, memory, mask)
    width = 2
    beam_step = rnn_step_fn(
        embedding,
        decoder.cell,
        projection,
        tile_beams(memory, width),
        tile_beams(mask, width),
    )
    outputs = {
        "greedy": greedy_search(step, decoder.initial_states(2), starts, 0, 4),
        "sample": sample(step, decoder.initial_states(2), starts, 0, 4, seed=1),
        "beam": beam_search(
            beam_step, tile_beams(decoder.initial_states(2), width), starts, 0, 4, width
        ),
    }
    for name, out in outputs.items():
        assert "alignments" in out, name
        for key, value in out.items():
            array = np.asarray(value)
            assert array.shape == tuple(value.shape), (name, key)
            np.testing.assert_array_equal(array, ops.convert_to_numpy(value))

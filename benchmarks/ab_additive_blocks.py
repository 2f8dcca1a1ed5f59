"""BahdanauAttention's blocks at lengths unknown when traced, against one piece.

A train step (``tf.function`` without XLA, ``tf.GradientTape``, Adam) of
``BahdanauAttention(units=256)`` traced with the lengths unknown, as under a
``tf.data`` pipeline of varying lengths, on batches of B=32 with 96 to 128
query and memory steps of dimension 256. One version plans the score blocks
when the step runs (``additive._dynamic_blocks``, what the layer does); the
other computes the ``[B, Tq, Tv, units]`` tanh in one piece and leaves the
gradient to autodiff (the layer's behaviour before the blocks were planned at
run time). Both are traced in this process with the same weights and timed in
alternating rounds of three steps (one per batch shape). The memory of the
same comparison through ``fit`` is the ``fit`` row of ``bench_bahdanau``.

Usage: ``python -m benchmarks.ab_additive_blocks [--rounds 10]``.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import paired  # noqa: E402

B, D, UNITS = 32, 256, 256
SHAPES = ((96, 128), (112, 96), (128, 112))  # (Tq, Tv) of the three batches


def one_piece(query_proj, key_proj, v, budget):
    """The scores with the whole tanh tensor at once (autodiff gradient)."""
    from keras import ops

    from attention_layers.base import linear

    tanh = ops.tanh(ops.expand_dims(query_proj, 2) + ops.expand_dims(key_proj, 1))
    return linear(tanh, v)


def train_step(dynamic_blocks=None):
    """A traced train step; ``dynamic_blocks`` replaces the layer's while it traces."""
    import keras
    import numpy as np
    import tensorflow as tf

    import attention_layers as al
    from attention_layers import additive

    keras.utils.set_random_seed(0)
    layer = al.BahdanauAttention(units=UNITS)
    layer(np.zeros((1, 2, D), "float32"), np.zeros((1, 3, D), "float32"))
    optimizer = keras.optimizers.Adam()
    spec = [tf.TensorSpec((B, None, D), tf.float32)] * 2

    @tf.function(input_signature=spec, jit_compile=False)
    def step(query, value):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(layer(query, value) ** 2)
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(grads, layer.trainable_variables)
        return loss

    real = additive._dynamic_blocks
    if dynamic_blocks is not None:
        additive._dynamic_blocks = dynamic_blocks
    try:
        step.get_concrete_function()
    finally:
        additive._dynamic_blocks = real
    return step


def main(argv=None):
    import tensorflow as tf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    batches = [
        (tf.random.normal((B, tq, D), seed=i), tf.random.normal((B, tv, D), seed=i + 1))
        for i, (tq, tv) in enumerate(SHAPES)
    ]
    steps = {"blocks": train_step(), "one piece": train_step(one_piece)}

    def rounds_of(step):
        def run():
            for batch in batches:
                step(*batch).numpy()

        return run

    fns = {name: rounds_of(step) for name, step in steps.items()}
    wall, cpu = paired.paired_rounds(fns, args.rounds, warmup=1)
    ratio = paired.summary(paired.ratios(wall["one piece"], wall["blocks"]))
    cpu_ratio = paired.summary(paired.ratios(cpu["one piece"], cpu["blocks"]))
    for name in steps:
        ms = paired.summary([s * 1e3 / len(SHAPES) for s in wall[name]])
        print(f"{name}: {ms['median']:.0f} ms per step (median)")
    print(f"ratio one piece / blocks (wall): {paired.fmt_spread(ratio)}")
    print(f"ratio one piece / blocks (CPU time): {paired.fmt_spread(cpu_ratio)}")
    print(f"rounds: {args.rounds} of {len(SHAPES)} steps")


if __name__ == "__main__":
    main()

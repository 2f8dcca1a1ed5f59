"""The attention images' time budget, on a fake clock and a fake drawer."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")


class Clock:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_drawer(clock: Clock, costs: list[float]):
    """A ``draw`` that takes ``costs[k]`` seconds the k-th time (the last
    cost repeats) and writes one small PNG."""
    import tensorflow as tf

    calls = []

    def draw(folder):
        clock.now += costs[min(len(calls), len(costs) - 1)]
        calls.append(folder)
        path = folder / "picture.png"
        grey = tf.fill([4, 6, 3], tf.constant(200, tf.uint8))
        path.write_bytes(tf.io.encode_png(grey).numpy())
        return [path]

    return draw, calls


def train(images, clock: Clock, epochs: int, seconds: float) -> list[float]:
    """Run ``epochs`` fake epochs of ``seconds`` each; the drawing's share of
    the training time after each."""
    shares = []
    images.on_train_begin()
    for epoch in range(epochs):
        images.on_epoch_begin(epoch)
        clock.now += seconds
        images.on_epoch_end(epoch)
        shares.append(sum(images.seconds) / images.training)
    images.on_train_end()
    return shares


def test_every_drawing_first_included_keeps_within_the_budget(tmp_path):
    """Epochs of 10 s, 5%: 0.5 s of drawing earned per epoch. The first
    drawing, estimated at 2 s, waits for epoch 3 and takes 2 s (tracing);
    the next, estimated from it, waits for epoch 7 and takes 0.4 s; then
    each epoch can pay 0.4 s. The images are read back at those epochs."""
    from pipelines.core.attention_board import AttentionImages, read_images

    clock = Clock()
    draw, calls = fake_drawer(clock, [2.0, 0.4])
    images = AttentionImages(draw, tmp_path, budget=0.05, first_estimate=2.0,
                             clock=clock)  # fmt: skip
    shares = train(images, clock, epochs=10, seconds=10.0)
    assert max(shares) <= 0.05, shares
    steps = sorted(step for _, step, _ in read_images(tmp_path / "attention"))
    assert steps == [3, 7, 8, 9], steps
    assert len(calls) == 4
    assert images.report() == (
        "Attention images for TensorBoard: 4 of 10 epochs drawn, 6 skipped to "
        "keep drawing within 5% of the training time; drawing took 3.2 s, 3.2% "
        "of 100 s of training (2.00 s the first time, tracing the graph, then "
        "0.40 s each)"
    )


def test_a_run_too_short_for_a_drawing_draws_none_and_says_so(tmp_path):
    """Three epochs of 100 s earn 15 s; a drawing estimated at the shortest
    epoch (no estimate given) is never made, last epoch included."""
    from pipelines.core.attention_board import AttentionImages, read_images

    clock = Clock()
    draw, calls = fake_drawer(clock, [20.0])
    images = AttentionImages(draw, tmp_path, clock=clock)
    train(images, clock, epochs=3, seconds=100.0)
    assert calls == [] and read_images(tmp_path / "attention") == []
    assert images.report().startswith(
        "Attention images for TensorBoard: 0 of 3 epochs drawn, 3 skipped to keep "
        "drawing within 5% of the training time; drawing took 0.0 s, 0.0% of 300 s"
    )


def test_the_next_estimate_is_the_last_drawing(tmp_path):
    """The first drawing, estimated at the shortest epoch (10 s), is made
    after epoch 19 (200 s of training earn 10 s) and takes 12 s; the next,
    now estimated at 12 s, waits until 480 s of training earn 24 s."""
    from pipelines.core.attention_board import AttentionImages, read_images

    clock = Clock()
    draw, _ = fake_drawer(clock, [12.0])
    images = AttentionImages(draw, tmp_path, clock=clock)
    train(images, clock, epochs=48, seconds=10.0)
    steps = sorted(step for _, step, _ in read_images(tmp_path / "attention"))
    assert steps == [19, 47], steps
    assert images.skipped == 46
    assert sum(images.seconds) <= 0.05 * images.training

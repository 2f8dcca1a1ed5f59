"""The attention of a few validation examples in TensorBoard, every epoch.

A Keras user watches training in TensorBoard; `AttentionImages` puts the
attention there as it forms: at the end of each epoch the task draws its
usual plots (`Task.plot_attention`: alignment heatmaps, caption overlays,
memory hops, span attention) for the same validation examples through the
export's own graph, and the PNGs go to ``logs/attention`` as images
(TensorBoard's Images tab, one slider step per epoch drawn). ``train.
attention_images`` sets how many examples (0: none). Drawing is held to 5%
of the training time: an epoch whose drawing would break that is skipped,
the first drawing (which traces the graph) included; what was drawn, what
was skipped and what it took is printed after training.

Example:

>>> import tempfile, numpy as np
>>> from pathlib import Path
>>> def draw(folder):
...     path = Path(folder) / "square.png"
...     import matplotlib; matplotlib.use("Agg")
...     import matplotlib.pyplot as plt
...     plt.imsave(path, np.eye(4)); return [path]
>>> logs = Path(tempfile.mkdtemp())
>>> images = AttentionImages(draw, logs)
>>> images.write(0)  # as an epoch within the budget is drawn
>>> [(tag, step) for tag, step, _ in read_images(logs / "attention")]
[('attention/square', 0)]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf


class AttentionImages(keras.callbacks.Callback):
    """The PNGs ``draw(folder)`` writes, logged as images under
    ``log_dir/attention`` at step ``epoch`` (Keras' epoch scalars' step).

    An epoch is drawn only when the drawing, as estimated, keeps the time
    spent drawing within ``budget`` of the training time so far; every
    drawing counts, the first (which traces the graph) included, and none is
    forced. The estimate is the previous drawing's time; before the first,
    ``first_estimate`` seconds (None: the shortest epoch so far, whose time
    includes tracing the training step, a larger graph than the one drawn).
    `report` says how many epochs were drawn and skipped and the share of
    the training time the drawings took.
    """

    def __init__(
        self,
        draw: Callable[[Path], list[Path]],
        log_dir: str | Path,
        budget: float = 0.05,
        first_estimate: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self.draw = draw
        self.budget = budget
        self.first_estimate = first_estimate
        self.clock = clock
        self.writer = tf.summary.create_file_writer(str(Path(log_dir) / "attention"))
        self.seconds: list[float] = []
        self.epochs = 0
        self.skipped = 0
        self.training = 0.0
        self._shortest: float | None = None
        self._epoch_start: float | None = None

    def on_train_begin(self, logs=None):
        self._epoch_start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.clock()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1
        if self._epoch_start is not None:
            took = self.clock() - self._epoch_start
            self.training += took
            shortest = self._shortest
            self._shortest = took if shortest is None else min(shortest, took)
            self._epoch_start = None
        if self.affordable():
            self.write(epoch)
        else:
            self.skipped += 1

    def estimate(self) -> float | None:
        """Seconds the next drawing is expected to take (None: unknown)."""
        if self.seconds:
            return self.seconds[-1]
        if self.first_estimate is not None:
            return self.first_estimate
        return self._shortest

    def affordable(self) -> bool:
        """Whether drawing now keeps drawing within the budget."""
        cost = self.estimate()
        if cost is None:
            return False
        return sum(self.seconds) + cost <= self.budget * self.training

    def write(self, epoch: int) -> None:
        """Draw now and log the images at step ``epoch``."""
        t0 = self.clock()
        with tempfile.TemporaryDirectory() as folder:
            paths = self.draw(Path(folder))
            with self.writer.as_default():
                for path in paths:
                    image = tf.io.decode_png(tf.io.read_file(str(path)), channels=3)
                    tf.summary.image(f"attention/{path.stem}", image[None], step=epoch)
            self.writer.flush()
        self.seconds.append(self.clock() - t0)

    def report(self) -> str:
        """One line: the epochs drawn and skipped for the budget, and the
        share of the training time the drawings took."""
        if not self.epochs:
            return ""
        spent = sum(self.seconds)
        share = spent / self.training if self.training else 0.0
        line = (
            f"Attention images for TensorBoard: {len(self.seconds)} of "
            f"{self.epochs} epoch{'s' * (self.epochs != 1)} drawn, {self.skipped} "
            "skipped to keep drawing "
            f"within {self.budget:.0%} of the training time; drawing took "
            f"{spent:.1f} s, {share:.1%} of {self.training:.0f} s of training"
        )
        if len(self.seconds) > 1:
            line += (
                f" ({self.seconds[0]:.2f} s the first time, tracing the graph, then "
                f"{np.mean(self.seconds[1:]):.2f} s each)"
            )
        return line


def read_images(log_dir: str | Path) -> list[tuple[str, int, np.ndarray]]:
    """``(tag, step, RGB array)`` of every image summary in ``log_dir``'s
    event files, as TensorBoard reads them (TF2 summaries: tensors of PNG
    strings)."""
    from tensorflow.core.util import event_pb2

    found = []
    for path in sorted(Path(log_dir).glob("events.out.tfevents*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "images":
                    continue
                encoded = tf.make_ndarray(value.tensor)  # [width, height, png...]
                for png in encoded[2:]:
                    pixels = tf.io.decode_png(png, channels=3).numpy()
                    found.append((value.tag, int(event.step), pixels))
    return found

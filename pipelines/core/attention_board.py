"""The attention of a few validation examples in TensorBoard, every epoch.

A Keras user watches training in TensorBoard; `AttentionImages` puts the
attention there as it forms: at the end of each epoch the task draws its
usual plots (`Task.plot_attention`: alignment heatmaps, caption overlays,
memory hops, span attention) for the same validation examples through the
export's own graph, and the PNGs go to ``logs/attention`` as images
(TensorBoard's Images tab, one slider step per epoch drawn). ``train.
attention_images`` sets how many examples (0: none). Drawing is held to 5%
of the training time (fast epochs skip some; the first and the last are
always drawn); what it took is printed after training.

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
>>> images.on_train_begin()
>>> images.on_epoch_end(0)
>>> images.on_train_end()
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

    They are drawn after the first epoch, after the last, and after any
    other whose drawing keeps the time spent drawing within ``budget`` of
    the time spent training (fast epochs skip some; the first drawing, which
    traces the graph, is not counted), so the images do not show in the
    run's time.
    """

    def __init__(
        self,
        draw: Callable[[Path], list[Path]],
        log_dir: str | Path,
        budget: float = 0.05,
    ):
        super().__init__()
        self.draw = draw
        self.budget = budget
        self.writer = tf.summary.create_file_writer(str(Path(log_dir) / "attention"))
        self.seconds: list[float] = []
        self.epochs = 0
        self._start = time.perf_counter()
        self._undrawn: int | None = None

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1
        # The first drawing traces the graph once: not counted in the budget.
        drawing = sum(self.seconds[1:])
        training = time.perf_counter() - self._start - sum(self.seconds)
        mean = drawing / len(self.seconds[1:]) if self.seconds[1:] else 0.0
        if not self.seconds or drawing + mean <= self.budget * training:
            self.write(epoch)
        else:
            self._undrawn = epoch

    def on_train_end(self, logs=None):
        if self._undrawn is not None:  # the last epoch, always shown
            self.write(self._undrawn)

    def write(self, epoch: int) -> None:
        """Draw now and log the images at step ``epoch``."""
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            paths = self.draw(Path(folder))
            with self.writer.as_default():
                for path in paths:
                    image = tf.io.decode_png(tf.io.read_file(str(path)), channels=3)
                    tf.summary.image(f"attention/{path.stem}", image[None], step=epoch)
            self.writer.flush()
        self._undrawn = None
        self.seconds.append(time.perf_counter() - t0)

    def report(self) -> str:
        """One line: what the images cost, the first drawing (which traces
        the graph) apart from the others, and how many epochs were drawn."""
        if not self.seconds:
            return ""
        line = (
            f"Attention images for TensorBoard: {len(self.seconds)} of "
            f"{self.epochs} epochs drawn; {self.seconds[0]:.2f} s the first "
            "time (tracing the graph)"
        )
        if len(self.seconds) > 1:
            line += f", then {np.mean(self.seconds[1:]):.2f} s each"
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

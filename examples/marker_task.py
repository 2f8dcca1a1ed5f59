"""The marker task: a toy problem whose right attention position is known."""

import numpy as np

T, CLASSES, NOISE = 8, 8, 8


def marker_data(n, seed):
    """``(x [n, T, F], label [n], marked position [n])`` of the marker task.

    ``T`` vectors per example: channel 0 marks one position (0.5), the next
    ``CLASSES`` channels one-hot a label per position, then Gaussian noise. The
    target is the label at the marked position, so a model must attend there:
    picking any other position gives the right label by chance (1/CLASSES).
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, (n, T))
    position = rng.integers(0, T, n)
    x = np.zeros((n, T, 1 + CLASSES + NOISE), "float32")
    x[np.arange(n), position, 0] = 0.5
    x[..., 1 : 1 + CLASSES] = np.eye(CLASSES)[labels]
    x[..., 1 + CLASSES :] = rng.normal(size=(n, T, NOISE))
    return x, labels[np.arange(n), position].astype("int32"), position

"""The layer contract's distribution clause, run in its own JAX process.

``python -m tests.distributed OUT.json CASE_ID...``, started by
`tests.contract.run_distributed` with ``KERAS_BACKEND=jax`` and two virtual
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=2``), takes
for each case one SGD step (learning rate 1, so the change of a weight is its
gradient) on one device, under
``keras.distribution.DataParallel`` over both devices, and under
``ModelParallel`` with `attention_layers.layout_map` on a ``(1, 2)`` mesh; it
writes each run's loss, weight changes and predictions against the one-device
run's to ``OUT.json`` for `tests.contract.check_distributed` to judge.
"""

import json
import sys
import traceback

import keras
import numpy as np

import attention_layers as al
from tests import contract
from tests.cases import CASES


def model_of(case):
    layer = case.make()
    model, feed, target = contract._trainable_model(case, layer)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    # Batch 4, so that each device of the batch axis holds 2 examples.
    feed = {k: np.concatenate([v, v[:1]]) for k, v in feed.items()}
    return model, feed, np.concatenate([target, target[:1]])


def step(model, feed, target):
    """The loss, each weight's change and the predictions after one step."""
    before = model.get_weights()
    history = model.fit(feed, target, batch_size=4, epochs=1, shuffle=False, verbose=0)
    change = [b - a for a, b in zip(model.get_weights(), before, strict=True)]
    return history.history["loss"][0], change, model.predict(feed, verbose=0)


def unsplittable(model, layouts, size):
    """Weights the layout map splits along an axis not divisible by ``size``."""
    found = []
    for w in model.weights:
        layout = layouts[w.path]
        for dim, axis in zip(w.shape, layout.axes if layout else (), strict=False):
            if axis is not None and dim % size:
                found.append(f"{w.path} {tuple(w.shape)}")
    return found


def compare(case, single, init, distribution):
    with distribution.scope():
        model, feed, target = model_of(case)
        model.set_weights(init)
        loss, change, predictions = step(model, feed, target)
        split = [
            w.path
            for w in model.weights
            if any(a is not None for a in w.value.sharding.spec)
        ]
    ref_loss, ref_change, ref_predictions = single
    return {
        "loss": [float(loss), float(ref_loss)],
        # Each weight's change against the one-device change, elementwise:
        # the largest |a - b| - 1e-4 |b| (the tolerance of the
        # MirroredStrategy clause: rtol 1e-4, atol 1e-6).
        "change": max(
            float(np.max(np.abs(a - b) - 1e-4 * np.abs(b)))
            for a, b in zip(change, ref_change, strict=True)
        ),
        "predictions": float(np.max(np.abs(predictions - ref_predictions))),
        "split": split,
    }


def check(case):
    devices = keras.distribution.list_devices()
    assert len(devices) == 2, devices
    keras.utils.set_random_seed(0)
    model, feed, target = model_of(case)
    init = model.get_weights()
    single = step(model, feed, target)
    result = {
        "data_parallel": compare(
            case, single, init, keras.distribution.DataParallel(devices=devices)
        )
    }
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
    layouts = al.layout_map(mesh)
    result["mapped"] = [w.path for w in model.weights if layouts[w.path] is not None]
    odd = unsplittable(model, layouts, 2)
    if odd:
        result["model_parallel"] = "not divisible over 2 devices: " + ", ".join(odd)
    else:
        distribution = keras.distribution.ModelParallel(
            layout_map=layouts, batch_dim_name="batch"
        )
        result["model_parallel"] = compare(case, single, init, distribution)
    return result


def main(out_path, ids):
    assert keras.backend.backend() == "jax", keras.backend.backend()
    cases = {c.id: c for c in CASES}
    results = {}
    for case_id in ids:
        try:
            results[case_id] = check(cases[case_id])
        except Exception:
            results[case_id] = traceback.format_exc()
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

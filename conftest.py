"""Test set-up: two logical CPU devices for tf.distribute, quiet TensorFlow."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    _cpus = tf.config.list_physical_devices("CPU")
    # Must happen before TensorFlow initialises its devices.
    tf.config.set_logical_device_configuration(
        _cpus[0],
        [
            tf.config.LogicalDeviceConfiguration(),
            tf.config.LogicalDeviceConfiguration(),
        ],
    )


def pytest_collection_modifyitems(config, items):
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason="needs the TensorFlow backend")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends in float32 with a fixed seed."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")

"""Where the layers run: the device query behind the kernels' choice.

The kernels' choice of evaluation (`attention.choose`, the additive score's
`choose_implementation`), never a layer, asks `platform()` once per trace.
Tests substitute it (``monkeypatch.setattr(devices, "platform", lambda:
"gpu")``) to check the accelerator choices on a CPU.
"""

import functools

import keras

PLATFORMS = ("cpu", "gpu", "tpu")


@functools.cache
def platform():
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: the kind of Keras' default devices.

    Asked of the backend once per process: JAX's and TensorFlow's device
    lists (``keras.distribution.list_devices``), PyTorch's default device
    (a CUDA, MPS or XPU device counts as ``"gpu"``).

    >>> platform() in PLATFORMS
    True
    """
    if keras.backend.backend() == "torch":
        kind = keras.ops.zeros(()).device.type
    else:
        kind = keras.distribution.list_devices()[0].split(":")[0].lower()
    return kind if kind in ("cpu", "tpu") else "gpu"


def on_accelerator():
    """Whether `platform` is a GPU or a TPU."""
    return platform() != "cpu"


@functools.cache
def pallas_attention_available():
    """Whether JAX's Pallas flash-attention kernel for GPUs compiles and runs here.

    ``False`` off the JAX backend or off a GPU. On a GPU a tiny call of the
    kernel is compiled and run once per process (outside any trace), so that
    a GPU or a JAX release the kernel does not support makes the layers fall
    back to another path instead of failing.
    """
    if keras.backend.backend() != "jax" or platform() != "gpu":
        return False
    try:
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.gpu import attention

        with jax.ensure_compile_time_eval():
            x = jnp.ones((1, 128, 1, 64), "float32")
            out = attention.mha(x, x, x, segment_ids=None, sm_scale=0.125)
            return bool(jnp.all(jnp.isfinite(out)))
    except Exception:  # no Triton, an unsupported GPU, another kernel API
        return False

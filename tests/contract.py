"""The layer contract, as checks that every public layer must pass.

Written against Keras's public API only. A ``Case`` describes how to build a
layer and feed it; each ``check_*`` function takes a case and fails loudly
when the layer breaks one clause of the contract (docs/contract.md lists
the clauses, docs/masking.md the mask semantics). ``tests/test_contract.py``
runs every check on every case.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import numpy as np

BATCH = 3


@dataclass
class Case:
    """One public layer configuration and the shapes it is fed.

    ``kind`` is ``"score"`` for the query/value layers (masks ``query_mask``,
    ``value_mask``), ``"decoder"`` for sequence decoders fed the same way (no
    ``key``, no causal mask: they are causal by construction), and ``"pool"``
    for single-sequence layers (mask ``mask``).
    """

    id: str
    factory: Callable[..., keras.layers.Layer]
    query_dim: int = 4
    value_dim: int = 6
    query_length: int = 4
    value_length: int = 5
    kind: str = "score"
    bad_ctor: list = field(default_factory=list)  # kwargs that must raise
    # False for layers whose weights may sum to less than 1 by definition
    # (local-p's Gaussian); their unmasked rows must then sum to (0, 1].
    weights_sum_to_one: bool = True
    # False for argmax hard attention, whose output is piecewise constant in
    # the values: perturbing a value it does not pick leaves the output as is.
    continuous_in_values: bool = True
    # False where the output is more than the context (a decoder's output
    # also carries its recurrent state): a fully masked memory then zeroes
    # the weights but not the output.
    output_is_context: bool = True
    # The axis of a heads dimension in the weights (1 for [B, H, Tq, Tv]), or
    # None for [B, Tq, Tv]; checks that index the query axis fold it into the
    # batch.
    heads_axis: int | None = None
    # False where training draws random numbers (dropout, Gumbel samples):
    # two devices then draw other numbers than one, so the MirroredStrategy
    # clause checks a finite loss only, not equal gradients.
    deterministic_training: bool = True

    def make(self, **kwargs):
        return self.factory(**kwargs)

    # -- inputs -----------------------------------------------------------
    def arrays(self, seed=0, scale=1.0):
        rng = np.random.default_rng(seed)
        value = rng.normal(size=(BATCH, self.value_length, self.value_dim))
        if self.kind == "pool":
            return {"inputs": (scale * value).astype("float32")}
        query = rng.normal(size=(BATCH, self.query_length, self.query_dim))
        return {
            "query": (scale * query).astype("float32"),
            "value": (scale * value).astype("float32"),
        }

    def masks(self):
        """Masks with padding at the end and one fully masked batch row (row 0)."""
        value_mask = np.ones((BATCH, self.value_length), bool)
        value_mask[0, :] = False
        value_mask[1, -2:] = False
        if self.kind == "pool":
            return {"mask": value_mask}
        query_mask = np.ones((BATCH, self.query_length), bool)
        query_mask[2, -1] = False
        return {"query_mask": query_mask, "value_mask": value_mask}

    def call(self, layer, arrays, masks=None, **kwargs):
        return layer(**arrays, **(masks or {}), **kwargs)

    def outputs(self, layer, arrays, masks=None, **kwargs):
        """``(output, weights)`` as numpy arrays."""
        out, weights = self.call(
            layer, arrays, masks, return_attention_scores=True, **kwargs
        )
        return keras.ops.convert_to_numpy(out), keras.ops.convert_to_numpy(weights)

    def functional_model(self, layer, with_masks=True):
        """A model with named inputs and named outputs ``output``, ``weights``."""
        arrays = self.arrays()
        inputs = {
            k: keras.Input(shape=v.shape[1:], name=k, dtype="float32")
            for k, v in arrays.items()
        }
        masks = {}
        if with_masks:
            masks = {
                k: keras.Input(shape=v.shape[1:], name=k, dtype="bool")
                for k, v in self.masks().items()
            }
        out, weights = self.call(layer, inputs, masks, return_attention_scores=True)
        return keras.Model({**inputs, **masks}, {"output": out, "weights": weights})

    def feed(self, with_masks=True):
        return {**self.arrays(), **(self.masks() if with_masks else {})}

    def query_major(self, weights):
        """``weights`` as ``[batch, Tq, Tv]``, a heads axis folded into the batch."""
        if self.heads_axis is None:
            return weights
        weights = np.moveaxis(weights, self.heads_axis, 1)
        return weights.reshape((-1,) + weights.shape[2:])


def built(case, **kwargs):
    layer = case.make(**kwargs)
    case.call(layer, case.arrays())
    return layer


def copy_weights(src, dst):
    dst.set_weights(src.get_weights())


def check_distinct_initial_weights(case):
    """No two randomly initialised weights of a built layer are equal.

    Keras 3 initializers give the same values on every call, so a layer that
    hands one instance to two weights of a shape starts them equal. Weights
    that are constant by design (zeros, ones) are not compared.
    """
    layer = built(case)
    random = [
        (v.path, np.asarray(keras.ops.convert_to_numpy(v.value))) for v in layer.weights
    ]
    random = [(p, w) for p, w in random if w.size > 1 and np.ptp(w) > 0]
    for i, (path_a, a) in enumerate(random):
        for path_b, b in random[i + 1 :]:
            if a.shape == b.shape:
                assert not np.array_equal(a, b), f"{path_a} == {path_b} after build"


# -- 1. config round trip ----------------------------------------------------
def check_config(case):
    layer = built(case)
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    case.call(clone, case.arrays())
    copy_weights(layer, clone)
    a = case.outputs(layer, case.arrays(), case.masks())
    b = case.outputs(clone, case.arrays(), case.masks())
    np.testing.assert_array_equal(a[0], b[0])
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is type(layer)

    def as_json(c):  # JSON turns tuples (nested build shapes) into lists
        return json.loads(json.dumps(c))

    assert as_json(restored.get_config()) == as_json(config)


# -- 2. .keras save and load ------------------------------------------------
def check_keras_file(case, tmp_path):
    model = case.functional_model(case.make())
    feed = case.feed()
    expected = model.predict(feed, verbose=0)
    path = os.path.join(tmp_path, f"{case.id}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects
    got = loaded.predict(feed, verbose=0)
    for name in ("output", "weights"):
        np.testing.assert_array_equal(expected[name], got[name])


# -- 3. SavedModel loaded where the library cannot be imported -----------------
def export_saved_model(model, feed, path):
    """Export ``model`` with named inputs (``feed``'s keys) and named outputs."""
    import tensorflow as tf

    names = list(feed)
    specs = [
        tf.TensorSpec((None,) + feed[n].shape[1:], tf.as_dtype(feed[n].dtype), name=n)
        for n in names
    ]

    def serve(*args):
        return model(dict(zip(names, args, strict=True)), training=False)

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=specs)
    archive.write_out(path, verbose=False)


def run_without_library(export_dir, feed, tmp_path):
    """Outputs of ``serving_default`` on ``feed``, in a process without the library."""
    got = run_many_without_library({"export": (export_dir, feed)}, tmp_path)["export"]
    assert not isinstance(got, str), got[-3000:]
    return got


def assert_served_without_library(models, tmp_path, rtol=1e-5, atol=1e-6):
    """Export each ``{name: (model, feed)}``, serve them all in one fresh
    process without the library, and compare each ``output`` with Python's."""
    exports, expected = {}, {}
    for name, (model, feed) in models.items():
        expected[name] = model.predict(feed, verbose=0)["output"]
        export_dir = os.path.join(tmp_path, name)
        export_saved_model(model, feed, export_dir)
        exports[name] = (export_dir, feed)
    served = run_many_without_library(exports, str(tmp_path))
    for name, want in expected.items():
        assert not isinstance(served[name], str), served[name][-3000:]
        np.testing.assert_allclose(
            served[name]["output"], want, rtol=rtol, atol=atol, err_msg=name
        )


def check_saved_model(case, tmp_path):
    feed, expected, export_dir = export_case(case, tmp_path)
    check_served(expected, run_without_library(export_dir, feed, tmp_path))


def export_case(case, tmp_path):
    """``(feed, expected outputs, export folder)`` of ``case`` exported."""
    model = case.functional_model(case.make())
    feed = case.feed()
    expected = model.predict(feed, verbose=0)
    export_dir = os.path.join(tmp_path, "export")
    export_saved_model(model, feed, export_dir)
    return feed, expected, export_dir


def check_served(expected, got):
    assert set(got) == {"output", "weights"}
    for name in ("output", "weights"):
        np.testing.assert_allclose(expected[name], got[name], rtol=1e-5, atol=1e-6)


_LOAD_MANY_WITHOUT_LIBRARY = textwrap.dedent(
    """
    import json, sys, traceback
    sys.modules["attention_layers"] = None  # any import of it now fails
    import numpy as np
    import tensorflow as tf
    try:
        import attention_layers  # noqa: F401
        sys.exit("attention_layers was importable")
    except ImportError:
        pass
    for export_dir, feed_path, out_path in json.loads(sys.argv[1]):
        try:
            fn = tf.saved_model.load(export_dir).signatures["serving_default"]
            feed = dict(np.load(feed_path))
            out = fn(**{k: tf.constant(v) for k, v in feed.items()})
            np.savez(out_path, **{k: v.numpy() for k, v in out.items()})
        except Exception:
            with open(out_path + ".error", "w") as f:
                f.write(traceback.format_exc())
    """
)


def run_many_without_library(exports, tmp_path):
    """`run_without_library` for many ``{id: (export_dir, feed)}`` in one process.

    Returns ``{id: outputs}``, or ``{id: traceback text}`` where loading or
    calling that export failed.
    """
    items = []
    for name, (export_dir, feed) in exports.items():
        feed_path = os.path.join(tmp_path, f"{name}.feed.npz")
        np.savez(feed_path, **feed)
        items.append((export_dir, feed_path, os.path.join(tmp_path, f"{name}.out.npz")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_MANY_WITHOUT_LIBRARY, json.dumps(items)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {}
    for name, (_, _, out_path) in zip(exports, items, strict=True):
        if os.path.exists(out_path + ".error"):
            with open(out_path + ".error") as f:
                results[name] = f.read()
        else:
            results[name] = dict(np.load(out_path))
    return results


# -- 4. masks ------------------------------------------------------------------
def check_implicit_mask(case):
    """A mask from ``Embedding(mask_zero=True)`` equals the same explicit mask."""
    masks = case.masks()
    layer = built(case)
    implicit_inputs, explicit_inputs = {}, {}
    for name, array in case.arrays().items():
        mask = masks["mask" if case.kind == "pool" else f"{name}_mask"]
        ids = np.where(mask, np.arange(1, mask.shape[1] + 1)[None, :], 0)
        emb = keras.layers.Embedding(mask.shape[1] + 1, array.shape[-1], mask_zero=True)
        implicit_inputs[name] = emb(ids)
        explicit_inputs[name] = keras.ops.convert_to_numpy(implicit_inputs[name])
    implicit = case.outputs(layer, implicit_inputs)
    explicit = case.outputs(layer, explicit_inputs, masks)
    unmasked = case.outputs(layer, explicit_inputs)
    np.testing.assert_array_equal(implicit[1], explicit[1])
    np.testing.assert_array_equal(implicit[0], explicit[0])
    assert not np.array_equal(unmasked[1], explicit[1]), "the mask had no effect"


def assert_row_sums(case, sums, atol=0.0, rtol=1e-5):
    """Unmasked rows sum to 1, or to (0, 1] where ``case.weights_sum_to_one`` is
    False."""
    if case.weights_sum_to_one:
        np.testing.assert_allclose(sums, 1.0, rtol=rtol, atol=atol)
    else:
        assert (sums > 0).all() and (sums <= 1.0 + rtol + atol).all(), sums


def check_fully_masked_row(case):
    layer = built(case)
    out, weights = case.outputs(layer, case.arrays(), case.masks())
    assert np.isfinite(out).all() and np.isfinite(weights).all()
    np.testing.assert_array_equal(weights[0], 0.0)  # row 0: every value masked
    if case.output_is_context:
        np.testing.assert_array_equal(out[0], 0.0)
    value_mask = case.masks()["mask" if case.kind == "pool" else "value_mask"]
    # Unmasked rows sum to one, and masked positions get no weight.
    assert_row_sums(case, weights[1].sum(-1))
    assert (weights[1][..., ~value_mask[1]] == 0).all()


def check_nan_in_masked_positions(case):
    layer = built(case)
    masks = case.masks()
    clean = case.arrays()
    dirty = {k: v.copy() for k, v in clean.items()}
    for name in dirty:
        mask = masks["mask" if case.kind == "pool" else f"{name}_mask"]
        dirty[name][~mask] = np.nan
    a = case.outputs(layer, clean, masks)
    b = case.outputs(layer, dirty, masks)
    assert np.isfinite(b[0]).all() and np.isfinite(b[1]).all()
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def check_causal(case):
    """Query ``i`` sees values ``j <= i`` (aligned at the first value, as in
    Keras): perturbing value ``Tq - 1`` leaves every earlier query untouched
    and reaches the last one; weights above the diagonal are zero."""
    layer = built(case)
    arrays = case.arrays()
    last = case.query_length - 1
    perturbed = {k: v.copy() for k, v in arrays.items()}
    perturbed["value"][:, last] += 10.0
    a = case.outputs(layer, arrays, use_causal_mask=True)
    b = case.outputs(layer, perturbed, use_causal_mask=True)
    a = (a[0], case.query_major(a[1]))
    b = (b[0], case.query_major(b[1]))
    np.testing.assert_array_equal(a[0][:, :last], b[0][:, :last])
    np.testing.assert_array_equal(a[1][:, :last], b[1][:, :last])
    if case.continuous_in_values:
        assert not np.array_equal(a[0][:, last], b[0][:, last]), (
            "last query ignored value"
        )
    upper = np.triu(np.ones((case.query_length, case.value_length)), 1)
    assert (a[1][:, upper.astype(bool)] == 0).all()


def sublayers(layer):
    """Every layer held by ``layer``'s attributes, recursively (in lists,
    tuples and dicts too), without ``layer`` itself."""
    found, todo = [], list(vars(layer).values())
    while todo:
        x = todo.pop()
        if isinstance(x, keras.layers.Layer):
            if x is not layer and all(x is not f for f in found):
                found.append(x)
                todo.extend(vars(x).values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
    return found


# -- 5. mixed precision --------------------------------------------------------
def check_mixed_precision(case, policy):
    compute = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[policy]
    reference = built(case)
    layer = built(case, dtype=policy)
    copy_weights(reference, layer)
    for sub in sublayers(layer):
        assert sub.dtype_policy.name == policy, (
            f"sublayer {sub.name} of {layer.name} runs under "
            f"{sub.dtype_policy.name}, not the layer's {policy}"
        )
    for w in layer.weights:
        assert w.dtype == "float32", f"{w.path} is {w.dtype}"
    arrays, masks = case.arrays(), case.masks()
    out, weights = case.call(layer, arrays, masks, return_attention_scores=True)
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in (out, weights)}
    assert dtypes == {compute}, dtypes
    want = case.outputs(reference, arrays, masks)
    tol = 2e-2 if compute == "float16" else 6e-2
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")),
        want[0],
        rtol=tol,
        atol=tol,
    )
    # 300x unit scale: no overflow before the softmax.
    big = case.arrays(scale=300.0)
    out, weights = case.outputs(layer, big, masks)
    out = out.astype("float32")
    assert np.isfinite(out).all(), f"overflow under {policy}"
    assert np.isfinite(weights.astype("float32")).all()
    assert_row_sums(case, weights[1].astype("float32").sum(-1), atol=2e-2, rtol=0)


def check_dropout(case):
    """Dropout acts in training only: at inference the layer equals its
    dropout-free twin; in training the output changes, masked positions keep
    zero weight and nothing is NaN."""
    layer = built(case)
    assert layer.dropout > 0, "a dropout case needs dropout > 0"
    twin = built(case, dropout=0.0)
    copy_weights(layer, twin)
    arrays, masks = case.arrays(), case.masks()
    out, weights = case.outputs(layer, arrays, masks)
    want = case.outputs(twin, arrays, masks)
    np.testing.assert_allclose(out, want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights, want[1], rtol=1e-6, atol=1e-6)
    out_t, weights_t = case.outputs(layer, arrays, masks, training=True)
    assert np.isfinite(out_t).all() and np.isfinite(weights_t).all()
    assert not np.allclose(out_t, out), "training=True dropped nothing"
    value_mask = masks["value_mask"]
    shape = (BATCH,) + (1,) * (weights_t.ndim - 2) + (case.value_length,)
    masked = np.broadcast_to(~value_mask.reshape(shape), weights_t.shape)
    assert (weights_t[masked] == 0).all(), "dropout revived a masked position"
    if case.output_is_context:
        assert (out_t[0] == 0).all(), "fully masked row not zero in training"


# -- 6. XLA training step and tf.distribute -------------------------------------
def _trainable_model(case, layer, mask_dtype="bool"):
    arrays = case.arrays()
    masks = {k: v.astype(mask_dtype) for k, v in case.masks().items()}
    inputs = {k: keras.Input(shape=v.shape[1:], name=k) for k, v in arrays.items()}
    mask_inputs = {
        k: keras.Input(shape=v.shape[1:], name=k, dtype=mask_dtype)
        for k, v in masks.items()
    }
    out = case.call(layer, inputs, mask_inputs)
    out = keras.layers.Dense(1)(out)
    model = keras.Model({**inputs, **mask_inputs}, out)
    feed = {**arrays, **masks}
    target = np.ones((BATCH,) + tuple(model.output.shape[1:]), "float32")
    return model, feed, target


def check_jit_training(case):
    layer = case.make()
    model, feed, target = _trainable_model(case, layer)
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    before = [keras.ops.convert_to_numpy(w) for w in layer.trainable_weights]
    history = model.fit(feed, target, batch_size=BATCH, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = [keras.ops.convert_to_numpy(w) for w in layer.trainable_weights]
    if before:
        assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@functools.cache
def two_device_strategy():
    """One MirroredStrategy per process: a second instance reuses collective
    instance keys and its all-reduce aborts with a shape mismatch."""
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def check_mirrored_strategy(case):
    """One SGD step (learning rate 1, so the weight change is the gradient) on
    two replicas equals the same step on one device: same loss, same update."""
    strategy = two_device_strategy()
    assert strategy.num_replicas_in_sync == 2

    def model_in(scope):
        with scope:
            layer = case.make()
            # Integer masks: Keras 3.15 fails to distribute boolean numpy
            # inputs (an AddN over bool), with keras.layers.Attention as well.
            model, feed, target = _trainable_model(case, layer, mask_dtype="int32")
            model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
        return model, feed, target

    mirrored, feed, target = model_in(strategy.scope())
    single, _, _ = model_in(contextlib.nullcontext())
    single.set_weights(mirrored.get_weights())
    before = single.get_weights()
    # Batch 4 over 2 replicas: 2 examples each (repeat to 4 rows).
    feed = {k: np.concatenate([v, v[:1]]) for k, v in feed.items()}
    target = np.concatenate([target, target[:1]])
    losses = []
    for model in (mirrored, single):
        history = model.fit(
            feed, target, batch_size=4, epochs=1, shuffle=False, verbose=0
        )
        losses.append(history.history["loss"][0])
    assert np.isfinite(losses).all(), losses
    if not case.deterministic_training:
        return
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    after = zip(mirrored.get_weights(), single.get_weights(), strict=True)
    for w, start, (a, b) in zip(mirrored.weights, before, after, strict=True):
        # The gradient, seen as the change of the weight.
        np.testing.assert_allclose(
            start - a, start - b, rtol=1e-4, atol=1e-6, err_msg=w.path
        )


# -- 7. Keras' distribution API on JAX (two virtual devices) ------------------------
def run_distributed(case_ids, tmp_path):
    """``{case id: result}`` of `tests.distributed` for every case, in one
    JAX process with two virtual CPU devices (a result is a traceback's text
    where that case failed to run)."""
    out_path = os.path.join(tmp_path, "distributed.json")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "jax"}
    env["XLA_FLAGS"] = " ".join(
        filter(None, [env.get("XLA_FLAGS"), "--xla_force_host_platform_device_count=2"])
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.distributed", out_path, *case_ids],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out_path) as f:
        return json.load(f)


def check_distributed(case, result):
    """One SGD step under ``DataParallel`` over two devices, and under
    ``ModelParallel`` with `attention_layers.layout_map`, equals the step on
    one device: the same loss, the same change of every weight (the gradient,
    at learning rate 1) and the same predictions after it; under
    ``ModelParallel`` the weights the layout map names are really split."""
    assert not isinstance(result, str), result[-3000:]
    runs = {"data_parallel": result["data_parallel"]}
    if isinstance(result["model_parallel"], str):
        # Only a case whose heads or units do not divide over two devices.
        assert "not divisible" in result["model_parallel"], result["model_parallel"]
    else:
        runs["model_parallel"] = result["model_parallel"]
        # Paths end alike; the layers' own names differ between the models.
        split, mapped = (
            sorted("/".join(p.split("/")[-2:]) for p in paths)
            for paths in (runs["model_parallel"]["split"], result["mapped"])
        )
        assert split == mapped, (split, mapped)
    for name, run in runs.items():
        assert np.isfinite(run["loss"]).all(), (name, run)
        if not case.deterministic_training:
            continue
        np.testing.assert_allclose(*run["loss"], rtol=1e-5, err_msg=name)
        assert run["change"] <= 1e-6, (name, run["change"])
        assert run["predictions"] < 1e-4, (name, run["predictions"])


# -- 8. bad input -----------------------------------------------------------------
def assert_clear_error(layer_cls, argument, fn):
    """``fn`` raises a ValueError naming the layer, the argument, expected, received."""
    try:
        fn()
    except ValueError as e:
        msg = str(e)
    else:
        raise AssertionError(f"no ValueError for bad `{argument}`")
    for part in (layer_cls.__name__, f"`{argument}`", "expected", "received"):
        assert part in msg, f"{part!r} missing from: {msg}"


def check_bad_input(case):
    cls = case.make().__class__
    arrays, masks = case.arrays(), case.masks()
    first = next(iter(arrays))

    def call_with(**changes):
        layer = case.make()
        kwargs = {**arrays, **changes}
        return lambda: layer(**kwargs)

    # Wrong rank.
    assert_clear_error(cls, first, call_with(**{first: arrays[first][0, 0]}))
    # Integer tensors.
    assert_clear_error(cls, first, call_with(**{first: arrays[first].astype("int32")}))
    if case.kind in ("score", "decoder"):
        assert_clear_error(cls, "value", call_with(value=arrays["value"][0]))
        assert_clear_error(cls, "value", call_with(value=arrays["value"][:2]))
        if case.kind == "score":
            assert_clear_error(cls, "key", call_with(key=arrays["value"][:, :-1]))
        assert_clear_error(
            cls, "value_mask", call_with(value_mask=masks["value_mask"][:, :-1])
        )
        assert_clear_error(
            cls, "query_mask", call_with(query_mask=masks["query_mask"][:, None])
        )
    else:
        assert_clear_error(cls, "mask", call_with(mask=masks["mask"][:, :-1]))
    for kwargs, argument in case.bad_ctor:
        assert_clear_error(cls, argument, lambda kw=kwargs: case.make(**kw))

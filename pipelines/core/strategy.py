"""The ``tf.distribute`` strategy a run trains under, chosen by config.

``auto``: ``TF_CONFIG`` with a cluster -> ``MultiWorkerMirroredStrategy``;
a TPU address -> ``TPUStrategy``; more than one GPU, or more than one logical
CPU device -> ``MirroredStrategy``; otherwise the default strategy.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf


def _cluster_size() -> int:
    spec = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster = spec.get("cluster", {})
    return sum(len(v) for v in cluster.values())


def split_cpu(devices: int) -> None:
    """Show the CPU as ``devices`` logical devices (to try MirroredStrategy on
    a laptop). Must run before TensorFlow initialises its devices."""
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(devices)]
    )


def make_strategy(kind: str = "auto", tpu: str | None = None) -> tf.distribute.Strategy:
    if kind == "auto":
        if tpu:
            kind = "tpu"
        elif _cluster_size() > 1:
            kind = "multi_worker"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            kind = "mirrored"
        elif len(tf.config.list_logical_devices("CPU")) > 1:
            kind = "mirrored"
        else:
            kind = "default"
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        devices = devices or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if kind == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise ValueError(
                "strategy multi_worker needs the TF_CONFIG environment variable "
                '(a JSON {"cluster": {"worker": [...]}, "task": {...}}).'
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "tpu":
        if not tpu:
            raise ValueError("strategy tpu needs a TPU address: set train.tpu.")
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(
        "train.strategy must be auto, default, mirrored, multi_worker or tpu; "
        f"received {kind!r}."
    )


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The public name of a strategy (MultiWorkerMirroredStrategy's class is
    CollectiveAllReduceStrategy; the default strategy's is private)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    if strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
        return "the default strategy"
    return type(strategy).__name__


def is_chief() -> bool:
    """True on the worker that writes shared files (all but multi-worker: True)."""
    spec = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = spec.get("task", {})
    return task.get("type", "chief") == "chief" or (
        task.get("type") == "worker"
        and task.get("index", 0) == 0
        and "chief" not in spec.get("cluster", {})
    )

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


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on 127.0.0.1 (bound once, then released)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch_workers(
    task, config, run_dir, workers: int, argv: list[str], overwrite: bool = False
) -> None:
    """Train with ``MultiWorkerMirroredStrategy`` over ``workers`` local processes.

    One command starts them all: each worker reruns the same ``train`` command
    with its own ``TF_CONFIG`` on 127.0.0.1. Worker 0 is the chief (it prints
    to this terminal and writes the run folder); the others' output goes to
    ``<run-dir>/logs/worker-<i>.log``. The run folder's guard (and
    ``--overwrite``) runs once, here, before any worker starts.
    """
    import subprocess
    import sys
    import time
    from pathlib import Path

    from pipelines.core.run_dir import PipelineError, RunDir
    from pipelines.core.trainer import check_run

    run = RunDir(run_dir)
    with run.lock():
        check_run(task, config, run, overwrite)
    run.logs.mkdir(parents=True, exist_ok=True)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    procs, logs, done = [], [], False
    try:
        for index in range(workers):
            spec = {
                "cluster": {"worker": addresses},
                "task": {"type": "worker", "index": index},
            }
            env = {**os.environ, "TF_CONFIG": json.dumps(spec)}
            env.pop("ATTENTION_PIPELINES_CPU_DEVICES", None)
            command = [sys.executable, "-m", "pipelines.cli", *argv,
                       "--set", "train.strategy=multi_worker"]  # fmt: skip
            if index == 0:
                procs.append(subprocess.Popen(command, env=env))
            else:
                log = open(Path(run.logs) / f"worker-{index}.log", "w")
                logs.append(log)
                procs.append(
                    subprocess.Popen(
                        command, env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        print(f"Started {workers} workers on {', '.join(addresses)}")
        failed = None
        while any(p.poll() is None for p in procs) and failed is None:
            for index, proc in enumerate(procs):
                if proc.poll() not in (None, 0):
                    failed = index
            time.sleep(0.5)
        done = failed is None
    finally:  # a failed worker, a failed start or Ctrl-C: stop the others
        for proc in procs:
            if proc.poll() is None and not done:
                proc.kill()
        for proc in procs:
            proc.wait()
        for log in logs:
            log.close()
    codes = [p.returncode for p in procs]
    if any(codes):
        index = next(i for i, c in enumerate(codes) if c)
        where = "above" if index == 0 else f"in {run.logs}/worker-{index}.log"
        raise PipelineError(
            f"worker {index} of {workers} failed (exit {codes[index]}); its output is "
            f"{where}."
        )

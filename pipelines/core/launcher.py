"""``train --workers N``: a local multi-worker run, its processes supervised.

One command starts N processes of the same ``train`` command, each with its
own ``TF_CONFIG`` on 127.0.0.1, under ``MultiWorkerMirroredStrategy``
(`pipelines.core.strategy`); a failed worker, a failed start or Ctrl-C stops
the others.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipelines.core.errors import PipelineError
from pipelines.core.run_dir import RunDir
from pipelines.core.run_guard import check_run


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on 127.0.0.1 (bound once, then released)."""
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

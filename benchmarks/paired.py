"""Shared benchmark helpers: paired A/B timing, a matmul peak, peak RSS in a child.

The machines these run on are shared and noisy, so absolute times mean little.
Every benchmark therefore alternates its candidates call by call in one process
and reports per-round ratios (median and spread), and measures a ``tf.matmul``
peak in the same rounds so that efficiency is taken under the same noise.
Peak memory is measured in a fresh child process per point, so that no other
point's allocations or peak carry over.
"""

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

_MARK = "@@PAIRED_RESULT@@ "


# -- statistics ------------------------------------------------------------
def write_json(path, command, env, **results):
    """The run's command, environment and results as JSON (``--json PATH``)."""
    with open(path, "w") as f:
        json.dump({"command": command, "environment": env, **results}, f, indent=2)


def summary(values):
    """Median, quartiles, extremes and count of a list of floats."""
    values = sorted(values)
    if len(values) >= 2:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": values[0],
        "max": values[-1],
        "n": len(values),
    }


def fmt_spread(s, digits=2):
    """``median [q1-q3] (min-max)`` of a ``summary`` as text."""
    f = f"{{:.{digits}f}}"
    return (
        f"{f.format(s['median'])} [IQR {f.format(s['q1'])}-{f.format(s['q3'])}; "
        f"min-max {f.format(s['min'])}-{f.format(s['max'])}]"
    )


# -- timing ----------------------------------------------------------------
def time_call(fn, reps=1):
    """Mean wall and CPU (all threads) seconds of ``reps`` calls of ``fn``."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    return (
        (time.perf_counter() - wall) / reps,
        (time.process_time() - cpu) / reps,
    )


def paired_rounds(fns, rounds, reps=1, warmup=2, progress=None):
    """Time the callables of ``fns`` (name -> fn) alternately, round by round.

    Each round calls every candidate once in turn (A B A B ...; the order is
    reversed every other round so that neither side always runs first), each
    timed as the mean of ``reps`` calls. ``warmup`` untimed rounds come first.
    Returns ``(wall, cpu)``: name -> list of per-round seconds, index-aligned
    across names. CPU time (this process, all threads) is less sensitive than
    wall time to other processes taking the cores, not to their cache traffic.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            w, c = time_call(fns[name], reps)
            wall[name].append(w)
            cpu[name].append(c)
        if progress:
            progress(r + 1, rounds, {n: t[-1] for n, t in wall.items()})
    return wall, cpu


def ratios(numerator, denominator):
    """Per-round ratios of two aligned lists of times."""
    return [a / b for a, b in zip(numerator, denominator, strict=True)]


def matmul_peak(n=1024, dtype="float32"):
    """A ``tf.function`` matmul of two ``n x n`` matrices and its FLOP count."""
    import tensorflow as tf

    a = tf.random.normal((n, n), dtype=dtype, seed=1)
    b = tf.random.normal((n, n), dtype=dtype, seed=2)
    fn = tf.function(lambda: tf.matmul(a, b), jit_compile=False)
    return fn, 2.0 * n**3


# -- environment -------------------------------------------------------------
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment():
    """Versions and hardware facts for a benchmark report."""
    import keras
    import tensorflow as tf

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_backend": keras.backend.backend(),
        "cpu": cpu_model(),
        "cores_usable": usable,
        "cores_total": os.cpu_count(),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
    }


# -- memory ------------------------------------------------------------------
def current_rss():
    """Resident set size of this process now, in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss():
    """Peak resident set size of this process so far, in bytes.

    ``VmHWM`` of ``/proc/self/status`` where there is one: the high-water mark
    of this process's own memory, which ``reset_peak_rss`` can reset.
    ``ru_maxrss`` is the fallback: on Linux it also carries the peak of the
    parent process that spawned this one (the kernel keeps the pre-``exec``
    peak), so a child started by a big parent reports the parent's peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return ru_maxrss()


def ru_maxrss():
    """``getrusage`` peak RSS of this process, in bytes."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def reset_peak_rss():
    """Reset the peak RSS to the current RSS (Linux ``clear_refs``); True if done.

    ``ru_maxrss`` never decreases otherwise, so a peak reached while importing
    or building would hide the peak of the measured calls.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure_peak(fn, calls=3):
    """Peak RSS growth of ``calls`` calls of ``fn`` over the RSS just before them.

    Call it in a fresh process after imports and model building. The peak is
    ``peak_rss`` (``VmHWM``), reset just before the baseline; ``ru_maxrss`` is
    returned for reference only: in a child it starts at the parent's peak.
    Where the peak cannot be reset and the process had peaked higher before
    the first call (``new_peak`` False), the growth is only an upper bound.
    """
    reset = reset_peak_rss()
    baseline = current_rss()
    peak_before = peak_rss()
    for _ in range(calls):
        fn()
    peak_after = peak_rss()
    return {
        "ru_maxrss_bytes": ru_maxrss(),
        "baseline_bytes": baseline,
        "peak_bytes": peak_after - baseline,
        "peak_reset": reset,
        "new_peak": peak_after > peak_before,
    }


def emit(result):
    """Print a worker's result as one marked JSON line for ``run_worker``."""
    print(_MARK + json.dumps(result), flush=True)


def run_worker(module, args, timeout=300):
    """Run ``python -m module *args`` in a fresh process; return its ``emit``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK) :])
    raise RuntimeError(
        f"worker {module} {args} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    )


# -- reporting ---------------------------------------------------------------
def markdown_table(headers, rows):
    """A GitHub markdown table."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mib(nbytes):
    return nbytes / 2**20

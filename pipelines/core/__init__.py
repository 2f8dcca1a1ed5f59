"""What every pipeline task shares; it imports no task (tasks import it).

* ``task``: the `Task` interface a task implements;
* ``config``: typed dataclass sections, presets, YAML and ``--set``, the fingerprint;
* ``run_dir``: the run folder, atomic writes, `PipelineError`;
* ``trainer``: the guard, strategy, dtype policy, crash-safe resume, final weights;
* ``backups``: end-of-epoch states, two generations, checked before use;
* ``datasets``: the training order of an epoch, length buckets, replica split;
* ``strategy``: ``tf.distribute`` strategies and the local multi-worker launcher;
* ``keras_compat``: the repairs Keras 3.15's ``fit`` needs under multi-worker;
* ``serving``: the serving module base, in-graph input checks, the client side;
* ``export``: versioned, audited, atomic publication in TF Serving's layout;
* ``cloader``: TF's C++ loader (``savedmodel_run.c``), no Python in the process;
* ``text``, ``metrics``, ``plots``: tokenizers in the graph, scores, figures.
"""

"""What every pipeline task shares; it imports no task (tasks import it).

* ``task``: the `Task` interface a task implements (wiring only), and
  `saved_or_learned` for its preprocessors;
* ``client``: the `Client` a task's command-line side implements;
* ``contract_cases``: the `ContractCases` of the pipeline contract;
* ``errors``: `PipelineError`, `ConfigError`, `MissingDataError`;
* ``config``: typed dataclass sections (`SplitConfig` among them), presets,
  YAML and ``--set``, the fingerprint;
* ``run_dir``: the run folder and atomic writes; ``run_guard``: which run a
  folder holds, and whether it may go on;
* ``trainer``: a training run in named stages: strategy, data, model, fit,
  weights; the dtype policy, crash-safe resume;
* ``backups``: end-of-epoch states, two generations, checked before use;
* ``warm_start``: ``train.init_from``, weights from another run;
* ``datasets``: the training order of an epoch, length buckets, replica split;
* ``strategy``: ``tf.distribute`` strategies; ``launcher``: ``--workers``,
  local worker processes supervised;
* ``keras_compat``: the repairs Keras 3.15's ``fit`` needs under multi-worker;
* ``serving``: the serving module base, in-graph input checks, the client side;
* ``export``: versioned, audited, atomic publication in TF Serving's layout;
* ``text``, ``metrics``, ``plots``, ``search``, ``compiled``, ``optimizers``:
  tokenizers in the graph, scores, figures, beam options, XLA buckets,
  optimizers.

TF's C++ loader, the serving smoke tool, is `pipelines.cloader`.
"""

"""What captioning's training augmentation costs: the input pipeline with
``data.augment`` against the same pipeline without it, and both against the
model's own training step.

The ``digits`` preset's batches (``--strips`` training strips), built once
per candidate; each round reads ``--batches`` batches from each candidate's
pipeline in turn (`paired` timing: alternating, one process) and reports the
per-round ratio of images/s, augmented over plain (< 1: augmentation is
slower). The training step of the preset's model on the plain batches
(``train_on_batch``, traced first) gives the images/s the input pipeline
has to keep up with; tf.data prefetches, so augmentation is free while its
images/s stays above the step's.

    python -m benchmarks.bench_augment --rounds 5 --batches 20
"""

from __future__ import annotations

import argparse
import itertools
import time


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--strips", type=int, default=4000)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from benchmarks import paired
    from pipelines.captioning.task import TASK
    from pipelines.core import config as config_lib
    from pipelines.core.trainer import build_compiled

    base = config_lib.preset(TASK.presets(), "digits")
    augmented = config_lib.apply_overrides(base, [f"data.source=digits:{args.strips}"])
    off = ["data.augment.scale=0", "data.augment.stretch=0", "data.augment.shift=0",
           "data.augment.blur=0", "data.augment.jpeg_quality=100"]  # fmt: skip
    plain = config_lib.apply_overrides(augmented, off)
    assert augmented.data.augment.on and not plain.data.augment.on
    data = TASK.load_data(augmented)
    tokenizer = TASK.preprocessors(None, data, augmented, create=False)
    datasets = {
        name: TASK.make_dataset(data.train, tokenizer, config, True)
        for name, config in (("augmented", augmented), ("plain", plain))
    }
    batch = augmented.train.batch_size

    def read(dataset):
        for _ in itertools.islice(iter(dataset), args.batches):
            pass

    for dataset in datasets.values():  # trace the pipelines
        read(dataset)
    model = build_compiled(TASK, augmented, tokenizer, tf.distribute.get_strategy())
    chunk = list(itertools.islice(iter(datasets["plain"]), args.batches))
    for x, y in chunk:
        model.trainer.train_on_batch(x, y)
    rounds = []
    for _ in range(args.rounds):
        rates = {}
        for name, dataset in datasets.items():
            t0 = time.perf_counter()
            read(dataset)
            rates[name] = args.batches * batch / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for x, y in chunk:
            model.trainer.train_on_batch(x, y)
        rates["train_step"] = args.batches * batch / (time.perf_counter() - t0)
        rates["ratio"] = rates["augmented"] / rates["plain"]
        rounds.append(rates)
    out = {key: paired.summary([r[key] for r in rounds]) for key in rounds[0]}
    print(f"images/s over {args.rounds} rounds of {args.batches} batches of {batch}:")
    for key in ("plain", "augmented", "train_step"):
        print(f"  {key:<10} {paired.fmt_spread(out[key], 0)}")
    print(f"  augmented / plain: {paired.fmt_spread(out['ratio'])}")
    return out


if __name__ == "__main__":
    main()

"""Export a trained run for TF Serving, and use an export without this library.

`export` writes ``<base>/<name>/<version>/`` (atomic, warmup requests, an op
audit in ``assets.extra/op_audit.json``). `translate_with_export` needs only
TensorFlow and tensorflow-text (for the tokenizer ops): it is what a client
of the SavedModel does.
"""

from __future__ import annotations

import json
from pathlib import Path

SAMPLES = {
    "dates": ["montag, 9. märz 1987", "9 de marzo de 1987", "march 9, 1987"],
    "bible": [
        "in the beginning god created the heavens and the earth.",
        "jesus wept.",
        "love your neighbor as yourself.",
    ],
    "ding": ["ich habe keine zeit.", "das ist mein buch."],
}


def samples_for(config) -> list[str]:
    corpus = config.data.corpus.split(":", 1)[0]
    return SAMPLES.get(corpus, SAMPLES["bible"])


def export(
    run_dir: str | Path,
    base_dir: str | Path,
    name: str = "translation",
    version: int | None = None,
) -> Path:
    """Export the run's model; returns the version directory."""
    import numpy as np

    from pipelines.core.export import audit_ops, export_for_serving
    from pipelines.translation.run import PipelineError, load_translator
    from pipelines.translation.translator import export_signatures

    translator, config = load_translator(run_dir)
    samples = samples_for(config)
    warmup = [
        {"source": np.array(samples, dtype=object)},
        {"source": np.array(samples[:1], dtype=object)},
    ]
    path = export_for_serving(
        translator,
        export_signatures(translator),
        base_dir,
        name,
        version=version,
        warmup=("serving_default", warmup),
    )
    audit = audit_ops(path)
    (path / "assets.extra" / "op_audit.json").write_text(json.dumps(audit, indent=2))
    print(
        f"Exported {path}: {len(audit['core'])} core op types, "
        f"TF Text ops {audit['tf_text']}, unknown {audit['unknown']}"
    )
    if audit["unknown"]:
        raise PipelineError(
            f"the export uses ops TF Serving 2.20 may not have: {audit['unknown']}"
        )
    return path


def latest_version(model_dir: Path) -> Path:
    versions = sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if not versions:
        raise FileNotFoundError(f"no integer version folder in {model_dir}")
    return versions[-1]


def translate_with_export(
    export_dir: str | Path,
    texts: list[str],
    beam_width: int | None = None,
    length_penalty: float | None = None,
) -> dict:
    """Load the SavedModel with TensorFlow alone and call ``serving_default``.

    ``export_dir`` is a version directory, or a model directory (its latest
    version is used). Returns numpy arrays keyed by the signature's outputs.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  registers the tokenizer ops

    export_dir = Path(export_dir)
    if not (export_dir / "saved_model.pb").exists():
        export_dir = latest_version(export_dir)
    from tensorflow.python.tools import saved_model_utils

    signature = saved_model_utils.get_meta_graph_def(
        str(export_dir), "serve"
    ).signature_def["serving_default"]
    defaults = {k: tf.make_ndarray(v) for k, v in signature.defaults.items()}
    fn = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    feed = {
        "source": tf.constant(texts),
        "beam_width": tf.constant(
            defaults["beam_width"] if beam_width is None else beam_width, tf.int32
        ),
        "length_penalty": tf.constant(
            defaults["length_penalty"] if length_penalty is None else length_penalty,
            tf.float32,
        ),
    }
    return {k: v.numpy() for k, v in fn(**feed).items()}

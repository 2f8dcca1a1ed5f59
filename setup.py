from setuptools import find_packages, setup

TENSORFLOW = ["tensorflow>=2.21,<2.22", "tensorflow-text>=2.21,<2.22"]

setup(
    name="attention-layers",
    version="0.1.0",
    description=(
        "Keras 3 attention layers (Bahdanau; Luong global and local; hard, with "
        "REINFORCE or Gumbel; scaled dot-product; multi-head with a KV cache; "
        "pooling; an attention RNN decoder; sinusoidal, learned and rotary "
        "positions; Transformer blocks; greedy, beam and sampling decoders) and "
        "reference pipelines that train, evaluate and export them for TF Serving."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license_expression="Apache-2.0",  # SPDX (PEP 639): no licence classifier
    python_requires=">=3.10",
    packages=find_packages(
        include=["attention_layers", "attention_layers.*", "pipelines", "pipelines.*"]
    ),
    package_data={"pipelines": ["translation/*.tsv.gz", "core/*.txt", "*.c"]},
    entry_points={"console_scripts": ["attention-pipelines=pipelines.cli:console"]},
    # The layers need Keras and NumPy only, on any Keras backend; TensorFlow
    # comes with the `tensorflow` and `pipelines` extras.
    install_requires=["keras>=3.15", "numpy"],
    extras_require={
        "tensorflow": TENSORFLOW,
        "dev": [
            "pytest>=8",
            "pytest-xdist",
            "ruff",
            "jax[cpu]",
            "matplotlib",
            "babel",
            # The captioning tests score CIDEr too (the `cider` extra).
            "pycocoevalcap>=1.2",
            # The decoding point of benchmarks/bench_gpu.py, whose --smoke
            # mode the tests run (the peer samplers).
            "keras-hub",
        ],
        # The reference pipelines (pipelines/): metrics, plots, data, serving.
        "pipelines": [
            *TENSORFLOW,
            "matplotlib",
            "babel",
            "pyyaml",
            "sacrebleu>=2.4",
            "rouge-score>=0.1.2",
            "tensorboard>=2.21,<2.22",
            "tensorflow-serving-api>=2.21,<2.22",
            # Country facts for span QA (pipelines/extractive/countries.py); pinned:
            # the generated passages, tests and doctests follow its data.
            "countryinfo==1.0.1",
            # Digit strips for captioning (pipelines/captioning/digit_strips.py):
            # scikit-learn's bundled load_digits scans, pasted with Pillow.
            "scikit-learn",
            "pillow",
        ],
        # CIDEr-D for captioning's evaluate (pure Python; its METEOR, SPICE
        # and PTB tokenizer need Java, and are not used).
        "cider": ["pycocoevalcap>=1.2"],
        # The third Keras backend, for the layer tests on it (make test). The
        # CPU build of this release; a bare "torch" may fetch a CUDA build.
        "torch": ["torch==2.13.0"],
        "bench": ["keras-hub"],  # the peer samplers of benchmarks/bench_decoding.py
        "docs": ["mkdocs>=1.6", "mkdocs-material", "mkdocstrings-python"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)

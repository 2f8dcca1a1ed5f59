"""The public API is frozen: a change here is a deliberate, documented decision."""

import attention_layers

PUBLIC = [
    "AttentionDecoder",
    "AttentionPooling",
    "AttentionRNNCell",
    "BahdanauAttention",
    "HardAttention",
    "LocalAttention",
    "LuongAttention",
    "ReinforceLoss",
    "ScaledDotProductAttention",
    "ScoreAttention",
    "additive_scores",
    "masked_softmax",
    "merge_masks",
]


def test_public_names():
    assert sorted(attention_layers.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(attention_layers, name), name


def test_no_tensorflow_only_imports():
    """The layers stay backend-agnostic: no tf.data, tf.distribute or tf-text."""
    import pathlib

    root = pathlib.Path(attention_layers.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import tensorflow" not in text, path
        assert "from tensorflow" not in text, path
        assert "pipelines" not in text.replace("pipelines`", ""), path

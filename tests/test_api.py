"""The public API is frozen: a change here is a deliberate, documented decision."""

import attention_layers

PUBLIC = [
    "AttentionDecoder",
    "AttentionPooling",
    "AttentionRNNCell",
    "BahdanauAttention",
    "BidirectionalAttentionFlow",
    "CoverageLoss",
    "DoublyStochasticLoss",
    "HardAttention",
    "LocalAttention",
    "LuongAttention",
    "MemoryNetwork",
    "MemorySupervisionLoss",
    "MultiHeadAttention",
    "PointerGenerator",
    "PositionEmbedding",
    "ReinforceLoss",
    "RotaryEmbedding",
    "ScaledDotProductAttention",
    "ScoreAttention",
    "SinusoidalPositionEncoding",
    "SinusoidalPositionEncoding2D",
    "SpanPointer",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "additive_scores",
    "best_span",
    "copy_step_inputs",
    "coverage_loss",
    "doubly_stochastic_loss",
    "extended_source_ids",
    "extended_target_ids",
    "layout_map",
    "masked_softmax",
    "memory_supervision_loss",
    "merge_masks",
    "span_loss",
]


def test_public_names():
    assert sorted(attention_layers.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(attention_layers, name), name


def test_split_modules_keep_their_import_paths():
    """Classes moved to modules of their own stay importable from the old ones."""
    import importlib

    import keras

    moved = {
        "attention_layers.transformer": [
            "TransformerDecoderBlock",
            "TransformerEncoderBlock",
        ],
        "attention_layers.recurrent": ["AttentionDecoder", "AttentionRNNCell"],
    }
    for module, names in moved.items():
        for name in names:
            found = getattr(importlib.import_module(module), name)
            assert found is getattr(attention_layers, name), (module, name)
            registered = f"attention_layers>{name}"
            assert keras.saving.get_registered_object(registered) is found, name
    memory = importlib.import_module("attention_layers.memory")
    assert memory.MemoryNetwork is attention_layers.MemoryNetwork
    assert callable(memory.position_encoding) and callable(memory.temporal_weights)


def test_no_tensorflow_only_imports():
    """The layers stay backend-agnostic: no tf.data, tf.distribute or tf-text."""
    import pathlib

    root = pathlib.Path(attention_layers.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import tensorflow" not in text, path
        assert "from tensorflow" not in text, path
        assert "pipelines" not in text.replace("pipelines`", ""), path


DECODING = [
    "beam_search",
    "filter_logits",
    "gnmt_coverage_penalty",
    "gnmt_length_penalty",
    "greedy_search",
    "rnn_step_fn",
    "sample",
    "tile_beams",
    "transformer_initial_state",
    "transformer_step_fn",
]


def test_decoding_names_are_frozen_and_documented():
    import pathlib

    from attention_layers import decoding

    assert sorted(decoding.__all__) == DECODING
    api = (pathlib.Path(__file__).parent.parent / "docs" / "api.md").read_text()
    for name in DECODING:
        assert f"::: attention_layers.decoding.{name}\n" in api, name


def test_pipeline_core_imports_no_task():
    """``pipelines/core`` is what every task shares: it imports no task (nor the
    registry or the CLI that know them) and names none; tasks import it."""
    import ast
    import pathlib
    import re

    import pipelines.core

    root = pathlib.Path(pipelines.core.__file__).parent
    tasks = re.compile(
        r"\b(translat\w*|summarization|captioning|qa|bible|dates)\b", re.I
    )
    for path in sorted(root.glob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("pipelines"):
                    assert name.startswith("pipelines.core"), (path.name, name)
        assert not tasks.search(text), (path.name, tasks.search(text).group())

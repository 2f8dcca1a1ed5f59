"""Keras 3 attention layers, from Bahdanau and Luong to hard and scaled dot-product."""

from attention_layers.additive import BahdanauAttention, additive_scores
from attention_layers.base import ScoreAttention
from attention_layers.distribution import layout_map
from attention_layers.hard import HardAttention, ReinforceLoss
from attention_layers.local import LocalAttention
from attention_layers.losses import (
    CoverageLoss,
    DoublyStochasticLoss,
    MemorySupervisionLoss,
    coverage_loss,
    doubly_stochastic_loss,
    memory_supervision_loss,
)
from attention_layers.luong import LuongAttention
from attention_layers.masking import masked_softmax, merge_masks
from attention_layers.memory import MemoryNetwork
from attention_layers.multi_head import MultiHeadAttention
from attention_layers.pointer_generator import (
    PointerGenerator,
    copy_step_inputs,
    extended_source_ids,
    extended_target_ids,
)
from attention_layers.pooling import AttentionPooling
from attention_layers.positional import (
    PositionEmbedding,
    RotaryEmbedding,
    SinusoidalPositionEncoding,
    SinusoidalPositionEncoding2D,
)
from attention_layers.recurrent import AttentionDecoder, AttentionRNNCell
from attention_layers.scaled_dot import ScaledDotProductAttention
from attention_layers.span import (
    BidirectionalAttentionFlow,
    SpanPointer,
    best_span,
    span_loss,
)
from attention_layers.transformer import (
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)

__version__ = "0.1.0"

__all__ = [
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

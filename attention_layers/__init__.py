"""Keras 3 attention layers: Bahdanau, Luong, scaled dot-product, pooling."""

from attention_layers.additive import BahdanauAttention, additive_scores
from attention_layers.base import ScoreAttention
from attention_layers.luong import LuongAttention
from attention_layers.masking import masked_softmax, merge_masks
from attention_layers.pooling import AttentionPooling
from attention_layers.scaled_dot import ScaledDotProductAttention

__version__ = "0.1.0"

__all__ = [
    "AttentionPooling",
    "BahdanauAttention",
    "LuongAttention",
    "ScaledDotProductAttention",
    "ScoreAttention",
    "additive_scores",
    "masked_softmax",
    "merge_masks",
]

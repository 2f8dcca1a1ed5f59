"""What the Transformer encoder and decoder blocks share (Vaswani et al., 2017).

Each block is attention plus a position-wise feed-forward network, each
sub-layer wrapped in dropout, a residual connection and layer normalisation,
either after the residual (``norm_first=False``, the paper's post-norm) or
before the sub-layer (``norm_first=True``, pre-norm, which trains deep stacks
without warm-up; end a pre-norm stack with a ``LayerNormalization``).
"""

import keras

from attention_layers.base import check_positive_int, static_shape
from attention_layers.base import input_error as _input_error
from attention_layers.multi_head import MultiHeadAttention
from attention_layers.multi_head_inputs import rotary_config


class _Block(keras.layers.Layer):
    """What the encoder and decoder blocks share: arguments, sub-layers, config."""

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-5,
        norm_first=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        attention_implementation="auto",
        seed=None,
        rotary=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_heads = check_positive_int(self, "num_heads", num_heads)
        intermediate_dim = check_positive_int(
            self, "intermediate_dim", intermediate_dim
        )
        key_dim = check_positive_int(self, "key_dim", key_dim, allow_none=True)
        if not 0.0 <= float(dropout) < 1.0:
            raise _input_error(self, "dropout", "a float in [0, 1)", repr(dropout))
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.dropout = dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm_first = bool(norm_first)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.attention_implementation = attention_implementation
        self.seed = seed
        self.rotary = rotary_config(self, rotary)
        if self.rotary is not None and key_dim is not None and key_dim % 2:
            raise _input_error(
                self, "key_dim", "an even size with rotary positions", repr(key_dim)
            )
        self.supports_masking = True

    def _initializers(self):
        # Fresh initializer objects per sub-layer: a shared seeded one would
        # give every sub-layer the same weights.
        return {
            "kernel_initializer": keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            "bias_initializer": keras.initializers.get(
                keras.initializers.serialize(self.bias_initializer)
            ),
        }

    def _hidden_dim(self, shape, argument):
        shape = static_shape(shape)
        if len(shape) != 3 or shape[-1] is None:
            raise _input_error(
                self,
                argument,
                "a rank-3 tensor [batch, length, hidden_dim] with a known hidden_dim",
                f"shape {shape}",
            )
        hidden = shape[-1]
        if self.key_dim is None and hidden % self.num_heads:
            raise _input_error(
                self,
                "key_dim",
                f"an explicit key_dim when hidden_dim ({hidden}) is not a "
                f"multiple of num_heads ({self.num_heads})",
                "None",
            )
        head = self.key_dim or hidden // self.num_heads
        if self.rotary is not None and head % 2:
            raise _input_error(
                self,
                "key_dim",
                "an even head size with rotary positions (set key_dim, or a "
                "hidden_dim that is an even multiple of num_heads)",
                f"head size {head} (hidden_dim {hidden}, {self.num_heads} heads)",
            )
        return hidden

    def _attention(self, name, query_shape, value_shape, hidden, rotary=None):
        layer = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim or hidden // self.num_heads,
            dropout=self.dropout,
            implementation=self.attention_implementation,
            seed=self.seed,
            rotary=rotary,
            dtype=self.dtype_policy,
            name=name,
            **self._initializers(),
        )
        layer.build(query_shape, value_shape)
        return layer

    def _build_attention(self, kind, query_shape, value_shape, hidden, rotary=None):
        """The ``kind`` (``"self"`` or ``"cross"``) attention sub-layer:
        ``{kind}_attention`` and its ``_norm`` and ``_dropout``."""
        name = f"{kind}_attention"
        attention = self._attention(name, query_shape, value_shape, hidden, rotary)
        setattr(self, name, attention)
        setattr(self, f"{name}_norm", self._norm(f"{name}_norm", query_shape))
        setattr(self, f"{name}_dropout", self._dropout(f"{name}_dropout"))

    def _norm(self, name, shape):
        layer = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        layer.build(shape)
        return layer

    def _dropout(self, name):
        return keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy, name=name
        )

    def _build_feed_forward(self, shape, hidden):
        self.intermediate_dense = keras.layers.Dense(
            self.intermediate_dim,
            activation=self.activation,
            dtype=self.dtype_policy,
            name="intermediate",
            **self._initializers(),
        )
        self.intermediate_dense.build(shape)
        self.output_dense = keras.layers.Dense(
            hidden, dtype=self.dtype_policy, name="output", **self._initializers()
        )
        self.output_dense.build(tuple(shape[:-1]) + (self.intermediate_dim,))
        self.feed_forward_norm = self._norm("feed_forward_norm", shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")

    def _residual(self, x, norm, dropout, sublayer, training):
        """One sub-layer with dropout, residual and pre- or post-norm.

        ``sublayer(y)`` returns the sub-layer output, or a tuple whose first
        item is the output (the rest is passed back unchanged).
        """
        y = norm(x) if self.norm_first else x
        result = sublayer(y)
        extra = ()
        if isinstance(result, tuple):
            result, extra = result[0], result[1:]
        x = x + dropout(result, training=training)
        if not self.norm_first:
            x = norm(x)
        return (x, *extra)

    def _attend(self, kind, x, value, training, **kwargs):
        """The ``kind`` (``"self"`` or ``"cross"``) attention sub-layer over
        ``value`` (None: the sub-layer's own input) through `_residual`;
        ``kwargs`` go to the `MultiHeadAttention`."""
        attention = getattr(self, f"{kind}_attention")

        def attend(y):
            return attention(
                y, y if value is None else value, training=training, **kwargs
            )

        norm = getattr(self, f"{kind}_attention_norm")
        dropout = getattr(self, f"{kind}_attention_dropout")
        return self._residual(x, norm, dropout, attend, training)

    def _feed_forward(self, x, training):
        def ffn(y):
            return self.output_dense(self.intermediate_dense(y))

        return self._residual(
            x, self.feed_forward_norm, self.feed_forward_dropout, ffn, training
        )[0]

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
            "activation": keras.activations.serialize(self.activation),
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "norm_first": self.norm_first,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "attention_implementation": self.attention_implementation,
            "seed": self.seed,
            "rotary": self.rotary,
        }

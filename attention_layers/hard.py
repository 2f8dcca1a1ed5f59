"""Hard (stochastic) attention and its REINFORCE training loss.

``HardAttention`` attends to one position per query: sampled in training,
the argmax (or the expected context) at inference. A sampled choice has no
gradient, so its score weights are trained either by REINFORCE, through the
endpoint layer ``ReinforceLoss``, or by the straight-through Gumbel-softmax
estimator, which needs nothing beyond the task loss.

Design of the REINFORCE training (why an endpoint layer). The score-function
gradient needs the per-example task loss ``L`` *and* the log-probability of
the samples of the same forward pass. A Keras ``Loss`` sees only
``(y_true, y_pred)`` and reduces them, and a ``Model.compute_loss`` override
ties the user to one model class and to Keras internals that differ between
backends. ``ReinforceLoss`` instead sits inside the model: it takes the targets
(a model input), the predictions and the ``log_prob`` output of
``HardAttention``, computes ``L`` per example with an unreduced Keras loss, and
``add_loss``-es the whole surrogate (task loss, score-function term, entropy
bonus, learned-baseline regression). The moving-average baseline is a
non-trainable variable of that layer. So ``model.compile(optimizer)`` +
``model.fit`` train it on every backend, under ``jit_compile`` and
``tf.distribute``; the stop-gradients
cannot be forgotten (the user never writes the surrogate), and a scalar
(already reduced) loss is rejected. For serving, build a second model from the
same layers without ``ReinforceLoss`` and export that.
"""

import numbers
import warnings

import keras
from keras import ops

from attention_layers import masking
from attention_layers.additive import BahdanauAttention
from attention_layers.base import input_error

ESTIMATORS = ("reinforce", "gumbel")
INFERENCE_MODES = ("argmax", "soft")


def _one_hot(index, depth):
    """``float32`` one-hot of ``index`` over ``depth`` classes (``depth`` may be
    a traced length)."""
    positions = ops.arange(depth, dtype=index.dtype)
    return ops.cast(ops.equal(ops.expand_dims(index, -1), positions), "float32")


@keras.saving.register_keras_serializable(package="attention_layers")
class HardAttention(BahdanauAttention):
    """Hard attention of Xu et al. (2015): one position per query.

    The score is Bahdanau's ``e_ij = v^T tanh(W1 s_i + W2 h_j)`` (Xu's
    ``f_att``) and ``p_ij = softmax_j(e_ij)`` over the unmasked positions.

    * Training (``training=True``): one position ``s_i ~ Categorical(p_i)`` is
      sampled per query (never a masked one); the weights are its one-hot and
      the context is the value ``h_{s_i}`` itself. With
      ``estimator="reinforce"`` the score weights get their gradient only from
      the score-function term ``(L - b) grad log p(s)``: return the
      log-probabilities (``return_log_prob=True``) and feed them to a
      `ReinforceLoss`. With ``estimator="gumbel"`` the sample is
      ``argmax(e + g)``, ``g ~ Gumbel(0, 1)``, and the weights are
      ``y_hard + y_soft - stop_gradient(y_soft)`` with
      ``y_soft = softmax((e + g) / temperature)``: one-hot in the forward pass,
      the (biased) Gumbel-softmax gradient in the backward pass, trained by the
      task loss alone (do not add a ``ReinforceLoss`` then).
    * ``sample_probability < 1`` (training only): each example samples with
      that probability and otherwise takes the expected context (its weights
      are ``p``, trained by backpropagation), as Xu et al. do with 0.5
      (section 4.1). A row that does not sample has ``log_prob`` 0, so it adds
      nothing to the score-function term; its ``entropy`` is kept.
    * Inference (``training`` False or None): ``inference="argmax"`` attends
      to the most probable position, ``"soft"`` returns the expected context
      ``sum_j p_ij h_j`` (Xu's deterministic approximation). Both are
      deterministic: the same input gives the same output.

    The sampling path (``training=True``) is random by design and is exempt
    from the equality clauses of the layer contract (round trips, masks,
    backends), which check the deterministic inference path.

    A fully masked row (no position may be attended) gets zero weights, a zero
    context, and zero log-probability and entropy.

    Args:
        units: size of the hidden layer of the score (``W1``, ``W2``).
        estimator: ``"reinforce"`` (score function, Xu et al. 2015) or
            ``"gumbel"`` (straight-through Gumbel-softmax, Jang et al. 2017).
        inference: ``"argmax"`` or ``"soft"``, the deterministic inference path.
        temperature: temperature of the Gumbel-softmax relaxation (> 0).
        sample_probability: in ``(0, 1]``, the chance that an example samples
            in training (otherwise it attends softly).
        normalize: use the weight-normalised score of `BahdanauAttention`.
        block_elements: memory budget of the score, as in `BahdanauAttention`.
        kernel_initializer: initializer of ``W1``, ``W2`` and ``v``.
        seed: seed of the sampling (``None``: drawn from Keras's global seed).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        query, value, key, query_mask, value_mask, attention_mask,
            use_causal_mask, return_attention_scores: as in `ScoreAttention`.
        training: sample (True) or take the inference path (False/None).
        return_log_prob: also return ``log_prob`` and ``entropy``.

    Returns:
        ``context`` ``[B, Tq, Dv]`` (``[B, Dv]`` for a rank-2 query); with
        ``return_attention_scores=True`` also ``weights`` ``[B, Tq, Tv]``
        (one-hot, or ``p`` for ``inference="soft"``); with
        ``return_log_prob=True`` also ``log_prob`` ``[B, Tq]`` (``[B]``),
        the float32 ``log p(s_i)`` of the selected position (the sample in
        training, the argmax otherwise), and ``entropy`` ``[B, Tq]``
        (``[B]``), ``H(p_i) = -sum_j p_ij log p_ij``. Order:
        ``(context[, weights][, log_prob, entropy])``.

    Example:

    >>> import numpy as np
    >>> layer = HardAttention(units=8, seed=1)
    >>> query = np.random.rand(2, 3, 4).astype("float32")
    >>> value = np.random.rand(2, 5, 6).astype("float32")
    >>> context, weights, log_prob, entropy = layer(
    ...     query, value, return_attention_scores=True, return_log_prob=True,
    ...     training=True)
    >>> tuple(context.shape), tuple(log_prob.shape)
    ((2, 3, 6), (2, 3))
    >>> np.asarray(weights).sum(-1).tolist()  # one position per query
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]

    References:
        Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel, Bengio. Show,
        Attend and Tell: Neural Image Caption Generation with Visual
        Attention. ICML 2015. https://arxiv.org/abs/1502.03044

        Mnih, Heess, Graves, Kavukcuoglu. Recurrent Models of Visual
        Attention. NeurIPS 2014. https://arxiv.org/abs/1406.6247

        Jang, Gu, Poole. Categorical Reparameterization with Gumbel-Softmax.
        ICLR 2017. https://arxiv.org/abs/1611.01144
    """

    def __init__(
        self,
        units,
        estimator="reinforce",
        inference="argmax",
        temperature=1.0,
        normalize=False,
        block_elements=None,
        kernel_initializer="glorot_uniform",
        seed=None,
        sample_probability=1.0,
        **kwargs,
    ):
        super().__init__(
            units,
            normalize=normalize,
            block_elements=block_elements,
            kernel_initializer=kernel_initializer,
            dropout=0.0,
            seed=seed,
            **kwargs,
        )
        if estimator not in ESTIMATORS:
            raise self._error("estimator", f"one of {ESTIMATORS}", repr(estimator))
        if inference not in INFERENCE_MODES:
            raise self._error("inference", f"one of {INFERENCE_MODES}", repr(inference))
        if not isinstance(temperature, int | float) or not temperature > 0:
            raise self._error("temperature", "a number > 0", repr(temperature))
        if (
            isinstance(sample_probability, bool)
            or not isinstance(sample_probability, numbers.Real)
            or not 0.0 < sample_probability <= 1.0
        ):
            raise self._error(
                "sample_probability", "a number in (0, 1]", repr(sample_probability)
            )
        self.sample_probability = float(sample_probability)
        self.estimator = estimator
        self.inference = inference
        self.temperature = temperature
        self.seed_generator = keras.random.SeedGenerator(seed)
        self._warned_no_log_prob = False

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        return_log_prob=False,
    ):
        inputs = self._prepare_inputs(
            query, value, key, query_mask, value_mask, attention_mask, use_causal_mask
        )
        if training and self.estimator == "reinforce" and not return_log_prob:
            self._warn_no_log_prob()
        context, weights, log_prob, entropy = self._select(inputs, training)
        outputs = self._finish(inputs, context, weights, return_attention_scores)
        if not return_log_prob:
            return outputs
        if inputs.single_step:
            log_prob, entropy = ops.squeeze(log_prob, 1), ops.squeeze(entropy, 1)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return outputs + (log_prob, entropy)

    def _select(self, inputs, training=None):
        """Pick one position per query (or average, for soft inference).

        Returns ``(context [B, Tq, Dv], weights [B, Tq, Tv], log_prob [B, Tq],
        entropy [B, Tq])``; the first two in the compute dtype, the last two
        in float32.
        """
        scores = ops.cast(self.score(inputs.query, inputs.key), "float32")
        mask = inputs.mask
        logits = scores if mask is None else ops.where(mask, scores, masking.MASK_FILL)
        log_p = ops.log_softmax(logits, axis=-1)
        probs = masking.masked_softmax(scores, mask)
        if mask is not None:
            log_p = ops.where(mask, log_p, 0.0)
        entropy = -ops.sum(probs * log_p, axis=-1)
        depth = ops.shape(scores)[-1]

        gumbel_soft = None
        if training and self.estimator == "reinforce":
            flat = ops.reshape(logits, (-1, depth))
            index = keras.random.categorical(
                flat, 1, dtype="int32", seed=self.seed_generator
            )
            index = ops.reshape(index, ops.shape(scores)[:-1])
        elif training:  # Gumbel-max sample with its softmax relaxation.
            uniform = keras.random.uniform(
                ops.shape(scores), minval=1e-20, maxval=1.0, seed=self.seed_generator
            )
            perturbed = (logits - ops.log(-ops.log(uniform))) / self.temperature
            index = ops.argmax(perturbed, axis=-1)
            gumbel_soft = masking.masked_softmax(perturbed, mask)
        else:
            index = ops.argmax(logits, axis=-1)
        one_hot = _one_hot(index, depth)
        if mask is not None:  # Zero on fully masked rows (any pick is masked).
            one_hot = one_hot * ops.cast(mask, "float32")
        log_prob = ops.sum(one_hot * log_p, axis=-1)

        if gumbel_soft is not None:
            weights = one_hot + (gumbel_soft - ops.stop_gradient(gumbel_soft))
        elif training or self.inference == "argmax":
            weights = one_hot
        else:
            weights = probs
        if training and self.sample_probability < 1.0:
            # Xu et al.'s mixture: a row that does not sample attends softly.
            batch = ops.shape(scores)[0]
            coin = keras.random.uniform((batch,), seed=self.seed_generator)
            sampled = ops.reshape(coin < self.sample_probability, (batch, 1))
            weights = ops.where(ops.expand_dims(sampled, -1), weights, probs)
            log_prob = ops.where(sampled, log_prob, 0.0)
        weights = ops.cast(weights, self.compute_dtype)
        context = self._weighted_sum(weights, inputs.value, training)
        return context, weights, log_prob, entropy

    def _warn_no_log_prob(self):
        if not self._warned_no_log_prob:
            self._warned_no_log_prob = True
            warnings.warn(
                f"HardAttention (name={self.name!r}) samples with "
                "estimator='reinforce' but its log-probabilities are not "
                "returned: its score weights get no gradient. Call it with "
                "return_log_prob=True and feed log_prob to a ReinforceLoss, "
                "or use estimator='gumbel'.",
                stacklevel=3,
            )

    def get_config(self):
        config = super().get_config()
        config.pop("dropout")  # always 0: a hard choice is not dropped out
        return {
            **config,
            "estimator": self.estimator,
            "inference": self.inference,
            "temperature": self.temperature,
            "sample_probability": self.sample_probability,
        }


def reinforce_surrogate(loss, log_prob, baseline, entropy=None, entropy_weight=0.0):
    """Per-example REINFORCE surrogate with the value of the task loss.

    ``L + stop_gradient(L - b) * (log p - stop_gradient(log p)) - lambda_H H``:
    its gradient is that of ``L + stop_gradient(L - b) log p(s) - lambda_H H``
    (the score-function estimator), but the score-function term is 0 in value,
    so the loss that ``fit`` reports is the task loss (minus the entropy bonus).

    Args:
        loss: ``[B]`` per-example task loss ``L(s)``.
        log_prob: ``[B]`` ``log p(s)`` of the samples (summed over queries).
        baseline: scalar or ``[B]`` baseline ``b`` (its gradient is stopped).
        entropy: optional ``[B]`` attention entropy ``H``.
        entropy_weight: ``lambda_H``.

    Returns:
        ``[B]`` surrogate losses.

    Example:

    >>> import numpy as np
    >>> s = reinforce_surrogate(np.array([2.0, 1.0]), np.array([-0.5, -1.0]), 1.5)
    >>> np.asarray(s).tolist()  # the value is the task loss
    [2.0, 1.0]
    """
    advantage = ops.stop_gradient(loss - baseline)
    surrogate = loss + advantage * (log_prob - ops.stop_gradient(log_prob))
    if entropy is not None and entropy_weight:
        surrogate = surrogate - entropy_weight * entropy
    return surrogate


def _per_example(x):
    """Mean over every axis but the first: ``[B, ...]`` to ``[B]``, float32."""
    x = ops.cast(x, "float32")
    if len(x.shape) > 1:
        x = ops.mean(ops.reshape(x, (ops.shape(x)[0], -1)), axis=-1)
    return x


def _summed(x):
    """Sum over every axis but the first: ``[B, ...]`` to ``[B]``, float32."""
    x = ops.cast(x, "float32")
    if len(x.shape) > 1:
        x = ops.sum(ops.reshape(x, (ops.shape(x)[0], -1)), axis=-1)
    return x


@keras.saving.register_keras_serializable(package="attention_layers")
class ReinforceLoss(keras.layers.Layer):
    """Endpoint layer that trains `HardAttention` with REINFORCE in ``fit``.

    It computes the per-example task loss ``L = loss(y_true, y_pred)`` (every
    axis but the batch averaged) and adds to the model, with ``add_loss``, the
    batch mean of ``L + stop_gradient(L - b) * log p(s) - entropy_weight * H``
    (plus that of ``(stop_gradient(L) - b)^2`` with a learned baseline),
    written so that the score-function term is 0 in value (the reported loss
    is the task loss) and has the gradient ``(L - b) grad log p(s)``.
    ``log p(s)`` and ``H`` are summed over the queries of an example. The
    baseline ``b`` is the bias-corrected exponential moving average of the
    batch-mean loss (updated in training; under ``tf.distribute`` each replica
    averages its own batches), plus, with ``learned_baseline=True``, a
    ``Dense(1)`` on ``baseline_features`` (whose gradient is stopped) trained
    by the squared error above. Compile the model with no loss:
    ``model.compile(optimizer)``, and pass the targets as a model input.

    Args:
        loss: a Keras loss (name, ``keras.losses.Loss``, or function
            ``(y_true, y_pred) -> [B, ...]``) giving per-example values;
            a loss that returns a scalar is rejected.
        baseline_decay: decay of the moving-average baseline, in ``[0, 1)``;
            ``None`` for no moving average (``b = 0``, or the learned part).
        learned_baseline: add a learned, input-dependent baseline.
        entropy_weight: ``lambda_H >= 0``, weight of the entropy bonus.
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        y_true: targets (a model input).
        y_pred: predictions, as ``loss`` expects them.
        log_prob: ``[B]`` or ``[B, Tq]``, from ``HardAttention(...,
            return_log_prob=True)``; several can be added together.
        entropy: optional ``[B]`` or ``[B, Tq]`` attention entropy.
        baseline_features: ``[B, ..., D]`` input of the learned baseline
            (e.g. the query), averaged over the middle axes; required with
            ``learned_baseline=True``.
        training: update the moving average (True) or not.

    Returns:
        ``y_pred``, unchanged.

    Example:

    >>> import keras, numpy as np
    >>> import attention_layers as al
    >>> seq = keras.Input((5, 4))
    >>> label = keras.Input((), dtype="int32")
    >>> query = keras.layers.GlobalAveragePooling1D()(seq)
    >>> context, log_prob, entropy = al.HardAttention(units=8)(
    ...     query, seq, return_log_prob=True)
    >>> logits = keras.layers.Dense(3)(context)
    >>> logits = al.ReinforceLoss(
    ...     keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    ...     entropy_weight=0.01)(label, logits, log_prob, entropy)
    >>> model = keras.Model([seq, label], logits)
    >>> model.compile(optimizer="adam")
    >>> x = np.random.rand(8, 5, 4).astype("float32")
    >>> y = np.random.randint(0, 3, size=8)
    >>> history = model.fit([x, y], epochs=1, verbose=0)
    >>> bool(np.isfinite(history.history["loss"]).all())
    True

    References:
        Williams. Simple Statistical Gradient-Following Algorithms for
        Connectionist Reinforcement Learning. Machine Learning 8, 1992.

        Xu et al. Show, Attend and Tell. ICML 2015, section 4.1.
        https://arxiv.org/abs/1502.03044
    """

    def __init__(
        self,
        loss,
        baseline_decay=0.9,
        learned_baseline=False,
        entropy_weight=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.loss = keras.losses.get(loss)
        if self.loss is None or not callable(self.loss):
            raise input_error(self, "loss", "a Keras loss or a callable", repr(loss))
        if baseline_decay is not None and not 0.0 <= float(baseline_decay) < 1.0:
            raise input_error(
                self,
                "baseline_decay",
                "a float in [0, 1) or None",
                repr(baseline_decay),
            )
        if not float(entropy_weight) >= 0.0:
            raise input_error(
                self, "entropy_weight", "a float >= 0", repr(entropy_weight)
            )
        self.baseline_decay = baseline_decay
        self.learned_baseline = learned_baseline
        self.entropy_weight = entropy_weight

    def _replica_scalar(self, name):
        """A float32 scalar state, zero at first, kept by each replica."""
        return self.add_weight(
            name=name,
            shape=(),
            initializer="zeros",
            trainable=False,
            autocast=False,
            aggregation="none",
        )

    def build(
        self,
        y_true_shape,
        y_pred_shape,
        log_prob_shape,
        entropy_shape=None,
        baseline_features_shape=None,
    ):
        # aggregation="none": under tf.distribute each replica averages its own
        # batches (like BatchNormalization's moving statistics). "mean" would
        # all-reduce through a merge_call in the middle of the replica threads,
        # which interleaves them and loses the add_loss tensors of one replica.
        self.baseline_average = self._replica_scalar("baseline_average")
        self.baseline_steps = self._replica_scalar("baseline_steps")
        if self.learned_baseline:
            if baseline_features_shape is None:
                raise input_error(
                    self,
                    "baseline_features",
                    "a [batch, ..., dim] tensor with learned_baseline=True",
                    "None",
                )
            self.baseline_dense = keras.layers.Dense(
                1, kernel_initializer="zeros", dtype=self.dtype_policy, name="baseline"
            )
            self.baseline_dense.build((None, baseline_features_shape[-1]))

    def moving_baseline(self, batch_mean=None):
        """The bias-corrected moving average (``batch_mean`` before any update)."""
        steps = ops.convert_to_tensor(self.baseline_steps)
        correction = 1.0 - ops.power(float(self.baseline_decay or 0.0), steps)
        corrected = self.baseline_average / ops.maximum(correction, 1e-12)
        if batch_mean is None:
            return corrected
        return ops.where(steps > 0, corrected, batch_mean)

    def call(
        self,
        y_true,
        y_pred,
        log_prob,
        entropy=None,
        baseline_features=None,
        training=None,
    ):
        if len(log_prob.shape) not in (1, 2):
            raise input_error(
                self,
                "log_prob",
                "a [batch] or [batch, query_length] tensor, the log_prob output "
                "of HardAttention(..., return_log_prob=True)",
                f"shape {tuple(log_prob.shape)}",
            )
        if isinstance(self.loss, keras.losses.Loss):
            per_example = self.loss.call(y_true, ops.cast(y_pred, "float32"))
        else:
            per_example = self.loss(y_true, ops.cast(y_pred, "float32"))
        if len(per_example.shape) == 0:
            raise input_error(
                self,
                "loss",
                "a loss that returns one value per example, [batch, ...]",
                "a scalar (an already reduced loss)",
            )
        task_loss = _per_example(per_example)
        log_prob = _summed(log_prob)
        if entropy is not None:
            entropy = _summed(entropy)
        batch_mean = ops.mean(ops.stop_gradient(task_loss))

        baseline = 0.0
        if self.baseline_decay is not None:
            baseline = self.moving_baseline(batch_mean)
        extra = 0.0
        if self.learned_baseline:
            if baseline_features is None:
                raise input_error(
                    self,
                    "baseline_features",
                    "a [batch, ..., dim] tensor with learned_baseline=True",
                    "None",
                )
            features = ops.stop_gradient(
                ops.cast(baseline_features, self.compute_dtype)
            )
            if len(features.shape) > 2:
                features = ops.mean(
                    ops.reshape(
                        features, (ops.shape(features)[0], -1, features.shape[-1])
                    ),
                    axis=1,
                )
            learned = ops.cast(self.baseline_dense(features), "float32")[:, 0]
            baseline = baseline + learned
            extra = ops.mean(ops.square(ops.stop_gradient(task_loss) - baseline))
        surrogate = reinforce_surrogate(
            task_loss, log_prob, baseline, entropy, self.entropy_weight
        )
        self.add_loss(ops.mean(surrogate) + extra)

        if training and self.baseline_decay is not None:
            decay = float(self.baseline_decay)
            self.baseline_average.assign(
                decay * self.baseline_average + (1.0 - decay) * batch_mean
            )
            self.baseline_steps.assign(self.baseline_steps + 1.0)
        return y_pred

    def get_config(self):
        return {
            **super().get_config(),
            "loss": keras.losses.serialize(self.loss),
            "baseline_decay": self.baseline_decay,
            "learned_baseline": self.learned_baseline,
            "entropy_weight": self.entropy_weight,
        }

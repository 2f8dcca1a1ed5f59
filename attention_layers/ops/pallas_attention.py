"""Multi-head attention through JAX's Pallas flash-attention kernel for GPUs.

``jax.experimental.pallas.ops.gpu.attention.mha`` is a maintained fused
kernel (Triton) with its own backward pass: it never stores the scores, so
memory grows linearly with the lengths, in float32 too, where cuDNN's fused
attention (what ``keras.ops.dot_product_attention`` reaches on a GPU) takes
16-bit inputs only. It takes no mask but a causal one aligned at the first
key and segment ids over one length; this module maps the layer's masks onto
that where it can (`supports`); its backward pass wants as many query blocks
as key blocks, so it serves equal lengths only. Off a GPU it runs in Pallas'
interpreter
(slow, exact: how the tests prove it on a CPU).
"""

from attention_layers import masking
from attention_layers.base import static_shape
from attention_layers.ops import devices

# The kernel's default block of query rows and of keys; lengths that are not a
# multiple of it are padded, the padding hidden from the real rows through
# segment ids (which the kernel reads for queries and keys from one array).
BLOCK = 128


def supports(masks, query_length, key_length, key_dim, value_dim):
    """Whether the kernel computes this call exactly as the other paths do.

    It does for equal static lengths, one head size, no key, pairwise or
    window mask, and a causal mask only where query ``i`` sits at key position
    ``i``. Query masks are applied to the output.
    """
    tq, tk = query_length, key_length
    if not (isinstance(tq, int) and isinstance(tk, int)) or key_dim != value_dim:
        return False
    if masks.kv is not None or masks.pair is not None or masks.window is not None:
        return False
    if masks.causal_offset is not None and not (
        isinstance(masks.causal_offset, int) and masks.causal_offset == 0
    ):
        return False
    return tq == tk


def pallas_attention(query, key, value, masks, scale):
    """``softmax(scale q k^T) v`` per head for ``[B, T, H, D]`` inputs, by the
    Pallas kernel; `supports` must hold. Rows that ``masks.query`` hides get
    a zero output."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention

    tq = static_shape(query.shape)[1]  # == Tk (`supports`)
    segment_ids = None
    pad = (-tq) % BLOCK
    if pad:  # pad both, hide the padding from the real rows
        widths = ((0, 0), (0, pad), (0, 0), (0, 0))
        query, key, value = (jnp.pad(x, widths) for x in (query, key, value))
        real = jnp.arange(tq + pad) < tq
        segment_ids = jnp.broadcast_to(
            jnp.where(real, 0, 1).astype("int32"), (query.shape[0], tq + pad)
        )
    out = attention.mha(
        query,
        key,
        value,
        segment_ids=segment_ids,
        sm_scale=float(scale),
        causal=masks.causal_offset is not None,
        interpret=devices.platform() != "gpu",
    )
    return masking.zero_masked(out[:, :tq], masks.query)

"""The online-softmax step both sparse attention kernels share (docs/spec.md §6): a block of BLOCK_H
heads against a tile of BLOCK_N gathered KV rows, K = V (the first d_v dims of a row are its
value), and the final normalization with the attention sink.

State per head: m (running max of the logits, natural units), l (sum of exp(logit - m)), acc
(sum of exp(logit - m) * v, fp32). Logits are scale * q.k in fp32 (bf16 operands, fp32
accumulation); the softmax weights enter the P.V product as bf16, as FlashMLA's kernels do.
"""
import triton
import triton.language as tl

from ._checks import interpreting
from ._formats import round_bf16

# Triton's interpreter multiplies bf16 dot operands as their raw bit patterns: there the products
# run in fp32 (the operands are still bf16 values, so only the rounding of the sums differs).
_NATIVE_BF16_DOT = tl.constexpr(not interpreting())


@triton.jit
def mma(a, b):
    """a @ b with fp32 accumulation (bf16 tensor cores on a GPU)."""
    if _NATIVE_BF16_DOT:
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))


@triton.jit
def logits(q, k, q_tail, k_tail, scale, HAS_TAIL: tl.constexpr):
    """scale * q.k for q [BH, 512] and k [BN, 512] bf16 (+ the 64-dim tails of d_qk 576)."""
    s = mma(q, tl.trans(k))
    if HAS_TAIL:
        s += mma(q_tail, tl.trans(k_tail))
    return s * scale


@triton.jit
def softmax_update(m_i, l_i, acc, s, valid, v, v_scale):
    """One tile: s [BH, BN] logits, valid [BN], v [BN, DV] bf16 values times v_scale (an
    FP8_PER_TENSOR cache's scale: the codes stay exact in bf16, the scale rides on P)."""
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m_i - m_use) * 1.4426950408889634)
    p = tl.exp2((s - m_use[:, None]) * 1.4426950408889634)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    pv = p * v_scale
    if not _NATIVE_BF16_DOT:
        pv = round_bf16(pv)  # the GPU's round-to-nearest-even (the interpreter's cast truncates)
    acc = acc * alpha[:, None] + mma(pv.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def finish(m_i, l_i, acc, sink, HAS_SINK: tl.constexpr):
    """(out [BH, DV] fp32, lse [BH]) of the final state: lse = m + ln l (natural log, without
    the sink); out = acc / l * 1 / (1 + exp(sink - lse)). No valid row: out 0, lse +inf."""
    empty = l_i == 0.0
    lse = tl.where(empty, float("inf"),
                   m_i + tl.log2(tl.where(empty, 1.0, l_i)) * 0.6931471805599453)
    f = 1.0 / tl.where(empty, 1.0, l_i)
    if HAS_SINK:
        f = f / (1.0 + tl.exp2((sink - lse) * 1.4426950408889634))
    f = tl.where(empty, 0.0, f)
    return acc * f[:, None], lse


@triton.jit
def partial(m_i, l_i, acc):
    """(o = acc / l, lse) of one split's state; an empty split gives o 0, lse -inf."""
    empty = l_i == 0.0
    lse = tl.where(empty, float("-inf"),
                   m_i + tl.log2(tl.where(empty, 1.0, l_i)) * 0.6931471805599453)
    f = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
    return acc * f[:, None], lse

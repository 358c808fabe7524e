"""A head row (D = 128, 512 or 576 values) as the row kernels hold it: two fp32 tiles `even`,
`odd` of shape [NBP, 32], element (b, i) being the GPT-J pair (dim b*64 + 2i, dim b*64 + 2i + 1);
a block of HB heads is [HB, NBP, 32] (every helper reduces over the last axes only).

One layout serves every per-row op: a pair is the unit RoPE rotates, row b is one 64-wide FP8
scale block of MODEL1_FP8 (two rows make a 128-wide V32_FP8 / activation block), and the rope
dims (the last R of D) are whole rows. NBP = the next power of two >= D / 64; rows b >= D / 64
are padding (masked).
"""
import triton
import triton.language as tl


@triton.jit
def pair_dims(NBP: tl.constexpr):
    """(dim of `even` [NBP, 32], block index b [NBP, 1], pair index b*32 + i [NBP, 32])."""
    b = tl.arange(0, NBP)[:, None]
    i = tl.arange(0, 32)[None, :]
    return b * 64 + 2 * i, b, b * 32 + i


@triton.jit
def rope_rotate(even, odd, pair, cos_sin_row, first_pair, HALF_R: tl.constexpr,
                INVERSE: tl.constexpr):
    """Rotates pairs first_pair .. first_pair + HALF_R - 1 by the angles of one cos/sin table
    row ([cos x HALF_R | sin x HALF_R]); inverse: the conjugate. Other pairs pass unchanged.
    `pair` [NBP, 32] (or broadcastable to the tiles' shape)."""
    j = pair - first_pair
    m = (j >= 0) & (j < HALF_R)
    c = tl.load(cos_sin_row + j, mask=m, other=1.0)
    s = tl.load(cos_sin_row + HALF_R + j, mask=m, other=0.0)
    if INVERSE:
        s = -s
    e2 = even * c - odd * s
    o2 = even * s + odd * c
    return tl.where(m, e2, even), tl.where(m, o2, odd)


@triton.jit
def rms_inverse(even, odd, n, eps):
    """1 / sqrt(mean(x^2) + eps) of each row (padding must be 0): a scalar for [NBP, 32]
    tiles, [HB] for [HB, NBP, 32]."""
    ss = tl.sum(tl.sum(even * even + odd * odd, axis=-1), axis=-1)
    return tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(ss, n * 1.0) + eps))


@triton.jit
def block_amax(even, odd):
    """max |x| of each 64-wide row block: [NBP] (or [HB, NBP])."""
    return tl.max(tl.maximum(tl.abs(even), tl.abs(odd)), axis=-1)


@triton.jit
def pair_blocks_max(v, NBP: tl.constexpr):
    """Per 128-wide block (two rows): max of v [NBP] over rows 2c, 2c+1, broadcast back to
    [NBP] (row b gets block b // 2's value)."""
    m = tl.max(tl.reshape(v, [NBP // 2, 2]), axis=1)
    return tl.reshape(tl.broadcast_to(m[:, None], [NBP // 2, 2]), [NBP])


@triton.jit
def pair_blocks_max_heads(v, HB: tl.constexpr, NBP: tl.constexpr):
    """pair_blocks_max for each head of v [HB, NBP]."""
    m = tl.max(tl.reshape(v, [HB, NBP // 2, 2]), axis=2)
    return tl.reshape(tl.broadcast_to(m[:, :, None], [HB, NBP // 2, 2]), [HB, NBP])


def heads_per_program(H: int, gpu_heads: int) -> int:
    """Heads a row kernel handles per program: `gpu_heads` on a GPU (enough programs to fill it);
    every head under Triton's interpreter, whose cost is per operation, not per element."""
    from ._checks import interpreting

    n = triton.next_power_of_2(H) if interpreting() else gpu_heads
    return min(n, triton.next_power_of_2(H))

"""Index planning on the Triton backend (include/dsv4/indexing.h) against the CPU reference ops
on valid data (identical int32 outputs, outputs poisoned beforehand), and the documented CUDA
handling of data the CPU rejects (the Triton backend cannot read values on the host either):
unmappable entries become -1 / are left out, inconsistent rows become all -1 with length 0.
"""
import torch

from triton_support import gpu_or, op, poisoned, to_dev

I32 = torch.int32


def test_local_to_global_slots_matches_reference_and_aliases():
    T, K, B = gpu_or(6, 64), gpu_or(10, 512), 8
    local = torch.randint(-1, 40, (T, K), dtype=I32)
    t2r = torch.randint(0, 3, (T,), dtype=I32)
    table = torch.tensor([[3, 1, -1, 7, 2], [0, 2, 5, 6, 9], [9, 8, 4, -1, 11]], dtype=I32)
    local[0, 0] = -7   # < -1: -1 (the CPU's unchecked variant does the same)
    local[1, 1] = 400  # beyond the table: -1
    want_g, want_l = torch.empty(T, K, dtype=I32), torch.empty(T, dtype=I32)
    torch.ops.dsv4.local_to_global_slots(local, t2r, table, B, want_g, want_l, False)
    got_g, got_l = poisoned((T, K), I32), poisoned((T,), I32)
    op("local_to_global_slots")(*to_dev(local, t2r, table), B, got_g, got_l, False)
    assert torch.equal(got_g.cpu(), want_g) and torch.equal(got_l.cpu(), want_l)
    inplace = to_dev(local)
    op("local_to_global_slots")(inplace, *to_dev(t2r, table), B, inplace, None, False)
    assert torch.equal(inplace.cpu(), want_g)
    # A token whose request is outside the table: all -1, length 0.
    t2r[2] = 3
    op("local_to_global_slots")(*to_dev(local, t2r, table), B, got_g, got_l, False)
    assert (got_g[2] == -1).all() and got_l[2] == 0


def test_swa_window_indices_matches_reference():
    T, W, B = gpu_or(6, 64), gpu_or(16, 128), 8
    pos = torch.randint(0, 40, (T,))
    pos[0] = 0
    t2r = torch.randint(0, 3, (T,), dtype=I32)
    table = torch.randint(0, 50, (3, 6), dtype=I32)
    for positions in (pos, pos.to(I32)):
        want_i, want_l = torch.empty(T, W, dtype=I32), torch.empty(T, dtype=I32)
        torch.ops.dsv4.swa_window_indices(positions, t2r, table, B, W, want_i, want_l)
        got_i, got_l = poisoned((T, W), I32), poisoned((T,), I32)
        op("swa_window_indices")(*to_dev(positions, t2r, table), B, W, got_i, got_l)
        assert torch.equal(got_i.cpu(), want_i) and torch.equal(got_l.cpu(), want_l)


def test_swa_window_indices_released_blocks_give_the_live_suffix():
    """CUDA semantics: window positions whose block was released are left out, the rest stays
    packed oldest first; a negative position gives an all -1 row."""
    table = torch.tensor([[9, -1, 4, 10]], dtype=I32)
    pos = torch.tensor([30, -1])
    t2r = torch.zeros(2, dtype=I32)
    got_i, got_l = poisoned((2, 16), I32), poisoned((2,), I32)
    op("swa_window_indices")(*to_dev(pos, t2r, table), 8, 16, got_i, got_l)
    # Window 15..30: position 15 (block 1) released; 16..23 in block 4, 24..30 in block 10.
    assert got_i[0].tolist() == list(range(32, 40)) + list(range(80, 87)) + [-1]
    assert got_l.tolist() == [15, 0] and (got_i[1] == -1).all()


def combine_case():
    # Three requests (the middle one without tokens), rows of a batch slice starting at 5.
    qsl = torch.tensor([5, 8, 8, 12], dtype=I32)
    seq = torch.tensor([40, 20, 9], dtype=I32)
    gl = torch.tensor([18, 0, 9], dtype=I32)
    topk = torch.tensor([[0, 3, -1, -1, -1], [1, 2, 4, 8, -1], [5, -1, -1, -1, -1],
                         [0, -1, -1, -1, -1], [0, -1, -1, -1, -1], [1, -1, -1, -1, -1],
                         [0, 1, -1, -1, -1]], dtype=I32)
    return topk, qsl, seq, gl


def test_combine_topk_swa_indices_matches_reference():
    topk, qsl, seq, gl = combine_case()
    T, W, N = topk.shape[0], 16, 12
    for k_in, n, ratio in ((topk, N, 4), (torch.empty(T, 0, dtype=I32), 0, 0)):
        M = n + 18
        K = k_in.shape[1]
        want_o, want_l = torch.empty(T, K + W, dtype=I32), torch.empty(T, dtype=I32)
        torch.ops.dsv4.combine_topk_swa_indices(k_in, qsl, seq, gl, W, n, M, ratio, want_o,
                                                want_l)
        got_o, got_l = poisoned((T, K + W), I32), poisoned((T,), I32)
        op("combine_topk_swa_indices")(*to_dev(k_in, qsl, seq, gl), W, n, M, ratio, got_o, got_l)
        assert torch.equal(got_o.cpu(), want_o) and torch.equal(got_l.cpu(), want_l)


def test_combine_topk_swa_indices_rejected_data():
    """CUDA semantics: non-causal or out-of-region top-k entries are left out; a request whose
    gathered range misses its first token's window gets all -1 rows and length 0."""
    topk, qsl, seq, gl = combine_case()
    T, W, N = topk.shape[0], 16, 12
    topk[0, 1] = 11   # position 35: visible entries < 9: left out
    topk[1, 0] = -3   # < -1: left out
    got_o, got_l = poisoned((T, 5 + W), I32), poisoned((T,), I32)
    op("combine_topk_swa_indices")(*to_dev(topk, qsl, seq, gl), W, N, N + 18, 4, got_o, got_l)
    # Row 0 (position 37): entry 0, then its window 22..37 at workspace rows 12 + q - 22.
    assert got_o[0].cpu().tolist() == [0] + list(range(12, 28)) + [-1] * 4
    assert got_o[1].cpu().tolist()[:3] == [2, 4, 8]
    gl[0] = 3  # request 0's first token (position 37) needs the window from 22 on
    op("combine_topk_swa_indices")(*to_dev(topk, qsl, seq, gl), W, N, N + 18, 4, got_o, got_l)
    assert (got_o[:3] == -1).all() and (got_l[:3] == 0).all()
    assert (got_l[3:] > 0).all()

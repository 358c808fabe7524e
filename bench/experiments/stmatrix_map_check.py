#!/usr/bin/env python3
"""Host check for p-tile-stmatrix.patch: the stmatrix.x4 store of P writes every packed bf16 pair
of every thread to the byte the 4-byte stores wrote (attention_tile.cuh's store_p_tile before the
patch: sw128_elem_offset(acc_row, acc_col)), and each 8×8 block's rows fall in distinct 16-byte
bank groups. The formulas are transcribed from smem_layout.cuh, wgmma.cuh and the patch.

stmatrix.sync.aligned.x4.m8n8.shared.b16: register q of lane l holds row l/4, columns
2·(l%4), +1 of block q; lane 8q + r names the address of row r of block q."""


def chunk_offset(rows, row, chunk):  # sw128_chunk_offset<rows>
    return (chunk >> 3) * (rows * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4)


def elem_offset(rows, row, col):  # sw128_elem_offset<rows>
    return chunk_offset(rows, row, col >> 3) + ((col & 7) << 1)


def acc_row(i, t):
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2)


def acc_col(i, t):
    return 8 * (i // 4) + 2 * (t % 4) + (i % 2)


def row_address(rows, t, m):
    """The patch: lane l of warp w names row 16w + 8·(block % 2) + l % 8, chunk 2m + block / 2."""
    lane, block = t % 32, (t % 32) // 8
    return chunk_offset(rows, 16 * (t // 32) + 8 * (block % 2) + lane % 8, 2 * m + block // 2)


def main():
    rows, pairs = 64, 16  # 64 heads; a 64×64 P tile: 32 elements, 16 pairs per thread
    written = set()
    for t in range(128):
        warp0, lane = t - t % 32, t % 32
        for k in range(pairs):
            m, q = divmod(k, 4)  # pair k is register q of the m-th stmatrix
            new = row_address(rows, warp0 + 8 * q + lane // 4, m) + 4 * (lane % 4)
            old = elem_offset(rows, acc_row(2 * k, t), acc_col(2 * k, t))
            assert new == old, (t, k, new, old)
            written.add(new)
    assert len(written) == 128 * pairs, "every pair to its own 4 bytes"
    for t in range(0, 128, 8):  # the 8 lanes naming one block's rows
        for m in range(pairs // 4):
            groups = {(row_address(rows, t + r, m) % 128) // 16 for r in range(8)}
            assert len(groups) == 8, (t, m, groups)
    print(f"stmatrix store of P: {128 * pairs} pairs at the old offsets, every block conflict-free")


if __name__ == "__main__":
    main()

<%namespace name="c" file="common.mako"/>
## CSR, KB vectors at once, "lanes over k" (the GPU block kernel): KB consecutive
## work-items share a row, work-item `lane` computing column `lane` of the block.  For
## each of the row's entries they all read the same (column, value), which the cache
## serves once, and read KB consecutive entries of that column's row of x (coalesced);
## they write KB consecutive entries of y.  No local memory, no reduction.  KB is a
## power of two up to 32 (a warp on NVIDIA); the sums are real_t, so complex values
## work as in the one-vector kernels.
${c.preamble()}
#define KB ${block_width}

${signature("csr_lanes_block")}
{
${c.lanes_row()}
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
        __global const real_t *xl = x + x_col + lane;
        real_t sum = (real_t)(0);
        index_t j = row_ptr[row];
        // Two sums in turn: two loads of x in flight per work-item.
        real_t sum2 = (real_t)(0);
        for (; j + 1 < end; j += 2) {
            sum += MUL(LOADV(j, values), xl[(long)col_idx[j] * ldx]);
            sum2 += MUL(LOADV(j + 1, values), xl[(long)col_idx[j + 1] * ldx]);
        }
        if (j < end)
            sum += MUL(LOADV(j, values), xl[(long)col_idx[j] * ldx]);
        sum += sum2;
${c.store_y_lane("row", "sum")}
    }
}

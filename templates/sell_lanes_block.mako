<%namespace name="c" file="common.mako"/>
<%namespace name="sc" file="sell_common.mako"/>
## SELL-C-sigma, KB vectors at once, lanes over k (formats/lanes.py): KB / LC
## consecutive work-items share a row (its slots lie C apart in its slice; padding
## column -1 is skipped), each computing LC columns of the block, the result going to
## row perm[row] of y.
${c.preamble()}
#define KB ${block_width}
#define C ${slice_height}
${sc.columns()}

${signature("sell_lanes_block")}
{
${c.lanes_row()}
    if (row < n_rows) {
        // C is a power of two: a shift and a mask (a division and its remainder make
        // LLVM emit a "freeze", which Oclgrind's uninitialised-value check misreads)
        const long slice = row >> ${slice_height.bit_length() - 1};
        const long r = row & (C - 1);
${sc.slice_base()}
        __global const real_t *xl = x + x_col + lane;
${c.lane_sums("s")}
        const index_t end = slice_ptr[slice + 1];
        for (index_t k = slice_ptr[slice] + (index_t)r; k < end; k += C) {
            const index_t col = COL(k);
            if (col >= 0) {
                const real_t a = LOADV(k, values);
                __global const real_t *xa = xl + (long)col * ldx;
${c.lane_fma("s", "a", "xa")}
            }
        }
        const long out = ${"perm[row]" if has_perm else "row"};
${c.store_y_lane("out", "s")}
    }
}

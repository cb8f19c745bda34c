<%namespace name="c" file="common.mako"/>
## ELLPACK, KB vectors at once, lanes over k (formats/lanes.py; GPUs): KB / LC
## consecutive work-items share a row, each computing LC columns of the block; the
## row's slots (column-major, padding column -1 ends the row) are read once per lane
## group, X's rows side by side.
${c.preamble()}
#define KB ${block_width}

${signature("ell_lanes_block")}
{
${c.lanes_row()}
    if (row < n_rows) {
        __global const real_t *xl = x + x_col + lane;
${c.lane_sums("s")}
        long slot = row;
        for (long k = 0; k < width; ++k, slot += stride) {
            const index_t col = col_idx[slot];
            if (col < 0)
                break;
            const real_t a = values[slot];
            __global const real_t *xa = xl + (long)col * ldx;
${c.lane_fma("s", "a", "xa")}
        }
${c.store_y_lane("row", "s")}
    }
}

<%namespace name="c" file="common.mako"/>
## ELLPACK, KB vectors at once, lanes over k (formats/lanes.py; complex values): KB
## consecutive work-items share a row, lane j computing column j of the block; the
## row's slots (column-major, padding column -1 ends the row) are read once per lane
## group, X's rows side by side.
${c.preamble()}
#define KB ${block_width}

${signature("ell_lanes_block")}
{
${c.lanes_row()}
    if (row < n_rows) {
        __global const real_t *xl = x + x_col + lane;
        real_t sum = (real_t)(0);
        long slot = row;
        for (long k = 0; k < width; ++k, slot += stride) {
            const index_t col = col_idx[slot];
            if (col < 0)
                break;
            sum += MUL(values[slot], xl[(long)col * ldx]);
        }
${c.store_y_lane("row", "sum")}
    }
}

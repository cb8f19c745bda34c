<%namespace name="c" file="common.mako"/>
## ELLPACK, KB vectors at once, lanes over k (formats/lanes.py; complex values): KB
## consecutive work-items share a row, lane j computing column j of the block; the
## row's slots (column-major, padding column -1 ends the row) are read once per lane
## group, X's rows side by side.
${c.preamble()}
#define KB ${block_width}

${signature("ell_lanes_block")}
{
    const long gid = get_global_id(0);
    // KB is a power of two: shifts (Oclgrind cannot run the freeze of a / and %).
    const long row = gid >> ${block_width.bit_length() - 1};
    const long lane = gid & (KB - 1);
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
        __global real_t *yl = y + row * ldy + y_col + lane;
        *yl = NONZERO(beta) ? MUL(alpha, sum) + MUL(beta, *yl) : MUL(alpha, sum);
    }
}

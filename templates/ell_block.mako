<%namespace name="c" file="common.mako"/>
## ELLPACK, KB vectors at once: one work-item per row over the column-major padded
## arrays, KB sums per row; the loop stops at the first padding slot (column -1).
${c.preamble()}
${c.block_preamble()}

${signature("ell_block")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        realb_t sum = (realb_t)(0);
        long slot = row;
        for (long k = 0; k < width; ++k, slot += stride) {
            const index_t col = col_idx[slot];
            if (col < 0)
                break;
            sum += MULB(values[slot], XROW(col));
        }
${c.store_y_block("row", "sum")}
    }
}

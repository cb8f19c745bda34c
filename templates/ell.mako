<%namespace name="c" file="common.mako"/>
## ELLPACK (Bell & Garland): one work-item per row over column-major padded arrays;
## slot k of row i at k * stride + i, so a group reads consecutive addresses.  Padding
## slots (column -1) follow a row's entries: the loop stops at the first one, never
## multiplying x by a padding value.
${c.preamble()}
${c.streamed_loads(streamed_loads)}

${signature("ell")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        real_t sum = 0;
        long slot = row;
        for (long k = 0; k < width; ++k, slot += stride) {
            const index_t col = STREAMI(col_idx + slot);
            if (col < 0)
                break;
            sum += MUL(STREAMV(values + slot), x[col]);
        }
${c.store_y("row", "sum")}
    }
}

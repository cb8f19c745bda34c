<%namespace name="c" file="common.mako"/>
## ELLPACK (Bell & Garland): one work-item per row over column-major padded arrays;
## slot k of row i at k * stride + i, so a group reads consecutive addresses.  Padding
## slots (column -1) follow a row's entries: the loop stops at the first one, never
## multiplying x by a padding value.
${c.preamble()}

__kernel __attribute__((reqd_work_group_size(${work_group_size}, 1, 1)))
void ell(const long n_rows,
         const long stride,
         const long width,
         __global const index_t *restrict col_idx,
         __global const real_t *restrict values,
         __global const real_t *restrict x,
         __global real_t *restrict y,
         const real_t alpha,
         const real_t beta)
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        real_t sum = 0;
        long slot = row;
        for (long k = 0; k < width; ++k, slot += stride) {
            const index_t col = col_idx[slot];
            if (col < 0)
                break;
            sum += values[slot] * x[col];
        }
${c.store_y("row", "sum")}
    }
}

/* Tiled transpose: dst[c * dst_ld + r + dst_offset] = src[r * src_ld + c + src_offset]
   for r < rows, c < cols (src a row-major rows x cols block, dst one of cols x rows).
   real_t is defined before this text; TC and TR (powers of two, 2^TC_LOG and 2^TR_LOG)
   are the tile's columns and rows of src.  A work-group (1-D local size, any size) reads its TR x TC tile row
   by row (consecutive work-items on consecutive addresses of src), keeps it in local
   memory (rows padded to an odd stride: no bank conflicts) and writes it column by
   column (consecutive addresses of dst).  Thin blocks get thin tiles (TC = 4 for
   3 columns), so both sides stay coalesced.  The tile is picked by the 2-D NDRange's
   group ids (no 64-bit division): dimension 0 runs over row tiles when rows_first,
   else over column tiles (the long side goes in dimension 0, which has no 65535 cap
   on GPUs).  For the device block products of formats without block kernels. */
#define STRIDE (TC | 1)

__kernel void transpose(__global const real_t *restrict src, const long src_offset,
                        const long src_ld, __global real_t *restrict dst,
                        const long dst_offset, const long dst_ld, const long rows,
                        const long cols, const int rows_first)
{
    __local real_t tile[TR * STRIDE];
    const long row_tile = rows_first ? get_group_id(0) : get_group_id(1);
    const long col_tile = rows_first ? get_group_id(1) : get_group_id(0);
    const long r0 = row_tile * TR, c0 = col_tile * TC;
    const int lid = get_local_id(0), size = get_local_size(0);
    for (int t = lid; t < TR * TC; t += size) {
        /* Shifts and masks, not / and %: LLVM pairs those with a `freeze`, which
           Oclgrind's --uninitialized cannot run. */
        const int i = t >> TC_LOG, j = t & (TC - 1);
        const long r = r0 + i, c = c0 + j;
        if (r < rows && c < cols)
            tile[i * STRIDE + j] = src[src_offset + r * src_ld + c];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int t = lid; t < TR * TC; t += size) {
        const int i = t & (TR - 1), j = t >> TR_LOG;
        const long r = r0 + i, c = c0 + j;
        if (r < rows && c < cols)
            dst[dst_offset + c * dst_ld + r] = tile[i * STRIDE + j];
    }
}

/* One strided column copy: dst[i * dst_stride + dst_offset] =
   src[i * src_stride + src_offset] for i < n (real_t is defined before this text).
   Moves one column of a row-major block to or from a vector, for the device block
   products of formats without block kernels. */
__kernel void strided_copy(__global const real_t *restrict src, const long src_stride,
                           const long src_offset, __global real_t *restrict dst,
                           const long dst_stride, const long dst_offset, const long n)
{
    const long i = get_global_id(0);
    if (i < n)
        dst[i * dst_stride + dst_offset] = src[i * src_stride + src_offset];
}

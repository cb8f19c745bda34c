/* Device copy kernel: the bandwidth roofline that SpMV results are compared with.
   One float4 per work-item, so consecutive work-items touch consecutive addresses
   on GPUs and each CPU work-group streams one contiguous block. */
__kernel void copy_float4(__global const float4 *restrict src,
                          __global float4 *restrict dst,
                          const long n)
{
    const long i = get_global_id(0);
    if (i < n)
        dst[i] = src[i];
}

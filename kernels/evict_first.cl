/* Reads of matrix arrays that are read once, through PTX's ld.global.nc with the
   L1::evict_first policy (NVIDIA, compute capability 7.0+): x's lines then stay in L1
   longer.  One function per PTX type.  The text exists once: common.mako's
   streamed_loads includes it (and sell.mako uses its u16 read), and
   Device.evict_first_loads builds it with a probe kernel before any kernel relies on
   it.  volatile: each load stays in its branch. */
static inline float evict_first_f32(const __global float *p)
{
    float v;
    asm volatile("ld.global.nc.L1::evict_first.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
#ifdef cl_khr_fp64
static inline double evict_first_f64(const __global double *p)
{
    double v;
    asm volatile("ld.global.nc.L1::evict_first.f64 %0, [%1];" : "=d"(v) : "l"(p));
    return v;
}
#endif
static inline int evict_first_s32(const __global int *p)
{
    int v;
    asm volatile("ld.global.nc.L1::evict_first.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
static inline long evict_first_s64(const __global long *p)
{
    long v;
    asm volatile("ld.global.nc.L1::evict_first.s64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
static inline ushort evict_first_u16(const __global ushort *p)
{
    ushort v;
    asm volatile("ld.global.nc.L1::evict_first.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

<%namespace name="c" file="common.mako"/>
## value_bits (formats/storage.py): values (real_t) rounded to the stored type value_t
## (to nearest even, as numpy's astype), a finite value that overflows it flagged (the
## host then refuses the matrix rather than store inf).
${c.preamble()}

${signature("store_values")}
{
    const long i = get_global_id(0);
    if (i < count) {
        const real_t v = src[i];
        STOREV(v, i, dst);
        if (isinf(LOADV(i, dst)) && !isinf(v))
            atomic_max((volatile __global int *)overflow, 1);
    }
}

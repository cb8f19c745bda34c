<%namespace name="c" file="common.mako"/>
## update_values: new values in CSR order (src) scattered to where the format stores
## them (dst[slots[i]] = src[sources[i]]); padding slots are not listed and keep 0.
${c.preamble()}

${signature("scatter_values")}
{
    const size_t i = get_global_id(0);
    if (i < count)
        dst[slots[i]] = src[sources[i]];
}

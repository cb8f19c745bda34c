<%namespace name="c" file="common.mako"/>
## CMRS (Koza et al.): strips of HEIGHT rows, strip_ptr over strips, each entry's row in
## its strip packed into the top ROW_BITS bits of its column index (or a separate byte
## array).  One group of GROUP_WIDTH work-items per strip; work-item `lane` adds each of
## its products into its own slot buf[r][lane] (no other work-item touches it before
## the barrier), then the HEIGHT x GROUP_WIDTH sums are reduced per row:
##   reduction = "tree":   log2(GROUP_WIDTH) halving steps, the HEIGHT * half additions
##                         of each step spread cyclically over the group (GPUs);
##   reduction = "serial": one barrier, then one work-item per row adds its sums in
##                         lane order (CPUs, where a barrier splits the work-item loop).
## GROUP_WIDTH == 1: one work-item walks the whole strip into private sums (no buffer,
## no barrier).  Rows past n_rows (the last strip's tail) are never written.
${c.preamble()}
<%
    H, GW = height, group_width
    word_t = "u" + index_t
%>
#define HEIGHT ${H}
#define GROUP_WIDTH ${GW}
#define STRIPS_PER_GROUP ${work_group_size // GW}

${signature("cmrs")}
{
<%def name="decode()">
<% word_t = "u" + index_t %>
% if packed:
            const ${word_t} word = col_idx[j];
            const index_t col = (index_t)(word & ((((${word_t})1) << ${row_shift}) - 1));
            const uint r = (uint)(word >> ${row_shift});
% else:
            const index_t col = col_idx[j];
            const uint r = row_in_strip[j];
% endif
</%def>
% if GW == 1:
    const long strip = get_global_id(0);
    if (strip >= n_strips)
        return;
    real_t sum[HEIGHT];
% for r in range(H):
    sum[${r}] = 0;
% endfor
    // A running sum of the current row, flushed when the row changes: unsorted strips
    // (rows in order) then touch the indexed array once per row, not once per entry.
    real_t run = 0;
    uint current = 0;
    const index_t end = strip_ptr[strip + 1];
    for (index_t j = strip_ptr[strip]; j < end; ++j) {
${decode()}
        if (r != current) {
            sum[current] += run;
            run = 0;
            current = r;
        }
        run += MUL(values[j], x[col]);
    }
    sum[current] += run;
% for r in range(H):
    if (strip * HEIGHT + ${r} < n_rows) {
${c.store_y(f"strip * HEIGHT + {r}", f"sum[{r}]")}
    }
% endfor
% else:
    __local real_t buf[${work_group_size * H}];
    const uint lid = get_local_id(0);
    const uint lane = lid % GROUP_WIDTH;
    const long strip = (long)get_group_id(0) * STRIPS_PER_GROUP + lid / GROUP_WIDTH;
    // This strip's HEIGHT x GROUP_WIDTH sums: row r, lane l at b[r * GROUP_WIDTH + l].
    __local real_t *b = buf + (lid / GROUP_WIDTH) * (HEIGHT * GROUP_WIDTH);
% for r in range(H):
    b[${r * GW} + lane] = 0;
% endfor
    if (strip < n_strips) {
        const index_t end = strip_ptr[strip + 1];
        for (index_t j = strip_ptr[strip] + lane; j < end; j += GROUP_WIDTH) {
${decode()}
            b[r * GROUP_WIDTH + lane] += MUL(values[j], x[col]);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% if reduction == "tree":
% for half in [GW >> k for k in range(1, GW.bit_length())]:
    for (uint i = lane; i < ${H * half}; i += GROUP_WIDTH) {
        const uint at = (i / ${half}) * GROUP_WIDTH + (i % ${half});
        b[at] += b[at + ${half}];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
    for (uint r = lane; r < HEIGHT; r += GROUP_WIDTH) {
        const long row = strip * HEIGHT + r;
        if (strip < n_strips && row < n_rows) {
${c.store_y("row", "b[r * GROUP_WIDTH]")}
        }
    }
% else:
    for (uint r = lane; r < HEIGHT; r += GROUP_WIDTH) {
        const long row = strip * HEIGHT + r;
        if (strip < n_strips && row < n_rows) {
            real_t s = b[r * GROUP_WIDTH];
            for (uint l = 1; l < GROUP_WIDTH; ++l)
                s += b[r * GROUP_WIDTH + l];
${c.store_y("row", "s")}
        }
    }
% endif
% endif
}

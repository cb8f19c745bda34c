<%namespace name="c" file="common.mako"/>
<%namespace name="sc" file="sell_common.mako"/>
## SELL-C-sigma, KB vectors at once (see sell.mako for the layout and both mappings):
## each slot is read once and its value multiplies KB entries of row col of the x
## block; padding slots (column -1) are skipped; results go to row perm[row] of y.
${c.preamble()}
${c.block_preamble()}
<% C = slice_height %>
#define C ${C}
${sc.columns()}

${signature("sell_block")}
{
% if mapping == "slices":
    const long slice = get_global_id(0);
    if (slice >= n_slices)
        return;
    realb_t sum[C];
    for (int lane = 0; lane < C; ++lane)
        sum[lane] = (realb_t)(0);
${sc.slice_base()}
    const index_t end = slice_ptr[slice + 1];
    for (index_t k = slice_ptr[slice]; k < end; k += C) {
        for (int lane = 0; lane < C; ++lane) {
            const index_t col = COL(k + lane);
            if (col >= 0)
                sum[lane] += MULB(LOADV(k + lane, values), XROW(col));
        }
    }
    for (int lane = 0; lane < C; ++lane) {
        const long row = slice * C + lane;
        if (row < n_rows) {
            const long out = ${"perm[row]" if has_perm else "row"};
${c.store_y_block("out", "sum[lane]")}
        }
    }
% else:
<% T = threads_per_row %>
% if T > 1:
    __local lane_t partial[${work_group_size} * BLANES];
% endif
    const uint lid = get_local_id(0);
    const uint lane = lid % C;
% if T > 1:
    const uint t = (lid / C) % ${T};
% endif
    const long slice = (long)get_group_id(0) * ${work_group_size // (C * T)} + lid / ${C * T};
    realb_t sum = (realb_t)(0);
    if (slice < n_slices) {
${sc.slice_base()}
        const index_t end = slice_ptr[slice + 1];
        for (index_t k = slice_ptr[slice] + ${"t * C + " if T > 1 else ""}lane; k < end; k += ${C * T}) {
            const index_t col = COL(k);
            if (col >= 0)
                sum += MULB(LOADV(k, values), XROW(col));
        }
    }
% if T > 1:
    STOREB(sum, partial + lid * BLANES);
    barrier(CLK_LOCAL_MEM_FENCE);
% for s in [T >> i for i in range(1, T.bit_length())]:
    if (t < ${s}) {
        sum += LOADB(partial + (lid + ${s * C}) * BLANES);
        STOREB(sum, partial + lid * BLANES);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
    if (t == 0) {
% else:
    {
% endif
        const long row = slice * C + lane;
        if (slice < n_slices && row < n_rows) {
            const long out = ${"perm[row]" if has_perm else "row"};
${c.store_y_block("out", "sum")}
        }
    }
% endif
}

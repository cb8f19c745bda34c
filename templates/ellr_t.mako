<%namespace name="c" file="common.mako"/>
## ELLR-T (Vazquez, Fernandez & Garzon): ELLPACK-R with ${T} work-item(s) per row.
## Work-item `lane` of row i reads entries lane, lane + T, ... of the row, entry j at
## (j / T) * slice + i * T + j % T: in each iteration a group reads consecutive
## addresses.  The loop ends at the row's length rl[i], so padding is never read.
## The T partial sums are added in local memory with barriers (no lock-step warps).
${c.preamble()}
<% rows_per_group = work_group_size // T %>
${signature("ellr_t")}
{
% if T > 1:
    __local real_t partial[${work_group_size}];
    const uint lid = get_local_id(0);
    const uint lane = lid & ${T - 1};
    const long row = (long)get_group_id(0) * ${rows_per_group} + lid / ${T};
% else:
    const uint lane = 0;
    const long row = get_global_id(0);
% endif
    real_t sum = 0;
    if (row < n_rows) {
        const index_t rl = row_length[row];
        long slot = row * ${T} + lane;
        for (index_t j = lane; j < rl; j += ${T}, slot += slice)
            sum += MUL(values[slot], x[col_idx[slot]]);
    }
% if T > 1:
    partial[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
% for s in [T >> k for k in range(1, T.bit_length())]:
    if (lane < ${s})
        partial[lid] = sum = sum + partial[lid + ${s}];
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
% endif
    if (lane == 0 && row < n_rows) {
${c.store_y("row", "sum")}
    }
}

<%namespace name="c" file="common.mako"/>
<%namespace name="sc" file="sell_common.mako"/>
## SELL-C-sigma (Kreutzer et al.): slices of C rows, each padded to its own width and
## stored column-major: slot (row lane, step j) of slice s is slice_ptr[s] + j*C + lane.
## Padding slots hold column -1 and never multiply x.  With has_perm, sorted position
## p holds original row perm[p] and the result goes straight to y[perm[p]].
## Positions past n_rows (the last slice's padding rows) write nothing.
${c.preamble()}
<% C = slice_height %>
#define C ${C}
## streamed_loads (only with the work-items-per-row mapping): a slot's column and value
## each read once with the evict-first L1 policy (common.mako).
${c.streamed_loads(streamed_loads)}
${sc.columns(streamed_loads)}
% if streamed_loads:
#define SLOT_VALUE(k) STREAMV(values + (k))
% else:
#define SLOT_VALUE(k) LOADV(k, values)
% endif

${signature("sell")}
{
% if mapping == "slices":
    ## One work-item per slice; the lane loops run over consecutive addresses and
    ## compile to vector loads.  A padding slot reads x[0] (always allocated) and the
    ## product is discarded by the select, which keeps the loop branch-free.
    const long slice = get_global_id(0);
    if (slice >= n_slices)
        return;
    real_t sum[C];
    for (int lane = 0; lane < C; ++lane)
        sum[lane] = 0;
${sc.slice_base()}
    const index_t end = slice_ptr[slice + 1];
    for (index_t k = slice_ptr[slice]; k < end; k += C) {
        for (int lane = 0; lane < C; ++lane) {
            const index_t col = COL(k + lane);
            const real_t product = MUL(LOADV(k + lane, values), x[col < 0 ? 0 : col]);
            sum[lane] += (col >= 0) ? product : (real_t)0;
        }
    }
    for (int lane = 0; lane < C; ++lane) {
        const long row = slice * C + lane;
        if (row < n_rows) {
            const long out = ${"perm[row]" if has_perm else "row"};
${c.store_y("out", "sum[lane]")}
        }
    }
% else:
<% T = threads_per_row %>
% if T > 1:
    __local real_t partial[${work_group_size}];
% endif
    ## threads_per_row (T) work-items per row: work-item t of a row takes steps
    ## t, t+T, ...; consecutive work-items (lane fastest, then t) read consecutive slots.
    const uint lid = get_local_id(0);
    const uint lane = lid % C;
% if T > 1:
    const uint t = (lid / C) % ${T};
% endif
    const long slice = (long)get_group_id(0) * ${work_group_size // (C * T)} + lid / ${C * T};
    real_t sum = 0;
    if (slice < n_slices) {
${sc.slice_base()}
        const index_t end = slice_ptr[slice + 1];
        for (index_t k = slice_ptr[slice] + ${"t * C + " if T > 1 else ""}lane; k < end; k += ${C * T}) {
            const index_t col = COL(k);
            if (col >= 0)
                sum += MUL(SLOT_VALUE(k), x[col]);
        }
    }
% if T > 1:
    ## Partial sums of a row meet in local memory (barriers, no lock-step assumed).
    partial[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
% for s in [T >> i for i in range(1, T.bit_length())]:
    if (t < ${s})
        partial[lid] = sum = sum + partial[lid + ${s * C}];
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
    if (t == 0) {
% else:
    {
% endif
        const long row = slice * C + lane;
        if (slice < n_slices && row < n_rows) {
            const long out = ${"perm[row]" if has_perm else "row"};
${c.store_y("out", "sum")}
        }
    }
% endif
}

% if device_conversion:
## Conversion on the device from a CSR already there: sell_pad fills every slot with
## column -1 and value 0; with has_perm, sell_positions inverts the sort (row r sits at
## position[r]); then one work-item per row scatters its entries: the k-th of row r,
## at position p = s*C + lane, to slot slice_ptr[s] + k*C + lane.  The host computes
## only the sort and slice_ptr (one number per slice).  csr_values are already in
## value_t (rounded by store_values.mako with value_bits): LOADV then STOREV copies them
## exactly.
${signature("sell_pad")}
{
    const long slot = get_global_id(0);
    if (slot < n_slots) {
        col_idx_out[slot] = -1;
        STOREV((real_t)0, slot, values_out);
    }
}

% if has_perm:
${signature("sell_positions")}
{
    const long p = get_global_id(0);
    if (p < n_rows)
        position_out[perm_in[p]] = (index_t)p;
}
% endif

${signature("sell_scatter")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
% if has_perm:
        const long p = position_in[row];
% else:
        const long p = row;
% endif
        // C is a power of two: a shift and a mask (a division here makes LLVM emit
        // a "freeze", which Oclgrind cannot check)
        long slot = (long)slice_ptr_in[p >> ${C.bit_length() - 1}] + (p & (C - 1));
        const index_t end = csr_row_ptr[row + 1];
        for (index_t j = csr_row_ptr[row]; j < end; ++j, slot += C) {
            col_idx_out[slot] = csr_col_idx[j];
            STOREV(LOADV(j, csr_values), slot, values_out);
        }
    }
}

% if col_bits == 16:
## col_bits=16: one work-item per slice finds its smallest and largest column, writes
## the base and the 16-bit offsets (0xFFFF for padding), and flags a slice that spans
## 0xFFFF columns or more (the host then refuses the matrix).
${signature("sell_compress")}
{
    const long s = get_global_id(0);
    if (s < n_slices) {
        const index_t start = slice_ptr_in[s], end = slice_ptr_in[s + 1];
        index_t low = -1, high = -1;
        for (index_t k = start; k < end; ++k) {
            const index_t col = col_idx_in[k];
            if (col >= 0) {
                low = (low < 0 || col < low) ? col : low;
                high = col > high ? col : high;
            }
        }
        const index_t base = low < 0 ? 0 : low;
        col_base_out[s] = base;
        if (high - base >= 0xFFFF)
            atomic_max((volatile __global int *)too_wide, 1);
        for (index_t k = start; k < end; ++k) {
            const index_t col = col_idx_in[k];
            col_off_out[k] = col < 0 ? (ushort)0xFFFF : (ushort)(col - base);
        }
    }
}
% endif
% endif

<%namespace name="c" file="common.mako"/>
## CSR vector (Bell & Garland): a group of ${vector_size} work-items per row, each
## summing a strided share of the row, then combined in local memory with barriers
## (no reliance on lock-step execution of a warp or wavefront).
## reduction = "tree": log2(vector_size) halving steps (GPUs);
## reduction = "serial": one barrier, then lane 0 adds the partial sums (CPUs, where
## each barrier splits the work-item loop and costs more than the additions).
## mapping = "adaptive": see pyspmv_cl/formats/csr_vector.py (CSR-Adaptive's row blocks:
## several short rows streamed through local memory, or one long row for the group).
${c.preamble()}
% if mapping == "adaptive":
<% window = work_group_size * items_per_thread %>
#define WG ${work_group_size}
#define WINDOW ${window}

${signature("csr_vector")}
{
    __local real_t products[WINDOW];
    const uint lid = get_local_id(0);
    const index_t first = row_blocks[get_group_id(0)];
    const index_t last = row_blocks[get_group_id(0) + 1];
    const index_t begin = row_ptr[first];
    const index_t end = row_ptr[last];
    // The block's entries go through local memory WINDOW products at a time, read
    // consecutively by the group (coalesced, and neighbouring entries gather
    // neighbouring x).  Then each row of the block is added up by TPR work-items, the
    // most that fit the group (a power of two): one work-item a row when the block
    // holds WG short rows, the whole group for a single long row.  Their partial sums
    // are combined at the end.  Every barrier is outside any branch: PoCL hangs on
    // barriers inside a branch, even a uniform one.
    const uint n_rows = (uint)(last - first);   // 1..WG
    uint tpr = WG;
    while (tpr * n_rows > WG)
        tpr >>= 1;
    const uint sub = lid & (tpr - 1);
    const index_t row = first + (index_t)(lid / tpr);
    const bool has_row = row < last;
    const index_t row_begin = has_row ? row_ptr[row] : 0;
    const index_t row_end = has_row ? row_ptr[row + 1] : 0;
    real_t sum = 0;
    for (index_t window = begin; window < end; window += WINDOW) {
% for k in range(items_per_thread):
        {
            const index_t j = window + ${k * work_group_size} + (index_t)lid;
            products[${k * work_group_size} + lid] = (j < end) ? MUL(LOADV(j, values), x[col_idx[j]]) : (real_t)0;
        }
% endfor
        barrier(CLK_LOCAL_MEM_FENCE);
        const index_t hi = min(row_end, window + WINDOW);
        for (index_t j = max(row_begin, window) + (index_t)sub; j < hi; j += tpr)
            sum += products[j - window];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    // The window loop ended with a barrier: products can be overwritten.
    products[lid] = sum;
% if reduction == "tree":
    // log2(tpr) halving steps, none when each row has one work-item (the loop's trip
    // count is the group's, so its barriers are uniform).  Within a step, lid reads
    // lid + s, which (sub + s >= s) does not write.
    for (uint s = tpr >> 1; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (sub < s)
            products[lid] = sum = sum + products[lid + s];
    }
% else:
    barrier(CLK_LOCAL_MEM_FENCE);
    if (sub == 0) {
        for (uint k = 1; k < tpr; ++k)
            sum += products[lid + k];
    }
% endif
    if (has_row && sub == 0) {
${c.store_y("row", "sum")}
    }
}
% else:
<% rows_per_group = work_group_size // vector_size %>
#define VECTOR_SIZE ${vector_size}
#define ROWS_PER_GROUP ${rows_per_group}

${signature("csr_vector")}
{
    __local real_t partial[${work_group_size}];
    const uint lid = get_local_id(0);
    const uint lane = lid & (VECTOR_SIZE - 1);
    // One launch covers every row (the host sizes the grid), so there is no row loop
    // around the barriers.
    const long row = (long)get_group_id(0) * ROWS_PER_GROUP + lid / VECTOR_SIZE;
    real_t sum = 0;
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
        for (index_t j = row_ptr[row] + lane; j < end; j += VECTOR_SIZE)
            sum += MUL(LOADV(j, values), x[col_idx[j]]);
    }
    partial[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
% if reduction == "tree":
% for s in [vector_size >> k for k in range(1, vector_size.bit_length())]:
    if (lane < ${s})
        partial[lid] = sum = sum + partial[lid + ${s}];
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
% else:
    if (lane == 0) {
% for k in range(1, vector_size):
        sum += partial[lid + ${k}];
% endfor
    }
% endif
    if (lane == 0 && row < n_rows) {
${c.store_y("row", "sum")}
    }
}
% endif

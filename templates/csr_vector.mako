<%namespace name="c" file="common.mako"/>
## CSR vector (Bell & Garland): a group of ${vector_size} work-items per row, each
## summing a strided share of the row, then combined in local memory with barriers
## (no reliance on lock-step execution of a warp or wavefront).
## reduction = "tree": log2(vector_size) halving steps (GPUs);
## reduction = "serial": one barrier, then lane 0 adds the partial sums (CPUs, where
## each barrier splits the work-item loop and costs more than the additions).
${c.preamble()}
<% rows_per_group = work_group_size // vector_size %>
#define VECTOR_SIZE ${vector_size}
#define ROWS_PER_GROUP ${rows_per_group}

__kernel __attribute__((reqd_work_group_size(${work_group_size}, 1, 1)))
void csr_vector(const long n_rows,
                __global const index_t *restrict row_ptr,
                __global const index_t *restrict col_idx,
                __global const real_t *restrict values,
                __global const real_t *restrict x,
                __global real_t *restrict y,
                const real_t alpha,
                const real_t beta)
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
            sum += values[j] * x[col_idx[j]];
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

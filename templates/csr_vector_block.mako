<%namespace name="c" file="common.mako"/>
## CSR vector (mapping="rows"), KB vectors at once: ${vector_size} work-items per row,
## each summing a strided share of the row's entries into KB sums; the partial sums
## meet in local memory (BLANES lanes per work-item, contiguous) as in csr_vector.mako.
${c.preamble()}
${c.block_preamble()}
<% rows_per_group = work_group_size // vector_size %>
#define VECTOR_SIZE ${vector_size}
#define ROWS_PER_GROUP ${rows_per_group}

${signature("csr_vector_block")}
{
    __local lane_t partial[${work_group_size} * BLANES];
    const uint lid = get_local_id(0);
    const uint lane = lid & (VECTOR_SIZE - 1);
    const long row = (long)get_group_id(0) * ROWS_PER_GROUP + lid / VECTOR_SIZE;
    realb_t sum = (realb_t)(0);
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
        for (index_t j = row_ptr[row] + lane; j < end; j += VECTOR_SIZE)
            sum += MULB(LOADV(j, values), XROW(col_idx[j]));
    }
    STOREB(sum, partial + lid * BLANES);
    barrier(CLK_LOCAL_MEM_FENCE);
% if reduction == "tree":
% for s in [vector_size >> k for k in range(1, vector_size.bit_length())]:
    if (lane < ${s}) {
        sum += LOADB(partial + (lid + ${s}) * BLANES);
        STOREB(sum, partial + lid * BLANES);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
% else:
    if (lane == 0) {
% for k in range(1, vector_size):
        sum += LOADB(partial + (lid + ${k}) * BLANES);
% endfor
    }
% endif
    if (lane == 0 && row < n_rows) {
${c.store_y_block("row", "sum")}
    }
}

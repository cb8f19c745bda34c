<%namespace name="c" file="common.mako"/>
## CSR scalar, KB vectors at once: one work-item per row reads each of its entries once
## and accumulates KB sums (see common.mako's block_preamble).
${c.preamble()}
${c.block_preamble()}

${signature("csr_scalar_block")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
        realb_t sum = (realb_t)(0);
        for (index_t j = row_ptr[row]; j < end; ++j)
            sum += MULB(LOADV(j, values), XROW(col_idx[j]));
${c.store_y_block("row", "sum")}
    }
}

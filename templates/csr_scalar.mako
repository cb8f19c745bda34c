<%namespace name="c" file="common.mako"/>
## CSR scalar (Bell & Garland): one work-item per row.  The host launches one
## work-item per row, so each work-group covers a contiguous block of rows.
${c.preamble()}

${signature("csr_scalar")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
        real_t sum = 0;
        for (index_t j = row_ptr[row]; j < end; ++j)
            sum += MUL(LOADV(j, values), x[col_idx[j]]);
${c.store_y("row", "sum")}
    }
}

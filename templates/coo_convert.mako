<%namespace name="c" file="common.mako"/>
## COO arrays made on the device from a CSR there (templates/coo.mako reads them): one
## work-item per row writes its entries' row, column and value at their chunk-layout
## slots; coo_pad fills the interleaved layout's last chunk (the row of the last entry,
## column 0, value 0, as the host conversion does; never multiplied).
${c.preamble()}

// Slot of the p-th non-zero (CSR order) in the ${layout} layout of chunks of
// group * items non-zeros.
inline long coo_slot(const long p, const long group, const long items)
{
% if layout == "interleaved":
    // logical (chunk, item, k) -> physical (chunk, k, item): coalesced reads
    const long chunk = group * items;
    const long g = p / chunk;
    const long r = p - g * chunk;
    const long i = r / items;
    return g * chunk + (r - i * items) * group + i;
% else:
    return p;
% endif
}

${signature("coo_expand")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        // hyb's COO part: a row's entries after its first `skip` (the ELL part's),
        // at positions from the part's own row pointers; coo: skip 0, the CSR's.
        const index_t start = csr_row_ptr[row] + (index_t)skip;
        const index_t end = csr_row_ptr[row + 1];
        const long first = (long)part_row_ptr[row] - (long)start;
        for (index_t j = start; j < end; ++j) {
            const long slot = coo_slot(first + j, group, items);
            rows_out[slot] = (index_t)row;
            cols_out[slot] = csr_col_idx[j];
            values_out[slot] = csr_values[j];
        }
    }
}

${signature("coo_pad")}
{
    const long p = nnz + get_global_id(0);
    if (p < n_total) {
        const long slot = coo_slot(p, group, items);
        rows_out[slot] = last_row;
        cols_out[slot] = 0;
        values_out[slot] = 0;
    }
}

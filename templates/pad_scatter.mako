<%namespace name="c" file="common.mako"/>
## Device-side conversion of the ELL family (ell, ellr-t) from a CSR already on the
## device (and hyb's ELL part).  pad_fill gives every slot the padding (column -1, value 0); then one
## work-item per row scatters its entries, the k-th of row r to slot
## (k / ${T}) * slice + r * ${T} + k % ${T}: the arrays the host conversion makes.
${c.preamble()}

${signature("pad_fill")}
{
    const long slot = get_global_id(0);
    if (slot < n_slots) {
        col_idx_out[slot] = -1;
        values_out[slot] = 0;
    }
}

${signature("row_scatter")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        // Walk the slots instead of dividing: no division per entry, and no LLVM
        // "freeze" (which Oclgrind cannot check) from a division by the constant T.
        long base = row * ${T};
        int lane = 0;
        const index_t start = csr_row_ptr[row];
        const index_t stop = csr_row_ptr[row + 1];
        // hyb's ELL part takes a row's first `limit` entries (the rest go to COO)
        const index_t end = (stop - start > limit) ? start + (index_t)limit : stop;
        for (index_t j = start; j < end; ++j) {
            col_idx_out[base + lane] = csr_col_idx[j];
            values_out[base + lane] = csr_values[j];
            if (++lane == ${T}) {
                lane = 0;
                base += slice;
            }
        }
    }
}

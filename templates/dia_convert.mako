<%namespace name="c" file="common.mako"/>
## DIA arrays made on the device from a CSR there (templates/dia.mako reads them; the
## host conversion, formats/dia.py's analyse + convert, makes the same arrays bit for
## bit).
##
## dia_mark (in analyse; a work-item per row): present[column - row + n_rows - 1] = 1 for
##   every entry (the host reads the flags back and lists the occupied diagonals),
##   flags[0] = 1 where a row's columns do not strictly increase (unsorted or duplicate:
##   the host conversion then takes the matrix, with its layers), flags[1] = 1 where a
##   stored value is zero (the kernel then needs the validity bitmap).  Every writer
##   writes 1.
## dia_zero: data (+0.0) and the bitmap's words (0), one element each per work-item (a
##   kernel rather than clEnqueueFillBuffer, whose writes Oclgrind does not count as
##   initialising the buffer).
## dia_scatter (in convert_device, after dia_zero; a work-item per row): each entry's diagonal by a binary search of the sorted offsets, its value
##   at diagonal * stride + row, and with the bitmap that slot's bit (atomic_or: the 32
##   slots of a word belong to 32 rows).
${c.preamble()}

${signature("dia_mark")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        const index_t start = csr_row_ptr[row];
        const index_t end = csr_row_ptr[row + 1];
        for (index_t j = start; j < end; ++j) {
            const index_t col = csr_col_idx[j];
            present[(long)col - row + n_rows - 1] = 1;
            if (j > start && col <= csr_col_idx[j - 1])
                flags[0] = 1;
            const real_t v = csr_values[j];
% if is_complex:
            if (v.x == 0 && v.y == 0)
% else:
            if (v == 0)
% endif
                flags[1] = 1;
        }
    }
}

${signature("dia_zero")}
{
    const long i = get_global_id(0);
    if (i < n_slots)
        data_out[i] = (real_t)0;
    if (i < n_words)
        mask_out[i] = 0;
}

${signature("dia_scatter")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        const index_t end = csr_row_ptr[row + 1];
        for (index_t j = csr_row_ptr[row]; j < end; ++j) {
            const long offset = (long)csr_col_idx[j] - row;
            long lo = 0, hi = n_diags;   // the first diagonal >= offset: it is there
            while (lo < hi) {
                const long mid = lo + (hi - lo) / 2;
                if ((long)offsets[mid] < offset)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            const long slot = lo * stride + row;
            data_out[slot] = csr_values[j];
            if (with_mask)
                atomic_or(&mask_out[slot >> 5], 1u << (uint)(slot & 31));
        }
    }
}

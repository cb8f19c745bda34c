<%namespace name="c" file="common.mako"/>
## CMRS arrays made on the device from a CSR there (templates/cmrs.mako reads them; the
## host conversion, formats/cmrs.py's convert, makes the same arrays bit for bit).  The
## host gives strip_ptr (row_ptr at every height-th row, from its copy of indptr).
##
## cmrs_check_rows (sort_columns only; a work-item per row): bad[0] = 1 where a row's
##   columns decrease somewhere (the host conversion then takes the matrix).
## cmrs_scatter (a work-item per entry): the entry's row by a binary search of row_ptr,
##   its row in the strip (row - the strip's first row), and its slot: its own position
##   in CSR order, or with sort_columns its rank in the strip's stable sort by column
##   (the entries of its row before it, those of the strip's earlier rows with a column
##   up to its own and of the later rows with a smaller one: binary searches, each row
##   being in order), added to strip_ptr.  It writes the column (packed: with the row in
##   the strip in the top ROW_BITS bits), the row in the strip (separate) and the value.
${c.preamble()}
% if packed:
typedef ${word_t} word_t;
#define ROW_SHIFT ${row_shift}
% endif

${signature("cmrs_check_rows")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        const index_t end = csr_row_ptr[row + 1];
        for (index_t j = csr_row_ptr[row] + 1; j < end; ++j) {
            if (csr_col_idx[j] < csr_col_idx[j - 1]) {
                bad[0] = 1;   // every writer writes 1
                break;
            }
        }
    }
}

% if sort_columns:
// Entries of csr_col_idx[lo, hi) (in order) below `col`, or up to it with `inclusive`.
inline long count_before(__global const index_t *restrict csr_col_idx, long lo, long hi,
                         const index_t col, const int inclusive)
{
    const long first = lo;
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        const index_t c = csr_col_idx[mid];
        if (c < col || (inclusive && c == col))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - first;
}
% endif

${signature("cmrs_scatter")}
{
    const long j = get_global_id(0);
    if (j >= nnz)
        return;
    // The entry's row: the last r with row_ptr[r] <= j (then row_ptr[r + 1] > j).
    long lo = 0, hi = n_rows;
    while (hi - lo > 1) {
        const long mid = lo + (hi - lo) / 2;
        if ((long)csr_row_ptr[mid] <= j)
            lo = mid;
        else
            hi = mid;
    }
    const long row = lo;
    const long first_row = row - row % height;
    const index_t col = csr_col_idx[j];
% if sort_columns:
    const long last_row = min(first_row + height, n_rows);
    long slot = (long)csr_row_ptr[first_row] + (j - (long)csr_row_ptr[row]);
    for (long r = first_row; r < last_row; ++r) {
        if (r != row)
            slot += count_before(csr_col_idx, csr_row_ptr[r], csr_row_ptr[r + 1], col,
                                 r < row);
    }
% else:
    const long slot = j;
% endif
% if packed:
    col_idx_out[slot] = (word_t)col | ((word_t)(row - first_row) << ROW_SHIFT);
% else:
    col_idx_out[slot] = col;
    row_in_strip_out[slot] = (uchar)(row - first_row);
% endif
    values_out[slot] = csr_values[j];
}

<%namespace name="c" file="common.mako"/>
## BCCOO arrays of 1 x 1 blocks in one slice, made on the device from a CSR there whose
## rows hold strictly increasing columns (templates/bccoo.mako reads them; the host
## conversion, formats/bccoo_convert.py's build_blocks + layout, makes the same arrays
## bit for bit).  Each entry is a block; an empty row gets one dummy block (column 0,
## value +0.0); so row r's blocks start at first_block[r] = row_ptr[r] + the empty rows
## before r (the host gives first_block: row_ptr itself when no row is empty), and
## first_block strictly increases.
##
## bccoo_check_rows (a work-item per row): bad[0] = 1 where a row's columns do not
##   strictly increase (unsorted, or duplicates: the host conversion then takes it).
## bccoo_convert (a work-item per thread tile of T blocks, one more for the end): the
##   tile's first row by a binary search of first_block (the row stops before the tile:
##   first_entry), then its T blocks in order: column, value (stored zeros as -0.0,
##   fill as +0.0), the row-stop bit flags (0 = stop; bits past T are 1) and, with
##   col_compress, the column deltas (-1 escapes to the full column).  Blocks past the
##   last are padding: no stop, value +0.0, the last block's column.
## bccoo_group_full (a work-item per group of GROUP threads): whether every thread of
##   the group has a stop (the tile kernel may then skip its scan).
## The k-th item of thread t goes to (t / GROUP) * PER * GROUP + k * GROUP + t % GROUP
## transposed, t * PER + k otherwise (PER items per thread: T blocks, NW flag words).
${c.preamble()}
typedef ${pos_t} pos_t;
typedef ${flag_t} flag_t;
typedef ${col_t} col_t;
#define T ${tile_size}
#define FB ${flag_bits}
#define NW ${n_words}

inline long item_slot(const long t, const long k, const long per, const long group)
{
% if transpose:
    const long g = t / group;
    return g * per * group + k * group + (t - g * group);
% else:
    return t * per + k;
% endif
}

${signature("bccoo_check_rows")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        const index_t end = csr_row_ptr[row + 1];
        for (index_t j = csr_row_ptr[row] + 1; j < end; ++j) {
            if (csr_col_idx[j] <= csr_col_idx[j - 1]) {
                bad[0] = 1;   // every writer writes 1
                break;
            }
        }
    }
}

${signature("bccoo_convert")}
{
    const long t = get_global_id(0);
    if (t > n_threads)
        return;
    const long b0 = t * T;
    // The row holding block b0: the last r with first_block[r] <= b0 (n_rows past the
    // last block).
    long lo = 0, hi = n_rows + 1;
    while (hi - lo > 1) {
        const long mid = lo + (hi - lo) / 2;
        if ((long)first_block[mid] <= b0)
            lo = mid;
        else
            hi = mid;
    }
    first_entry[t] = (pos_t)lo;
    if (t == n_threads)
        return;
    // The padding's column: the last block's (a dummy's 0 when the last row is empty).
    const index_t nnz = csr_row_ptr[n_rows];
    const long last_col = csr_row_ptr[n_rows - 1] < nnz ? (long)csr_col_idx[nnz - 1] : 0;
    long row = lo;
% if col_compress:
    long prev = 0;
% endif
    flag_t word = 0;
    for (int k = 0; k < T; ++k) {
        const long b = b0 + k;
        long col = last_col;
        real_t value = (real_t)0;
        int stop = 0;
        if (b < n_blocks) {
            while ((long)first_block[row + 1] <= b)
                ++row;
            stop = b == (long)first_block[row + 1] - 1;
            const index_t start = csr_row_ptr[row];
            if (csr_row_ptr[row + 1] > start) {   // else a dummy: column 0, +0.0
                const long j = (long)start + (b - (long)first_block[row]);
                col = (long)csr_col_idx[j];
                value = csr_values[j];
                if (value == (real_t)0)
                    value = -(real_t)0;   // a stored zero: multiplied
            } else {
                col = 0;
            }
        }
        const long slot = item_slot(t, k, T, group);
        cols_out[slot] = (col_t)col;
        values_out[slot] = value;
% if col_compress:
        const long delta = k == 0 ? col : col - prev;
        col_delta_out[slot] = (delta < -32768 || delta > 32767 || delta == -1) ? (short)-1
                                                                              : (short)delta;
        prev = col;
% endif
        if (!stop)
            word |= (flag_t)((flag_t)1 << (k % FB));
        if (k % FB == FB - 1) {
            flags_out[item_slot(t, k / FB, NW, group)] = word;
            word = 0;
        }
    }
% if tile_size % flag_bits:
    // The last word's bits past the tile are 1.
    for (int k = T; k < NW * FB; ++k)
        word |= (flag_t)((flag_t)1 << (k % FB));
    flags_out[item_slot(t, NW - 1, NW, group)] = word;
% endif
}

${signature("bccoo_group_full")}
{
    const long g = get_global_id(0);
    if (g < n_groups) {
        uchar full = 1;
        for (long t = g * group; t < (g + 1) * group; ++t)
            full &= first_entry[t + 1] > first_entry[t];
        group_full[g] = full;
    }
}

<%namespace name="c" file="common.mako"/>
## CSR5 arrays made on the device from a CSR there (templates/csr5.mako reads them; the
## host conversion, formats/csr5.py's tile_arrays, makes the same arrays bit for bit).
## The host gives what depends on indptr alone at a number per tile or per empty row
## (tile_ptr, empty_offset_ptr, the empty-row list); these kernels do the rest:
##
## csr5_columns: one work-item per column of the complete tiles.  Column `lane` of tile
##   t holds CSR entries begin .. begin + SIGMA - 1 (begin = (t*OMEGA + lane)*SIGMA):
##   it writes them transposed (entry j at t*TILE_SIZE + j*OMEGA + lane) and sets the
##   bit_flag of each row start among them (and of the tile's first entry), found by a
##   binary search for the row holding `begin`, then row by row (a search again only
##   where empty rows come between).  The words of the descriptor are written whole:
##   flags only, y_offset and seg_offset still 0.  Work-items past the columns copy the
##   incomplete last tile's entries as they are.
## csr5_descriptors: one work-item per complete tile walks its OMEGA columns: seg_offset
##   (columns to the right before the next one holding a flag), then y_offset (flags
##   in the columns to the left), or-ed into each column's first word.
## csr5_empty_offsets (tiles with empty rows only): one work-item per column of such a
##   tile finds its row starts again and writes, for each, the row's offset from the
##   tile's first row at empty_offset_ptr[t] + y_offset + k (the k-th flag of the
##   column: the segment's number in the tile).
## No division: OMEGA is a power of two (shifts and masks), and the rest multiplies.
${c.preamble()}
<%
    flag_shift = y_bits + seg_bits
    wide = index_t == "long"
%>
#define OMEGA ${omega}
#define LOG_OMEGA ${omega.bit_length() - 1}
#define SIGMA ${sigma}
#define TILE_SIZE ${omega * sigma}
#define DESC_WORDS ${desc_words}
#define Y_MASK ${(1 << y_bits) - 1}u
#define SEG_SHIFT ${y_bits}
#define FLAG_SHIFT ${flag_shift}
% if wide:
typedef ulong tile_ptr_t;
#define ROW_MASK 0x7fffffffffffffffUL
% else:
typedef uint tile_ptr_t;
#define ROW_MASK 0x7fffffffu
% endif
#define FIRST_ROW(p) ((index_t)((p) & ROW_MASK))
#define HAS_EMPTY(p) (((p) & ~(tile_ptr_t)ROW_MASK) != 0)

// The last row r in [lo, hi) with row_ptr[r] <= pos, given row_ptr[lo] <= pos <
// row_ptr[hi]: the (non-empty) row holding entry pos.
inline index_t row_holding(__global const index_t *restrict row_ptr, index_t lo, index_t hi,
                           const index_t pos)
{
    while (hi - lo > 1) {
        const index_t mid = lo + ((hi - lo) >> 1);
        if (row_ptr[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

## Run ${action} for each flagged entry of the column starting at entry `begin`, in
## order, with `j` its step in the column and `r` its row (for the tile's first entry,
## the row holding it, flagged whether or not the row starts there).  Every entry of the
## column lies before nnz (complete tiles only), so row_ptr[r + 2] exists below.
<%def name="walk_flags(action)">
        index_t r = row_holding(csr_row_ptr, 0, n_rows, begin);
        if (lane == 0 || csr_row_ptr[r] == begin) {
            const int j = 0;
            ${action}
        }
        for (index_t next = csr_row_ptr[r + 1]; next < begin + SIGMA;
             next = csr_row_ptr[r + 1]) {
            // The row starting at `next`: r + 1, unless empty rows come first.
            r = csr_row_ptr[r + 2] > next ? r + 1
                                          : row_holding(csr_row_ptr, r + 1, n_rows, next);
            const int j = (int)(next - begin);
            ${action}
        }
</%def>

${signature("csr5_columns")}
{
    const index_t g = (index_t)get_global_id(0);
    if (g < n_columns) {
        const index_t tile = g >> LOG_OMEGA;
        const int lane = (int)(g & (OMEGA - 1));
        const index_t begin = g * SIGMA;
        const index_t out = tile * TILE_SIZE + lane;
        for (int j = 0; j < SIGMA; j++) {
            col_idx_out[out + j * OMEGA] = csr_col_idx[begin + j];
            values_out[out + j * OMEGA] = csr_values[begin + j];
        }
        uint words[DESC_WORDS];
        for (int w = 0; w < DESC_WORDS; w++)
            words[w] = 0;
${walk_flags("words[(FLAG_SHIFT + j) >> 5] |= 1u << ((FLAG_SHIFT + j) & 31);")}
        __global uint *restrict d = tile_desc_out + tile * (DESC_WORDS * OMEGA) + lane;
        for (int w = 0; w < DESC_WORDS; w++)
            d[w * OMEGA] = words[w];
    } else if (g < n_columns + n_tail) {
        // The incomplete last tile stays in CSR order.
        const index_t p = n_columns * SIGMA + (g - n_columns);
        col_idx_out[p] = csr_col_idx[p];
        values_out[p] = csr_values[p];
    }
}

${signature("csr5_descriptors")}
{
    const index_t tile = (index_t)get_global_id(0);
    if (tile < n_full_tiles) {
        __global uint *restrict d = tile_desc_out + tile * (DESC_WORDS * OMEGA);
        // seg_offset: the words hold flags only so far.
        int next = OMEGA;       // the nearest column to the right holding a flag
        for (int lane = OMEGA - 1; lane >= 0; lane--) {
            uint flags = 0;
            for (int w = 0; w < DESC_WORDS; w++)
                flags |= d[w * OMEGA + lane];
            const uint seg_offset = (uint)(next - lane - 1);
            if (flags)
                next = lane;
            d[lane] |= seg_offset << SEG_SHIFT;
        }
        // y_offset: the flags of the columns to the left.
        uint y_offset = 0;
        for (int lane = 0; lane < OMEGA; lane++) {
            const uint first = d[lane];
            uint count = popcount(first >> FLAG_SHIFT);
            for (int w = 1; w < DESC_WORDS; w++)
                count += popcount(d[w * OMEGA + lane]);
            d[lane] = first | y_offset;
            y_offset += count;
        }
    }
}

% if has_empty_offset:
${signature("csr5_empty_offsets")}
{
    const index_t g = (index_t)get_global_id(0);
    if (g < n_columns) {
        const index_t tile = g >> LOG_OMEGA;
        const tile_ptr_t tp = tile_ptr[tile];
        if (HAS_EMPTY(tp)) {
            const int lane = (int)(g & (OMEGA - 1));
            const index_t begin = g * SIGMA;
            const index_t first_row = FIRST_ROW(tp);
            index_t slot = empty_offset_ptr[tile]
                + (index_t)(tile_desc_in[tile * (DESC_WORDS * OMEGA) + lane] & Y_MASK);
${walk_flags("empty_offset_out[slot++] = r - first_row;")}
        }
    }
}
% endif

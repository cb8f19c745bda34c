<%namespace name="c" file="common.mako"/>
## CSR5 arrays made on the device from a CSR there (templates/csr5.mako reads them; the
## host conversion, formats/csr5.py's tile_layout + tile_arrays, makes the same arrays
## bit for bit).  Nothing here reads the matrix back: the host gets a handful of scalars.
##
## The layout (formats/csr5.py's analyse, before the SpMV kernels are built):
## csr5_rows_count (a work-item per PER_ITEM consecutive rows): for each non-empty row,
##   the tiles whose first entry lies in it get it as their first row (first_row); the
##   group's count of empty rows goes to row_sums.
## csr5_scan_rows (one group): row_sums -> their exclusive prefix sums, in place.
## csr5_rows_scan: empty_before[r] = the empty rows before row r (r = 0 .. n_rows), and
##   the non-empty rows listed in order (nonempty_rows[r - empty_before[r]] = r).
## csr5_tiles_count (a work-item per PER_ITEM tiles): tile_ptr (first_row with the
##   sign bit when empty rows lie between a tile's first row and the next's: counted by
##   empty_before), each complete tile's segments when it has empty rows (its head and
##   the non-empty rows starting strictly inside it), their sum per group, and per
##   group whether a tile's first row is longer than long_row entries (every row that
##   long holds a tile's first entry).
## csr5_scan_tiles (one group): tile_sums -> exclusive prefix sums, in place, and the
##   scalars the host reads back: tail_row_begin, the empty rows before it, the
##   empty_offset entries, whether a row is long.
## The conversion (convert_device):
## csr5_tile_offsets (tiles with empty rows only): empty_offset_ptr from the segments,
##   and each such tile's first empty_offset (0: its first row).
## csr5_rows_convert: the empty rows before tail_row_begin into empty_rows (at
##   empty_before[r]), and for a row starting strictly inside a complete tile with empty
##   rows its offset from the tile's first row into empty_offset (its segment: 1 + the
##   non-empty rows between the tile's first row and it).
## csr5_tiles_convert (TILE_GROUP work-items, TILES_PER_GROUP tiles): the tiles'
##   entries transposed (read in CSR order by consecutive work-items; through local
##   memory when it fits, so that the writes are consecutive too), then the bit_flags
##   of each tile's head and row starts (its non-empty rows, consecutive in
##   nonempty_rows, read by its OMEGA work-items side by side; local atomic_or into the
##   words), and per column (OMEGA work-items per tile, the words side by side) y_offset
##   (an exclusive scan of the columns' flag counts) and seg_offset (a suffix minimum of
##   the columns holding flags) or-ed into the first word; the last group copies the
##   incomplete tile as it is.
## Divisions are by compile-time constants only, on unsigned positions (32-bit for
## 32-bit indices), and never beside the remainder of the same value (LLVM pairs them
## with a "freeze", which Oclgrind's uninitialised-value checker cannot run): within a
## tile, DIV_SIGMA multiplies (mul_hi by a rounded-up reciprocal: exact for the
## positions of a tile) and the transposition steps its column and step along.
${c.preamble()}
<%
    flag_shift = y_bits + seg_bits
    wide = index_t == "long"
    tile_size = omega * sigma
%>
#define OMEGA ${omega}
#define LOG_OMEGA ${omega.bit_length() - 1}
#define SIGMA ${sigma}
#define TILE_SIZE ${tile_size}
#define DESC_WORDS ${desc_words}
#define SEG_SHIFT ${y_bits}
#define FLAG_SHIFT ${flag_shift}
#define SCAN_GROUP ${work_group_size}
#define PER_ITEM ${per_item}
#define CHUNK (SCAN_GROUP * PER_ITEM)
#define TILES_PER_GROUP ${tiles_per_group}
#define TILE_GROUP (TILES_PER_GROUP * OMEGA)
% if sigma & (sigma - 1) == 0:
#define DIV_SIGMA(e) ((int)((uint)(e) >> ${sigma.bit_length() - 1}))
% else:
## With R = ceil(2**32 / sigma), mul_hi(e, R) = e / sigma while e < 2**32 / sigma: true
## of every position in a tile (e < OMEGA * SIGMA <= 2**19).
#define DIV_SIGMA(e) ((int)mul_hi((uint)(e), ${-(-2**32 // sigma)}u))
% endif
% if wide:
typedef ulong tile_ptr_t;
typedef ulong upos_t;
#define ROW_MASK 0x7fffffffffffffffUL
% else:
typedef uint tile_ptr_t;
typedef uint upos_t;
#define ROW_MASK 0x7fffffffu
% endif
#define FIRST_ROW(p) ((index_t)((p) & ROW_MASK))
#define HAS_EMPTY(p) (((p) & ~(tile_ptr_t)ROW_MASK) != 0)

// Exclusive prefix sum of x over the work-group (SCAN_GROUP work-items, every one
// calling it), *total the group's sum; buf: SCAN_GROUP elements of local memory.
inline index_t group_scan(index_t x, __local index_t *buf, index_t *total)
{
    const int l = (int)get_local_id(0);
    buf[l] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    index_t sum = x;
    for (int s = 1; s < SCAN_GROUP; s <<= 1) {
        const index_t add = l >= s ? buf[l - s] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        sum += add;
        buf[l] = sum;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    *total = buf[SCAN_GROUP - 1];
    barrier(CLK_LOCAL_MEM_FENCE);   // buf free for the next call
    return sum - x;
}

${signature("csr5_rows_count")}
{
    __local index_t buf[SCAN_GROUP];
    const index_t first = (index_t)get_group_id(0) * CHUNK + (index_t)get_local_id(0) * PER_ITEM;
    if (get_global_id(0) == 0)
        first_row[n_tiles] = n_rows;
    index_t empty = 0;
    for (int k = 0; k < PER_ITEM; k++) {
        const index_t r = first + k;
        if (r < n_rows) {
            const upos_t a = (upos_t)row_ptr[r], b = (upos_t)row_ptr[r + 1];
            if (a == b) {
                empty++;
            } else {
                // Tiles whose first entry t*TILE_SIZE lies in [a, b).
                for (upos_t t = (a + TILE_SIZE - 1) / TILE_SIZE, end = (b - 1) / TILE_SIZE;
                     t <= end; t++)
                    first_row[t] = r;
            }
        }
    }
    index_t total;
    group_scan(empty, buf, &total);
    if (get_local_id(0) == 0)
        row_sums[get_group_id(0)] = total;
}

## The one-group exclusive scan of sums[0 .. n) in place (each work-item rewrites the
## PER_ITEM consecutive sums it read); `total` holds their sum after it.
<%def name="scan_in_place(sums, n)">
    __local index_t buf[SCAN_GROUP];
    index_t carry = 0;
    for (index_t base = 0; base < ${n}; base += CHUNK) {   // the same count for every item
        const index_t first = base + (index_t)get_local_id(0) * PER_ITEM;
        index_t v[PER_ITEM];
        index_t sum = 0;
        for (int k = 0; k < PER_ITEM; k++) {
            v[k] = first + k < ${n} ? ${sums}[first + k] : 0;
            sum += v[k];
        }
        index_t block;
        index_t run = carry + group_scan(sum, buf, &block);
        for (int k = 0; k < PER_ITEM; k++) {
            if (first + k < ${n})
                ${sums}[first + k] = run;
            run += v[k];
        }
        carry += block;
    }
    const index_t total = carry;
</%def>

${signature("csr5_scan_rows")}
{
${scan_in_place("row_sums", "n_groups")}
}

${signature("csr5_rows_scan")}
{
    __local index_t buf[SCAN_GROUP];
    const index_t first = (index_t)get_group_id(0) * CHUNK + (index_t)get_local_id(0) * PER_ITEM;
    uint empty = 0;   // bit k: row first + k is empty
    index_t count = 0;
    for (int k = 0; k < PER_ITEM; k++) {
        const index_t r = first + k;
        if (r < n_rows && row_ptr[r] == row_ptr[r + 1]) {
            empty |= 1u << k;
            count++;
        }
    }
    index_t total;
    index_t before = row_sums[get_group_id(0)] + group_scan(count, buf, &total);
    for (int k = 0; k < PER_ITEM; k++) {
        const index_t r = first + k;
        if (r <= n_rows)
            empty_before[r] = before;
        if (r < n_rows && !((empty >> k) & 1))
            nonempty_rows[r - before] = r;
        before += (empty >> k) & 1;
    }
}

${signature("csr5_tiles_count")}
{
    __local index_t buf[SCAN_GROUP];
    const index_t first = (index_t)get_group_id(0) * CHUNK + (index_t)get_local_id(0) * PER_ITEM;
    index_t segs = 0, longs = 0;
    for (int k = 0; k < PER_ITEM; k++) {
        const index_t t = first + k;
        if (t < n_tiles) {
            const index_t r0 = first_row[t], r1 = first_row[t + 1];
            // Empty rows strictly between this tile's first row and the next's.
            const index_t empty = r1 > r0 + 1 ? empty_before[r1] - empty_before[r0 + 1] : 0;
            tile_ptr[t] = (tile_ptr_t)r0 | (empty ? ~(tile_ptr_t)ROW_MASK : 0);
            index_t seg = 0;
            if (empty && t < n_full_tiles) {
                // Its head, the non-empty rows strictly between, and r1 when it starts
                // inside the tile too.
                const upos_t end = (upos_t)(t + 1) * TILE_SIZE;
                seg = 1 + (r1 - r0 - 1 - empty) + ((upos_t)row_ptr[r1] < end ? 1 : 0);
            }
            if (t < n_full_tiles)
                segments[t] = seg;
            segs += seg;
            longs |= row_ptr[r0 + 1] - row_ptr[r0] > long_row;
        } else if (t == n_tiles) {
            tile_ptr[t] = (tile_ptr_t)n_rows;
        }
    }
    index_t total;
    group_scan(segs, buf, &total);
    if (get_local_id(0) == 0)
        tile_sums[get_group_id(0)] = total;
    group_scan(longs, buf, &total);
    if (get_local_id(0) == 0)
        tile_longs[get_group_id(0)] = total;
}

${signature("csr5_scan_tiles")}
{
${scan_in_place("tile_sums", "n_groups")}
    index_t longs = 0;
    for (index_t g = (index_t)get_local_id(0); g < n_groups; g += SCAN_GROUP)
        longs += tile_longs[g];
    index_t any;
    group_scan(longs, buf, &any);
    if (get_local_id(0) == 0) {
        const index_t tail_row_begin = n_tiles > n_full_tiles ? first_row[n_full_tiles] + 1
                                                              : n_rows;
        info[0] = tail_row_begin;
        info[1] = empty_before[tail_row_begin];
        info[2] = total;
        info[3] = any;
    }
}

${signature("csr5_tile_offsets")}
{
    __local index_t buf[SCAN_GROUP];
    const index_t first = (index_t)get_group_id(0) * CHUNK + (index_t)get_local_id(0) * PER_ITEM;
    index_t v[PER_ITEM];
    index_t sum = 0;
    for (int k = 0; k < PER_ITEM; k++) {
        v[k] = first + k < n_full_tiles ? segments[first + k] : 0;
        sum += v[k];
    }
    index_t total;
    index_t before = tile_sums[get_group_id(0)] + group_scan(sum, buf, &total);
    for (int k = 0; k < PER_ITEM; k++) {
        if (first + k <= n_full_tiles) {
            empty_offset_ptr[first + k] = before;
            if (v[k])
                empty_offset_out[before] = 0;   // segment 0: the tile's first row
        }
        before += v[k];
    }
}

${signature("csr5_rows_convert")}
{
    const index_t r = (index_t)get_global_id(0);
    if (r < n_rows) {
        const upos_t a = (upos_t)row_ptr[r], b = (upos_t)row_ptr[r + 1];
        if (a == b) {
            if (r < tail_row_begin)
                empty_rows[empty_before[r]] = r;
        } else if (with_offsets && a < (upos_t)n_full_tiles * TILE_SIZE) {
            const upos_t t = a / TILE_SIZE;
            const tile_ptr_t tp = tile_ptr[t];
            const index_t r0 = FIRST_ROW(tp);
            // Not the tile's first row: starts strictly inside it (no a % TILE_SIZE
            // beside the division: LLVM would pair them with a "freeze", which
            // Oclgrind cannot check).
            if (r != r0 && HAS_EMPTY(tp)) {
                const index_t segment = r - r0 - (empty_before[r] - empty_before[r0 + 1]);
                empty_offset_out[empty_offset_ptr[t] + segment] = r - r0;
            }
        }
    }
}

${signature("csr5_tiles_convert")}
{
    const int l = (int)get_local_id(0);
    const index_t group = (index_t)get_group_id(0);
    const upos_t full_end = (upos_t)n_full_tiles * TILE_SIZE;
    const int lane = l & (OMEGA - 1);
    const int tile_in_group = l >> LOG_OMEGA;
    const int column0 = l - lane;   // the tile's first work-item
    const index_t tile = group * TILES_PER_GROUP + tile_in_group;
    const bool valid = tile < n_full_tiles;
    const upos_t begin = (upos_t)tile * TILE_SIZE;
    // Entry e = j*OMEGA + lane of the tile (read side by side by the tile's work-items)
    // goes to (e % SIGMA) * OMEGA + e / SIGMA: column c and step s of e, stepped along.
    int c = DIV_SIGMA(lane), s = lane - c * SIGMA;
% if local_transpose:
    __local index_t cols[TILES_PER_GROUP * TILE_SIZE];
    __local real_t vals[TILES_PER_GROUP * TILE_SIZE];
    __local index_t *restrict tile_cols = cols + tile_in_group * TILE_SIZE;
    __local real_t *restrict tile_vals = vals + tile_in_group * TILE_SIZE;
% endif
    for (int j = 0; j < SIGMA; j++) {
        if (valid) {
            const upos_t from = begin + (upos_t)(j * OMEGA + lane);
% if local_transpose:
            tile_cols[s * OMEGA + c] = csr_col_idx[from];
            tile_vals[s * OMEGA + c] = csr_values[from];
% else:
            const upos_t to = begin + (upos_t)(s * OMEGA + c);
            col_idx_out[to] = csr_col_idx[from];
            values_out[to] = csr_values[from];
% endif
        }
        c += OMEGA / SIGMA;
        s += OMEGA % SIGMA;
        if (s >= SIGMA) {
            s -= SIGMA;
            c++;
        }
    }
% if local_transpose:
    barrier(CLK_LOCAL_MEM_FENCE);
    if (valid) {
        for (int j = 0; j < SIGMA; j++) {
            col_idx_out[begin + (upos_t)(j * OMEGA + lane)] = tile_cols[j * OMEGA + lane];
            values_out[begin + (upos_t)(j * OMEGA + lane)] = tile_vals[j * OMEGA + lane];
        }
    }
% endif

    // The descriptors: work-item `lane` of a tile holds its column's words (word w of
    // work-item l at flags[w * TILE_GROUP + l]).  The bit_flags: the tile's head, and
    // the start of each non-empty row starting inside it (consecutive in nonempty_rows,
    // from the tile's first row to the next tile's: at most TILE_SIZE + 1 of them).
    __local uint flags[DESC_WORDS * TILE_GROUP];
    __local uint counts[TILE_GROUP];
    __local int nexts[TILE_GROUP];
    for (int w = 0; w < DESC_WORDS; w++)
        flags[w * TILE_GROUP + l] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (valid) {
        const index_t r0 = first_row[tile], r1 = first_row[tile + 1];
        const index_t last = r1 - empty_before[r1] - (r1 == n_rows ? 1 : 0);
        if (lane == 0)
            atomic_or(flags + (FLAG_SHIFT >> 5) * TILE_GROUP + column0,
                      1u << (FLAG_SHIFT & 31));
        for (index_t i = r0 - empty_before[r0] + lane; i <= last; i += OMEGA) {
            const upos_t a = (upos_t)row_ptr[nonempty_rows[i]];
            if (a >= begin && a < begin + TILE_SIZE) {
                const uint e = (uint)(a - begin), column = DIV_SIGMA(e);
                const uint bit = FLAG_SHIFT + (e - column * SIGMA);
                atomic_or(flags + (bit >> 5) * TILE_GROUP + column0 + column,
                          1u << (bit & 31));
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint count = 0;
    for (int w = 0; w < DESC_WORDS; w++)
        count += popcount(flags[w * TILE_GROUP + l]);
    uint y = count;                       // inclusive scan of the counts
    int next = count ? lane : OMEGA;      // the first column from here holding a flag
    counts[l] = y;
    nexts[l] = next;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = 1; s < OMEGA; s <<= 1) {
        const uint left = lane >= s ? counts[l - s] : 0;
        const int right = lane + s < OMEGA ? nexts[l + s] : OMEGA;
        barrier(CLK_LOCAL_MEM_FENCE);
        y += left;
        next = min(next, right);
        counts[l] = y;
        nexts[l] = next;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int after = lane + 1 < OMEGA ? nexts[l + 1] : OMEGA;
    if (valid) {
        __global uint *restrict d = tile_desc + tile * (DESC_WORDS * OMEGA) + lane;
        d[0] = flags[l] | (y - count) | ((uint)(after - lane - 1) << SEG_SHIFT);
        for (int w = 1; w < DESC_WORDS; w++)
            d[w * OMEGA] = flags[w * TILE_GROUP + l];
    }

    // The incomplete last tile stays in CSR order.
    if (group == (index_t)get_num_groups(0) - 1) {
        for (index_t q = l; q < n_tail; q += TILE_GROUP) {
            col_idx_out[full_end + q] = csr_col_idx[full_end + q];
            values_out[full_end + q] = csr_values[full_end + q];
        }
    }
}

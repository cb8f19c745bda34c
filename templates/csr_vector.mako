<%namespace name="c" file="common.mako"/>
## CSR vector (Bell & Garland): a group of ${vector_size} work-items per row, each
## summing a strided share of the row, then combined in local memory with barriers
## (no reliance on lock-step execution of a warp or wavefront).
## reduction = "tree": log2(vector_size) halving steps (GPUs);
## reduction = "serial": one barrier, then lane 0 adds the partial sums (CPUs, where
## each barrier splits the work-item loop and costs more than the additions).
## mapping = "adaptive": see pyspmv_cl/formats/csr_vector.py (CSR-Adaptive's row blocks:
## several short rows streamed through local memory, or one long row for the group).
## mapping = "merge": Merrill & Garland's merge-based SpMV (see csr_vector.py): each
## work-item walks ITEMS items of the merged sequence of row ends and entries, one carry
## per work-item meets the group's in local memory, and csr_vector_merge_fixup completes
## the rows begun in an earlier group.
${c.preamble()}
% if mapping == "merge":
#define WG ${work_group_size}
#define ITEMS ${items_per_thread}
#define GROUP_ITEMS ${work_group_size * items_per_thread}
typedef ${pos_t} pos_t;

${signature("csr_vector_merge")}
{
    __local index_t s_row[WG];
    __local real_t s_sum[WG];
    const uint lid = get_local_id(0);
    const index_t g = (index_t)get_group_id(0);
    const pos_t n_items = (pos_t)n_rows + (pos_t)nnz;
    // The group's first and last rows (host-made: merge_groups), and whether its first
    // row began in an earlier group (the fix-up kernel then completes that row).
    const index_t lo = group_rows[g];
    const index_t hi = group_rows[g + 1];
    const pos_t group_begin = (pos_t)g * GROUP_ITEMS;
    const bool group_open = lo < n_rows && group_begin - (pos_t)lo > (pos_t)row_ptr[lo];
    const pos_t begin = min(group_begin + (pos_t)(lid * ITEMS), n_items);
    const pos_t end = min(begin + ITEMS, n_items);
    // This work-item's start on the merge path: the rows ended before item `begin` (row
    // k's end is item row_ptr[k + 1] + k), searched between the group's rows.
    pos_t x_lo = max((pos_t)lo, begin - (pos_t)nnz);
    pos_t x_hi = min((pos_t)hi, begin);
    while (x_lo < x_hi) {
        const pos_t pivot = (x_lo + x_hi) >> 1;
        if ((pos_t)row_ptr[pivot + 1] + pivot + 1 <= begin)
            x_lo = pivot + 1;
        else
            x_hi = pivot;
    }
    const index_t first_row = (index_t)x_lo;
    index_t row = first_row;
    index_t j = (index_t)(begin - x_lo);
    index_t row_end = row < n_rows ? row_ptr[row + 1] : j;
    // Each item: the next entry of the current row, or the row's end.  Rows ended here
    // are complete, but the first (earlier work-items may hold some of it).
    real_t sum = 0, first_sum = 0;
    bool has_first = false;
    for (pos_t d = begin; d < end; d++) {
        if (j < row_end) {
            sum += MUL(LOADV(j, values), x[col_idx[j]]);
            j++;
        } else {
            if (has_first) {
${c.store_y("row", "sum")}
            } else {
                first_sum = sum;
                has_first = true;
            }
            sum = 0;
            row++;
            row_end = row < n_rows ? row_ptr[row + 1] : j;
        }
    }
    // The carry: the partial sum of the row this work-item ends in.  Rows never
    // decrease along the group, so the carries of one row are consecutive.
    s_row[lid] = row;
    s_sum[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
% if reduction == "tree":
    // Inclusive segmented scan of the carries (Hillis-Steele, keys: rows): s_sum[lid]
    // ends as the sum of the carries of lid's row from the group's start to lid.
    real_t acc = sum;
% for s in [1 << k for k in range((work_group_size - 1).bit_length())]:
    {
        const real_t before = (lid >= ${s} && s_row[lid - ${s}] == row) ? s_sum[lid - ${s}]
                                                                     : (real_t)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        acc += before;
        s_sum[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endfor
    // What earlier work-items of the group hold of first_row (the carry of lid - 1 is
    // always in first_row, where lid starts).
    const real_t inbound = (lid > 0 && s_row[lid - 1] == first_row) ? s_sum[lid - 1]
                                                                   : (real_t)0;
    const real_t group_carry = acc;
% else:
    // Each work-item that ends its first row walks back over the carries of that row;
    // the last one over those of its own carry's row (the group's carry).
    real_t inbound = 0;
    if (has_first) {
        for (int t = (int)lid - 1; t >= 0 && s_row[t] == first_row; t--)
            inbound += s_sum[t];
    }
    real_t group_carry = sum;
    if (lid == WG - 1) {
        for (int t = WG - 2; t >= 0 && s_row[t] == row; t--)
            group_carry += s_sum[t];
    }
% endif
    if (has_first) {
        const real_t total = first_sum + inbound;
        if (group_open && first_row == lo)
            head[g] = total;      // the rest is in earlier groups: the fix-up adds it
        else {
${c.store_y("first_row", "total")}
        }
    }
    if (lid == WG - 1)
        carry[g] = group_carry;   // of row group_rows[g + 1]
}

## One work-item per group that ends a row begun in an earlier group: the group's part
## (head) plus the carries of the earlier groups that end in that row, latest first.
${signature("csr_vector_merge_fixup")}
{
    const index_t k = (index_t)get_global_id(0);
    if (k < n_fix) {
        const index_t g = fix_groups[k];
        const index_t r = group_rows[g];
        real_t sum = head[g];
        // Group c ends in row group_rows[c + 1]; rows never decrease and group g - 1
        // ends in r, so when group c - 7 does, so do c - 6 ... c: eight loads a step.
        index_t c = g - 1;
        for (; c >= 7 && group_rows[c - 6] == r; c -= 8)
            sum += ((carry[c] + carry[c - 1]) + (carry[c - 2] + carry[c - 3]))
                   + ((carry[c - 4] + carry[c - 5]) + (carry[c - 6] + carry[c - 7]));
        for (; c >= 0 && group_rows[c + 1] == r; c--)
            sum += carry[c];
${c.store_y("r", "sum")}
    }
}
% elif mapping == "adaptive":
<% window = work_group_size * items_per_thread %>
#define WG ${work_group_size}
#define WINDOW ${window}
${c.streamed_loads(streamed_loads)}
## col_bits=16: a column is the block's base plus a 16-bit offset (csr_vector.py).  With
## col_escape, a wide block (base < 0) skips the window loop and runs a second one that
## reads its 32-bit columns from col_wide (WIDE); a narrow block skips that one.  On an
## H100 (cage10 x133 with one wide block, float32) the main loop stays as fast as
## without the escape (61 us); choosing the column's source per entry took 81 us, per
## window 67 (as slow as 32 bits), and a second kernel for the wide blocks 70.
% if col_bits == 16 and streamed_loads:
#define COLUMN(j) (block_base + (index_t)evict_first_u16(col_off + (j)))
#define WIDE(j) STREAMI(col_wide + (j) + wide_at)
% elif col_bits == 16:
#define COLUMN(j) (block_base + (index_t)col_off[j])
#define WIDE(j) col_wide[(j) + wide_at]
% elif streamed_loads:
#define COLUMN(j) STREAMI(col_idx + (j))
% else:
#define COLUMN(j) col_idx[j]
% endif
% if streamed_loads:
#define PRODUCT_OF(j, COL) MUL(STREAMV(values + (j)), x[COL(j)])
% else:
#define PRODUCT_OF(j, COL) MUL(LOADV(j, values), x[COL(j)])
% endif
## The window loop over the block's entries begin..stop, columns from COL: WINDOW
## products at a time into local memory, then each work-item adds its row's share.
<%def name="window_loop(col, stop)">
    for (index_t window = begin; window < ${stop}; window += WINDOW) {
% for k in range(items_per_thread):
        {
            const index_t j = window + ${k * work_group_size} + (index_t)lid;
            products[${k * work_group_size} + lid] =
                (j < ${stop}) ? PRODUCT_OF(j, ${col}) : (real_t)0;
        }
% endfor
        barrier(CLK_LOCAL_MEM_FENCE);
        const index_t hi = min(row_end, window + WINDOW);
        index_t r = max(row_begin, window) + (index_t)sub;
% if row_unroll > 1:
        for (; r + ${row_unroll - 1} * (index_t)tpr < hi; r += ${row_unroll} * (index_t)tpr) {
            __local const real_t *p = products + (r - window);
            sum += ${" + ".join(f"p[{k} * tpr]" if k else "p[0]" for k in range(row_unroll))};
        }
% endif
        for (; r < hi; r += tpr)
            sum += products[r - window];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
</%def>
<% escape = col_bits == 16 and col_escape %>

${signature("csr_vector")}
{
    __local real_t products[WINDOW];
    const uint lid = get_local_id(0);
    const index_t first = row_blocks[get_group_id(0)];
    const index_t last = row_blocks[get_group_id(0) + 1];
    const index_t begin = row_ptr[first];
% if col_bits == 16:
    const index_t block_base = col_base[get_group_id(0)];
% endif
% if escape:
    // A wide block (base < 0) has no entries in the first loop (kept as short-lived
    // as without the escape: more state live through it made float64 slower).
    const index_t end = block_base < 0 ? begin : row_ptr[last];
% else:
    const index_t end = row_ptr[last];
% endif
    // The block's entries go through local memory WINDOW products at a time, read
    // consecutively by the group (coalesced, and neighbouring entries gather
    // neighbouring x).  Then each row of the block is added up by TPR work-items, the
    // most that fit the group (a power of two): one work-item a row when the block
    // holds WG short rows, the whole group for a single long row.  Their partial sums
    // are combined at the end.  Every barrier is outside any branch (the loops' trip
    // counts are the group's): PoCL hangs on barriers inside a branch, even a uniform
    // one.
    const uint n_rows = (uint)(last - first);   // 1..WG
    uint tpr = WG;
    while (tpr * n_rows > WG)
        tpr >>= 1;
    const uint sub = lid & (tpr - 1);
    const index_t row = first + (index_t)(lid / tpr);
    const bool has_row = row < last;
    const index_t row_begin = has_row ? row_ptr[row] : 0;
    const index_t row_end = has_row ? row_ptr[row + 1] : 0;
    real_t sum = 0;
% if escape:
${window_loop("COLUMN", "end")}
    {   // ... and all of them in the second, which a narrow block skips
        const index_t wide_end = block_base < 0 ? row_ptr[row_blocks[get_group_id(0) + 1]]
                                                : begin;
        // (a wide block's base is -1 - the position of its first column in col_wide)
        const index_t wide_at = -1 - block_base - begin;
${window_loop("WIDE", "wide_end")}
    }
% else:
${window_loop("COLUMN", "end")}
% endif
    // The window loop ended with a barrier: products can be overwritten.
    products[lid] = sum;
% if reduction == "tree":
    // log2(tpr) halving steps, none when each row has one work-item (the loop's trip
    // count is the group's, so its barriers are uniform).  Within a step, lid reads
    // lid + s, which (sub + s >= s) does not write.
    for (uint s = tpr >> 1; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (sub < s)
            products[lid] = sum = sum + products[lid + s];
    }
% else:
    barrier(CLK_LOCAL_MEM_FENCE);
    if (sub == 0) {
        for (uint k = 1; k < tpr; ++k)
            sum += products[lid + k];
    }
% endif
    if (has_row && sub == 0) {
${c.store_y("row", "sum")}
    }
}
% if col_bits == 16 and device_conversion:

## col_bits=16 on the device: a group per row block finds the block's smallest and
## largest column (a tree over the group), writes the base for the block and its rows
## and each entry's offset, and flags a block spanning more than 0xFFFF columns: its
## base is -1 and its offsets 0 (the host then takes 32-bit columns, or has
## csr_vector_widen write the block's escape).
${signature("csr_vector_compress")}
{
    __local index_t lows[WG];
    __local index_t highs[WG];
    const uint lid = get_local_id(0);
    const index_t b = (index_t)get_group_id(0);
    const index_t first = blocks_in[b], last = blocks_in[b + 1];
    const index_t begin = csr_row_ptr[first], end = csr_row_ptr[last];
    // Any entry of the block seeds both bounds (an empty block keeps base 0).
    index_t low = end > begin ? csr_col_idx[begin] : 0;
    index_t high = low;
    for (index_t j = begin + (index_t)lid; j < end; j += WG) {
        const index_t col = csr_col_idx[j];
        low = min(low, col);
        high = max(high, col);
    }
    lows[lid] = low;
    highs[lid] = high;
    // Within a step lid reads lid + s, which (lid < s writes only) no one writes.
    for (uint s = WG >> 1; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < s) {
            lows[lid] = low = min(low, lows[lid + s]);
            highs[lid] = high = max(high, highs[lid + s]);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const bool wide = highs[0] - lows[0] > 0xFFFF;
    const index_t base = wide ? -1 : lows[0];
    if (lid == 0) {
        col_base_out[b] = base;
        if (wide)
            atomic_max((volatile __global int *)bad, 1);
    }
    for (index_t r = first + (index_t)lid; r < last; r += WG)
        row_base_out[r] = base;
    for (index_t j = begin + (index_t)lid; j < end; j += WG)
        col_off_out[j] = wide ? (ushort)0 : (ushort)(csr_col_idx[j] - base);
}
% if col_escape:

## The wide blocks (widen_blocks, whose first column goes to widen_at in col_wide; the
## host's prefix sum of their sizes), a group each: their bases (-1 - the position of
## their first column in col_wide, a row's of its first), and their columns copied.
${signature("csr_vector_widen")}
{
    const uint lid = get_local_id(0);
    const index_t b = widen_blocks[get_group_id(0)], at = widen_at[get_group_id(0)];
    const index_t first = blocks_in[b], last = blocks_in[b + 1];
    const index_t begin = csr_row_ptr[first], end = csr_row_ptr[last];
    if (lid == 0)
        col_base_out[b] = -1 - at;
    for (index_t r = first + (index_t)lid; r < last; r += WG)
        row_base_out[r] = -1 - (at + csr_row_ptr[r] - begin);
    for (index_t j = begin + (index_t)lid; j < end; j += WG)
        col_wide_out[at + j - begin] = csr_col_idx[j];
}
% endif
% endif
% else:
<% rows_per_group = work_group_size // vector_size %>
#define VECTOR_SIZE ${vector_size}
#define ROWS_PER_GROUP ${rows_per_group}

${signature("csr_vector")}
{
    __local real_t partial[${work_group_size}];
    const uint lid = get_local_id(0);
    const uint lane = lid & (VECTOR_SIZE - 1);
    // One launch covers every row (the host sizes the grid), so there is no row loop
    // around the barriers.
    const long row = (long)get_group_id(0) * ROWS_PER_GROUP + lid / VECTOR_SIZE;
    real_t sum = 0;
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
        for (index_t j = row_ptr[row] + lane; j < end; j += VECTOR_SIZE)
            sum += MUL(LOADV(j, values), x[col_idx[j]]);
    }
    partial[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
% if reduction == "tree":
% for s in [vector_size >> k for k in range(1, vector_size.bit_length())]:
    if (lane < ${s})
        partial[lid] = sum = sum + partial[lid + ${s}];
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
% else:
    if (lane == 0) {
% for k in range(1, vector_size):
        sum += partial[lid + ${k}];
% endfor
    }
% endif
    if (lane == 0 && row < n_rows) {
${c.store_y("row", "sum")}
    }
}
% endif

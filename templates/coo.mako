<%namespace name="c" file="common.mako"/>
## COO SpMV by segmented reduction over fixed-size chunks of non-zeros (Bell & Garland's
## COO kernel, after Blelloch et al.): load-balanced whatever the row lengths.
##
## coo_chunks: work-group g takes the CHUNK = WG * T consecutive non-zeros starting at
##   g * CHUNK; work-item lid reduces its T consecutive ones sequentially by row.  A
##   segmented scan (by row) of the work-items' last segments in local memory joins rows
##   that cross work-items.  Each row ending inside the group is stored by exactly one
##   work-item, except the group's first and last row segments, which may continue in
##   other groups: they become the group's two carries (row, value).
## coo_carries: one work-item per carry that starts a run of equal rows adds up the run
##   (carries are ordered as the groups are) and stores it: one writer per row, no
##   atomics, so results are deterministic.
## coo_empty_rows: y = beta * y (0 when beta == 0) on the rows without non-zeros.
##
## layout "interleaved": the host stored item lid's k-th non-zero of a chunk at
##   k * WG + lid, so neighbouring work-items read neighbouring words (coalesced);
## layout "contiguous": at lid * T + k, so each work-item streams its own run (CPUs).
## scan "tree": log2(WG) halving steps (GPUs); "serial": work-item 0 walks the WG
##   entries after one barrier (CPUs, where a barrier costs more than WG additions).
${c.preamble()}
typedef ${pos_t} pos_t;
#define WG ${work_group_size}
#define T ${items_per_thread}
#define CHUNK ((pos_t)WG * T)

% if layout == "interleaved":
#define PHYS(start, lid, k) ((start) + (pos_t)(k) * WG + (lid))
% else:
#define PHYS(start, lid, k) ((start) + (pos_t)(lid) * T + (k))
% endif

${signature("coo_chunks")}
{
    __local index_t head_row[WG];
    __local index_t tail_row[WG];
    __local real_t tail_sum[WG];
    const uint lid = get_local_id(0);
    const size_t group = get_group_id(0);
    const pos_t start = (pos_t)group * CHUNK;
    const pos_t first = start + (pos_t)lid * T;   // logical position of this item's first
    const uint last_item = (uint)((min(CHUNK, nnz - start) - 1) / T);

    // Sequential reduction of this item's run.  Rows strictly inside it are complete:
    // stored here.  The head (first segment) and tail (last) go through the scan.
    // Items past the end hold the sentinel row n_rows (keeps the rows non-decreasing).
    index_t h_row = n_rows, cur = n_rows;
    real_t h_sum = 0, sum = 0;
    bool split = false;   // does the head row end inside this item?
    if (first < nnz) {
        cur = rows[PHYS(start, lid, 0)];
        const uint count = (uint)min((pos_t)T, nnz - first);
        for (uint k = 0; k < count; ++k) {
            const pos_t p = PHYS(start, lid, k);
            const index_t r = rows[p];
            if (r != cur) {
                if (split) {
${c.store_y("cur", "sum")}
                } else {
                    h_row = cur;
                    h_sum = sum;
                    split = true;
                }
                cur = r;
                sum = 0;
            }
            sum += MUL(values[p], x[cols[p]]);
        }
    }
    if (!split)
        h_row = cur;
    head_row[lid] = h_row;
    tail_row[lid] = cur;
    tail_sum[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);

    // Inclusive segmented scan of the tails by row (rows are non-decreasing over items,
    // so equal rows are contiguous and a key comparison delimits the segments).
% if scan == "tree":
% for d in [1 << k for k in range(work_group_size.bit_length()) if (1 << k) < work_group_size]:
    {
        const real_t add = (lid >= ${d} && tail_row[lid - ${d}] == cur)
                           ? tail_sum[lid - ${d}] : (real_t)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        tail_sum[lid] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endfor
% else:
    if (lid == 0) {
        real_t run = tail_sum[0];
        for (uint i = 1; i <= last_item; ++i) {
            if (tail_row[i] == tail_row[i - 1]) {
                run += tail_sum[i];
                tail_sum[i] = run;
            } else {
                run = tail_sum[i];
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% endif

    if (lid > last_item)
        return;
    const index_t group_row = head_row[0];
    __global index_t *const crow = carry_rows + 2 * group;
    __global real_t *const cval = carry_values + 2 * group;
    // (a) The head row ends inside this item: its value is the head plus the scanned
    // tails of the items before that end in the same row.
    if (split) {
        real_t v = h_sum;
        if (lid > 0 && tail_row[lid - 1] == h_row)
            v += tail_sum[lid - 1];
        if (h_row == group_row) {
            crow[0] = h_row;
            cval[0] = v;
        } else {
${c.store_y("h_row", "v")}
        }
    }
    // (b) The tail row ends at this item's end (the next item starts another row, or
    // this is the group's last item): the scanned tail holds its value in this group.
    if (lid == last_item) {
        const real_t v = tail_sum[lid];
        if (cur == group_row) {   // one row across the whole group
            crow[0] = cur;
            cval[0] = v;
            crow[1] = cur;
            cval[1] = 0;
        } else {
            crow[1] = cur;
            cval[1] = v;
        }
    } else if (head_row[lid + 1] != cur) {
        const real_t v = tail_sum[lid];
        if (cur == group_row) {
            crow[0] = cur;
            cval[0] = v;
        } else {
${c.store_y("cur", "v")}
        }
    }
}

${signature("coo_carries")}
{
    const size_t i = get_global_id(0);
    if (i >= n_carries)
        return;
    const index_t row = carry_rows[i];
    if (i > 0 && carry_rows[i - 1] == row)
        return;   // not the first of its run
    real_t sum = 0;
    for (size_t j = i; j < n_carries && carry_rows[j] == row; ++j)
        sum += carry_values[j];
${c.store_y("row", "sum")}
}

${signature("coo_empty_rows")}
{
    const size_t i = get_global_id(0);
    if (i < n_empty) {
        const index_t row = empty_rows[i];
        // alpha * 0 (+ beta * y): NaN where alpha is inf or NaN, as a row's sum of 0
${c.store_y("row", "(real_t)(0)")}
    }
}

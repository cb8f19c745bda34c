<%namespace name="c" file="common.mako"/>
## CSR5 SpMV (Liu & Vinter, Algorithm 8), in two kernels.
##
## csr5_compute: a work-group runs TILES_PER_GROUP complete tiles, one work-item per tile
##   column (OMEGA of them).  Column i walks its SIGMA entries (stored at j*OMEGA + i)
##   and, at each bit_flag (a row start), closes the running sum: the part before its
##   first flag is RED (it belongs to a row begun in a column to the left), a segment
##   closed by a later flag in the same column is GREEN (complete: stored directly), the
##   part after its last flag is BLUE (continued by the red parts of the columns to the
##   right up to the next column holding a flag, seg_offset of them).  The reds are
##   joined to their blue by a segmented sum over the tile's columns in local memory
##   (segment heads: columns with a flag; the tile's first entry is always flagged, so
##   segments never cross tiles), then read at column i + seg_offset -- the paper's fast
##   segmented sum with a segmented scan instead of differences of a plain prefix sum,
##   which would mix rows (cancellation, and Inf - Inf = NaN leaking into other rows).
##   segmented_sum "scan": log2(OMEGA) Hillis-Steele steps with barriers (GPUs);
##   "serial": each blue column adds its seg_offset + 1 reds itself after one barrier
##   (each red is read once: OMEGA additions per tile; CPUs, where barriers are costly).
##   Segment s of a tile lies in row tile_ptr + s, or tile_ptr + empty_offset[s] when
##   the tile has empty rows.  Its segment 0 (first row, maybe begun in earlier tiles)
##   goes to head[tile], and its last segment, when that row continues into the next
##   tile, to tail[tile] (else tail[tile] = 0): no row is stored by two tiles.
## csr5_calibrate: one work-item per tile, then one per row after the incomplete last
##   tile's first row.  The work-item of the first tile holding a row adds, in order, the
##   previous tile's tail and the heads of the tiles that start in that row (plus its
##   entries in the incomplete tile) and stores the row: the authors' calibrate kernel
##   without atomics, so results are deterministic.  Rows after the incomplete tile's
##   first row are complete and stored row by row, CSR-scalar style; then one work-item
##   per empty row before them (a list made at conversion) stores its zero.
## csr5_run_sums (only with run_group > 0, for rows spanning many tiles): before the
##   calibrate kernel, each group of RUN_GROUP consecutive tiles replaces head[t] of
##   every tile t that starts a run of equal first rows inside the group by the run's
##   sum within the group (a segmented suffix scan in local memory; tile_ptr's rows never
##   decrease, so equal keys mean one segment).  The calibrate kernel then adds one value
##   per group instead of one per tile: a row over 4000 tiles costs 16 serial loads with
##   groups of 256, not 4000.  The order of additions is fixed: still deterministic.
${c.preamble()}
${c.streamed_loads(streamed_loads)}
<%
    tiles_per_group = work_group_size // omega
    flag_shift = y_bits + seg_bits
    wide = index_t == "long"
    unrolled = sigma <= 64
%>
#define OMEGA ${omega}
#define SIGMA ${sigma}
#define TILE_SIZE ${omega * sigma}
#define WG ${work_group_size}
#define TILES_PER_GROUP ${tiles_per_group}
#define DESC_WORDS ${desc_words}
% if run_group:
#define RUN_GROUP ${run_group}
% endif
#define Y_MASK ${(1 << y_bits) - 1}u
#define SEG_SHIFT ${y_bits}
#define SEG_MASK ${(1 << seg_bits) - 1}u
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

## The row of segment s of the current tile.
% if has_empty_offset:
#define SEGMENT_ROW(s) (row0 + (eo_base >= 0 ? empty_offset[eo_base + (s)] : (index_t)(s)))
% else:
#define SEGMENT_ROW(s) (row0 + (index_t)(s))
% endif

## One entry of a column: close the running segment at a row start, then add.
<%def name="entry(flag, offset)">
        if (${flag}) {
            if (started) {      // a green segment ends: complete, store it
                const int s = seg - 1;
                if (s == 0) {
                    head[tile] = sum;
                } else {
                    const index_t row = SEGMENT_ROW(s);
${c.store_y("row", "sum")}
                }
            } else {
                red = sum;
            }
            started = true;
            sum = 0;
            seg++;
        }
        sum += MUL(STREAMV(values + base + ${offset}), x[STREAMI(col_idx + base + ${offset})]);
</%def>

${signature("csr5_compute")}
{
    __local real_t s_red[WG];
% if segmented_sum == "scan":
    __local int s_flag[WG];
% endif
    const int lid = get_local_id(0);
    const int lane = lid & (OMEGA - 1);
    const int tile_base = lid - lane;
    const index_t tile = (index_t)get_group_id(0) * TILES_PER_GROUP + lid / OMEGA;
    const bool active = tile < n_tiles;

    real_t red = 0, sum = 0;
    bool started = false;
    int seg = 0, seg_offset = 0;
    index_t row0 = 0, next_row0 = 0;
% if has_empty_offset:
    index_t eo_base = -1;
% endif
    if (active) {
        const tile_ptr_t tp = tile_ptr[tile];
        row0 = FIRST_ROW(tp);
        next_row0 = FIRST_ROW(tile_ptr[tile + 1]);
% if has_empty_offset:
        if (HAS_EMPTY(tp))
            eo_base = empty_offset_ptr[tile];
% endif
        __global const uint *d = tile_desc + tile * (DESC_WORDS * OMEGA) + lane;
% if unrolled:
% for w in range(desc_words):
        const uint desc${w} = d[${w * omega}];
% endfor
% else:
        uint desc[DESC_WORDS];
        for (int w = 0; w < DESC_WORDS; w++)
            desc[w] = d[w * OMEGA];
        const uint desc0 = desc[0];
% endif
        seg = (int)(desc0 & Y_MASK);
        seg_offset = (int)((desc0 >> SEG_SHIFT) & SEG_MASK);
        const index_t base = tile * TILE_SIZE + lane;
% if unrolled:
% for j in range(sigma):
<% b = flag_shift + j %>\
${entry("(desc%d >> %d) & 1u" % (b >> 5, b & 31), str(j * omega))}
% endfor
% else:
        for (int j = 0; j < SIGMA; j++) {
${entry("(desc[(FLAG_SHIFT + j) >> 5] >> ((FLAG_SHIFT + j) & 31)) & 1u", "j * OMEGA")}
        }
% endif
        if (!started)
            red = sum;          // no row starts here: the whole column is red
    }
    // Column i's red continues the blue of a column left of it: it sits at i - 1, so
    // that the blue at column b finds its reds at b ... b + seg_offset (the last slot
    // of a tile gets column 0's red, always 0).
    s_red[tile_base + ((lane + OMEGA - 1) & (OMEGA - 1))] = red;
% if segmented_sum == "scan":
    s_flag[lid] = started;
    barrier(CLK_LOCAL_MEM_FENCE);
    // Inclusive segmented scan (heads: columns with a row start).
    real_t acc = s_red[lid];
    int reached = started;
% for d in [1 << k for k in range((omega - 1).bit_length())]:
    {
        real_t before = 0;
        int before_flag = 1;
        if (!reached && lane >= ${d}) {
            before = s_red[lid - ${d}];
            before_flag = s_flag[lid - ${d}];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!reached) {
            acc = before + acc;
            reached = before_flag;
            s_red[lid] = acc;
            s_flag[lid] = reached;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endfor
    if (active && started) {
        const real_t total = sum + s_red[lid + seg_offset];
% else:
    barrier(CLK_LOCAL_MEM_FENCE);
    if (active && started) {
        real_t total = sum;
        for (int q = 0; q <= seg_offset; q++)
            total += s_red[lid + q];
% endif
        // The blue segment, completed: the tile's last one when nothing follows it.
        const int s = seg - 1;
        const index_t row = SEGMENT_ROW(s);
        const bool last = lane + seg_offset == OMEGA - 1;
        const bool continues = last && s != 0 && row == next_row0;
        if (s == 0) {
            head[tile] = total;
        } else if (continues) {
            tail[tile] = total;
        } else {
${c.store_y("row", "total")}
        }
        if (last && !continues)
            tail[tile] = 0;
    }
}

${signature("csr5_calibrate")}
{
    const index_t g = (index_t)get_global_id(0);
    if (g < n_tiles) {
        const index_t t = g;
        const tile_ptr_t tp = tile_ptr[t];
        const index_t row0 = FIRST_ROW(tp);
        if (t == 0 || FIRST_ROW(tile_ptr[t - 1]) != row0) {
            // First tile starting in row0: add up the row's pieces in order.
            real_t sum = t > 0 ? tail[t - 1] : (real_t)0;
% if run_group:
            // head[t] holds the row's sum over t's run-sums group; each later group
            // the row reaches holds its part at the group's first tile.
            if (t < n_full_tiles) {
                sum += head[t];
                for (index_t k = (t / RUN_GROUP + 1) * RUN_GROUP;
                     k < n_full_tiles && FIRST_ROW(tile_ptr[k]) == row0; k += RUN_GROUP)
                    sum += head[k];
            }
% else:
            index_t k = t;
            // tile_ptr's rows never decrease: when tile k + 7 starts in row0, so do
            // k ... k + 6 -- eight independent loads per step for rows over many tiles.
            for (; k + 8 <= n_full_tiles && FIRST_ROW(tile_ptr[k + 7]) == row0; k += 8)
                sum += ((head[k] + head[k + 1]) + (head[k + 2] + head[k + 3]))
                       + ((head[k + 4] + head[k + 5]) + (head[k + 6] + head[k + 7]));
            for (; k < n_full_tiles && FIRST_ROW(tile_ptr[k]) == row0; k++)
                sum += head[k];
% endif
            // The incomplete tile continues row0 when it starts in row0 (rows never
            // decrease, so every tile from t on does).
            if (n_full_tiles < n_tiles && FIRST_ROW(tile_ptr[n_full_tiles]) == row0) {
                const index_t end = row_ptr[row0 + 1];
                for (index_t j = n_full_tiles * TILE_SIZE; j < end; j++)
                    sum += MUL(STREAMV(values + j), x[STREAMI(col_idx + j)]);
            }
${c.store_y("row0", "sum")}
        }
    } else if (g < n_tiles + n_tail_rows) {
        const index_t r = tail_row_begin + (g - n_tiles);
        real_t sum = 0;
        const index_t end = row_ptr[r + 1];
        for (index_t j = row_ptr[r]; j < end; j++)
            sum += MUL(STREAMV(values + j), x[STREAMI(col_idx + j)]);
${c.store_y("r", "sum")}
    } else if (g < n_tiles + n_tail_rows + n_empty_rows) {
        // One work-item per empty row before the tail rows: tiles may span runs of
        // thousands of empty rows (R-MAT graphs), too long a walk for one work-item.
        const index_t r = empty_rows[g - n_tiles - n_tail_rows];
${c.store_y("r", "(real_t)0")}
    }
}

% if run_group:
${signature("csr5_run_sums")}
{
    __local real_t s_sum[RUN_GROUP];
    __local index_t s_row[RUN_GROUP];
    const int lid = get_local_id(0);
    const index_t t = (index_t)get_group_id(0) * RUN_GROUP + lid;
    const bool active = t < n_full_tiles;
    // Past the end: a row number no tile has, so no segment reaches there.
    const index_t row = active ? FIRST_ROW(tile_ptr[t]) : (index_t)-1;
    real_t acc = active ? head[t] : (real_t)0;
    s_row[lid] = row;
    s_sum[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    // Inclusive suffix scan within each segment of equal rows (Hillis-Steele).
% for d in [1 << k for k in range((run_group - 1).bit_length())]:
    {
        const real_t after = (lid + ${d} < RUN_GROUP && s_row[lid + ${d}] == row)
                             ? s_sum[lid + ${d}] : (real_t)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        acc += after;
        s_sum[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endfor
    // A segment's first tile now holds the segment's total; the calibrate kernel reads
    // only those.
    if (active && (lid == 0 || s_row[lid - 1] != row))
        head[t] = acc;
}
% endif

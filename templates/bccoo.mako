<%namespace name="c" file="common.mako"/>
## BCCOO / BCCOO+ SpMV by the matrix-based segmented sum of yaSpMV (Yan et al., PPoPP'14,
## section 3), with the carries across work-groups done by a second kernel instead of
## adjacent synchronisation (safe on every device; deterministic, no atomics).
##
## bccoo_tiles: work-group g takes the WG * T consecutive blocks starting at g * WG * T;
##   work-item lid its T consecutive ones (its thread-level tile).  Sequential segmented
##   sum over the tile, using the bit flags (0 = row stop).  Every row stop yields the
##   H sums of one (rearranged) block row, whose index is first_entry[thread] + the
##   stops seen so far.  The tails after each thread's last stop go through a parallel
##   segmented scan in local memory (skipped when group_full says every thread has a
##   stop); a thread's first stop adds the scanned tails of the threads before it.
##   The group's first row (its "head": it may have begun in earlier groups) is left in
##   head_vals, the group's tail in tail_vals, for
## bccoo_carries: one work-item per group with a stop adds the tails of the groups
##   before it back to the last one with a stop, and writes the head row.
## bccoo_combine (BCCOO+): y = alpha * (sum of the slices' partial results) + beta * y.
##
## strategy 1: each thread keeps its stops' sums in a private intermediate_sums array
##   and writes them after the scan; strategy 2: the sums go to a per-group result
##   cache of RC rows in local memory (the rest straight to global memory), written
##   out together (coalesced) at the end.
## transpose: the host stored the k-th block of thread lid at k * WG + lid of the
##   group's tile (coalesced on GPUs), otherwise at lid * T + k (streams on CPUs).
## Fill entries (inside blocks, dummy and padding blocks) are +0.0 and are skipped:
##   they never multiply x (0 * Inf); stored zeros were written as -0.0.
${c.preamble()}
${c.streamed_loads(streamed_loads)}
typedef ${pos_t} pos_t;
typedef ${flag_t} flag_t;
typedef ${col_t} col_t;
#define WG ${work_group_size}
#define T ${tile_size}
#define H ${block_height}
#define W ${block_width}
#define FB ${flag_bits}
#define NW ${n_words}
% if strategy == 2:
#define RC ${cache_rows}
% endif
% if is_complex:
## A complex entry is stored when either part has a bit set (a stored zero's real
## part is -0.0).
#define STORED(v) (${"as_ulong" if is_double else "as_uint"}((v).x) != 0 || \
                   ${"as_ulong" if is_double else "as_uint"}((v).y) != 0)
% else:
#define STORED(v) (${"as_ulong" if is_double else "as_uint"}(v) != 0)
% endif

% if transpose:
#define BPOS(i) (tile_base + (pos_t)(i) * WG + lid)
#define FPOS(j) (group * (pos_t)(WG * NW) + (pos_t)(j) * WG + lid)
% else:
#define BPOS(i) (tile_base + (pos_t)lid * T + (i))
#define FPOS(j) (gid * NW + (j))
% endif

## Strategy 1 unrolls the tile loops so that intermediate_sums is indexed by constants
## (registers, not memory); not for huge tiles, which the compiler would refuse.
<%def name="unroll()">
% if strategy == 1 and tile_size * block_height * block_width <= 256:
#pragma unroll
% endif
</%def>
<%def name="emit(r, v)">
% for jr in range(block_height):
% if sliced:
            y[(${r}) * H + ${jr}] = ${v}[${jr}];
% else:
            {
                const pos_t row_ = (${r}) * H + ${jr};
                if (row_ < n_rows) {
${c.store_y("row_", v + "[" + str(jr) + "]")}
                }
            }
% endif
% endfor
</%def>

${signature("bccoo_tiles")}
{
    __local real_t last_partial_sums[WG * H];
    __local uchar starts[WG];
% if strategy == 2:
    __local real_t cache[RC * H];
% endif
    const uint lid = get_local_id(0);
    const pos_t group = get_group_id(0);
    const pos_t gid = group * WG + lid;
    const pos_t tile_base = group * (pos_t)(WG * T);
    const pos_t fe = first_entry[gid];
    const pos_t group_row = first_entry[group * WG];

    real_t sum[H];
% if strategy == 1:
    // The running sum at every position of the tile (the paper's intermediate_sums):
    // indexed by position, so unrolled loops keep it in registers.
    real_t intermediate_sums[T * H];
    uint words[NW];
% else:
    real_t first_sum[H];
% endif
    for (uint r = 0; r < H; ++r)
        sum[r] = 0;
    uint n_stops = 0;
% if col_compress:
    index_t col = 0;
% endif
${unroll()}
    for (uint wd = 0; wd < NW; ++wd) {
        const uint word = flags[FPOS(wd)];
% if strategy == 1:
        words[wd] = word;
% endif
${unroll()}
        for (uint b = 0; b < FB; ++b) {
            const uint i = wd * FB + b;
% if tile_size % flag_bits:
            if (i >= T)
                break;
% endif
            const pos_t p = BPOS(i);
% if col_compress:
            const short d = col_delta[p];
            col = (d == -1) ? (index_t)cols[p] : col + d;
% else:
% if col_t == index_t:
            const index_t col = STREAMI(cols + p);
% else:
            const index_t col = cols[p];
% endif
% endif
            const index_t xb = col * W;
% for jr in range(block_height):
% for jc in range(block_width):
            {
                const real_t v = STREAMV(values + ${jr} * value_stride + p * W + ${jc});
                if (STORED(v))
                    sum[${jr}] += MUL(v, x[xb + ${jc}]);
            }
% endfor
% endfor
% if strategy == 1:
            for (uint r = 0; r < H; ++r)
                intermediate_sums[i * H + r] = sum[r];
% endif
            if (!((word >> b) & 1u)) {   // row stop
% if strategy == 2:
                if (n_stops == 0) {
                    for (uint r = 0; r < H; ++r)
                        first_sum[r] = sum[r];
                } else if (fe + n_stops - group_row < RC) {
                    const pos_t idx = fe + n_stops - group_row;
                    for (uint r = 0; r < H; ++r)
                        cache[idx * H + r] = sum[r];
                } else {
${emit("fe + n_stops", "sum")}
                }
% endif
                ++n_stops;
                for (uint r = 0; r < H; ++r)
                    sum[r] = 0;
            }
        }
    }

    // Parallel segmented scan of the last partial sums; a thread with a stop starts a
    // segment.  Skipped when every thread has one (all segments have length 1).
    for (uint r = 0; r < H; ++r)
        last_partial_sums[lid * H + r] = sum[r];
    starts[lid] = n_stops > 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!group_full[group]) {
% if scan == "tree":
% for d in [1 << k for k in range(work_group_size.bit_length()) if (1 << k) < work_group_size]:
        {
            const bool take = lid >= ${d} && !starts[lid];
            real_t add[H];
            for (uint r = 0; r < H; ++r)
                add[r] = take ? last_partial_sums[(lid - ${d}) * H + r] : (real_t)0;
            const uchar st = lid >= ${d} ? starts[lid - ${d}] : 0;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (take) {
                for (uint r = 0; r < H; ++r)
                    last_partial_sums[lid * H + r] += add[r];
                starts[lid] = st;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
% endfor
% else:
        if (lid == 0) {
            for (uint t = 1; t < WG; ++t)
                if (!starts[t])
                    for (uint r = 0; r < H; ++r)
                        last_partial_sums[t * H + r] += last_partial_sums[(t - 1) * H + r];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
% endif
    }

    real_t carry[H];
    for (uint r = 0; r < H; ++r)
        carry[r] = lid > 0 ? last_partial_sums[(lid - 1) * H + r] : (real_t)0;
    if (lid == WG - 1)
        for (uint r = 0; r < H; ++r)
            tail_vals[group * H + r] = last_partial_sums[lid * H + r];
    // No stop before this thread in the group: its first stop ends the group's head row.
    const bool head = fe == group_row;
% if strategy == 1:
    // Walk the intermediate sums: a row stop's entry is a finished row, except the
    // first stop of the tile, which adds the carry from the threads before.
    pos_t row = fe;
${unroll()}
    for (uint i = 0; i < T; ++i) {
        if (!((words[i / FB] >> (i % FB)) & 1u)) {
            real_t v[H];
            for (uint r = 0; r < H; ++r)
                v[r] = intermediate_sums[i * H + r] + (row == fe ? carry[r] : (real_t)0);
            if (row == fe && head) {
                for (uint r = 0; r < H; ++r)
                    head_vals[group * H + r] = v[r];
            } else {
${emit("row", "v")}
            }
            ++row;
        }
    }
% else:
    if (n_stops > 0) {
        real_t v[H];
        for (uint r = 0; r < H; ++r)
            v[r] = first_sum[r] + carry[r];
        if (head) {
            for (uint r = 0; r < H; ++r)
                head_vals[group * H + r] = v[r];
        } else if (fe - group_row < RC) {
            for (uint r = 0; r < H; ++r)
                cache[(fe - group_row) * H + r] = v[r];
        } else {
${emit("fe", "v")}
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // The group's rows after its head that fit in the cache, written out together.
    const pos_t cached = min(first_entry[(group + 1) * WG] - group_row, (pos_t)RC);
    for (pos_t i = 1 + lid; i < cached; i += WG) {
        real_t v[H];
        for (uint r = 0; r < H; ++r)
            v[r] = cache[i * H + r];
${emit("group_row + i", "v")}
    }
% endif
}

${signature("bccoo_carries")}
{
    const pos_t g = get_global_id(0);
    if (g >= n_groups)
        return;
    const pos_t row = first_entry[g * WG];
    if (first_entry[(g + 1) * WG] == row)
        return;   // no row stop in this group: its tail is a later group's carry
    real_t v[H];
    for (uint r = 0; r < H; ++r)
        v[r] = head_vals[g * H + r];
    for (pos_t j = g; j > 0;) {
        --j;
        for (uint r = 0; r < H; ++r)
            v[r] += tail_vals[j * H + r];
        if (first_entry[(j + 1) * WG] != first_entry[j * WG])
            break;   // group j has a stop: the row began after it
    }
${emit("row", "v")}
}

% if sliced:
${signature("bccoo_combine")}
{
    const pos_t i = get_global_id(0);
    if (i >= n_rows)
        return;
    real_t s = 0;
    for (uint k = 0; k < ${slices}; ++k)
        s += partial[k * slice_stride + i];
${c.store_y("i", "s")}
}
% endif

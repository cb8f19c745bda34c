<%namespace name="c" file="common.mako"/>
## CSR, KB vectors at once, "lanes over k" (the GPU block kernel): KB / LC consecutive
## work-items share a row, each computing LC columns of the block (common.mako's
## lanes_row).  For each of the row's entries they all read the same (column, value),
## which the cache serves once, and read consecutive entries of that column's row of x
## (coalesced); they write consecutive entries of y.  No local memory, no reduction.
## KB is a power of two up to 32; the sums are real_t, so complex values work as in the
## one-vector kernels.
## lane_split = S > 1: S groups of a row's LPR lanes share its entries (group g takes
## entries g, g + S, ...: neighbouring groups read neighbouring entries), so a long row
## is S times shorter to walk; the groups' sums meet in local memory, where group 0 adds
## them in order (deterministic) and writes y.
## row_order: the row a group of lanes takes is row_order[its slot] (rows sorted by
## length in windows, formats/lanes.py's lane_order), so that a warp's rows end together.
<% split = lane_split %>\
${c.preamble()}
#define KB ${block_width}

${signature("csr_lanes_block")}
{
% if split == 1:
${c.lanes_row("slot" if row_order else "row")}
${c.lane_sums("s")}
% else:
<% lpr = block_width // lane_columns %>\
#define LC ${lane_columns}
#define LPR ${lpr}
#define SPLIT ${split}
    __local real_t shared_sums[${lanes_group} * LC];
    const long gid = get_global_id(0);
    const long ${"slot" if row_order else "row"} = gid >> ${(lpr * split).bit_length() - 1};
    const long lane = gid & (LPR - 1);
    const index_t part = (index_t)((gid >> ${lpr.bit_length() - 1}) & (SPLIT - 1));
    const uint lid = get_local_id(0);
${c.lane_sums("s")}
% endif
% if row_order:
    const long row = slot < n_rows ? (long)row_order[slot] : n_rows;
% endif
    if (row < n_rows) {
        const index_t end = row_ptr[row + 1];
% if col_bits == 16:
        // csr-vector's col_bits=16: the row's base plus each entry's 16-bit offset; with
        // col_escape, a row of a wide block (base -1 - the position of its first column
        // in col_wide) reads col_wide, in a loop of its own (a choice per entry is
        // slow: csr_vector.mako).
        const index_t base = row_base[row];
#define COLUMN(j) (base + (index_t)col_off[j])
% else:
#define COLUMN(j) col_idx[j]
% endif
% if col_bits == 16 and col_escape:
        const index_t wide_at = -1 - base - row_ptr[row];
#define WIDE(j) col_wide[(j) + wide_at]
% endif
        __global const real_t *xl = x + x_col + lane;
% if split == 1:
        index_t j = row_ptr[row];
#define STEP 1
% else:
        index_t j = row_ptr[row] + part;
#define STEP SPLIT
% endif
        // Two entries in turn, each with sums of its own: more loads of x in flight.
${c.lane_sums("t")}
<%def name="entries(col)">
        for (; j + STEP < end; j += 2 * STEP) {
            const real_t a = LOADV(j, values);
            const real_t b = LOADV(j + STEP, values);
            __global const real_t *xa = xl + (long)${col}(j) * ldx;
            __global const real_t *xb = xl + (long)${col}(j + STEP) * ldx;
${c.lane_fma("s", "a", "xa")}
${c.lane_fma("t", "b", "xb")}
        }
        if (j < end) {
            const real_t a = LOADV(j, values);
            __global const real_t *xa = xl + (long)${col}(j) * ldx;
${c.lane_fma("s", "a", "xa")}
        }
</%def>
% if col_bits == 16 and col_escape:
        if (base < 0) {
${entries("WIDE")}
        } else {
${entries("COLUMN")}
        }
% else:
${entries("COLUMN")}
% endif
${c.lane_add("s", "t")}
% if split == 1:
${c.store_y_lane("row", "s")}
    }
% else:
    }
% for v in range(lane_columns):
    shared_sums[lid * LC + ${v}] = s${v};
% endfor
    barrier(CLK_LOCAL_MEM_FENCE);
    if (part == 0 && row < n_rows) {
        for (uint g = 1; g < SPLIT; g++) {
% for v in range(lane_columns):
            s${v} += shared_sums[(lid + g * LPR) * LC + ${v}];
% endfor
        }
${c.store_y_lane("row", "s")}
    }
% endif
}

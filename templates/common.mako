## Shared definitions for every SpMV template.
<%def name="preamble()">
% if fp64_pragma:
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
typedef ${real_t} real_t;
typedef ${index_t} index_t;
## The value arithmetic every kernel writes through: MUL(a, b) is the product of two
## values, NONZERO(a) a scalar test (an OpenCL vector comparison would give a vector),
## CONJ(a) the conjugate.  Sums (+, +=), zero ((real_t)0) and copies are plain C for
## both kinds.  Complex values are real_t = float2/double2 (.x real, .y imaginary part,
## numpy's layout), part_t the type of a part; their product is written out in
## registers (no extension needed).
% if is_complex:
typedef ${part_t} part_t;
static inline real_t cmul(const real_t a, const real_t b)
{
    return (real_t)(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
#define MUL(a, b) cmul((a), (b))
// alpha or beta times a value: exact when the scalar is 1 (BLAS's convention; a
// product with 1 + 0j would make an Inf's other part 0 * Inf = NaN, scipy's not).
// (all() of a vector comparison: Oclgrind 21.10 crashes on .x == 1 && .y == 0, as
// NONZERO's note says)
#define SCALE(s, v) (all((s) == (real_t)(1, 0)) ? (v) : cmul((s), (v)))
// any() of the vector comparison: the same test as .x != 0 || .y != 0, which
// Oclgrind 21.10's --uninitialized crashes on (SIGSEGV).
#define NONZERO(a) any((a) != 0)
#define CONJ(a) ((real_t)((a).x, -(a).y))
% else:
typedef ${real_t} part_t;
#define MUL(a, b) ((a) * (b))
#define SCALE(s, v) ((s) * (v))
#define NONZERO(a) ((a) != 0)
#define CONJ(a) (a)
% endif
## The matrix's stored values (value_bits, formats/storage.py): value_t is the type of
## a value array, LOADV(k, p) reads element k of p as a real_t, STOREV(v, k, p) rounds
## the real_t v to value_t (to nearest even, as numpy's astype) and writes element k.
## Half values are read and written with vload_half/vstore_half_rte (core OpenCL: no
## cl_khr_fp16), a half pointer being the only use of the type allowed without it.
% if value_storage == "half":
#define value_t half
#define LOADV(k, p) ((real_t)vload_half((k), (p)))
% if is_double:
## Not vstore_half's double overload: Oclgrind 21.10's uninitialised-value checker
## marks what it writes as uninitialised (even a constant 0.0).  Rounding to float
## towards zero, with any lost bits kept as a sticky last bit ("round to odd"), then to
## half to nearest even gives the correctly rounded double -> half (float keeps 13 more
## bits than half; Boldo & Melquiond), as numpy's astype(float16) from float64.
static inline float half_ready(const double v)
{
    const float f = convert_float_rtz(v);
    return ((double)f == v) ? f : as_float(as_uint(f) | 1u);
}
#define STOREV(v, k, p) vstore_half_rte(half_ready(v), (k), (p))
% else:
#define STOREV(v, k, p) vstore_half_rte((v), (k), (p))
% endif
% elif value_storage == "float":
#define value_t float
#define LOADV(k, p) ((real_t)(p)[k])
#define STOREV(v, k, p) ((p)[k] = convert_float_rte(v))
% else:
#define value_t real_t
#define LOADV(k, p) ((p)[k])
#define STOREV(v, k, p) ((p)[k] = (v))
% endif
</%def>
## STREAMV(p) / STREAMI(p): the real_t / index_t at p, of a matrix array read once.
## With enabled (SpMVFormat.streamed_loads_ok: an NVIDIA GPU of compute capability 7.0+,
## real values at full width) through PTX's evict-first L1 policy, so that x's lines
## stay in L1 longer (kernels/evict_first.cl); plain reads otherwise.
<%def name="streamed_loads(enabled)">
% if enabled:
${helper("evict_first.cl")}
#define STREAMV(p) evict_first_${"f64" if is_double else "f32"}(p)
#define STREAMI(p) evict_first_${"s64" if index_t == "long" else "s32"}(p)
% else:
#define STREAMV(p) (*(p))
#define STREAMI(p) (*(p))
% endif
</%def>
## Store alpha*sum (+ beta*y) into y[row]. With beta == 0, y is never read, so
## whatever it held (even NaN) does not leak into the result (BLAS convention).
## beta is a kernel argument: the branch is uniform across the launch, and one
## compiled kernel serves both cases (half the builds of a specialisation).
<%def name="store_y(row, value)">
        y[${row}] = NONZERO(beta) ? SCALE(alpha, (${value})) + SCALE(beta, y[${row}])
                                  : SCALE(alpha, (${value}));
</%def>
## Multi-vector (block) kernels: KB vectors at once, KB a compile-time constant.  Row i
## of the x block is x[i*ldx + x_col + 0..KB-1] (contiguous), of the y block
## y[i*ldy + y_col + 0..KB-1]; a row's KB sums live in one realb_t, loaded and stored
## with LOADB/STOREB from BLANES elements of type lane_t, and a value multiplies them
## with MULB(value, sums):
##  - real values: realb_t is real_t (KB = 1) or the OpenCL vector real_tKB, lane_t is
##    real_t, BLANES = KB and MULB a plain `*`;
##  - complex values, KB = 1: realb_t = lane_t = real_t (float2/double2), MULB = MUL;
##  - complex values, KB > 1: realb_t is the vector part_t(2*KB) of the KB sums'
##    parts in numpy's order (re0, im0, re1, im1, ...), lane_t = part_t, BLANES = 2*KB,
##    and MULB multiplies by a complex scalar lane-wise: a.x*b + a.y*(-im0, re0, -im1,
##    re1, ...).  OpenCL vectors stop at 16 lanes, so complex blocks are at most 8 wide.
<%def name="block_preamble()">
<% wide_complex = is_complex and block_width > 1 %>\
#define KB ${block_width}
% if block_width == 1:
typedef real_t realb_t;
typedef real_t lane_t;
#define BLANES 1
#define LOADB(p) (*(p))
#define STOREB(v, p) (*(p) = (v))
#define MULB(a, b) MUL(a, b)
% elif not is_complex:
typedef ${real_t}${block_width} realb_t;
typedef real_t lane_t;
#define BLANES KB
#define LOADB(p) vload${block_width}(0, p)
#define STOREB(v, p) vstore${block_width}(v, 0, p)
#define MULB(a, b) ((a) * (b))
% else:
<%
    lanes = 2 * block_width
    digits = "0123456789abcdef"
    swapped = ", ".join(f"-b.s{digits[2 * i + 1]}, b.s{digits[2 * i]}"
                        for i in range(block_width))
%>\
typedef ${part_t}${lanes} realb_t;
typedef part_t lane_t;
#define BLANES ${lanes}
#define LOADB(p) vload${lanes}(0, p)
#define STOREB(v, p) vstore${lanes}(v, 0, p)
// KB complex products a * b_k, b's parts interleaved.
static inline realb_t cmulb(const real_t a, const realb_t b)
{
    return a.x * b + a.y * (realb_t)(${swapped});
}
#define MULB(a, b) cmulb((a), (b))
% endif
% if is_complex:
// A complex scalar times a row's sums: exact when it is 1, as SCALE.
#define SCALEB(s, v) (all((s) == (real_t)(1, 0)) ? (v) : MULB((s), (v)))
% endif
// Row `col` of the x block.
% if wide_complex:
#define XROW(col) LOADB((__global const lane_t *)(x + (long)(col) * ldx + x_col))
% else:
#define XROW(col) LOADB(x + (long)(col) * ldx + x_col)
% endif
</%def>
## Store alpha*acc (+ beta*y) into row `row` of the y block (y not read when beta == 0).
<%def name="store_y_block(row, value)">
% if not is_complex:
        {
            __global real_t *yr = y + (long)(${row}) * ldy + y_col;
            if (beta != 0)
                STOREB(alpha * (${value}) + beta * LOADB(yr), yr);
            else
                STOREB(alpha * (${value}), yr);
        }
% else:
        {
            __global lane_t *yr = (__global lane_t *)(y + (long)(${row}) * ldy + y_col);
            if (NONZERO(beta))
                STOREB(SCALEB(alpha, (${value})) + SCALEB(beta, LOADB(yr)), yr);
            else
                STOREB(SCALEB(alpha, (${value})), yr);
        }
% endif
</%def>
## The lanes block kernels (formats/lanes.py): LPR = KB / LC consecutive work-items
## share a row, `lane` computing the LC columns lane, lane + LPR, lane + 2*LPR, ... of
## the block (LC = lane_columns).  Several columns per work-item put several rows in a
## warp at k = 32, so more of X's row reads are in flight.  For one column offset the
## LPR lanes of a row read LPR consecutive entries of X's row (one cache sector or more).
## KB and LC are powers of two: shifts (a division and its remainder compile to LLVM's
## freeze, which Oclgrind's uninitialised-value checker cannot run).
<%def name="lanes_row(row='row')">
<% lpr = block_width // lane_columns %>#define LC ${lane_columns}
#define LPR ${lpr}
    const long gid = get_global_id(0);
    const long ${row} = gid >> ${lpr.bit_length() - 1};
    const long lane = gid & (LPR - 1);
</%def>
## Declare the LC sums `name`0, `name`1, ... of a work-item, zero.
<%def name="lane_sums(name)">
% for v in range(lane_columns):
        real_t ${name}${v} = (real_t)(0);
% endfor
</%def>
## Add value `a` times the work-item's LC entries of the X row starting at `xr` (a
## pointer already offset by x_col + lane) to the sums `name`0, `name`1, ...
<%def name="lane_fma(name, a, xr)">
% for v in range(lane_columns):
            ${name}${v} += MUL(${a}, (${xr})[${v} * LPR]);
% endfor
</%def>
## Add the sums `other`v into `name`v.
<%def name="lane_add(name, other)">
% for v in range(lane_columns):
        ${name}${v} += ${other}${v};
% endfor
</%def>
## Store alpha*sum`v` (+ beta*y) into the work-item's LC entries of row `row` of the y
## block.
<%def name="store_y_lane(row, name)">
        {
            __global real_t *yl = y + (long)(${row}) * ldy + y_col + lane;
% for v in range(lane_columns):
            yl[${v} * LPR] = NONZERO(beta) ? SCALE(alpha, ${name}${v}) + SCALE(beta, yl[${v} * LPR])
                                  : SCALE(alpha, ${name}${v});
% endfor
        }
</%def>

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
// any() of the vector comparison: the same test as .x != 0 || .y != 0, which
// Oclgrind 21.10's --uninitialized crashes on (SIGSEGV).
#define NONZERO(a) any((a) != 0)
#define CONJ(a) ((real_t)((a).x, -(a).y))
% else:
typedef ${real_t} part_t;
#define MUL(a, b) ((a) * (b))
#define NONZERO(a) ((a) != 0)
#define CONJ(a) (a)
% endif
</%def>
## Store alpha*sum (+ beta*y) into y[row]. With beta == 0, y is never read, so
## whatever it held (even NaN) does not leak into the result (BLAS convention).
## beta is a kernel argument: the branch is uniform across the launch, and one
## compiled kernel serves both cases (half the builds of a specialisation).
<%def name="store_y(row, value)">
        y[${row}] = NONZERO(beta) ? MUL(alpha, (${value})) + MUL(beta, y[${row}])
                                  : MUL(alpha, (${value}));
</%def>
## Multi-vector (block) kernels: KB vectors at once, KB a compile-time constant.  Row i
## of the x block is x[i*ldx + x_col + 0..KB-1] (contiguous), of the y block
## y[i*ldy + y_col + 0..KB-1]; a row's KB sums live in one realb_t (real_t, or the
## OpenCL vector type real_tKB), loaded and stored with vloadKB/vstoreKB.
<%def name="block_preamble()">
#define KB ${block_width}
% if block_width == 1:
typedef real_t realb_t;
#define LOADB(p) (*(p))
#define STOREB(v, p) (*(p) = (v))
% else:
typedef ${real_t}${block_width} realb_t;
#define LOADB(p) vload${block_width}(0, p)
#define STOREB(v, p) vstore${block_width}(v, 0, p)
% endif
// Row `col` of the x block.
#define XROW(col) LOADB(x + (long)(col) * ldx + x_col)
</%def>
## Store alpha*acc (+ beta*y) into row `row` of the y block (y not read when beta == 0).
<%def name="store_y_block(row, value)">
        {
            __global real_t *yr = y + (long)(${row}) * ldy + y_col;
            if (beta != 0)
                STOREB(alpha * (${value}) + beta * LOADB(yr), yr);
            else
                STOREB(alpha * (${value}), yr);
        }
</%def>

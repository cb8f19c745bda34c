## Shared definitions for every SpMV template.
<%def name="preamble()">
% if fp64_pragma:
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
typedef ${real_t} real_t;
typedef ${index_t} index_t;
</%def>
## Store alpha*sum (+ beta*y) into y[row]. With beta == 0, y is never read, so
## whatever it held (even NaN) does not leak into the result (BLAS convention).
## beta is a kernel argument: the branch is uniform across the launch, and one
## compiled kernel serves both cases (half the builds of a specialisation).
<%def name="store_y(row, value)">
        y[${row}] = (beta != 0) ? alpha * (${value}) + beta * y[${row}] : alpha * (${value});
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

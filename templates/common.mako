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

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
<%def name="store_y(row, value)">
% if use_beta:
        y[${row}] = alpha * (${value}) + beta * y[${row}];
% else:
        y[${row}] = alpha * (${value});
% endif
</%def>

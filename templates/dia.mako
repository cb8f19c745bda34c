<%namespace name="c" file="common.mako"/>
## DIA (Bell & Garland): one work-item per row; diagonal d of row i at d * stride + i,
## so a group reads consecutive addresses.  A slot is multiplied only if it holds a
## stored entry: a bit of its value set when no stored value was zero at conversion
## (padding is +0.0; update_values writes a new zero as -0.0), else its bit in `mask`
## (stored zeros must still turn x's inf/NaN into NaN, padding must not).
${c.preamble()}
% if not has_mask:
<% bits = "as_ulong" if is_double else "as_uint" %>
% if is_complex:
#define STORED(v) (${bits}((v).x) != 0 || ${bits}((v).y) != 0)
% else:
#define STORED(v) (${bits}(v) != 0)
% endif
% endif

${signature("dia")}
{
    const long row = get_global_id(0);
    if (row < n_rows) {
        real_t sum = 0;
        long slot = row;
        for (long d = 0; d < n_diags; ++d, slot += stride) {
            const real_t v = data[slot];
% if has_mask:
            if ((mask[slot >> 5] >> (slot & 31)) & 1u)
% else:
            if (STORED(v))
% endif
                sum += MUL(v, x[row + offsets[d]]);
        }
${c.store_y("row", "sum")}
    }
}

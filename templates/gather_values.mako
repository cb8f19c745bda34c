<%namespace name="c" file="common.mako"/>
## update_values for an operator converted on the device: its map is a copy of its own
## value arrays made from the codes of the CSR positions (formats/values.py,
## _CODE_BASE): slot i takes src[codes[i] - first], and a slot whose code is 0 (padding
## and other fill, +0.0) keeps what it holds.  Complex maps are read by their real
## parts (STRIDE 2).  Formats that tell stored zeros from fill by the sign bit
## (signed_zeros: bccoo, dia) get each zero as -0.0 (a complex one's real part), as
## values.mark_stored_zeros does on the host (a host pass over every value, here free).
${c.preamble()}
typedef ${code_t} code_t;
#define STRIDE ${stride}
% if not signed_zeros:
#define MARK(v) (v)
% elif is_complex:
#define MARK(v) (NONZERO(v) ? (v) : (real_t)(-(part_t)0, (part_t)0))
% else:
#define MARK(v) (NONZERO(v) ? (v) : -(real_t)0)
% endif

${signature("gather_values")}
{
    const size_t i = get_global_id(0);
    if (i < count) {
        const code_t code = codes[i * STRIDE];
        if (code != 0)
            dst[i] = MARK(src[(ulong)code - first]);
    }
}

<%namespace name="c" file="common.mako"/>
## update_values for an operator converted on the device: its map is a copy of its own
## value arrays made from the codes of the CSR positions (formats/values.py,
## _CODE_BASE): slot i takes src[codes[i] - first], and a slot whose code is 0 (padding
## and other fill, +0.0) keeps what it holds.  Complex maps are read by their real
## parts (STRIDE 2).
${c.preamble()}
typedef ${code_t} code_t;
#define STRIDE ${stride}

${signature("gather_values")}
{
    const size_t i = get_global_id(0);
    if (i < count) {
        const code_t code = codes[i * STRIDE];
        if (code != 0)
            dst[i] = src[(ulong)code - first];
    }
}

## sell's column reads, shared by its kernels (sell, sell_block, sell_lanes_block).
## col_bits=16: a slot holds a 16-bit offset from its slice's smallest column
## (col_base), 0xFFFF marking padding; col_bits=32: the column itself, -1 for padding.
## COL(k) is the column of slot k (-1 for padding) of the slice whose slice_base() ran.
## streamed: each read through common.mako's streamed_loads (its helper included first).

<%def name="columns(streamed=False)">\
% if col_bits == 16:
static inline index_t slot_column(const ushort offset, const index_t base)
{
    return offset == (ushort)0xFFFF ? (index_t)(-1) : base + (index_t)offset;
}
% if streamed:
#define COL(k) slot_column(evict_first_u16(col_off + (k)), col_base_s)
% else:
#define COL(k) slot_column(col_off[k], col_base_s)
% endif
% elif streamed:
#define COL(k) STREAMI(col_idx + (k))
% else:
#define COL(k) (col_idx[k])
% endif
</%def>

## The current slice's base, read once (slice must be a valid slice here).
<%def name="slice_base()">\
% if col_bits == 16:
        const index_t col_base_s = col_base[slice];
% endif
</%def>

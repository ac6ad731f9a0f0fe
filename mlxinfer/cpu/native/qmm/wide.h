// Whether the several-row tiles run 512-bit (tiles_wide.h: sixteen columns a vector; int8_wide.h: two columns a
// vector) or 256-bit. The bits are the same either way; only the speed differs by CPU. A Zen 5 retires a 512-bit
// FMA or VNNI instruction at the 256-bit rate, twice the work (measured: ~7.1 G a second a core at either width);
// an earlier Xeon VM issued 2.7 G 512-bit FMAs a second against 6.7 G 256-bit ones (docs/performance.md), where they
// would be slower; Zen 4 splits a 512-bit instruction in two.
#pragma once

namespace mlxinfer {

// Decided at first use: MLXINFER_QMM_WIDE=1 (on, true) or 0 (off, false) where it is set, else a ~1 ms timing of
// both widths on this CPU (512-bit where one 512-bit instruction costs under 1.5 256-bit ones). False
// without AVX-512F.
bool wide_tiles();
void set_wide_tiles(bool on);  // for the tests, which hold both forms to the same bits

}  // namespace mlxinfer

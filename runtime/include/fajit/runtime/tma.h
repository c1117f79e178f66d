// TMA tensor maps of two [B, H, L, D] operands for a Hopper kernel's producer (FaTmaPair,
// fajit/params.h). Nothing here knows about MLIR or code generation.
//
//   FaTmaPair maps = fa::rt::make_tma_pair(k, v, 128);  // the forward's K, V, tiles of 128 rows
//   void* args[] = {&p, &captures, &maps};
#pragma once

#include <cstdint>

#include "fajit/params.h"
#include "fajit/tensor.h"

namespace fa::rt {

// Both operands as 4-d tensor maps {D, L, H, B} with boxes of 64 columns x `rows` rows (128B
// swizzle, zero fill out of bounds); enabled = 0 (the kernel falls back to cp.async) when the
// driver does not take either tensor (a base address or stride that is not a multiple of 16
// bytes, or a stride of 0), and when the environment has FAJIT_TMA=0 (read per call: for A/B
// runs and tests of the cp.async path).
FaTmaPair make_tma_pair(const TensorView& a, const TensorView& b, int rows);

// The backward's contiguous fp32 dQ accumulator [batch, heads, len, dim] as a 4-d tensor map
// {dim, len, heads, batch} with boxes of 32 columns x `rows` rows (128B swizzle), for the Hopper
// dK/dV kernel's bulk reductions (FaTmaMap); enabled = 0 under FAJIT_TMA=0 or when the driver
// does not take it (the kernel then reduces row by row).
FaTmaMap make_tma_accum(float* data, int batch, int heads, int64_t len, int dim, int rows);

// The byte strides of a 16-bit [B, H, L, D] view's L, H and B dims as a tensor map takes them
// (multiples of 16 below 2^40; a size-1 dim gets the packed stride), or false: D not
// contiguous, a stride of 0 or not a multiple of 16 bytes.
bool tma_strides(const TensorView& t, uint64_t (&bytes)[3]);

}  // namespace fa::rt

// Filling the forward kernel's parameter block (fajit/params.h) from validated tensor views
// and a block mask. Nothing here knows about MLIR or code generation.
//
//   FaFwdParams p = fa::rt::make_fwd_params(q, k, v, o, &lse, 0.125f, mask);
//   void* args[] = {&p, &captures};
#pragma once

#include "fajit/block_mask.h"
#include "fajit/params.h"
#include "fajit/tensor.h"

namespace fa::rt {

// Validates the views (validate_attention) and copies pointers, element strides and sizes
// into FaFwdParams; `tables` is copied into params.mask as given.
FaFwdParams make_fwd_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView* lse, float scale,
                            const FaBlockTables& tables);

// Same, with the block mask checked against the shapes (check_compatible) and its device
// tables (uploaded to the current context on first use) filled in.
FaFwdParams make_fwd_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView* lse, float scale, const BlockMask& mask);

// The Hopper forward's K/V tensor maps (FaKvMaps) for tiles of block_n rows; enabled = 0 (the
// kernel falls back to cp.async) when the driver does not take either tensor (a base address
// or stride that is not a multiple of 16 bytes, or a stride of 0), and when the environment
// has FAJIT_TMA=0 (read per call: for A/B runs and tests of the cp.async path).
FaKvMaps make_kv_maps(const TensorView& k, const TensorView& v, int block_n);

}  // namespace fa::rt

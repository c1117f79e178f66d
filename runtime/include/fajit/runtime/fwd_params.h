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

}  // namespace fa::rt

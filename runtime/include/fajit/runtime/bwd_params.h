// Filling the backward kernels' parameter block (fajit/params.h, FaBwdParams) from validated
// tensor views, a block mask and the scratch the host allocated. Nothing here knows about
// MLIR or code generation.
//
//   FaBwdParams p = fa::rt::make_bwd_params(t, 0.125f, mask, delta, dq_accum);
//   void* args[] = {&p, &captures, &grads};
#pragma once

#include "fajit/block_mask.h"
#include "fajit/params.h"
#include "fajit/tensor.h"

namespace fa::rt {

// The tensors of one backward call (dlse optional).
struct BwdTensors {
  const TensorView *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv, *dlse;
};

// Validates (validate_attention_backward), checks the mask against the shapes and fills in
// pointers, element strides, sizes, the mask's transposed device tables and the scratch:
// delta [B, Hq, Lq] and dq_accum [B, Hq, Lq, Dqk], fp32, contiguous (a packed call sets
// delta_stride_b/h and the cu_seqlens itself).
FaBwdParams make_bwd_params(const BwdTensors& t, float scale, const BlockMask& mask, float* delta,
                            float* dq_accum);

}  // namespace fa::rt

#include "fajit/runtime/fwd_params.h"

namespace fa::rt {

FaFwdParams make_fwd_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView* lse, float scale,
                            const FaBlockTables& tables) {
  const AttentionShape s = validate_attention(q, k, v, o, lse);
  FaFwdParams p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = o.data;
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  p.q_stride_b = q.stride[0];
  p.q_stride_h = q.stride[1];
  p.q_stride_m = q.stride[2];
  p.k_stride_b = k.stride[0];
  p.k_stride_h = k.stride[1];
  p.k_stride_n = k.stride[2];
  p.v_stride_b = v.stride[0];
  p.v_stride_h = v.stride[1];
  p.v_stride_n = v.stride[2];
  p.o_stride_b = o.stride[0];
  p.o_stride_h = o.stride[1];
  p.o_stride_m = o.stride[2];
  p.lse_stride_b = lse ? lse->stride[0] : 0;
  p.lse_stride_h = lse ? lse->stride[1] : 0;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.len_q = s.len_q;
  p.len_kv = s.len_kv;
  p.scale = scale;
  p.mask = tables;
  return p;
}

FaFwdParams make_fwd_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView* lse, float scale, const BlockMask& mask) {
  const AttentionShape s = validate_attention(q, k, v, o, lse);
  mask.check_compatible(s.batch, s.heads_q, s.len_q, s.len_kv);
  FaBlockTables tables{};
  mask.fill(tables);
  return make_fwd_params(q, k, v, o, lse, scale, tables);
}

}  // namespace fa::rt

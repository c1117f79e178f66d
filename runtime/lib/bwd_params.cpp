#include "fajit/runtime/bwd_params.h"

namespace fa::rt {

FaBwdParams make_bwd_params(const BwdTensors& t, float scale, const BlockMask& mask, float* delta,
                            float* dq_accum) {
  const AttentionShape s =
      validate_attention_backward(*t.q, *t.k, *t.v, *t.o, *t.lse, *t.dout, *t.dq, *t.dk, *t.dv, t.dlse);
  mask.check_compatible(s.batch, s.heads_q, s.len_q, s.len_kv);
  FaBwdParams p{};
  p.q = t.q->data;
  p.k = t.k->data;
  p.v = t.v->data;
  p.o = t.o->data;
  p.dout = t.dout->data;
  p.lse = static_cast<const float*>(t.lse->data);
  p.dlse = t.dlse ? static_cast<const float*>(t.dlse->data) : nullptr;
  p.dq = t.dq->data;
  p.dk = t.dk->data;
  p.dv = t.dv->data;
  p.delta = delta;
  p.dq_accum = dq_accum;
  auto strides3 = [](const TensorView& v, long long& sb, long long& sh, long long& sm) {
    sb = v.stride[0], sh = v.stride[1], sm = v.stride[2];
  };
  strides3(*t.q, p.q_stride_b, p.q_stride_h, p.q_stride_m);
  strides3(*t.k, p.k_stride_b, p.k_stride_h, p.k_stride_n);
  strides3(*t.v, p.v_stride_b, p.v_stride_h, p.v_stride_n);
  strides3(*t.o, p.o_stride_b, p.o_stride_h, p.o_stride_m);
  strides3(*t.dout, p.do_stride_b, p.do_stride_h, p.do_stride_m);
  strides3(*t.dq, p.dq_stride_b, p.dq_stride_h, p.dq_stride_m);
  strides3(*t.dk, p.dk_stride_b, p.dk_stride_h, p.dk_stride_n);
  strides3(*t.dv, p.dv_stride_b, p.dv_stride_h, p.dv_stride_n);
  p.lse_stride_b = t.lse->stride[0];
  p.lse_stride_h = t.lse->stride[1];
  p.dlse_stride_b = t.dlse ? t.dlse->stride[0] : 0;
  p.dlse_stride_h = t.dlse ? t.dlse->stride[1] : 0;
  // delta / dq_accum: [B, Hq, Lq] contiguous (a packed call re-strides them to [Hq, total_q])
  p.delta_stride_h = s.len_q;
  p.delta_stride_b = (long long)s.heads_q * s.len_q;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.len_q = s.len_q;
  p.len_kv = s.len_kv;
  p.scale = scale;
  mask.fill_transposed(p.mask_t);
  mask.fill(p.mask);
  return p;
}

}  // namespace fa::rt

#include "fajit/runtime/fwd_params.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fajit/runtime/driver.h"

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

namespace {

// One [B, H, L, D] operand as a 4-d tensor map {D, L, H, B}; false if the driver refuses it.
bool encode_rows(FaTensorMap& map, const TensorView& t, int block_n) {
  static_assert(sizeof(FaTensorMap) == sizeof(CUtensorMap), "FaTensorMap must be a CUtensorMap");
  const int esize = 2;  // f16 / bf16 (validate_attention)
  const uint64_t dims[4] = {uint64_t(t.shape[3]), uint64_t(t.shape[2]), uint64_t(t.shape[1]),
                            uint64_t(t.shape[0])};
  if (t.stride[3] != 1) return false;
  cuuint64_t strides[3];  // bytes, dims 1..3 (n, h, b)
  int64_t packed = (int64_t(dims[0]) * esize + 15) / 16 * 16;
  for (int i = 0; i < 3; ++i) {
    // A size-1 dim is never stepped: give it the packed stride the driver expects of one.
    const int64_t bytes = dims[i + 1] == 1 ? packed : t.stride[2 - i] * esize;
    if (bytes <= 0 || bytes % 16 != 0) return false;
    strides[i] = cuuint64_t(bytes);
    packed = bytes * int64_t(dims[i + 1]);
  }
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  const cuuint64_t gdims[4] = {dims[0], dims[1], dims[2], dims[3]};
  const cuuint32_t box[4] = {64, cuuint32_t(block_n), 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  CUtensorMap m;
  const CUresult r = driver().cuTensorMapEncodeTiled(
      &m, t.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(t.data), gdims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(&map, &m, sizeof m);
  return true;
}

}  // namespace

FaKvMaps make_kv_maps(const TensorView& k, const TensorView& v, int block_n) {
  FaKvMaps maps;
  std::memset(&maps, 0, sizeof maps);
  if (const char* e = std::getenv("FAJIT_TMA"); e && std::strcmp(e, "0") == 0) return maps;
  maps.enabled = encode_rows(maps.k, k, block_n) && encode_rows(maps.v, v, block_n) ? 1 : 0;
  return maps;
}

}  // namespace fa::rt

// TMA tensor maps of attention operands for the Hopper kernels (fajit/params.h, FaTmaPair).
#include "fajit/runtime/tma.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fajit/runtime/driver.h"

namespace fa::rt {

bool tma_strides(const TensorView& t, uint64_t (&bytes)[3]) {
  const int esize = 2;  // f16 / bf16 (validate_attention)
  if (t.rank != 4 || t.stride[3] != 1) return false;
  int64_t packed = (t.shape[3] * esize + 15) / 16 * 16;
  for (int i = 0; i < 3; ++i) {  // dims L, H, B: element strides 2, 1, 0
    const int64_t extent = t.shape[2 - i];
    // A size-1 dim is never stepped: give it the packed stride the driver expects of one.
    const int64_t b = extent == 1 ? packed : t.stride[2 - i] * esize;
    if (b <= 0 || b % 16 != 0 || b >= (int64_t(1) << 40)) return false;
    bytes[i] = uint64_t(b);
    packed = b * extent;
  }
  return true;
}

namespace {

// One [B, H, L, D] operand as a 4-d tensor map {D, L, H, B}; false if the driver refuses it.
bool encode_rows(FaTensorMap& map, const TensorView& t, int rows) {
  static_assert(sizeof(FaTensorMap) == sizeof(CUtensorMap), "FaTensorMap must be a CUtensorMap");
  uint64_t sb[3];
  if (!tma_strides(t, sb)) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  const cuuint64_t strides[3] = {sb[0], sb[1], sb[2]};
  const cuuint64_t gdims[4] = {cuuint64_t(t.shape[3]), cuuint64_t(t.shape[2]), cuuint64_t(t.shape[1]),
                               cuuint64_t(t.shape[0])};
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1};
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

FaTmaPair make_tma_pair(const TensorView& a, const TensorView& b, int rows) {
  FaTmaPair maps;
  std::memset(&maps, 0, sizeof maps);
  if (const char* e = std::getenv("FAJIT_TMA"); e && std::strcmp(e, "0") == 0) return maps;
  maps.enabled = encode_rows(maps.a, a, rows) && encode_rows(maps.b, b, rows) ? 1 : 0;
  return maps;
}

}  // namespace fa::rt

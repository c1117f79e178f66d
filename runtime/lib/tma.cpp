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

// A 4-d tensor map {dims[0] (contiguous), dims[1], dims[2], dims[3]} with byte strides of
// dims 1..3, boxes of box_cols x box_rows, 128B swizzle; false if the driver refuses it.
bool encode_4d(FaTensorMap& map, CUtensorMapDataType type, void* data, const cuuint64_t (&dims)[4],
               const cuuint64_t (&strides)[3], cuuint32_t box_cols, cuuint32_t box_rows) {
  static_assert(sizeof(FaTensorMap) == sizeof(CUtensorMap), "FaTensorMap must be a CUtensorMap");
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
  const cuuint32_t box[4] = {box_cols, box_rows, 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  CUtensorMap m;
  const CUresult r = driver().cuTensorMapEncodeTiled(
      &m, type, 4, data, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(&map, &m, sizeof m);
  return true;
}

// One [B, H, L, D] operand as a 4-d tensor map {D, L, H, B}, boxes of 64 columns x `rows`.
bool encode_rows(FaTensorMap& map, const TensorView& t, int rows) {
  uint64_t sb[3];
  if (!tma_strides(t, sb)) return false;
  const cuuint64_t strides[3] = {sb[0], sb[1], sb[2]};
  const cuuint64_t dims[4] = {cuuint64_t(t.shape[3]), cuuint64_t(t.shape[2]), cuuint64_t(t.shape[1]),
                              cuuint64_t(t.shape[0])};
  return encode_4d(
      map, t.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      const_cast<void*>(t.data), dims, strides, 64, cuuint32_t(rows));
}

bool tma_disabled() {
  const char* e = std::getenv("FAJIT_TMA");
  return e && std::strcmp(e, "0") == 0;
}

}  // namespace

FaTmaPair make_tma_pair(const TensorView& a, const TensorView& b, int rows) {
  FaTmaPair maps;
  std::memset(&maps, 0, sizeof maps);
  if (tma_disabled()) return maps;
  maps.enabled = encode_rows(maps.a, a, rows) && encode_rows(maps.b, b, rows) ? 1 : 0;
  return maps;
}

FaTmaMap make_tma_accum(float* data, int batch, int heads, int64_t len, int dim, int rows) {
  FaTmaMap map;
  std::memset(&map, 0, sizeof map);
  if (tma_disabled() || data == nullptr || len <= 0) return map;
  const cuuint64_t row = cuuint64_t(dim) * sizeof(float);
  const cuuint64_t dims[4] = {cuuint64_t(dim), cuuint64_t(len), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {row, row * cuuint64_t(len), row * cuuint64_t(len) * cuuint64_t(heads)};
  map.enabled =
      encode_4d(map.map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, data, dims, strides, 32, cuuint32_t(rows)) ? 1 : 0;
  return map;
}

}  // namespace fa::rt

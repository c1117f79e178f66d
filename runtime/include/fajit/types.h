// fa::DType and fa::Stream: the plain values every layer above the driver names (tensor
// views, kernel specs, launches), without CUDA headers.
#pragma once

#include <cstdint>

#include "fajit/export.h"

struct CUstream_st;

namespace fa {

// A CUDA stream as the driver API spells it (CUstream); nullptr is the default stream.
using Stream = CUstream_st*;

enum class DType : uint8_t { f16, bf16, f32, i32, i64, u8, boolean };

FA_API const char* dtype_name(DType t);  // "f16", "bf16", "f32", "i32", "i64", "u8", "bool"
FA_API int dtype_size(DType t);          // bytes per element

}  // namespace fa

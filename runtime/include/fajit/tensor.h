// fa::TensorView: a non-owning view of a device tensor (pointer, dtype, shape, element
// strides), and the checks attention runs on its inputs before any launch.
//
//   fa::TensorView q(q_ptr, fa::DType::bf16, {B, H, L, 128});            // contiguous
//   fa::TensorView k(k_ptr, fa::DType::bf16, {B, H, L, 128}, {s0, s1, s2, 1});
//   fa::AttentionShape s = fa::validate_attention(q, k, v, o, &lse);   // throws fa::Error
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "fajit/export.h"
#include "fajit/types.h"

namespace fa {

constexpr int kMaxTensorRank = 4;

struct FA_API TensorView {
  void* data = nullptr;  // device address
  DType dtype = DType::f32;
  int rank = 0;
  int64_t shape[kMaxTensorRank] = {0, 0, 0, 0};
  int64_t stride[kMaxTensorRank] = {0, 0, 0, 0};  // in elements

  TensorView() = default;
  // Contiguous (row-major) strides. Throws fa::Error for more than 4 dimensions.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape);
  // Explicit element strides (must have as many entries as shape).
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides);
  TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape)
      : TensorView(const_cast<void*>(data), dtype, shape) {}
  TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides)
      : TensorView(const_cast<void*>(data), dtype, shape, strides) {}

  int64_t numel() const;
  std::string to_string() const;  // "bf16[2, 8, 1024, 64] strides [524288, 65536, 64, 1]"
};

// Whether some byte is addressed by both views, exactly: views that interleave without sharing
// an element (q, k and v as heads of one packed buffer, rows 0 and 2 against row 1) do not
// overlap; an empty view overlaps nothing. Layouts too irregular to decide within a few
// thousand steps count as not overlapping (as torch's own checks give up).
FA_API bool overlaps(const TensorView& a, const TensorView& b);

// A tensor of a call by the name its errors use; view may be null (an optional argument not
// given). With `key` (a capture's name), `name` is a pattern its "{}" takes the key into:
// {"capture '{}'", &view, &key}. Nothing is formatted unless an error names it.
struct NamedView {
  const char* name;
  const TensorView* view = nullptr;
  const std::string* key = nullptr;
};

// Refuses outputs that share memory (overlaps: a byte both address) with an input or with an
// earlier output: the kernels would read a value they or another CTA had already overwritten,
// or write one output over another. Throws fa::Error "<output>: its memory overlaps that of
// <other>; give it a buffer of its own", for the first output in order, checked against the
// inputs in order, then the outputs before it.
FA_API void check_outputs_apart(const std::vector<NamedView>& outputs, const std::vector<NamedView>& inputs);

// Sizes of one attention call, after validation.
struct AttentionShape {
  int batch = 0, heads_q = 0, heads_kv = 0, len_q = 0, len_kv = 0, dim_qk = 0, dim_v = 0;
  DType dtype = DType::bf16;
};

// Checks Q [B,Hq,Lq,Dqk], K [B,Hkv,Lkv,Dqk], V [B,Hkv,Lkv,Dv], O [B,Hq,Lq,Dv] and the optional
// LSE [B,Hq,Lq] (f32): ranks, matching sizes, dtypes (q/k/v/o equal, f16 or bf16),
// Hq % Hkv == 0, non-null 16-byte aligned pointers, contiguous last dimensions, row strides
// and head dims that keep 16-byte rows, positive sizes that fit int32. Throws fa::Error
// (kInvalidArgument) naming the tensor and the dimension.
FA_API AttentionShape validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& o, const TensorView* lse = nullptr);

// A per-row fp32 output beside validate_attention's LSE (`name`: "max_scores"): [B, Hq, Lq]
// as q's first three dimensions, f32, 4-byte aligned, contiguous Lq. Errors name it.
FA_API void validate_row_output(const char* name, const TensorView& t, const TensorView& q);

// The backward's tensors: validate_attention(q, k, v, o, &lse) with the LSE required, then
// each gradient like its primal (dout like o, dq like q, dk like k, dv like v: same sizes and
// dtype, 16-byte rows, any strides) and the optional dlse like lse. Errors name the argument
// ("dk: Lkv must match k (1000), got 999").
FA_API AttentionShape validate_attention_backward(const TensorView& q, const TensorView& k,
                                                  const TensorView& v, const TensorView& o,
                                                  const TensorView& lse, const TensorView& dout,
                                                  const TensorView& dq, const TensorView& dk,
                                                  const TensorView& dv, const TensorView* dlse = nullptr);

}  // namespace fa

// fa::Captures: the run-time values of a variant's captured buffers and scalars, by name,
// bound at launch (Kernel::forward, Kernel::block_mask) and read by the block-mask analysis.
//
//   fa::Captures cap;
//   cap.buffer("slopes", slopes_view).scalar("window", 1024);
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "fajit/export.h"
#include "fajit/tensor.h"

namespace fa {

// Buffers are device tensors; a scalar is f32 or i32 (an int given for an f32 scalar widens).
class FA_API Captures {
 public:
  Captures& buffer(const std::string& name, const TensorView& t);
  Captures& scalar(const std::string& name, float value);
  Captures& scalar(const std::string& name, int32_t value);
  Captures& scalar(const std::string& name, double value) { return scalar(name, static_cast<float>(value)); }

  struct Scalar {
    bool is_float;
    float f;
    int32_t i;
  };
  const std::map<std::string, TensorView>& buffers() const { return buffers_; }
  const std::map<std::string, Scalar>& scalars() const { return scalars_; }

 private:
  std::map<std::string, TensorView> buffers_;
  std::map<std::string, Scalar> scalars_;
};

}  // namespace fa

#include "fajit/captures.h"

namespace fa {

Captures& Captures::buffer(const std::string& name, const TensorView& t) {
  buffers_[name] = t;
  return *this;
}
Captures& Captures::scalar(const std::string& name, float value) {
  scalars_[name] = Scalar{true, value, 0};
  return *this;
}
Captures& Captures::scalar(const std::string& name, int32_t value) {
  scalars_[name] = Scalar{false, 0.0f, value};
  return *this;
}

}  // namespace fa

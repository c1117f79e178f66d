// Cache keys: XXH3-128 over named, length-prefixed parts, printed as 32 lowercase hex chars.
//
//   std::string key = fa::jit::KeyBuilder()
//                         .add("source", cuda_source)
//                         .add("templates", fa::jit::templates_version())
//                         .add("spec", spec_text)
//                         .add("arch", "sm_90a")
//                         .add("nvrtc", "13.0")
//                         .hex();
//
// Each part is hashed as  len(name) name len(value) value  (lengths as 8-byte little-endian),
// after a fixed domain tag, so no two different part lists hash the same input bytes:
// moving a byte from one part to the next, renaming a part or reordering parts all change
// the key.
#pragma once

#include <string>
#include <string_view>

namespace fa::jit {

class KeyBuilder {
 public:
  KeyBuilder();
  // Appends one named part. Order matters.
  KeyBuilder& add(std::string_view name, std::string_view value);
  // XXH3-128 of everything added so far, as 32 lowercase hex characters.
  std::string hex() const;

 private:
  std::string bytes_;
};

// The key of one generated kernel: the parts above, in that order.
std::string kernel_key(std::string_view source, std::string_view templates_version, std::string_view spec,
                       std::string_view arch, std::string_view nvrtc_version);

// A fingerprint of the embedded device templates (names and texts of every header in
// fa::detail::embedded_headers()): any template edit changes it, and with it every key.
const std::string& templates_version();

// True for strings KeyBuilder::hex() can produce (32 lowercase hex characters).
bool is_valid_key(std::string_view key);

}  // namespace fa::jit

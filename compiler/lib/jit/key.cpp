#include "fajit/jit/key.h"

#include <cstdint>

#include "fajit/detail/embedded_templates.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace fa::jit {
namespace {

constexpr std::string_view kDomainTag = "fajit-key-v1";

void append_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void append_part(std::string& out, std::string_view s) {
  append_u64(out, s.size());
  out.append(s.data(), s.size());
}

}  // namespace

KeyBuilder::KeyBuilder() { append_part(bytes_, kDomainTag); }

KeyBuilder& KeyBuilder::add(std::string_view name, std::string_view value) {
  append_part(bytes_, name);
  append_part(bytes_, value);
  return *this;
}

std::string KeyBuilder::hex() const {
  XXH128_hash_t h = XXH3_128bits(bytes_.data(), bytes_.size());
  static const char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kDigits[(h.high64 >> (4 * i)) & 0xf];
    out[31 - i] = kDigits[(h.low64 >> (4 * i)) & 0xf];
  }
  return out;
}

std::string kernel_key(std::string_view source, std::string_view templates_version, std::string_view spec,
                       std::string_view arch, std::string_view nvrtc_version) {
  return KeyBuilder()
      .add("source", source)
      .add("templates", templates_version)
      .add("spec", spec)
      .add("arch", arch)
      .add("nvrtc", nvrtc_version)
      .hex();
}

const std::string& templates_version() {
  static const std::string kVersion = [] {
    int n = 0;
    const detail::EmbeddedHeader* headers = detail::embedded_headers(&n);
    KeyBuilder kb;
    for (int i = 0; i < n; ++i) kb.add(headers[i].name, headers[i].text);
    return "tpl-" + kb.hex();
  }();
  return kVersion;
}

bool is_valid_key(std::string_view key) {
  if (key.size() != 32) return false;
  for (char c : key)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace fa::jit

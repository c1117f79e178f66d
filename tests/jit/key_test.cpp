#include "fajit/jit/key.h"

#include <gtest/gtest.h>

#include <set>

namespace {

using fa::jit::kernel_key;
using fa::jit::KeyBuilder;

TEST(Key, IsStable) {
  // Pinned (XXH3-128 canonical hex, checked against xxhash's XXH128_canonicalFromHash):
  // a change here invalidates every cache on disk, so it must be deliberate.
  EXPECT_EQ(kernel_key("src", "tpl", "spec", "sm_90a", "13.0"), "7169be6608e002c2ccfdc693bd1cdd15");
  EXPECT_EQ(KeyBuilder().hex(), "37a99c46d6c4b35e69b16c3eeb387353");
  EXPECT_EQ(kernel_key("src", "tpl", "spec", "sm_90a", "13.0"),
            kernel_key("src", "tpl", "spec", "sm_90a", "13.0"));
}

TEST(Key, IsValidKey) {
  EXPECT_TRUE(fa::jit::is_valid_key(kernel_key("a", "b", "c", "d", "e")));
  EXPECT_FALSE(fa::jit::is_valid_key(""));
  EXPECT_FALSE(fa::jit::is_valid_key("0123456789ABCDEF0123456789abcdef"));
  EXPECT_FALSE(fa::jit::is_valid_key("0123456789abcdef0123456789abcde"));
  EXPECT_FALSE(fa::jit::is_valid_key("../23456789abcdef0123456789abcdef"));
}

TEST(Key, EveryPartMatters) {
  std::set<std::string> keys = {
      kernel_key("src", "tpl", "spec", "sm_90a", "13.0"),
      kernel_key("src ", "tpl", "spec", "sm_90a", "13.0"),
      kernel_key("src", "tpl2", "spec", "sm_90a", "13.0"),
      kernel_key("src", "tpl", "spec2", "sm_90a", "13.0"),
      kernel_key("src", "tpl", "spec", "sm_80", "13.0"),
      kernel_key("src", "tpl", "spec", "sm_90a", "12.8"),
  };
  EXPECT_EQ(keys.size(), 6u);
}

TEST(Key, PartBoundariesAndNamesMatter) {
  EXPECT_NE(KeyBuilder().add("a", "bc").hex(), KeyBuilder().add("a", "b").add("", "c").hex());
  EXPECT_NE(KeyBuilder().add("ab", "c").hex(), KeyBuilder().add("a", "bc").hex());
  EXPECT_NE(KeyBuilder().add("x", "1").add("y", "2").hex(), KeyBuilder().add("y", "2").add("x", "1").hex());
  EXPECT_NE(KeyBuilder().add("source", "s").hex(), KeyBuilder().add("spec", "s").hex());
  EXPECT_NE(KeyBuilder().add("a", std::string("\0", 1)).hex(), KeyBuilder().add("a", "").hex());
}

TEST(Key, TemplatesVersion) {
  const std::string& v = fa::jit::templates_version();
  EXPECT_EQ(v.rfind("tpl-", 0), 0u);
  EXPECT_EQ(v.size(), 4u + 32u);
  EXPECT_EQ(&v, &fa::jit::templates_version());
}

}  // namespace

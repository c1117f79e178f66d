// What a mask's walk costs the three-consumer Hopper forward (192-row query blocks, 64 rows a
// warpgroup), counted from its regrouped tables on the CPU: the tile steps, and per step how many
// warpgroups compute (their 64-row sub-block is not empty and their rows exist). A warpgroup with
// nothing to compute still takes its turns, so a step with one live warpgroup costs about 0.45 of
// a full one and with two about 0.75 (H200, d64: NOTES-sm90, "The partial query block first").
//   build/bench/fajit_bench_walk [--len L] [--window W]
// Prints, for causal, sliding W and prefix-LM W at Lq = Lkv = L (default 4096, W 1024), the
// regrouping as the forward takes it (led by 128 rows where Lq % 192 is 64: detail::lead_rows)
// and the plain one, with the weighted steps.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fajit/block_mask.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"

namespace {

struct Steps {
  long steps = 0, live[4] = {0, 0, 0, 0};
  double weighted() const { return live[3] + 0.75 * live[2] + 0.45 * live[1] + 0.2 * live[0]; }
};

Steps count(const fa::BlockMask& r, int len_q) {
  Steps s;
  const int nkv = r.num_kv_blocks();
  for (int i = 0; i < r.num_q_blocks(); ++i)
    for (int j = 0; j < nkv; ++j) {
      const fa::BlockKind k = r.kind(0, 0, i, j);
      if (k == fa::BlockKind::kEmpty) continue;
      ++s.steps;
      int n = 0;
      for (int c = 0; c < 3; ++c) {
        const long row0 = 192L * i - r.q_offset() + 64L * c;
        if (row0 < 0 || row0 >= len_q) continue;
        const unsigned sub =
            k == fa::BlockKind::kFull ? 2u : (r.sub_kinds()[size_t(i) * nkv + j] >> (2 * c)) & 3u;
        n += sub != 0;
      }
      ++s.live[n];
    }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int len = 4096, window = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--len")) len = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--window")) window = std::atoi(argv[i + 1]);
  }
  struct Mask {
    std::string name;
    fa::MaskMod mod;
    fa::Captures cap;
  };
  fa::Captures sliding_cap, prefix_cap;
  sliding_cap.scalar("window", window);
  prefix_cap.scalar("prefix", window);
  const Mask masks[] = {{"causal", fa::mods::causal(), {}},
                        {"sliding " + std::to_string(window), fa::mods::sliding_window(), sliding_cap},
                        {"prefix-LM " + std::to_string(window), fa::mods::prefix_lm(), prefix_cap}};
  std::printf("Lq = Lkv = %d, 192x128 tiles: steps, steps by live warpgroups 0/1/2/3, weighted\n", len);
  for (const Mask& m : masks) {
    const fa::BlockMask mask = fa::create_block_mask(m.mod, 1, 1, len, len, m.cap);
    const int lead = len % 192 == 64 ? 128 : 0;
    for (int l : {0, lead}) {
      const Steps s = count(l ? mask.regrouped_led(192, 128, l) : mask.regrouped(192, 128), len);
      std::printf("%-16s lead %3d: %5ld  %ld/%ld/%ld/%ld  %.1f\n", m.name.c_str(), l, s.steps, s.live[0],
                  s.live[1], s.live[2], s.live[3], s.weighted());
      if (!lead) break;
    }
  }
}

// The block walks of templates/fajit/block_walk.cuh compiled with the host compiler and run,
// without a GPU: the deterministic backward's DescendingCursor (every role of the Hopper dK/dV
// kernel walks a CTA's query tiles with it in deterministic mode) must visit exactly the tiles
// TileCursor visits (and both the tiles the lists name, counted directly), each once, with the same full /
// partial kind, in descending order where the tables list each kind's blocks ascending (as fajit builds
// them), and every tile once whatever the lists' order. Random rows: block sizes 64 to 512 over tiles of 64
// and 128, lengths inside, at and past the blocks' edges, empty lists, and shuffled lists.
#include <gtest/gtest.h>

#include <string>

#include "host_mods.h"

namespace {

// What every check program starts with: block_walk.cuh and host block tables built row by row.
constexpr const char* kPrologue = R"(
#include <algorithm>
#include <random>
#include <tuple>
static inline int min(int a, int b) { return a < b ? a : b; }
#include "fajit/block_walk.cuh"

// Host block tables of `rows` rows of `nblk` entries: each row's partial and full lists, in the
// order added.
struct Rows {
  int nblk;
  std::vector<int> num_p, num_f, idx_p, idx_f;
  Rows(int rows, int nblk_)
      : nblk(nblk_), num_p(rows), num_f(rows), idx_p(size_t(rows) * nblk_, -7), idx_f(size_t(rows) * nblk_, -7) {}
  void add(int row, int blk, bool full) {
    if (full)
      idx_f[size_t(row) * nblk + num_f[row]++] = blk;
    else
      idx_p[size_t(row) * nblk + num_p[row]++] = blk;
  }
  // The tables as the kernels read them (with_full false: null full_* tables).
  FaBlockTables tables(int col_block, int num_q_blocks, long long stride_b, long long stride_h, bool with_full) {
    FaBlockTables bt{};
    bt.kv_num_blocks = num_p.data();
    bt.kv_indices = idx_p.data();
    bt.full_kv_num_blocks = with_full ? num_f.data() : nullptr;
    bt.full_kv_indices = with_full ? idx_f.data() : nullptr;
    bt.row_stride_b = stride_b;
    bt.row_stride_h = stride_h;
    bt.num_q_blocks = num_q_blocks;
    bt.num_kv_blocks = nblk;
    bt.q_block = 128;
    bt.kv_block = col_block;
    return bt;
  }
};
)";

// Every check program's main: 20000 rounds of check<64> and check<128> from `seed`, stopping at
// 5 failures; prints "all rounds agree" when none failed.
std::string driver(int seed) {
  return R"(
int main() {
  std::mt19937 rng()" +
         std::to_string(seed) + R"();
  int bad = 0;
  for (int round = 0; round < 20000 && bad < 5; ++round)
    bad += round % 2 ? check<64>(rng, round) : check<128>(rng, round);
  std::printf("%s\n", bad ? "FAILED" : "all rounds agree");
  return bad ? 1 : 0;
}
)";
}

// Compiles kPrologue + `checks` (defining check<kTile>(rng, round): 0 or 1) + driver(seed) on the
// host and runs it; the test fails with the program's output unless every round agreed.
void run_walk_checks(const char* tag, const std::string& checks, int seed) {
  fa_test::HostRun r = fa_test::run_on_host(tag, kPrologue + checks + driver(seed));
  ASSERT_TRUE(r.compiled) << r.command << "\n" << r.compile_log;
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("all rounds agree"), std::string::npos) << r.output;
  if (!::testing::Test::HasFailure()) r.remove();
}

TEST(BlockWalkHost, DescendingCursorVisitsTileCursorsTilesInDescendingOrder) {
  run_walk_checks("fajit-block-walk", R"(
struct Tile { int start; bool full; };

template <int kTile>
int check(std::mt19937& rng, int round) {
  const int col_block = kTile * (1 + int(rng() % 4));  // 1-4 tiles a block
  const int n_blocks_total = 1 + int(rng() % 40);
  // each block empty, partial or full
  std::vector<int> partial, full;
  for (int i = 0; i < n_blocks_total; ++i) {
    const unsigned k = rng() % 3;
    if (k == 1) partial.push_back(i);
    if (k == 2) full.push_back(i);
  }
  const bool shuffled = rng() % 4 == 0;
  if (shuffled) {
    std::shuffle(partial.begin(), partial.end(), rng);
    std::shuffle(full.begin(), full.end(), rng);
  }
  // len: anywhere from before the last block to past the row, often at a tile or block edge
  const int span = n_blocks_total * col_block;
  int len = 1 + int(rng() % (span + col_block));
  if (rng() % 3 == 0) len = (len / kTile) * kTile + (int(rng() % 3) - 1);
  if (len < 1) len = 1;
  Rows rows(1, n_blocks_total);
  for (int blk : partial) rows.add(0, blk, false);
  for (int blk : full) rows.add(0, blk, true);
  const FaBlockTables bt = rows.tables(col_block, 1, 0, 0, true);
  const fa::BlockWalk<kTile> walk(bt, 0, 0, 0);
  std::vector<Tile> want, got;
  for (fa::TileCursor<kTile> c(walk, len); !c.done(walk); c.next(walk, len)) want.push_back({c.start, c.is_full(walk)});
  for (fa::DescendingCursor<kTile> c(walk, len); !c.done(walk); c.next(walk, len)) {
    got.push_back({c.start, c.is_full(walk)});
    if (got.size() > want.size() + 1) break;
  }
  auto fail = [&](const char* what) {
    std::printf("round %d tile %d block %d len %d blocks %d%s: %s (TileCursor %zu tiles, DescendingCursor %zu)\n",
                round, kTile, col_block, len, n_blocks_total, shuffled ? " shuffled" : "", what, want.size(),
                got.size());
    return 1;
  };
  if (got.size() != want.size()) return fail("tile counts differ");
  for (const Tile& t : got)
    if (t.start < 0 || t.start >= len || t.start % kTile != 0) return fail("a tile outside the row or off the grid");
  if (!shuffled)
    for (size_t i = 1; i < got.size(); ++i)
      if (got[i].start >= got[i - 1].start) return fail("not descending");
  auto by_start = [](const Tile& a, const Tile& b) { return a.start < b.start; };
  std::sort(want.begin(), want.end(), by_start);
  std::sort(got.begin(), got.end(), by_start);
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].start != want[i].start || got[i].full != want[i].full) return fail("tiles or kinds differ");
  // and both against the rows' tiles counted directly: every listed block's tiles inside len
  std::vector<Tile> all;
  for (int f = 0; f < 2; ++f)
    for (int blk : f ? full : partial)
      for (int t = 0; t < col_block / kTile; ++t)
        if (blk * col_block + t * kTile < len) all.push_back({blk * col_block + t * kTile, f == 1});
  std::sort(all.begin(), all.end(), by_start);
  if (all.size() != got.size()) return fail("tile count differs from the tables' own");
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].start != got[i].start || all[i].full != got[i].full) return fail("tiles differ from the tables' own");
  return 0;
}
)",
                  5601);
}

// Deterministic mode's GroupTileWalk (one cursor over a GQA group's heads) against the two loop
// nests it stands for: with `interleave` every head at each DescendingCursor tile of head h0's
// row (tables broadcast over heads), else each head's DescendingCursor walk in turn over tables of
// its own (heads with no tile, or none at all, included), at any batch and key-block row of
// tables with several of each, with and without full blocks (null full_* tables).
TEST(BlockWalkHost, GroupTileWalkIsTheNestedLoopsOrder) {
  run_walk_checks("fajit-group-walk", R"(
using Step = std::tuple<int, int, bool>;  // head, start, full

template <int kTile>
int check(std::mt19937& rng, int round) {
  const int col_block = kTile * (1 + int(rng() % 3));
  const int nblk = 1 + int(rng() % 24);
  const int group = 1 + int(rng() % 8), h0 = int(rng() % 3) * group, heads = h0 + group;
  const bool interleave = rng() % 2 == 0;
  // several batches and query-block rows a head (the walk's own row: batch b, key block row0)
  const int nb = 1 + int(rng() % 3), nrow = 1 + int(rng() % 3);
  const int b = int(rng() % nb), row0 = 128 * int(rng() % nrow);
  const int per_b = (interleave ? 1 : heads) * nrow;  // broadcast tables: one set of rows for every head
  Rows rows(nb * per_b, nblk);
  const bool no_full = rng() % 5 == 0;  // tables without full blocks (null full_*)
  for (int r = 0; r < nb * per_b; ++r) {
    const unsigned density = rng() % 4;  // some heads with nothing at all
    for (int i = 0; i < nblk; ++i) {
      const unsigned k = density == 0 ? 0 : rng() % (no_full ? 2 : 3);
      if (k != 0) rows.add(r, i, k == 2);
    }
  }
  const int len = 1 + int(rng() % (nblk * col_block + col_block));
  const FaBlockTables bt = rows.tables(col_block, nrow, per_b, interleave ? 0 : nrow, !no_full);
  std::vector<Step> want, got;
  if (interleave) {
    const fa::BlockWalk<kTile> w(bt, b, h0, row0);
    for (fa::DescendingCursor<kTile> c(w, len); !c.done(w); c.next(w, len))
      for (int h = h0; h < heads; ++h) want.emplace_back(h, c.start, c.is_full(w));
  } else {
    for (int h = h0; h < heads; ++h) {
      const fa::BlockWalk<kTile> w(bt, b, h, row0);
      for (fa::DescendingCursor<kTile> c(w, len); !c.done(w); c.next(w, len)) want.emplace_back(h, c.start, c.is_full(w));
    }
  }
  for (fa::GroupTileWalk<kTile> w(bt, b, h0, group, row0, len, interleave); !w.done(); w.next()) {
    got.emplace_back(w.hq, w.start(), w.is_full());
    if (got.size() > want.size() + 1) break;
  }
  if (got != want) {
    std::printf("round %d tile %d block %d len %d group %d from %d %s: %zu steps, want %zu\n", round, kTile,
                col_block, len, group, h0, interleave ? "interleaved" : "head by head", got.size(), want.size());
    return 1;
  }
  return 0;
}
)",
                  5602);
}

}  // namespace

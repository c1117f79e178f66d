// fa::BlockMask: flex_attention's block-sparse tables.
//
// The (Lq x Lkv) score matrix is cut into q_block x kv_block tiles. A tile is FULL when
// mask_mod holds for every in-range element, EMPTY when it holds for none, PARTIAL otherwise
// (elements past Lq / Lkv in a tail tile are ignored; kernels bounds-check tail tiles).
// Tables (int32, contiguous), with Bm in {1, B} and Hm in {1, H} (1 = broadcast):
//   kv_num_blocks [Bm, Hm, nq]      kv_indices [Bm, Hm, nq, nkv]   partial tiles of a q row
//   full_kv_num_blocks, full_kv_indices (same shapes)               full tiles of a q row
//   q_num_blocks  [Bm, Hm, nkv]     q_indices  [Bm, Hm, nkv, nq]   partial tiles of a kv col
//   full_q_num_blocks, full_q_indices (same shapes)                 (for the backward)
// Index rows list block numbers in ascending order and are padded with 0 after their count.
// A mask keeps `kinds`; the tables are built from it on first use (a host getter, fill() or
// device_tables()), each table set once, thread-safely: the forward needs only the kv tables,
// and fill() builds and uploads those straight to the device without keeping host copies.
//
//   auto m = fa::BlockMask::from_kinds(1, 1, 1000, 1000, kinds);   // 0 empty 1 partial 2 full
//   m.check_compatible(B, H, Lq, Lkv);
//   std::cout << m.to_string();
//   FaBlockTables t; m.fill(t);                                    // device tables
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fajit/export.h"
#include "fajit/params.h"
#include "fajit/types.h"

namespace fa {

// A tile's kind, with the byte values of the kernel ABI (params.h). A BlockMask holds only
// empty, partial and full tiles; kUndecided marks tiles a symbolic analysis left open (the
// GPU builder's BlockMaskBuildOptions::known, fa::MaskAnalysis::kinds).
enum class BlockKind : uint8_t {
  kEmpty = kFaBlockEmpty,
  kPartial = kFaBlockPartial,
  kFull = kFaBlockFull,
  kUndecided = kFaBlockUndecided,
};

struct BlockMaskDensity {
  double fraction = 0;  // non-empty tiles / all tiles
  int64_t full = 0, partial = 0, empty = 0;
};

// Device addresses of all eight tables in one context (valid while the mask lives).
struct BlockMaskDeviceTables {
  const int* kv_num_blocks = nullptr;
  const int* kv_indices = nullptr;
  const int* full_kv_num_blocks = nullptr;
  const int* full_kv_indices = nullptr;
  const int* q_num_blocks = nullptr;
  const int* q_indices = nullptr;
  const int* full_q_num_blocks = nullptr;
  const int* full_q_indices = nullptr;
};

class FA_API BlockMask {
 public:
  static constexpr int kDefaultBlock = 128;

  // An unusable mask (valid() is false); every other member throws.
  BlockMask() = default;

  // From a dense per-tile classification `kinds` [Bm, Hm, nq, nkv] (BlockKind values, no kUndecided),
  // nq = ceil(len_q / q_block), nkv = ceil(len_kv / kv_block). This is what the GPU builder
  // and a symbolic analysis produce.
  static BlockMask from_kinds(int batch, int heads, int64_t len_q, int64_t len_kv,
                              const std::vector<uint8_t>& kinds, int q_block = kDefaultBlock,
                              int kv_block = kDefaultBlock);
  // The same, taking `kinds` without a copy.
  static BlockMask from_kinds(int batch, int heads, int64_t len_q, int64_t len_kv,
                              std::vector<uint8_t>&& kinds, int q_block = kDefaultBlock,
                              int kv_block = kDefaultBlock);

  // From host kv tables in flex's layout (see above); full_* may be empty (no full tiles).
  // Each row's first kv_num_blocks entries are used, in any order; the q_* transposes are
  // computed. Throws on out-of-range counts or indices and on tiles listed twice.
  static BlockMask from_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                  const std::vector<int32_t>& kv_num_blocks,
                                  const std::vector<int32_t>& kv_indices,
                                  const std::vector<int32_t>& full_kv_num_blocks,
                                  const std::vector<int32_t>& full_kv_indices, int q_block = kDefaultBlock,
                                  int kv_block = kDefaultBlock);

  // Over kv tables that stay on the device, in flex's layout as from_kv_blocks takes them (int32,
  // contiguous, in the current context; full_* null for no full tiles). The forward and decoding
  // kernels read them in place: building the mask copies nothing and waits for nothing, so a
  // mask made per call (a decoding step's slice of a larger mask, by a position on the GPU)
  // costs no sync, and a launch with it can be captured in a CUDA graph (replays read the
  // tables' values at replay time). The caller keeps the tables alive while the mask lives and
  // their entries valid. They are checked, from a copy (after cuCtxSynchronize), where the host
  // needs them: kinds(), density(), to_string() and the host getters read one snapshot taken at
  // the first such call; FAJIT_CHECK_DEVICE_TABLES=1 checks them at every fill(). What a call
  // needs beyond the kv tables (the backward's transposed tables, a tile that splits the blocks)
  // fa::Kernel derives from them on the device at each call (fa::rt::derive_device_kinds: bad
  // entries are skipped there, never read out of bounds), in the call's stream order, with no
  // sync; regrouped() refuses (host_copy() is the tables as they are now).
  static BlockMask from_device_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                         const int32_t* kv_num_blocks, const int32_t* kv_indices,
                                         const int32_t* full_kv_num_blocks, const int32_t* full_kv_indices,
                                         int q_block = kDefaultBlock, int kv_block = kDefaultBlock);
  // Whether the mask reads tables kept on the device (from_device_kv_blocks).
  bool on_device() const;
  // The mask's tables as they are now, as a host mask: for a device-table mask one copy (after
  // cuCtxSynchronize, in its own context), checked as from_kv_blocks checks; a host mask itself.
  // Inside a CUDA-graph capture that copy fails with the driver's error.
  BlockMask host_copy() const;

  // Whether the mask was classified on the device with its tables built there: what
  // fa::create_block_mask, BlockMaskFactory::build and Kernel::block_mask return where the GPU
  // evaluates mask_mod. Building one copies nothing to the host and waits for nothing, so a
  // mask made every training step costs no sync; the kernels read its tables in place (the
  // backward's transposed ones too) and regrouped() regroups it on the device. It is ordered on
  // the stream it was built on, as any stream-ordered allocation is: the builder reads the
  // captures there after the call returns (keep them unchanged until it has run), the tables are
  // ready once that stream has run it (use the mask there, or order other streams after it), and
  // its memory is freed there when the mask goes (order that stream after every use on another
  // one before letting the mask go, and keep it alive while the mask lives). It lives in its
  // builder's CUDA context (another context's launches get an error). Not built while its stream
  // captures a CUDA graph (an error): build it before, the graph's launches read it in place.
  // kinds(), density(), to_string() and the host getters read one copy of its kinds, made at the
  // first such call (after cuCtxSynchronize); host_copy() is a host mask of them.
  bool built_on_device() const;
  // A built-on-device mask over `kinds` (fajit/runtime/block_mask_builder.h), of Bm = batch and
  // Hm = heads, in the current context. fa::rt::build_block_mask makes them.
  struct DeviceKinds;
  static BlockMask from_device_kinds(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                                     int kv_block, std::shared_ptr<const DeviceKinds> kinds);

  // Every tile full (no mask_mod).
  static BlockMask all_full(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block = kDefaultBlock,
                            int kv_block = kDefaultBlock);

  bool valid() const { return state_ != nullptr; }
  int batch() const;  // Bm: 1 (broadcast) or B
  int heads() const;  // Hm: 1 (broadcast) or H
  int64_t len_q() const;
  int64_t len_kv() const;
  int q_block() const;
  int kv_block() const;
  int num_q_blocks() const;
  int num_kv_blocks() const;

  BlockKind kind(int b, int h, int q_blk, int kv_blk) const;
  const std::vector<uint8_t>& kinds() const;  // [Bm, Hm, nq, nkv]
  // A regrouped mask's tiles split into 64-row sub-blocks (regrouped() below), [Bm, Hm, nq, nkv]:
  // sub-block c's kind at bits 2c..2c+1 (0 past len_q), the join of the original tiles it
  // overlaps. Empty unless the mask came from regrouped() into a q_block of 128, 192 or 256
  // other than its own.
  const std::vector<uint8_t>& sub_kinds() const;

  const std::vector<int32_t>& kv_num_blocks() const;
  const std::vector<int32_t>& kv_indices() const;
  const std::vector<int32_t>& full_kv_num_blocks() const;
  const std::vector<int32_t>& full_kv_indices() const;
  const std::vector<int32_t>& q_num_blocks() const;
  const std::vector<int32_t>& q_indices() const;
  const std::vector<int32_t>& full_q_num_blocks() const;
  const std::vector<int32_t>& full_q_indices() const;

  BlockMaskDensity density() const;

  // A header line, then one line per q block with one character per kv block:
  // '#' full, '+' partial, '.' empty (of the tables of batch b, head h).
  std::string to_string(int b = 0, int h = 0) const;

  // Whether the tiles agree with the mask_mod the mask runs with, element by element: full tiles
  // where mask_mod holds for every in-range element, empty ones where it holds for none. Masks
  // built from a mask_mod (fa::Kernel::block_mask, fa::create_block_mask) are marked so; tables
  // given as such (from_kinds, from_kv_blocks, all_full) are not, since flex_attention lets a
  // full or empty tile override mask_mod.
  bool matches_mask_mod() const;
  // Marks (or unmarks) the mask as agreeing with its mask_mod (above). Call before sharing it.
  BlockMask& set_matches_mask_mod(bool matches = true);
  // This mask regrouped into blocks of q_block x kv_block (multiples of 16): a tile is full
  // where every tile it overlaps is full, empty where every one is empty, else partial, so the
  // mask_mod decides its elements. Built once per size and kept with this mask (thread-safe).
  // Returns *this for the mask's own block sizes; splits blocks (block sizes that divide the
  // mask's) whatever the tables, since each part keeps its block's kind; merges them only where
  // regroupable(). The Hopper forward runs 128x128 masks this way on its 192x128 tile (head dims
  // up to 64; up to 128 with P through shared memory: the default at 113-128 without mods, else
  // where the tuner takes it) and its 192x112 tile (up to 96); its consumer warpgroups (64 rows
  // each) skip the partial tiles whose sub-block (sub_kinds()) is empty, and apply no mask_mod
  // where it is full.
  // It also splits wider kv blocks to its BLOCK_N (one tile a block): a mask of 128-key blocks
  // on a 64-key tile (V head dims above 128) holds a second set of tables (8 bytes a tile, built
  // and uploaded on the first call with that tile: ~20 ms a million tiles on the 2-core build box).
  // A built-on-device mask is regrouped on the device, on the stream it was built on, or with
  // the second form on `stream` (a kernel call's), once per size and stream: later uses on that
  // stream are ordered after it. The regrouping's memory is freed on that stream when the mask
  // goes. Not while `stream` captures a CUDA graph: use regrouped_now() there.
  const BlockMask& regrouped(int q_block, int kv_block) const;
  const BlockMask& regrouped(int q_block, int kv_block, Stream stream) const;
  // A regrouping made now on `stream` and kept only by the result (a built-on-device mask's is
  // freed on `stream` when the result goes): what a launch captured into a CUDA graph reads, its
  // memory and kernels part of the graph. For other masks, regrouped(q_block, kv_block).
  BlockMask regrouped_now(int q_block, int kv_block, Stream stream) const;
  // regrouped(q_block, kv_block) with the first block starting q_offset rows before query 0 (a
  // multiple of 64 below q_block; 0 is regrouped()): block i holds rows i·q_block - q_offset ..,
  // so where Lq is not a multiple of q_block the one partial block can come first. The
  // persistent Hopper forward runs a causal-like mask this way (its first rows walk the fewest
  // key blocks, so its idle warpgroups cost least there); FaBlockTables::q_offset carries it.
  // Host kinds only (not a mask built on the device or over device tables), regroupable() (a
  // shifted block straddles the source's); not regrouped again, and no transposed tables: the
  // forward's own, which Kernel calls refuse as an argument.
  const BlockMask& regrouped_led(int q_block, int kv_block, int q_offset) const;
  // The rows of the first query block before query 0 (regrouped_led; else 0).
  int q_offset() const;
  // Whether regrouped() may merge the mask's blocks: matches_mask_mod(), or every tile has the
  // same kind (an all-full mask regroups exactly whatever the mask_mod; not looked for in device
  // tables, whose kinds would cost a sync: false there). Splitting needs neither.
  bool regroupable() const;

  // Throws fa::Error unless the mask was built for these lengths and Bm/Hm are 1 or B/H:
  // "block mask was built for Lq=1024, Lkv=1024; got Lq=2048, Lkv=1024".
  void check_compatible(int batch, int heads, int64_t len_q, int64_t len_kv) const;

  // Device tables in the current (or primary) context, uploaded on first use per context
  // (the kv tables and the q tables separately: addresses stay the same between calls).
  BlockMaskDeviceTables device_tables() const;
  // The forward's FaBlockTables (params.h): the kv tables of device_tables(), uploading only
  // those (the q tables are uploaded when device_tables() is first called).
  void fill(FaBlockTables& tables) const;
  // The backward's transposed tables (q_num_blocks, q_indices, full_q_*) in the same struct,
  // read along the other axis: rows are KV blocks, columns query blocks (params.h,
  // FaBwdParams::mask_t). Uploads all eight tables on first use.
  void fill_transposed(FaBlockTables& tables) const;

  struct State;

 private:
  explicit BlockMask(std::shared_ptr<State> s) : state_(std::move(s)) {}
  const BlockMask& regrouped_on_host(int q_block, int kv_block, int q_offset) const;
  const State& state() const;
  std::shared_ptr<State> state_;
};

}  // namespace fa

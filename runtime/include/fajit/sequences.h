// fa::Sequences: ragged ("packed", variable-length) batches and paged KV caches for the
// forward, given as device int32 tables at run time (flash-attention's cu_seqlens, vLLM's
// block tables): changing the lengths, the pages or appending tokens compiles nothing.
//
//   fa::Sequences s;
//   s.cu_seqlens_q = &cu_q;  s.max_seqlen_q = 512;   // q, o [total_q, Hq, D]; lse [Hq, total_q]
//   s.cu_seqlens_k = &cu_k;  s.max_seqlen_k = 2048;  // k, v [total_kv, Hkv, D]
//   fa::ForwardOptions fo;  fo.sequences = s;         // the block mask: [B or 1, H, max_q, max_k]
//
// Paged: k, v are pools [num_pages, page_size, Hkv, D]; page_table [B, max_pages] and
// seqlens_k [B] say where and how many keys each sequence has (page_size is the pools' dim 1).
// A pool's page stride and row stride (dims 0 and 1) must each be under 2^31 bytes (the kernels
// address a row as page * page stride + row * row stride, in 32-bit bytes per product).
// mask_mod / score_mod see positions within each sequence (q_idx from 0 at its first query).
#pragma once

#include "fajit/export.h"
#include "fajit/tensor.h"

namespace fa {

struct Sequences {
  // Packed queries, int32 [B+1]: sequence b's queries are rows cu_seqlens_q[b] ..
  // cu_seqlens_q[b+1]-1 of q [total_q, Hq, Dqk] and o [total_q, Hq, Dv]; lse is [Hq, total_q].
  const TensorView* cu_seqlens_q = nullptr;
  int max_seqlen_q = 0;  // required with cu_seqlens_q: the most queries of any sequence
  // Packed keys, int32 [B+1]: rows cu_seqlens_k[b] .. of k [total_kv, Hkv, Dqk], v [.., Dv].
  const TensorView* cu_seqlens_k = nullptr;
  // Keys of each sequence, int32 [B]: required with a page table; with dense k, v
  // [B, Hkv, Lkv, D] it marks a padded cache (keys at or past it are never read).
  const TensorView* seqlens_k = nullptr;
  // Paged K/V, int32 [B, max_pages]: key kv of sequence b is row kv % page_size of page
  // page_table[b][kv / page_size] of the pools k [num_pages, page_size, Hkv, Dqk], v [.., Dv].
  const TensorView* page_table = nullptr;
  int max_seqlen_k = 0;  // required with cu_seqlens_k or a page table: the most keys of any sequence
  // Copy the tables to the host and check them before launching (offsets non-decreasing and
  // within the tensors, lengths within the maxima, pages within the pool). Synchronizes the
  // stream. Off by default: without it, tables that break these rules are undefined behaviour.
  bool check_tables = false;

  bool any() const {
    return cu_seqlens_q != nullptr || cu_seqlens_k != nullptr || seqlens_k != nullptr ||
           page_table != nullptr;
  }
};

// A ragged / paged call as the kernels see it: [B, H, L, D]-shaped views of the packed or
// paged tensors (batch stride 0 over packed rows; the page stride for pools; L the longest
// sequence), for validate_attention, the block mask and FaFwdParams.
struct RaggedViews {
  TensorView q, k, v, o, lse;
  bool has_lse = false;
  bool paged = false;
};

// Checks the tables and tensors against each other (errors name the argument: "cu_seqlens_k:
// expected 5 entries (B+1, B = 4 from cu_seqlens_q), got 4") and builds the views; with
// s.check_tables, also the tables' contents (synchronizing `stream`, a CUstream).
FA_API RaggedViews ragged_views(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& o, const TensorView* lse, const Sequences& s,
                                void* stream = nullptr);

// Another per-row fp32 output of the same call (ForwardOptions::max_scores) as the kernels see
// it, beside ragged_views' lse: [Hq, total_q] with packed queries (errors name it: "max_scores:
// expected [Hq, total_q] = [8, 300], got [8, 299]"), else t as given. Call after ragged_views.
FA_API TensorView ragged_rows_view(const TensorView& t, const char* name, const TensorView& q,
                                   const Sequences& s);

// The backward's gradient tensors of a ragged call (Kernel::backward with
// BackwardOptions::sequences), as [B, H, Lmax, D]-shaped views beside ragged_views': dout like o
// and dq like q ([total_q, Hq, D] with cu_seqlens_q), dk like k and dv like v ([total_kv, Hkv, D]
// with cu_seqlens_k), dlse like lse ([Hq, total_q]). The totals must match the forward tensors'
// (errors name the argument). The backward takes no paged or padded (seqlens_k) keys.
struct RaggedGradViews {
  TensorView dout, dq, dk, dv, dlse;
  bool has_dlse = false;
};
FA_API RaggedGradViews ragged_grad_views(const TensorView& q, const TensorView& k, const TensorView& dout,
                                         const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                         const TensorView* dlse, const Sequences& s);

}  // namespace fa

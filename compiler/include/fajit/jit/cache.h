// The cubin cache: an in-memory map in front of one file per key on disk.
//
//   fa::jit::Cache& cache = fa::jit::Cache::global();   // $FAJIT_CACHE_DIR or ~/.cache/fajit
//   fa::jit::Lookup hit = cache.get_or_compile(key, [&] { return nvrtc.compile(...).cubin; },
//                                              "fa_fwd_kernel hd=128 causal");
//   load(hit.entry->cubin);   // hit.origin: memory, disk or compiled
//
// Disk layout: <dir>/<key>.fajit, written to <key>.<pid>.<random>.tmp and renamed into place,
// so readers never see a partial file and racing processes all succeed. A file holds a
// 48-byte header (magic "FAJITCB\0", format version, key size, payload size, cubin size,
// XXH3-64 of the payload, XXH3-64 of header+key), the key, then the payload: cubin bytes
// followed by the metadata text. A file that fails any check (magic, version, key, sizes,
// checksums, truncation) is a miss: the kernel is recompiled and the file replaced.
//
// The forward's autotuner (compiler/lib/api/autotune.h) keeps its choices here too: an entry
// whose bytes are the record's text, meta "autotune <shape class> on <device>".
//
// Many threads asking for one key at once compile it once; the others wait for that result.
// A directory that cannot be created or written turns the cache memory-only, with one
// warning on stderr; the cache never throws for I/O. Set FAJIT_DEBUG=1 for a line on stderr
// about each rejected file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fajit/cache_origin.h"

namespace fa::jit {

// One cached kernel binary. Handed out as shared_ptr<const Entry>: never copied, never freed
// while someone holds it.
struct Entry {
  std::string key;
  std::string cubin;  // bytes
  std::string meta;   // small free text (kernel name, spec summary) for `fajit cache ls`
};

struct Lookup {
  std::shared_ptr<const Entry> entry;
  CacheOrigin origin;
};

// One file of the cache directory, as `fajit cache ls` shows it.
struct ListedEntry {
  std::string key;
  uint64_t size = 0;   // file size in bytes
  int64_t mtime = 0;   // seconds since the epoch
  bool valid = false;  // passes every check get_or_compile makes
  std::string meta;    // empty when !valid
};

struct CacheStats {
  // The directory now.
  uint64_t disk_entries = 0;  // *.fajit files
  uint64_t disk_bytes = 0;
  // This Cache object since it was made.
  uint64_t memory_entries = 0;
  uint64_t memory_hits = 0;  // includes threads that waited for another's compile
  uint64_t disk_hits = 0;
  uint64_t misses = 0;            // compiles, for any reason (corrupt files included)
  uint64_t corrupt_replaced = 0;  // files that failed a check and were recompiled
  uint64_t write_failures = 0;    // files that could not be written
  bool disk_enabled = false;      // false: memory only
};

// Whether $name is set, non-empty and not "0" (FAJIT_DEBUG: the cache's and the autotuner's
// lines on stderr).
bool env_flag(const char* name);

class Cache {
 public:
  // A cache backed by `dir` (created on first write). An empty `dir` means memory only.
  explicit Cache(std::string dir);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // The process-wide cache at default_dir().
  static Cache& global();
  // $FAJIT_CACHE_DIR, else $XDG_CACHE_HOME/fajit, else $HOME/.cache/fajit ("" if none).
  static std::string default_dir();

  // The entry for `key` (is_valid_key()), from memory, else disk, else compile(): its
  // return value is the cubin, stored with `meta`. An exception from compile() reaches
  // every caller waiting on that key and nothing is cached.
  Lookup get_or_compile(const std::string& key, const std::function<std::string()>& compile,
                        std::string_view meta = {});

  // get_or_compile split in two for a compile on another thread: claims `key`'s flight now,
  // on the calling thread, so that a get_or_compile arriving before the returned job has even
  // started waits for it instead of compiling again, and returns the job that does the lookup
  // and the compile and ends the flight. Empty when the key is in memory or already in flight
  // (nothing to do). The job never throws: a failure reaches the callers waiting on the key.
  std::function<void()> claim(const std::string& key, std::function<std::string()> compile, std::string meta);

  // The entry for `key` from memory or disk, or null. Never compiles.
  std::shared_ptr<const Entry> find(const std::string& key);

  std::vector<ListedEntry> list() const;  // sorted by key
  CacheStats stats() const;
  // Empties the memory map and removes every *.fajit file and every stale temporary file
  // (<key>.<pid>.<random>.tmp of a process that no longer runs, or older than an hour).
  // Returns the number of files removed.
  size_t clear();

  const std::string& dir() const;
  bool disk_enabled() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fa::jit

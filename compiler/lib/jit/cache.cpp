#include "fajit/jit/cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <unordered_map>

#include "fajit/error.h"
#include "fajit/jit/key.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace fa {

const char* to_string(CacheOrigin origin) {
  switch (origin) {
    case CacheOrigin::kMemory: return "memory";
    case CacheOrigin::kDisk: return "disk";
    case CacheOrigin::kCompiled: return "compiled";
  }
  return "?";
}

}  // namespace fa

namespace fa::jit {

namespace fs = std::filesystem;

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the cache file format is little-endian");

constexpr char kMagic[8] = {'F', 'A', 'J', 'I', 'T', 'C', 'B', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr char kSuffix[] = ".fajit";
constexpr int64_t kStaleTmpSeconds = 3600;

// The on-disk header, little-endian, followed by the key and then the payload.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t key_size;
  uint64_t payload_size;  // cubin_size + metadata size
  uint64_t cubin_size;
  uint64_t payload_hash;  // XXH3-64 of the payload
  uint64_t header_hash;   // XXH3-64 of the fields above and the key
};
static_assert(sizeof(FileHeader) == 48, "FileHeader must have no padding");

uint64_t header_hash(const FileHeader& h, std::string_view key) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &h, offsetof(FileHeader, header_hash));
  XXH3_64bits_update(&state, key.data(), key.size());
  return XXH3_64bits_digest(&state);
}

std::string encode(const Entry& e) {
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.key_size = static_cast<uint32_t>(e.key.size());
  h.payload_size = e.cubin.size() + e.meta.size();
  h.cubin_size = e.cubin.size();
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, e.cubin.data(), e.cubin.size());
  XXH3_64bits_update(&state, e.meta.data(), e.meta.size());
  h.payload_hash = XXH3_64bits_digest(&state);
  h.header_hash = header_hash(h, e.key);
  std::string out;
  out.reserve(sizeof h + e.key.size() + h.payload_size);
  out.append(reinterpret_cast<const char*>(&h), sizeof h);
  out += e.key;
  out += e.cubin;
  out += e.meta;
  return out;
}

// Parses a whole file; on failure returns null and says why in `why`.
std::shared_ptr<Entry> decode(std::string_view bytes, const std::string& key, std::string& why) {
  FileHeader h;
  if (bytes.size() < sizeof h) {
    why = "truncated header";
    return nullptr;
  }
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    why = "bad magic";
    return nullptr;
  }
  if (h.version != kFormatVersion) {
    why = "format version " + std::to_string(h.version) + ", expected " + std::to_string(kFormatVersion);
    return nullptr;
  }
  if (h.key_size != key.size() || bytes.size() < sizeof h + h.key_size ||
      bytes.substr(sizeof h, h.key_size) != key) {
    why = "key mismatch";
    return nullptr;
  }
  if (h.header_hash != header_hash(h, key)) {
    why = "header checksum mismatch";
    return nullptr;
  }
  const uint64_t expected = sizeof h + h.key_size + h.payload_size;
  if (bytes.size() != expected || h.cubin_size > h.payload_size) {
    why = "size " + std::to_string(bytes.size()) + ", expected " + std::to_string(expected);
    return nullptr;
  }
  std::string_view payload = bytes.substr(sizeof h + h.key_size);
  if (XXH3_64bits(payload.data(), payload.size()) != h.payload_hash) {
    why = "payload checksum mismatch";
    return nullptr;
  }
  auto e = std::make_shared<Entry>();
  e->key = key;
  e->cubin.assign(payload.data(), h.cubin_size);
  e->meta.assign(payload.data() + h.cubin_size, payload.size() - h.cubin_size);
  return e;
}

enum class ReadStatus { kAbsent, kOk, kBad };

// Reads a whole file. kAbsent when it does not exist (or cannot be opened).
ReadStatus read_all(const std::string& path, std::string& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ReadStatus::kAbsent;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return ReadStatus::kBad;
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  ::close(fd);
  return ReadStatus::kOk;
}

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

uint64_t random_u64() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }());
  return rng();
}

// "<key>.<pid>.<random>.tmp" -> pid, or -1 when `name` is not one of ours.
long tmp_owner(const std::string& name) {
  if (name.size() < 32 + 6 || !is_valid_key(std::string_view(name).substr(0, 32)) || name[32] != '.' ||
      name.compare(name.size() - 4, 4, ".tmp") != 0)
    return -1;
  std::string mid = name.substr(33, name.size() - 33 - 4);  // "<pid>.<random>"
  size_t dot = mid.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == mid.size()) return -1;
  std::string pid = mid.substr(0, dot), rnd = mid.substr(dot + 1);
  if (pid.find_first_not_of("0123456789") != std::string::npos ||
      rnd.find_first_not_of("0123456789abcdef") != std::string::npos)
    return -1;
  return std::strtol(pid.c_str(), nullptr, 10);
}

// The key of "<key>.fajit", or "".
std::string entry_key(const std::string& name) {
  if (name.size() != 32 + sizeof(kSuffix) - 1 || name.compare(32, std::string::npos, kSuffix) != 0) return {};
  std::string key = name.substr(0, 32);
  return is_valid_key(key) ? key : std::string();
}

}  // namespace

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

using EntryPtr = std::shared_ptr<const Entry>;

struct Cache::Impl {
  std::string dir;
  std::atomic<bool> disk{false};
  std::atomic<bool> warned{false};
  bool debug = false;
  std::once_flag dir_made;

  mutable std::shared_mutex mem_mu;
  std::unordered_map<std::string, EntryPtr> mem;

  // A flight belongs to the process that started it: a child forked while a compile ran (a
  // background one, say) inherits the entry but not the thread that would end it, so there it
  // counts as no flight and the child leads its own.
  struct InFlight {
    std::shared_future<EntryPtr> done;
    pid_t pid;
  };
  std::mutex flight_mu;
  std::unordered_map<std::string, InFlight> in_flight;

  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, misses{0}, corrupt{0}, write_failures{0};

  std::string path_of(const std::string& key) const { return dir + "/" + key + kSuffix; }

  void degrade(const std::string& why) {
    disk = false;
    if (!warned.exchange(true))
      std::fprintf(stderr,
                   "fajit: warning: cache directory '%s' is not writable (%s); caching in "
                   "memory only\n",
                   dir.c_str(), why.c_str());
  }

  EntryPtr memory_find(const std::string& key) const {
    std::shared_lock<std::shared_mutex> lock(mem_mu);
    auto it = mem.find(key);
    return it == mem.end() ? nullptr : it->second;
  }

  void memory_put(const EntryPtr& e) {
    std::unique_lock<std::shared_mutex> lock(mem_mu);
    mem[e->key] = e;
  }

  // Single flight: the first caller for a key does the work, later ones wait for it. The entry
  // if it is in memory (`found`), else the flight to wait on if one is running (`waiting`),
  // else this caller leads: `promise`'s flight is registered for the key.
  struct Flight {
    EntryPtr found;
    std::shared_future<EntryPtr> waiting;
    bool leader = false;
  };
  Flight join_flight(const std::string& key, std::promise<EntryPtr>& promise) {
    Flight f;
    if ((f.found = memory_find(key))) return f;
    std::lock_guard<std::mutex> lock(flight_mu);
    if ((f.found = memory_find(key))) return f;  // finished while we took the lock
    const pid_t self = ::getpid();
    auto it = in_flight.find(key);
    if (it != in_flight.end() && it->second.pid == self) {
      f.waiting = it->second.done;
    } else {
      in_flight.insert_or_assign(key, InFlight{promise.get_future().share(), self});
      f.leader = true;
    }
    return f;
  }

  // The flight leader's work for `key` (in flight, claimed by this caller with `promise`): disk,
  // else compile(); the entry into memory, then to the waiters, then the flight ends. A failure
  // reaches the waiters and is rethrown.
  Lookup lead(const std::string& key, const std::function<std::string()>& compile, std::string_view meta,
              std::promise<EntryPtr>& promise) {
    auto finish = [&] {
      std::lock_guard<std::mutex> lock(flight_mu);
      in_flight.erase(key);
    };
    try {
      bool bad = false;
      EntryPtr e = disk_find(key, &bad);
      CacheOrigin origin = CacheOrigin::kDisk;
      if (e) {
        ++disk_hits;
      } else {
        if (bad) ++corrupt;
        ++misses;
        auto fresh = std::make_shared<Entry>();
        fresh->key = key;
        fresh->cubin = compile();
        fresh->meta = std::string(meta);
        disk_put(*fresh);
        e = std::move(fresh);
        origin = CacheOrigin::kCompiled;
      }
      memory_put(e);  // before leaving the flight, so no later caller misses both
      promise.set_value(e);
      finish();
      return {std::move(e), origin};
    } catch (...) {
      promise.set_exception(std::current_exception());
      finish();
      throw;
    }
  }

  // The entry on disk, or null; *bad is set when a file exists but fails a check.
  EntryPtr disk_find(const std::string& key, bool* bad) {
    *bad = false;
    if (dir.empty()) return nullptr;
    std::string bytes;
    const std::string path = path_of(key);
    if (read_all(path, bytes) == ReadStatus::kAbsent) return nullptr;
    std::string why;
    EntryPtr e = decode(bytes, key, why);
    if (!e) {
      *bad = true;
      if (debug)
        std::fprintf(stderr, "fajit: debug: cache file '%s' rejected (%s); recompiling\n", path.c_str(),
                     why.c_str());
    }
    return e;
  }

  void disk_put(const Entry& e) {
    if (!disk) return;
    std::call_once(dir_made, [&] {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) degrade(ec.message());
    });
    if (!disk) return;
    const std::string bytes = encode(e);
    std::string tmp;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      char suffix[64];
      std::snprintf(suffix, sizeof suffix, ".%ld.%016llx.tmp", static_cast<long>(::getpid()),
                    static_cast<unsigned long long>(random_u64()));
      tmp = dir + "/" + e.key + suffix;
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      ++write_failures;
      degrade(std::strerror(errno));
      return;
    }
    bool ok = write_all(fd, bytes);
    int err = ok ? 0 : errno;
    if (::close(fd) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (ok && ::rename(tmp.c_str(), path_of(e.key).c_str()) != 0) {
      ok = false;
      err = errno;
    }
    if (!ok) {
      ::unlink(tmp.c_str());
      ++write_failures;
      degrade(std::strerror(err ? err : EIO));
    }
  }
};

Cache::Cache(std::string dir) : impl_(std::make_unique<Impl>()) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  impl_->dir = std::move(dir);
  impl_->disk = !impl_->dir.empty();
  impl_->debug = env_flag("FAJIT_DEBUG");
}

Cache::~Cache() = default;

Cache& Cache::global() {
  static Cache* instance = new Cache(default_dir());  // never destroyed: usable at exit
  return *instance;
}

std::string Cache::default_dir() {
  if (const char* d = std::getenv("FAJIT_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return std::string(x) + "/fajit";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/fajit";
  return {};
}

const std::string& Cache::dir() const { return impl_->dir; }
bool Cache::disk_enabled() const { return impl_->disk; }

Lookup Cache::get_or_compile(const std::string& key, const std::function<std::string()>& compile,
                             std::string_view meta) {
  if (!is_valid_key(key))
    throw Error("invalid cache key '" + key + "'; expected 32 lowercase hex characters");
  Impl& im = *impl_;
  std::promise<EntryPtr> promise;
  Impl::Flight f = im.join_flight(key, promise);
  if (!f.leader) {
    EntryPtr e = f.found ? std::move(f.found) : f.waiting.get();  // get() rethrows the leader's exception
    ++im.memory_hits;
    return {std::move(e), CacheOrigin::kMemory};
  }
  return im.lead(key, compile, meta, promise);
}

std::function<void()> Cache::claim(const std::string& key, std::function<std::string()> compile,
                                   std::string meta) {
  if (!is_valid_key(key)) return {};
  Impl& im = *impl_;
  auto promise = std::make_shared<std::promise<EntryPtr>>();
  if (!im.join_flight(key, *promise).leader) return {};
  return [&im, key, compile = std::move(compile), meta = std::move(meta), promise] {
    try {
      im.lead(key, compile, meta, *promise);
    } catch (...) {  // lead() handed it to the waiters
    }
  };
}

std::shared_ptr<const Entry> Cache::find(const std::string& key) {
  if (!is_valid_key(key)) return nullptr;
  Impl& im = *impl_;
  if (EntryPtr e = im.memory_find(key)) {
    ++im.memory_hits;
    return e;
  }
  bool bad = false;
  EntryPtr e = im.disk_find(key, &bad);
  if (e) {
    ++im.disk_hits;
    im.memory_put(e);
  }
  return e;
}

std::vector<ListedEntry> Cache::list() const {
  std::vector<ListedEntry> out;
  if (impl_->dir.empty()) return out;
  std::error_code ec;
  for (fs::directory_iterator it(impl_->dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string key = entry_key(it->path().filename().string());
    if (key.empty()) continue;
    struct stat st;
    if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    ListedEntry le;
    le.key = key;
    le.size = static_cast<uint64_t>(st.st_size);
    le.mtime = static_cast<int64_t>(st.st_mtime);
    std::string bytes, why;
    if (read_all(it->path().string(), bytes) == ReadStatus::kOk)
      if (auto e = decode(bytes, key, why)) {
        le.valid = true;
        le.meta = e->meta;
      }
    out.push_back(std::move(le));
  }
  std::sort(out.begin(), out.end(), [](const ListedEntry& a, const ListedEntry& b) { return a.key < b.key; });
  return out;
}

CacheStats Cache::stats() const {
  const Impl& im = *impl_;
  CacheStats s;
  if (!im.dir.empty()) {
    std::error_code ec;
    for (fs::directory_iterator it(im.dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (entry_key(it->path().filename().string()).empty()) continue;
      struct stat st;
      if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      ++s.disk_entries;
      s.disk_bytes += static_cast<uint64_t>(st.st_size);
    }
  }
  {
    std::shared_lock<std::shared_mutex> lock(im.mem_mu);
    s.memory_entries = im.mem.size();
  }
  s.memory_hits = im.memory_hits;
  s.disk_hits = im.disk_hits;
  s.misses = im.misses;
  s.corrupt_replaced = im.corrupt;
  s.write_failures = im.write_failures;
  s.disk_enabled = im.disk;
  return s;
}

size_t Cache::clear() {
  {
    std::unique_lock<std::shared_mutex> lock(impl_->mem_mu);
    impl_->mem.clear();
  }
  if (impl_->dir.empty()) return 0;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  std::vector<fs::path> doomed;
  std::error_code ec;
  for (fs::directory_iterator it(impl_->dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!entry_key(name).empty()) {
      doomed.push_back(it->path());
      continue;
    }
    long pid = tmp_owner(name);
    if (pid < 0) continue;
    bool gone = pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (gone || now - static_cast<int64_t>(st.st_mtime) > kStaleTmpSeconds) doomed.push_back(it->path());
  }
  size_t removed = 0;
  for (const fs::path& p : doomed)
    if (::unlink(p.c_str()) == 0) ++removed;
  return removed;
}

}  // namespace fa::jit

#include "fajit/jit/cache.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "fajit/error.h"
#include "fajit/jit/key.h"

namespace {

namespace fs = std::filesystem;
using fa::jit::Cache;
using Origin = fa::CacheOrigin;

const std::string kKey = fa::jit::KeyBuilder().add("test", "one").hex();
const std::string kKey2 = fa::jit::KeyBuilder().add("test", "two").hex();
const std::string kCubin = std::string(
    "\x7f"
    "ELF\0binary\xff",
    12);

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fajit-cache-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::unsetenv("FAJIT_DEBUG");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& key) const { return dir_ + "/" + key + ".fajit"; }
  std::string read(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void write(const std::string& path, const std::string& bytes) const {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  // Fills the cache file for kKey through a first Cache, then damages it with `damage`, and
  // checks that a second Cache recompiles and replaces it, saying `why` on FAJIT_DEBUG.
  void expect_replaced(const std::function<void(std::string&)>& damage, const std::string& why) {
    {
      Cache(dir_).get_or_compile(
          kKey, [] { return kCubin; }, "meta");
    }
    std::string bytes = read(file(kKey));
    const std::string good = bytes;
    damage(bytes);
    write(file(kKey), bytes);

    ::setenv("FAJIT_DEBUG", "1", 1);
    Cache cache(dir_);
    int compiles = 0;
    testing::internal::CaptureStderr();
    fa::jit::Lookup r = cache.get_or_compile(
        kKey,
        [&] {
          ++compiles;
          return kCubin;
        },
        "meta");
    EXPECT_EQ(testing::internal::GetCapturedStderr(),
              "fajit: debug: cache file '" + file(kKey) + "' rejected (" + why + "); recompiling\n");
    EXPECT_EQ(r.origin, Origin::kCompiled);
    EXPECT_EQ(compiles, 1);
    EXPECT_EQ(r.entry->cubin, kCubin);
    EXPECT_EQ(cache.stats().corrupt_replaced, 1u);
    EXPECT_EQ(cache.stats().misses, 1u);
    EXPECT_EQ(read(file(kKey)), good);  // replaced by a valid file
    EXPECT_EQ(Cache(dir_).get_or_compile(kKey, [] { return std::string("x"); }).origin, Origin::kDisk);
  }
  // Forks n processes that start `child` at the same moment (a pipe closed by the parent is the
  // gate); expects each to exit with 0, which `child` returns for success.
  void race_processes(int n, const std::function<bool(int)>& child) const {
    int gate[2];
    ASSERT_EQ(::pipe(gate), 0);
    std::vector<pid_t> kids;
    for (int i = 0; i < n; ++i) {
      pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(gate[1]);
        char c;
        while (::read(gate[0], &c, 1) < 0) {
        }
        ::_exit(child(i) ? 0 : 1);
      }
      kids.push_back(pid);
    }
    ::close(gate[0]);
    ::close(gate[1]);  // EOF releases every child at once
    for (pid_t pid : kids) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }
  // Files in the cache directory; every one must be an entry (no temporary file left).
  int entry_files() const {
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
      ++files;
      EXPECT_EQ(e.path().extension(), ".fajit") << e.path();
    }
    return files;
  }
  std::string dir_;
};

TEST_F(CacheTest, MissThenMemoryHit) {
  Cache cache(dir_);
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return kCubin;
  };
  fa::jit::Lookup a = cache.get_or_compile(kKey, compile, "fa_fwd hd=64");
  fa::jit::Lookup b = cache.get_or_compile(kKey, compile, "fa_fwd hd=64");
  EXPECT_EQ(a.origin, Origin::kCompiled);
  EXPECT_EQ(b.origin, Origin::kMemory);
  EXPECT_EQ(a.entry.get(), b.entry.get());  // no copy
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(a.entry->key, kKey);
  EXPECT_EQ(a.entry->cubin, kCubin);
  EXPECT_EQ(a.entry->meta, "fa_fwd hd=64");
  fa::jit::CacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.memory_hits, 1u);
  EXPECT_EQ(s.disk_hits, 0u);
  EXPECT_EQ(s.memory_entries, 1u);
  EXPECT_EQ(s.disk_entries, 1u);
  EXPECT_TRUE(s.disk_enabled);
  EXPECT_TRUE(fs::is_regular_file(file(kKey)));
  EXPECT_EQ(std::string(fa::to_string(a.origin)), "compiled");
  EXPECT_EQ(std::string(fa::to_string(b.origin)), "memory");
}

TEST_F(CacheTest, DiskHitFromAnotherInstance) {
  Cache(dir_).get_or_compile(
      kKey, [] { return kCubin; }, "meta text");
  Cache cache(dir_);
  fa::jit::Lookup r = cache.get_or_compile(kKey, [] { return std::string("wrong"); });
  EXPECT_EQ(r.origin, Origin::kDisk);
  EXPECT_EQ(std::string(fa::to_string(r.origin)), "disk");
  EXPECT_EQ(r.entry->cubin, kCubin);
  EXPECT_EQ(r.entry->meta, "meta text");
  EXPECT_EQ(cache.get_or_compile(kKey, [] { return std::string("wrong"); }).origin, Origin::kMemory);
  EXPECT_EQ(cache.stats().disk_hits, 1u);
  EXPECT_EQ(cache.stats().misses, 0u);
}

TEST_F(CacheTest, FindNeverCompiles) {
  Cache cache(dir_);
  EXPECT_EQ(cache.find(kKey), nullptr);
  cache.get_or_compile(kKey, [] { return kCubin; });
  EXPECT_EQ(Cache(dir_).find(kKey)->cubin, kCubin);
  EXPECT_EQ(cache.find("not a key"), nullptr);
}

TEST_F(CacheTest, FileLayout) {
  Cache(dir_).get_or_compile(
      kKey, [] { return kCubin; }, "m");
  std::string bytes = read(file(kKey));
  ASSERT_EQ(bytes.size(), 48u + 32u + kCubin.size() + 1u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("FAJITCB\0", 8));
  EXPECT_EQ(bytes.substr(48, 32), kKey);
  EXPECT_EQ(bytes.substr(80), kCubin + "m");
}

TEST_F(CacheTest, CorruptPayloadIsReplaced) {
  expect_replaced([](std::string& b) { b[48 + 32 + 3] ^= 0x01; }, "payload checksum mismatch");
}

TEST_F(CacheTest, TruncatedFileIsReplaced) {
  expect_replaced([](std::string& b) { b.resize(b.size() - 5); }, "size 91, expected 96");
}

TEST_F(CacheTest, EmptyFileIsReplaced) {
  expect_replaced([](std::string& b) { b.clear(); }, "truncated header");
}

TEST_F(CacheTest, WrongMagicIsReplaced) {
  expect_replaced([](std::string& b) { b[0] = 'X'; }, "bad magic");
}

TEST_F(CacheTest, WrongVersionIsReplaced) {
  expect_replaced([](std::string& b) { b[8] = 2; }, "format version 2, expected 1");
}

TEST_F(CacheTest, WrongKeyIsReplaced) {
  expect_replaced([](std::string& b) { b[48] = b[48] == 'a' ? 'b' : 'a'; }, "key mismatch");
}

TEST_F(CacheTest, DamagedHeaderIsReplaced) {
  expect_replaced([](std::string& b) { b[24] ^= 0x01; }, "header checksum mismatch");
}

TEST_F(CacheTest, UnwritableDirectoryDegradesToMemoryWithOneWarning) {
  write(dir_ + "/file", "not a directory");
  const std::string bad = dir_ + "/file/cache";
  Cache cache(bad);
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return kCubin;
  };
  testing::internal::CaptureStderr();
  EXPECT_EQ(cache.get_or_compile(kKey, compile).origin, Origin::kCompiled);
  EXPECT_EQ(cache.get_or_compile(kKey2, compile).origin, Origin::kCompiled);
  EXPECT_EQ(cache.get_or_compile(kKey, compile).origin, Origin::kMemory);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "fajit: warning: cache directory '" + bad +
                "' is not writable (Not a directory); caching in memory only\n");
  EXPECT_EQ(compiles, 2);
  EXPECT_FALSE(cache.disk_enabled());
  EXPECT_FALSE(cache.stats().disk_enabled);
  EXPECT_EQ(cache.stats().disk_entries, 0u);
  EXPECT_TRUE(cache.list().empty());
}

TEST_F(CacheTest, EmptyDirectoryMeansMemoryOnlyWithoutWarning) {
  Cache cache("");
  testing::internal::CaptureStderr();
  EXPECT_EQ(cache.get_or_compile(kKey, [] { return kCubin; }).origin, Origin::kCompiled);
  EXPECT_EQ(cache.get_or_compile(kKey, [] { return kCubin; }).origin, Origin::kMemory);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_FALSE(cache.disk_enabled());
}

TEST_F(CacheTest, CompileErrorIsNotCached) {
  Cache cache(dir_);
  EXPECT_THROW(
      cache.get_or_compile(kKey, []() -> std::string { throw fa::Error("boom", fa::ErrorCode::kCompile); }),
      fa::Error);
  EXPECT_FALSE(fs::exists(file(kKey)));
  EXPECT_EQ(cache.get_or_compile(kKey, [] { return kCubin; }).origin, Origin::kCompiled);
}

TEST_F(CacheTest, InvalidKeyIsRejected) {
  Cache cache(dir_);
  try {
    cache.get_or_compile("../etc/passwd", [] { return kCubin; });
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "invalid cache key '../etc/passwd'; expected 32 lowercase hex characters");
    EXPECT_EQ(e.code(), fa::ErrorCode::kInvalidArgument);
  }
}

TEST_F(CacheTest, SixteenThreadsCompileOnce) {
  Cache cache(dir_);
  std::atomic<int> compiles{0};
  std::atomic<bool> go{false};
  std::vector<fa::jit::Lookup> results(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i)
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      results[i] = cache.get_or_compile(kKey, [&] {
        ++compiles;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return kCubin;
      });
    });
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 1);
  int compiled = 0;
  for (const auto& r : results) {
    EXPECT_EQ(r.entry.get(), results[0].entry.get());
    compiled += r.origin == Origin::kCompiled;
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(cache.stats().memory_hits, 15u);
}

TEST_F(CacheTest, WaitersSeeTheCompileError) {
  Cache cache(dir_);
  std::atomic<int> compiles{0}, failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      try {
        cache.get_or_compile(kKey, []() -> std::string {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          throw fa::Error("nvrtc said no", fa::ErrorCode::kCompile);
        });
      } catch (const fa::Error& e) {
        if (std::string(e.what()) == "nvrtc said no") ++failures;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 8);
  EXPECT_EQ(cache.stats().memory_entries, 0u);
}

// claim() takes the key's flight on the calling thread: a get_or_compile that arrives before the
// claimed job has even started waits for it (one compile, the job's cubin), a second claim
// finds nothing to do, and once the job has run the entry is in memory. A failing job hands its
// error to the waiters and caches nothing, so a later lookup compiles again.
TEST_F(CacheTest, ClaimedFlightIsWaitedFor) {
  Cache cache(dir_);
  std::atomic<int> compiles{0};
  std::function<void()> job = cache.claim(
      kKey,
      [&] {
        ++compiles;
        return kCubin;
      },
      "claimed");
  ASSERT_TRUE(job);
  EXPECT_FALSE(cache.claim(
      kKey, [] { return std::string("x"); }, ""));  // in flight already
  std::thread runner([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the lookup below waits
    job();
  });
  const fa::jit::Lookup l = cache.get_or_compile(kKey, [&] {
    ++compiles;
    return std::string("a second compile");
  });
  runner.join();
  EXPECT_EQ(compiles.load(), 1);
  EXPECT_EQ(l.origin, Origin::kMemory);
  EXPECT_EQ(l.entry->cubin, kCubin);
  EXPECT_EQ(l.entry->meta, "claimed");
  EXPECT_FALSE(cache.claim(
      kKey, [] { return std::string("x"); }, ""));  // in memory now

  Cache other(dir_ + "/other");
  std::function<void()> failing = other.claim(
      kKey, []() -> std::string { throw fa::Error("nvrtc said no", fa::ErrorCode::kCompile); }, "");
  ASSERT_TRUE(failing);
  std::thread failer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    failing();  // never throws
  });
  std::string error;
  try {
    other.get_or_compile(kKey, [] { return std::string("unused"); });
  } catch (const fa::Error& e) {
    error = e.what();
  }
  failer.join();
  EXPECT_EQ(error, "nvrtc said no");
  EXPECT_EQ(other.get_or_compile(kKey, [] { return std::string("again"); }).entry->cubin, "again");
}

// A child forked while a compile was in flight (claimed, its thread not run yet: fa::compile's
// background compiles) inherits the flight but not the thread that ends it. There the key is no
// flight: the child compiles it itself instead of waiting for good.
TEST_F(CacheTest, ChildForkedMidFlightDoesNotWaitForTheParentsCompile) {
  Cache cache("");  // memory only: the child's compile stays in the child
  std::function<void()> job = cache.claim(
      kKey, [] { return kCubin; }, "parent");
  ASSERT_TRUE(job);
  const pid_t pid = ::fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    ::alarm(20);  // a child that waits on the parent's flight dies here: not status 0
    const fa::jit::Lookup l = cache.get_or_compile(kKey, [] { return std::string("child"); });
    ::_exit(l.origin == Origin::kCompiled && l.entry->cubin == "child" ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  job();  // the parent's flight ends as before
  EXPECT_EQ(cache.get_or_compile(kKey, [] { return std::string("again"); }).entry->cubin, kCubin);
}

TEST_F(CacheTest, EightProcessesRaceOnOneKey) {
  race_processes(8, [&](int) {
    Cache cache(dir_);
    fa::jit::Lookup r = cache.get_or_compile(
        kKey,
        [] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return kCubin;
        },
        "raced");
    return r.entry->cubin == kCubin && r.entry->meta == "raced";
  });
  Cache cache(dir_);
  fa::jit::Lookup r = cache.get_or_compile(kKey, [] { return std::string("wrong"); });
  EXPECT_EQ(r.origin, Origin::kDisk);
  EXPECT_EQ(r.entry->cubin, kCubin);
  EXPECT_EQ(entry_files(), 1);
}

TEST_F(CacheTest, EveryBitFlipIsRejectedOrHarmless) {
  {
    Cache(dir_).get_or_compile(
        kKey, [] { return kCubin; }, "meta");
  }
  const std::string good = read(file(kKey));
  int rejected = 0, total = 0;
  for (size_t at = 0; at < good.size(); ++at)
    for (unsigned char bit : {0x01, 0x10, 0x80}) {
      std::string bytes = good;
      bytes[at] = static_cast<char>(bytes[at] ^ bit);
      write(file(kKey), bytes);
      Cache cache(dir_);
      int compiles = 0;
      fa::jit::Lookup r = cache.get_or_compile(
          kKey,
          [&] {
            ++compiles;
            return kCubin;
          },
          "meta");
      ++total;
      rejected += compiles;
      ASSERT_EQ(r.entry->cubin, kCubin) << "flip 0x" << std::hex << int(bit) << " at byte " << std::dec << at;
      ASSERT_EQ(r.entry->meta, "meta") << "flip at byte " << at;
      ASSERT_EQ(read(file(kKey)), good) << "flip at byte " << at;  // a rejected file is replaced
    }
  // Header, key, payload and meta are all covered by checksums or compared: nothing slips by.
  EXPECT_EQ(rejected, total);
}

// A process killed while writing an entry leaves at most its temporary file: lookups never
// read it, the next writer publishes a complete entry, and clear() removes the orphan.
TEST_F(CacheTest, ProcessKilledMidWriteLeavesNothingReadable) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Half an entry under the writer's temporary name, then wait to be killed.
    ::close(ready[0]);
    const std::string tmp = dir_ + "/" + kKey + "." + std::to_string(::getpid()) + ".00000000deadbeef.tmp";
    std::ofstream(tmp, std::ios::binary) << std::string("FAJITCB\0\1", 9);
    (void)!::write(ready[1], "x", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));

  Cache cache(dir_);
  int compiles = 0;
  fa::jit::Lookup r = cache.get_or_compile(
      kKey,
      [&] {
        ++compiles;
        return kCubin;
      },
      "after");
  EXPECT_EQ(compiles, 1);  // the orphan is not an entry
  EXPECT_EQ(r.entry->cubin, kCubin);
  EXPECT_EQ(Cache(dir_).get_or_compile(kKey, [] { return std::string("wrong"); }).origin, Origin::kDisk);
  EXPECT_EQ(Cache(dir_).clear(), 2u);  // the entry and the dead writer's temporary file
  EXPECT_TRUE(fs::is_empty(dir_));
}

// 8 processes x 4 threads look up 16 keys in different orders at once: every lookup returns its
// key's bytes, and the directory ends with exactly one valid entry per key.
TEST_F(CacheTest, EightProcessesFourThreadsSixteenKeys) {
  auto key_of = [](int k) { return fa::jit::KeyBuilder().add("race", std::to_string(k)).hex(); };
  auto cubin_of = [](int k) { return kCubin + std::to_string(k); };
  race_processes(8, [&](int i) {
    Cache cache(dir_);
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int j = 0; j < 16; ++j) {
          const int k = (j * 5 + 3 * t + 7 * i) % 16;  // a different order per thread and process
          fa::jit::Lookup r = cache.get_or_compile(
              key_of(k),
              [&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
                return cubin_of(k);
              },
              "k" + std::to_string(k));
          if (r.entry->cubin != cubin_of(k) || r.entry->meta != "k" + std::to_string(k)) ++bad;
        }
      });
    for (std::thread& th : threads) th.join();
    return bad.load() == 0;
  });
  Cache cache(dir_);
  for (int k = 0; k < 16; ++k) {
    fa::jit::Lookup r = cache.get_or_compile(key_of(k), [] { return std::string("wrong"); });
    EXPECT_EQ(r.origin, Origin::kDisk) << k;
    EXPECT_EQ(r.entry->cubin, cubin_of(k)) << k;
  }
  EXPECT_EQ(entry_files(), 16);
}

// A full disk, the unprivileged way: a process whose file size limit (RLIMIT_FSIZE, SIGXFSZ
// ignored) is below an entry's size. The write fails (EFBIG) part-way: the lookup still returns
// the compiled cubin, the cache degrades to memory for the rest of the process, the partial
// temporary file is removed, and a later process with room writes and reads the entry.
TEST_F(CacheTest, FullDiskDegradesToMemoryAndLeavesNothing) {
  const std::string big(64 << 10, 'c');
  race_processes(1, [&](int) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return false;
    ::freopen("/dev/null", "w", stderr);  // the one warning ("... is not writable (File too large)")
    Cache cache(dir_);
    fa::jit::Lookup r = cache.get_or_compile(
        kKey, [&] { return big; }, "meta");
    bool ok = r.origin == Origin::kCompiled && r.entry->cubin == big;
    ok = ok && cache.get_or_compile(kKey, [] { return std::string("x"); }).origin == Origin::kMemory;
    ok = ok && cache.stats().write_failures == 1 && !cache.disk_enabled();
    return ok && fs::is_empty(dir_);
  });
  EXPECT_EQ(entry_files(), 0);
  EXPECT_EQ(Cache(dir_).get_or_compile(kKey, [&] { return big; }).origin, Origin::kCompiled);
  fa::jit::Lookup r = Cache(dir_).get_or_compile(kKey, [] { return std::string("x"); });
  EXPECT_EQ(r.origin, Origin::kDisk);
  EXPECT_EQ(r.entry->cubin, big);
}

// The same on a real full file system: a 256 KiB tmpfs filled to within 16 KiB (needs the
// privilege to mount; skipped, saying so, without it). ENOSPC instead of EFBIG, same outcome.
TEST_F(CacheTest, FullTmpfsDegradesToMemoryAndLeavesNothing) {
  const std::string mnt = dir_ + "/tiny";
  fs::create_directory(mnt);
  if (std::system(("mount -t tmpfs -o size=256k tmpfs '" + mnt + "' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN); the RLIMIT_FSIZE test covers the path";
  struct Unmount {
    std::string at;
    ~Unmount() { (void)std::system(("umount '" + at + "'").c_str()); }
  } unmount{mnt};
  write(mnt + "/filler", std::string(240 << 10, 'f'));
  const std::string big(64 << 10, 'c');
  testing::internal::CaptureStderr();
  {
    Cache cache(mnt);
    fa::jit::Lookup r = cache.get_or_compile(
        kKey, [&] { return big; }, "meta");
    EXPECT_EQ(r.origin, Origin::kCompiled);
    EXPECT_EQ(r.entry->cubin, big);
    EXPECT_EQ(cache.get_or_compile(kKey, [] { return std::string("x"); }).origin, Origin::kMemory);
    EXPECT_EQ(cache.stats().write_failures, 1u);
    EXPECT_FALSE(cache.disk_enabled());
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is not writable (No space left on device); caching in memory only"), std::string::npos)
      << err;
  int files = 0;
  for (const auto& e : fs::directory_iterator(mnt)) files += e.path().filename() != "filler";
  EXPECT_EQ(files, 0);  // no entry, no temporary file
  fs::remove(mnt + "/filler");
  EXPECT_EQ(Cache(mnt).get_or_compile(kKey, [&] { return big; }).origin, Origin::kCompiled);
  EXPECT_EQ(Cache(mnt).get_or_compile(kKey, [] { return std::string("x"); }).origin, Origin::kDisk);
}

TEST_F(CacheTest, ListAndStats) {
  Cache cache(dir_);
  cache.get_or_compile(
      kKey, [] { return kCubin; }, "first");
  cache.get_or_compile(
      kKey2, [] { return std::string(100, 'x'); }, "second");
  write(dir_ + "/README", "not ours");
  std::vector<fa::jit::ListedEntry> ls = cache.list();
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_LT(ls[0].key, ls[1].key);
  for (const auto& e : ls) {
    EXPECT_TRUE(e.valid);
    EXPECT_GT(e.mtime, 0);
    if (e.key == kKey) {
      EXPECT_EQ(e.meta, "first");
      EXPECT_EQ(e.size, 48u + 32u + kCubin.size() + 5u);
    } else {
      EXPECT_EQ(e.meta, "second");
    }
  }
  fa::jit::CacheStats s = cache.stats();
  EXPECT_EQ(s.disk_entries, 2u);
  EXPECT_EQ(s.disk_bytes, ls[0].size + ls[1].size);
  write(file(kKey2), "garbage");
  ls = cache.list();
  EXPECT_FALSE(ls[kKey2 < kKey ? 0 : 1].valid);
}

TEST_F(CacheTest, ClearRemovesOnlyWhatItOwns) {
  Cache cache(dir_);
  cache.get_or_compile(kKey, [] { return kCubin; });
  cache.get_or_compile(kKey2, [] { return kCubin; });
  const std::string dead_tmp = dir_ + "/" + kKey + ".999999999.0123456789abcdef.tmp";
  const std::string live_tmp = dir_ + "/" + kKey + "." + std::to_string(::getpid()) + ".00000000000000aa.tmp";
  write(dead_tmp, "partial");
  write(live_tmp, "partial");
  write(dir_ + "/notes.txt", "mine");
  write(dir_ + "/other.tmp", "mine");
  EXPECT_EQ(cache.clear(), 3u);
  EXPECT_FALSE(fs::exists(file(kKey)));
  EXPECT_FALSE(fs::exists(dead_tmp));
  EXPECT_TRUE(fs::exists(live_tmp));
  EXPECT_TRUE(fs::exists(dir_ + "/notes.txt"));
  EXPECT_TRUE(fs::exists(dir_ + "/other.tmp"));
  EXPECT_EQ(cache.stats().memory_entries, 0u);
  EXPECT_EQ(cache.get_or_compile(kKey, [] { return kCubin; }).origin, Origin::kCompiled);
}

TEST(CacheDefaults, DefaultDirectory) {
  const char* names[] = {"FAJIT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::pair<std::string, bool>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.emplace_back(v ? v : "", v != nullptr);
  }
  ::setenv("FAJIT_CACHE_DIR", "/a/b", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(Cache::default_dir(), "/a/b");
  ::unsetenv("FAJIT_CACHE_DIR");
  EXPECT_EQ(Cache::default_dir(), "/xdg/fajit");
  ::setenv("XDG_CACHE_HOME", "", 1);
  EXPECT_EQ(Cache::default_dir(), "/home/u/.cache/fajit");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(Cache::default_dir(), "/home/u/.cache/fajit");
  for (size_t i = 0; i < 3; ++i) {
    if (saved[i].second)
      ::setenv(names[i], saved[i].first.c_str(), 1);
    else
      ::unsetenv(names[i]);
  }
}

}  // namespace

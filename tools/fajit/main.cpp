// fajit: the command line.
//   fajit dump --mlir --mask causal --score alibi      the traced, simplified fa IR
//   fajit dump --cuda --mask-mod 'q >= kv'             the generated CUDA translation unit
//   fajit dump --ptx --arch sm_90a variant.mlir        PTX from NVRTC
//   fajit dump --sass ...                              SASS (needs cuobjdump or nvdisasm)
//   fajit dump --cuda --backward --mask causal         the backward kernels instead
//   fajit dump --cuda --kernel decode --mask causal    the split-KV decoding kernels instead
//   fajit cache ls | stats | clear                     the on-disk cubin cache
//   fajit cache warm variants.txt                      compile a list of variants into it ahead of time
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "fajit/detail/codegen.h"
#include "fajit/detail/expr.h"
#include "fajit/frontend.h"
#include "fajit/jit/cache.h"
#include "fajit/jit/nvrtc.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"
#include "mod_args.h"
#include "run_cmd.h"

namespace {

struct DumpOptions {
  bool mlir = false, cuda = false, ptx = false, sass = false;
  fajit_cli::ModArgs mods;
  std::string arch, dtype = "bf16";
  int head_dim_qk = 128, head_dim_v = 0;  // 0: same as head_dim_qk
  bool block_mask = false;
  bool block_tables = false;  // the builder's table kernels (codegen's generate_block_tables)
  bool backward = false;      // the backward kernels (KernelKind::kBackward)
  std::string family = "auto";
  std::string layout = "dense";  // dense, ragged or paged (fa::SequenceLayout)
  bool row_max = false;          // the twin that writes each row's largest score (KernelSpec::row_max)
  std::string tile;              // the forward tile, MxNwWsS; empty: the default
};

fa::KernelSpec spec_for(const DumpOptions& o) {
  fa::KernelSpec s;
  if (o.block_mask && o.backward) throw fa::Error("give --block-mask or --backward, not both");
  if (o.family == "decode" && (o.block_mask || o.backward))
    throw fa::Error("--kernel decode is the forward's decoding kernel: not with --block-mask or --backward");
  s.kind = o.block_mask           ? fa::KernelKind::kBlockMask
           : o.backward           ? fa::KernelKind::kBackward
           : o.family == "decode" ? fa::KernelKind::kDecode
                                  : fa::KernelKind::kForward;
  if (o.dtype == "bf16")
    s.dtype = fa::DType::bf16;
  else if (o.dtype == "f16" || o.dtype == "fp16")
    s.dtype = fa::DType::f16;
  else
    throw fa::Error(fmt::format("--dtype '{}': expected bf16 or f16", o.dtype));
  s.head_dim_qk = o.head_dim_qk;
  s.head_dim_v = o.head_dim_v ? o.head_dim_v : o.head_dim_qk;
  s.arch = o.arch.empty() ? "sm_90a" : o.arch;
  s.family = fajit_cli::kernel_family(o.family);
  s.layout = o.layout == "ragged"  ? fa::SequenceLayout::kRagged
             : o.layout == "paged" ? fa::SequenceLayout::kPaged
                                   : fa::SequenceLayout::kDense;
  s.row_max = o.row_max;
  s.tile = fajit_cli::parse_tile(o.tile);
  return s;  // generate() resolves it (the default tile depends on the mods)
}

// The CUDA toolkit's bin directory: $FAJIT_CUDA_BIN if set and non-empty, else
// /usr/local/cuda/bin.
std::string toolkit_bin_dir() {
  const char* env = std::getenv("FAJIT_CUDA_BIN");
  return env && *env ? env : "/usr/local/cuda/bin";
}

// The first of `names` found on PATH or in toolkit_bin_dir().
std::string find_tool(std::initializer_list<const char*> names) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');) dirs.push_back(d);
  }
  dirs.push_back(toolkit_bin_dir());
  for (const char* n : names)
    for (const std::string& d : dirs) {
      std::string p = d + "/" + n;
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
  return "";
}

// The block-mask builder's table kernels (kinds, tables, regrouping): one module per arch, the
// same for every mask_mod, so none of the variant's options but --arch apply.
fa::GeneratedKernel block_tables_of(const DumpOptions& o) {
  if (o.block_mask || o.backward || o.family == "decode")
    throw fa::Error(
        "--block-tables is a module of its own: not with --block-mask, --backward or --kernel decode");
  if (o.mlir) throw fa::Error("--block-tables has no IR (it reads no mods): give --cuda, --ptx or --sass");
  if (o.row_max || o.layout != "dense" || !o.tile.empty() || o.family != "auto")
    throw fa::Error(
        "--block-tables takes no forward options (--row-max, --layout, --tile, --kernel): the table kernels "
        "are one module per arch");
  // the variant's options checked as for any other kernel (dtype, head dims, arch); its arch
  return fa::generate_block_tables(spec_for(o).resolved().arch);
}

int run_dump(const DumpOptions& o) {
  fa::Program p = fajit_cli::program_of(o.mods);
  if (o.mlir && !o.block_tables) {
    std::cout << (o.backward ? p.score_grad_mlir() : p.to_mlir());  // --backward: the derivative
    return 0;
  }
  fa::GeneratedKernel g = o.block_tables ? block_tables_of(o) : fa::generate(p, spec_for(o));
  if (o.cuda) {
    std::cout << g.source;
    return 0;
  }
  fa::jit::CompileOptions copts;
  copts.arch = g.spec.arch;
  copts.want_ptx = o.ptx;
  fa::jit::CompileResult r = fa::jit::Nvrtc::get().compile(g.source, g.kernel_name + ".cu", copts);
  if (o.ptx) {
    std::cout << r.ptx;
    return 0;
  }
  std::string tool = find_tool({"cuobjdump", "nvdisasm"});
  if (tool.empty())
    throw fa::Error(fmt::format(
        "--sass needs cuobjdump or nvdisasm (from the CUDA toolkit) on PATH or in {}; neither was found "
        "(without the toolkit: pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump, then put their "
        "nvidia/cu13/bin on PATH)",
        toolkit_bin_dir()));
  char tmpl[] = "/tmp/fajit-sass-XXXXXX.cubin";
  int fd = ::mkstemps(tmpl, 6);
  if (fd < 0) throw fa::Error("cannot create a temporary file for --sass");
  ssize_t written = ::write(fd, r.cubin.data(), r.cubin.size());
  ::close(fd);
  if (written != static_cast<ssize_t>(r.cubin.size())) throw fa::Error("cannot write the cubin for --sass");
  bool is_cuobjdump = tool.find("cuobjdump") != std::string::npos;
  std::string cmd = fmt::format("'{}' {} '{}'", tool, is_cuobjdump ? "--dump-sass" : "", tmpl);
  int rc = std::system(cmd.c_str());
  ::unlink(tmpl);
  return rc == 0 ? 0 : 1;
}

// The options that name one variant (mods, dtype, head dims, arch), shared by `fajit dump` and
// the lines of a `fajit cache warm` file.
void add_variant_options(CLI::App* app, DumpOptions& o) {
  fajit_cli::add_mod_options(app, o.mods);
  app->add_option("--arch", o.arch, "target: sm_80, sm_86, sm_89, sm_90a, ... (default sm_90a)");
  app->add_option("--dtype", o.dtype, "element type: bf16 (default) or f16");
  app->add_option("--head-dim", o.head_dim_qk, "QK head dim: a multiple of 8 from 32 to 256 (default 128)");
  app->add_option("--head-dim-v", o.head_dim_v,
                  "V head dim: a multiple of 8 from 32 to 256 (default: the QK head dim)");
}

// One line of a warm file: a variant and the kernels to compile beside its forward.
struct WarmLine {
  int number = 0;
  std::string text;
  std::string error;  // a bad line or a failed compile
  std::string summary;
  fa::WarmReport report;
  double seconds = 0;
};

void warm_line(WarmLine& w) {
  DumpOptions o;
  std::vector<std::string> with;
  CLI::App app{"a line of a warm file", "warm"};
  add_variant_options(&app, o);
  app.add_option("--kernel", o.family, "forward kernel: auto, mma or wgmma")
      ->check(CLI::IsMember({"auto", "mma", "wgmma"}));
  app.add_option("--with", with,
                 "also: backward, deterministic, decode, ragged, paged, row_max, candidates (the "
                 "dense forward's autotuning candidates; comma-separated)")
      ->delimiter(',')
      ->check(
          CLI::IsMember({"backward", "deterministic", "decode", "ragged", "paged", "row_max", "candidates"}));
  try {
    app.parse(w.text, false);
  } catch (const CLI::ParseError& e) {
    w.error = e.what();
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    fa::Program p = fajit_cli::program_of(o.mods);
    const fa::KernelSpec spec = spec_for(o);  // checks dtype; the head dims, arch, family as dump does
    fa::Options opts;
    opts.dtype = spec.dtype;
    opts.head_dim_qk = spec.head_dim_qk;
    opts.head_dim_v = spec.head_dim_v;
    opts.arch = spec.arch;
    opts.family = spec.family;
    fa::Kernel k = fa::compile(p, opts);
    fa::WarmOptions wo;
    auto has = [&](const char* x) { return std::find(with.begin(), with.end(), x) != with.end(); };
    wo.backward = has("backward"), wo.deterministic = has("deterministic"), wo.decode = has("decode");
    wo.ragged = has("ragged"), wo.paged = has("paged"), wo.row_max = has("row_max");
    wo.candidates = has("candidates");
    w.report = k.warm(wo);
    w.summary = fmt::format("score_mod @{} mask_mod @{} {}", p.score_mod_name(), p.mask_mod_name(),
                            k.spec().to_string());
  } catch (const fa::Error& e) {
    w.error = e.what();
  } catch (const std::exception& e) {  // on a worker thread: uncaught, it would end the process
    w.error = std::string("internal error: ") + e.what();
  }
  w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// fajit cache warm FILE: compiles every variant of FILE (one per line, fajit dump's options plus
// --with) into the cache, `jobs` lines at a time; one line of report per variant.
int run_warm(const std::string& file, int jobs) {
  if (file.empty())
    throw fa::Error("fajit cache warm needs a file of variants (one per line, as fajit dump's options)");
  std::istringstream in(fajit_cli::read_file(file));
  std::vector<WarmLine> lines;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    const size_t first = text.find_first_not_of(" \t\r");
    if (first == std::string::npos || text[first] == '#') continue;
    WarmLine w;
    w.number = n, w.text = text.substr(first);
    lines.push_back(std::move(w));
  }
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int j = 0; j < std::max(1, jobs); ++j)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < lines.size();) warm_line(lines[i]);
    });
  for (std::thread& t : pool) t.join();
  fa::WarmReport total;
  int failed = 0;
  for (const WarmLine& w : lines) {
    if (!w.error.empty()) {
      ++failed;
      std::cout << fmt::format("{}:{}: error: {}\n", file, w.number, w.error);
      continue;
    }
    total.kernels += w.report.kernels, total.compiled += w.report.compiled;
    total.from_disk += w.report.from_disk, total.from_memory += w.report.from_memory;
    std::cout << fmt::format("{}:{}: {} kernel{} ({} compiled, {} from disk) in {:.2f} s: {}\n", file,
                             w.number, w.report.kernels, w.report.kernels == 1 ? "" : "s", w.report.compiled,
                             w.report.from_disk, w.seconds, w.summary);
  }
  fa::jit::Cache& cache = fa::jit::Cache::global();
  std::cout << fmt::format(
      "warmed {} of {} variant{}: {} kernels ({} compiled, {} from disk) in {:.2f} s into {}\n",
      lines.size() - failed, lines.size(), lines.size() == 1 ? "" : "s", total.kernels, total.compiled,
      total.from_disk, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      cache.disk_enabled() ? cache.dir() : "memory only (no writable cache directory)");
  return failed ? 1 : 0;
}

int run_cache(const std::string& what, const std::string& file, int jobs) {
  if (what == "warm") return run_warm(file, jobs);
  if (!file.empty()) throw fa::Error(fmt::format("fajit cache {} takes no file", what));
  fa::jit::Cache& cache = fa::jit::Cache::global();
  if (what == "ls") {
    for (const fa::jit::ListedEntry& e : cache.list())
      std::cout << fmt::format("{}  {:>9}  {}  {}\n", e.key, e.size, e.valid ? "ok     " : "corrupt", e.meta);
  } else if (what == "stats") {
    fa::jit::CacheStats s = cache.stats();
    std::cout << fmt::format("directory: {}{}\nentries:   {}\nbytes:     {}\n", cache.dir(),
                             s.disk_enabled ? "" : " (not writable: memory only)", s.disk_entries,
                             s.disk_bytes);
  } else {
    size_t n = cache.clear();
    std::cout << fmt::format("removed {} entr{} from {}\n", n, n == 1 ? "y" : "ies", cache.dir());
  }
  return 0;
}

}  // namespace

CLI::App* add_mask_command(CLI::App& app);  // tools/fajit/mask_cmd.cpp
int run_mask_command();
CLI::App* add_fuzz_command(CLI::App& app);  // tools/fajit/fuzz_cmd.cpp
int run_fuzz_command(const char* argv0);

int main(int argc, char** argv) {
  CLI::App app{"fajit: a just-in-time kernel compiler for FlexAttention-style attention", "fajit"};
  app.require_subcommand(1);

  DumpOptions dump;
  CLI::App* dump_cmd = app.add_subcommand("dump", "print the IR, CUDA, PTX or SASS of one attention variant");
  auto* what = dump_cmd->add_option_group("what", "what to print (exactly one)");
  what->add_flag("--mlir", dump.mlir, "the verified, simplified fa-dialect IR");
  what->add_flag("--cuda", dump.cuda, "the generated CUDA translation unit");
  what->add_flag("--ptx", dump.ptx, "PTX compiled by NVRTC");
  what->add_flag("--sass", dump.sass, "SASS (disassembled with cuobjdump or nvdisasm)");
  what->require_option(1);
  add_variant_options(dump_cmd, dump);
  dump_cmd
      ->add_option("--kernel", dump.family,
                   "forward kernel: auto (wgmma on sm_90a, else mma), mma, wgmma, or decode (split-KV "
                   "decoding for short queries)")
      ->check(CLI::IsMember({"auto", "mma", "wgmma", "decode"}));
  dump_cmd->add_flag("--block-mask", dump.block_mask,
                     "the block-mask builder's classifier (evaluates mask_mod on partial blocks) instead of "
                     "the forward kernel");
  dump_cmd->add_flag("--block-tables", dump.block_tables,
                     "the block-mask builder's table kernels (kinds to tables, regrouping; one module per "
                     "arch, the same for every mask_mod) instead of the forward kernel");
  dump_cmd->add_flag("--backward", dump.backward,
                     "the backward kernels (preprocess, dK/dV, dQ) instead of the forward kernel");
  dump_cmd
      ->add_option(
          "--layout", dump.layout,
          "sequence layout of the forward / decoding kernel: dense (default), ragged (cu_seqlens) or "
          "paged (K/V through a page table)")
      ->check(CLI::IsMember({"dense", "ragged", "paged"}));
  dump_cmd->add_flag("--row-max", dump.row_max,
                     "the forward / decoding kernel's twin that also writes each row's largest score "
                     "(ForwardOptions::max_scores)");
  dump_cmd->add_option(
      "--tile", dump.tile,
      "forward tile MxNwWsS (e.g. 192x128w16s3; wgmma: one of its list for the head dims, with "
      "--kernel wgmma); default: per head dims and mods");
  dump_cmd->add_option("file", dump.mods.file, "an .mlir file with a fa.score_mod and/or fa.mask_mod");

  fajit_cli::RunOptions run;
  std::string run_dtype = "bf16";
  CLI::App* run_cmd = app.add_subcommand(
      "run", "run one variant on the GPU, check it against the float64 reference, time it");
  fajit_cli::add_mod_options(run_cmd, run.mods);
  run_cmd->add_option("file", run.mods.file, "an .mlir file with a fa.score_mod and/or fa.mask_mod");
  run_cmd->add_option("--scalar", run.scalars,
                      "value of a runtime scalar: NAME=VALUE (a preset's knobs have defaults)");
  run_cmd->add_option("--buffer", run.buffers,
                      "shape and values of a captured buffer: NAME=D1[xD2...][:LO:HI], uniform in [LO, HI] "
                      "(default -1..1 for f32, 0..7 for i32; the presets' buffers have defaults)");
  run_cmd->add_option("--dtype", run_dtype, "bf16 (default) or f16")->check(CLI::IsMember({"bf16", "f16"}));
  run_cmd->add_flag("--backward", run.backward,
                    "also run the backward on random dO, check dQ, dK, dV against float64 and time it");
  run_cmd->add_flag(
      "--deterministic", run.deterministic,
      "with --backward: its deterministic mode (BackwardOptions::deterministic); the "
      "gradients of two runs are compared bit for bit (in their element type), and it is what is "
      "timed");
  run_cmd->add_flag("--max-scores", run.max_scores,
                    "also write each row's largest score (ForwardOptions::max_scores: the row-max kernels), "
                    "check it against float64, and time the forward with it");
  run_cmd->add_option("--batch", run.batch, "B (default 2)")->check(CLI::Range(1, 64));
  run_cmd->add_option("--heads", run.heads, "H (default 8)")->check(CLI::Range(1, 128));
  run_cmd->add_option("--len", run.len, "Lq = Lkv (default 1024)")->check(CLI::Range(1, 8192));
  run_cmd->add_option("--head-dim", run.head_dim,
                      "QK head dim: a multiple of 8 from 32 to 256 (default 128)");
  run_cmd->add_option("--head-dim-v", run.head_dim_v, "V head dim (default: the QK head dim)");
  run_cmd->add_option("--iters", run.iters, "timed launches (default 20)")->check(CLI::Range(1, 10000));
  run_cmd->add_option("--len-q", run.len_q, "Lq, the queries of each sequence (default: --len)")
      ->check(CLI::Range(1, 1 << 20));
  run_cmd->add_option("--len-kv", run.len_kv, "Lkv, the keys of each sequence (default: --len)")
      ->check(CLI::Range(1, 1 << 22));
  run_cmd->add_option("--heads-kv", run.heads_kv, "Hkv for GQA, dividing --heads (default: --heads)")
      ->check(CLI::Range(1, 128));
  run_cmd->add_option("--path", run.path, "forward kernel: auto (decoding for Lq <= 64), prefill or decode")
      ->check(CLI::IsMember({"auto", "prefill", "decode"}));
  run_cmd
      ->add_option("--splits", run.splits, "decoding: parts of the KV walk (default 0: enough for every SM)")
      ->check(CLI::Range(0, 1024));
  run_cmd->add_option("--kernel", run.kernel, "forward kernel family: auto (wgmma on sm_90a), mma or wgmma")
      ->check(CLI::IsMember({"auto", "mma", "wgmma"}));
  run_cmd->add_option("--tile", run.tile,
                      "forward tile MxNwWsS (e.g. 128x64w12s3; wgmma: one of its list for the head dims, "
                      "with --kernel wgmma); default: per head dims");
  run_cmd
      ->add_option("--autotune", run.autotune,
                   "time the forward's candidate tiles on first use of a shape and keep the fastest: env "
                   "(on unless FAJIT_AUTOTUNE=0), on or off")
      ->check(CLI::IsMember({"env", "on", "off"}));
  run_cmd->add_flag("--no-check", run.no_check,
                    "skip the float64 reference, forward and backward (timing shapes too large for it)");
  run_cmd->add_flag(
      "--varlen", run.varlen,
      "a ragged batch: random lengths up to --len-q / --len-kv per sequence (0 and 1 included), "
      "packed with cu_seqlens");
  run_cmd
      ->add_option("--seed", run.seed,
                   "seed of the random inputs and --varlen lengths (default: fresh each run), so "
                   "runs of two libraries or kernels see the same batch")
      ->check(CLI::Range(int64_t(0), int64_t(UINT32_MAX)));
  run_cmd
      ->add_option("--paged", run.page_size,
                   "K/V in a paged pool of this page size, pages shuffled, with a page table and seqlens_k")
      ->check(CLI::Range(1, 1 << 16));

  std::string cache_what, warm_file;
  int warm_jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CLI::App* cache_cmd =
      app.add_subcommand("cache", "inspect, clear or warm the on-disk cubin cache ($FAJIT_CACHE_DIR)");
  cache_cmd->add_option("command", cache_what, "ls, stats, clear, or warm FILE")
      ->required()
      ->check(CLI::IsMember({"ls", "stats", "clear", "warm"}));
  cache_cmd->add_option("file", warm_file,
                        "warm: variants to compile ahead of time, one per line as fajit dump's options "
                        "(--mask, --score, --mask-mod, --score-mod, --capture, --arch, --dtype, --head-dim, "
                        "--head-dim-v, --kernel auto|mma|wgmma) plus --with backward,deterministic,decode,"
                        "ragged,paged,row_max,candidates; # comments");
  cache_cmd->add_option("--jobs,-j", warm_jobs, "warm: variants compiled at once (default: the CPU count)")
      ->check(CLI::Range(1, 256));

  CLI::App* mask_cmd = add_mask_command(app);
  CLI::App* fuzz_cmd = add_fuzz_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*dump_cmd) return run_dump(dump);
    if (*cache_cmd) return run_cache(cache_what, warm_file, warm_jobs);
    if (*mask_cmd) return run_mask_command();
    if (*fuzz_cmd) return run_fuzz_command(argv[0]);
    if (*run_cmd) {
      run.dtype = run_dtype == "f16" ? fa::DType::f16 : fa::DType::bf16;
      return fajit_cli::run_variant(run);
    }
  } catch (const fa::Error& e) {
    std::fprintf(stderr, "fajit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fajit: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}

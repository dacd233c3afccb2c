// `moecore bench checkpoint`: save and load throughput (GB/s) of a small MoE model's full training state (weights
// and Adam moments), each against a plain sequential write (+ fsync) and read of the same bytes in one file in
// the same directory and run. Not a crash-safety test (tests/ckpt/crash_safety.sh).
#include "moecore/ckpt/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/core/timer.h"
#include "moecore/train/config/start_config.h"

namespace moecore::cli {

namespace {
struct CheckpointBenchArgs {
  std::string dir = "/tmp/moecore_bench_checkpoint";
  int iters = 3;
  std::vector<std::string> train_flags;  // `moecore train` flags overriding the model
};

// The baseline: `tensors` written one after another into one file and fsynced, then read back in the same order.
std::pair<double, double> plain_write_read(const std::string& path, const std::vector<Tensor>& tensors) {
  Stopwatch timer;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MOE_CHECK(fd >= 0, "cannot create {}", path);
  for (const auto& t : tensors) {
    const char* p = static_cast<const char*>(t.raw());
    size_t left = t.nbytes();
    while (left > 0) {
      const ssize_t w = ::write(fd, p, left);
      MOE_CHECK(w > 0, "cannot write {}", path);
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  MOE_CHECK(::fsync(fd) == 0 && ::close(fd) == 0, "cannot fsync {}", path);
  const double write_s = timer.seconds();
  timer.restart();
  fd = ::open(path.c_str(), O_RDONLY);
  MOE_CHECK(fd >= 0, "cannot open {}", path);
  for (const auto& t : tensors) {
    Tensor into = Tensor::empty(t.shape(), t.dtype());
    char* p = static_cast<char*>(into.raw());
    size_t left = into.nbytes();
    while (left > 0) {
      const ssize_t r = ::read(fd, p, left);
      MOE_CHECK(r > 0, "cannot read {}", path);
      p += r;
      left -= static_cast<size_t>(r);
    }
  }
  ::close(fd);
  return {write_s, timer.seconds()};
}

void run_bench_checkpoint(const CheckpointBenchArgs& a) {
  namespace fs = std::filesystem;
  TrainBenchArgs ta;
  ta.dtype = "f32";
  ta.iters = 1;
  ta.train_flags = a.train_flags;
  ta.train_flags.insert(ta.train_flags.end(), {"--save", a.dir + "/ckpt"});
  // About 55 M parameters: 0.66 GB of weights and Adam moments per checkpoint.
  const train::TrainConfig cfg = train::parse_train_config(
      bench_model_flags(ta,
                        "--normalization RMSNorm --position-embedding-type rope "
                        "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --swiglu --disable-bias-linear "
                        "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --seq-length 64 "
                        "--micro-batch-size 1 --global-batch-size 1 --vocab-size 32000"));
  fs::remove_all(a.dir);
  fs::create_directories(a.dir);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(cfg, null, false);
  t.train_step();  // non-zero moments
  // What the checkpoint holds, for the load targets and the baseline.
  std::vector<Tensor> moments;
  std::vector<ckpt::LoadTarget> targets;
  std::vector<Tensor> same_bytes;
  for (auto& p : t.params().all()) {
    targets.push_back({p->name, ckpt::box_of(*p), &p->value});
    for (int k = 0; k < 3; k++) same_bytes.push_back(p->value);  // weights and two moments' worth
    for (int k = 0; k < 2; k++) moments.push_back(Tensor::empty(p->value.shape(), DType::F32));
  }
  size_t mi = 0;
  for (auto& p : t.params().all())
    for (const char* k : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
      targets.push_back({k + p->name, ckpt::box_of(*p), &moments[mi++]});
  double save_best = 1e30, load_best = 1e30, write_best = 1e30, read_best = 1e30;
  std::string dir;
  for (int i = 0; i < a.iters; i++) {
    Stopwatch timer;
    dir = t.save_checkpoint();
    save_best = std::min(save_best, timer.seconds());
    timer.restart();
    ckpt::load_tensors(dir, targets);
    load_best = std::min(load_best, timer.seconds());
    const auto [w, r] = plain_write_read(a.dir + "/plain.bin", same_bytes);
    write_best = std::min(write_best, w);
    read_best = std::min(read_best, r);
  }
  std::fclose(null);
  double bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) bytes += static_cast<double>(e.file_size());
  double plain = 0;
  for (const auto& x : same_bytes) plain += static_cast<double>(x.nbytes());
  fmt::print(
      "moecore bench checkpoint: {:.1f} M parameters, {:.2f} GB per checkpoint (weights + Adam moments, "
      "index, state) in {}, best of {}\n",
      static_cast<double>(t.params().numel()) / 1e6, bytes / 1e9, a.dir, a.iters);
  fmt::print("checkpoint save_gbps={:.2f} plain_write_gbps={:.2f} ratio={:.2f} (checksums, fsync, rename)\n",
             bytes / save_best / 1e9, plain / write_best / 1e9, (bytes / save_best) / (plain / write_best));
  fmt::print(
      "checkpoint load_gbps={:.2f} plain_read_gbps={:.2f} ratio={:.2f} (index validation, checksums, copies "
      "into the layout; reads from the page cache for both)\n",
      bytes / load_best / 1e9, plain / read_best / 1e9, (bytes / load_best) / (plain / read_best));
  fs::remove_all(a.dir);
}
}  // namespace

BenchCommand add_checkpoint_bench(CLI::App& bench) {
  auto a = std::make_shared<CheckpointBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("checkpoint",
                                       "Checkpoint save/load GB/s vs a plain sequential write/read of the same bytes");
  cmd->add_option("--dir", a->dir, "Scratch directory (removed afterwards)")->capture_default_str();
  cmd->add_option("--iters", a->iters, "Repetitions (best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->allow_extras();  // moecore train flags overriding the model
  return {cmd, [a, cmd] {
            a->train_flags = cmd->remaining();
            run_bench_checkpoint(*a);
          }};
}

}  // namespace moecore::cli

// Checkpoint directories, atomic saves, the latest marker and its sidecar, and the guards around them (see
// manager.h).
#include "moecore/ckpt/manager.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "moecore/ckpt/foreign_checkpoint.h"
#include "moecore/ckpt/metadata.h"
#include "moecore/core/error.h"
#include "moecore/core/file.h"

namespace moecore::ckpt {

namespace fs = std::filesystem;

std::string iteration_dir(const std::string& root, int64_t iteration) {
  return iteration < 0 ? root + "/release" : fmt::format("{}/iter_{:07d}", root, iteration);
}

namespace {
void barrier(const comm::ProcessGroup* world) {
  if (world && world->size() > 1) world->barrier();
}

bool complete(const std::string& dir) {
  return fs::exists(dir + "/index.json") && fs::exists(dir + "/" + kStateFile);
}

std::string trimmed_marker(const std::string& path) {
  std::string text = moecore::read_file(path, "checkpoint marker");
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

std::string names_of(const std::vector<std::pair<int64_t, std::string>>& cks) {
  std::vector<std::string> names;
  for (const auto& [it, dir] : cks) names.push_back(fs::path(dir).filename().string());
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

// The marker's text parsed: an iteration >= 0, or -1 for "release".
int64_t parse_marker(const std::string& text, const std::string& marker) {
  if (text == "release") return -1;
  size_t pos = 0;
  int64_t it = -1;
  try {
    it = std::stoll(text, &pos);
  } catch (...) {
    pos = 0;
  }
  MOE_CHECK(pos == text.size() && pos > 0 && it >= 0,
            "{} is corrupt: expected an iteration number or 'release', found '{}'", marker, text);
  return it;
}

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}
}  // namespace

std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  static const std::regex iter_dir(R"(iter_(\d{7,}))");
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, iter_dir) && complete(e.path().string()))
      out.push_back({std::stoll(m[1].str()), e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

PendingSave begin_save(const std::string& root, int64_t iteration, const comm::ProcessGroup* world) {
  const int64_t rank = world ? world->rank() : 0;
  PendingSave p{root, iteration_dir(root, iteration) + ".tmp", iteration_dir(root, iteration), iteration};
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    MOE_CHECK(!ec, "cannot create the --save directory {}: {}", root, ec.message());
    fs::remove_all(p.tmp, ec);  // a save that crashed before
    fs::create_directory(p.tmp, ec);
    MOE_CHECK(!ec, "cannot create {}: {}", p.tmp, ec.message());
  }
  barrier(world);
  return p;
}

void write_rank_files(const PendingSave& p, int64_t rank, const std::vector<StoredTensor>& mine, SaveFault fault) {
  write_shards(p.tmp, rank, mine);
  if (fault.rank == rank && fault.iteration == p.iteration) std::raise(SIGKILL);  // --fault-kill-during-save
}

void abandon_save(const PendingSave& p, int64_t rank) {
  // A full disk: the partial directory goes (it is never loaded); the previous checkpoint stays as it was.
  std::error_code ec;
  if (rank == 0) fs::remove_all(p.tmp, ec);
}

void commit_save(const PendingSave& p, const nlohmann::json& state, const comm::ProcessGroup* world,
                 const std::vector<std::pair<std::string, std::string>>& extra_files, int64_t fragments) {
  const int64_t rank = world ? world->rank() : 0;
  const int64_t size = fragments > 0 ? fragments : world ? world->size() : 1;
  const std::string &root = p.root, &tmp = p.tmp, &final_dir = p.final_dir;
  barrier(world);  // every rank's files are on disk
  if (rank == 0) {
    try {
      write_model_index(tmp, size);  // refuses any missing or duplicated element
      // The extra files' checksums ride in the checksummed state (verified on load).
      nlohmann::json st = state;
      for (const auto& [name, content] : extra_files)
        st["files"][name] = fmt::format("{:016x}", XXH3_64bits(content.data(), content.size()));
      write_file_durable(tmp + "/" + kStateFile, metadata_text(st));
      for (const auto& [name, content] : extra_files) write_file_durable(tmp + "/" + name, content);
      if (p.integrity) write_integrity_manifest(tmp);
      fsync_dir(tmp);
    } catch (const Error&) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
    std::error_code ec;
    if (fs::exists(final_dir)) {
      // Saving an iteration again (e.g. resumed from it): the old copy goes only once the new one is complete.
      fs::remove_all(final_dir + ".old", ec);
      fs::rename(final_dir, final_dir + ".old", ec);
      MOE_CHECK(!ec, "cannot move the previous {} aside: {}", final_dir, ec.message());
    }
    rename_checked(tmp, final_dir);
    fsync_dir(root);
    // Megatron's plain marker first, then its checksummed sidecar: a crash between the two leaves the sidecar one
    // save behind a marker that names a newer complete checkpoint, which loading recognizes; a marker moved back
    // (edited) is refused.
    const std::string text = p.iteration < 0 ? "release" : std::to_string(p.iteration);
    write_file_atomic(root + "/" + kLatestFile, text);
    write_file_atomic(root + "/" + kMarkerSidecar, metadata_text({{"format", kMarkerFormat}, {"marker", text}}));
    fs::remove_all(final_dir + ".old", ec);
  }
  barrier(world);
}

std::string save_checkpoint(const std::string& root, int64_t iteration, const std::vector<StoredTensor>& mine,
                            const nlohmann::json& state, const comm::ProcessGroup* world,
                            const std::vector<std::pair<std::string, std::string>>& extra_files, SaveFault fault,
                            bool integrity) {
  const int64_t rank = world ? world->rank() : 0;
  PendingSave p = begin_save(root, iteration, world);
  p.integrity = integrity;
  try {
    write_rank_files(p, rank, mine, fault);
  } catch (const Error&) {
    abandon_save(p, rank);
    throw;
  }
  commit_save(p, state, world, extra_files);
  return p.final_dir;
}

namespace {
// The XXH3-64 of a file's bytes, in hex, read in pieces.
std::string file_hash(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MOE_CHECK(f != nullptr, "{}: cannot read it: {}", path, std::strerror(errno));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) XXH3_64bits_update(st, buf.data(), n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  MOE_CHECK(!failed, "{}: read error", path);
  return fmt::format("{:016x}", h);
}
}  // namespace

void write_integrity_manifest(const std::string& dir) {
  nlohmann::json files = nlohmann::json::object();
  std::vector<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) names.push_back(fs::relative(e.path(), dir).string());
  std::sort(names.begin(), names.end());
  for (const auto& n : names)
    if (n != kIntegrityFile) files[n] = file_hash(dir + "/" + n);
  write_file_durable(dir + "/" + kIntegrityFile,
                     nlohmann::json{{"algorithm", "xxh3_64"}, {"files", files}}.dump(2) + "\n");
}

void verify_integrity_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kIntegrityFile;
  MOE_CHECK(fs::exists(path),
            "--verify-integrity: integrity manifest not found at {}; the checkpoint must be saved with "
            "--verify-integrity before it can be verified on load (drop the flag to load it unverified)",
            path);
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(moecore::read_file(path, "integrity manifest"));
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "--verify-integrity: {} is not valid JSON: {}", path, e.what());
  }
  MOE_CHECK(m.is_object() && m.value("algorithm", "") == "xxh3_64" && m.contains("files") && m["files"].is_object(),
            "--verify-integrity: {} is not an integrity manifest (algorithm xxh3_64 and a files object)", path);
  std::vector<std::string> bad;
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const std::string f = dir + "/" + it.key();
    if (!fs::is_regular_file(f))
      bad.push_back(fmt::format("{}: file missing", it.key()));
    else if (!it.value().is_string() || file_hash(f) != it.value().get<std::string>())
      bad.push_back(fmt::format("{}: hash mismatch", it.key()));
  }
  MOE_CHECK(bad.empty(), "--verify-integrity: checkpoint integrity verification failed for {} file(s) in {}: {}",
            bad.size(), dir, fmt::join(bad, "; "));
}

void delete_checkpoints(const std::string& root, const std::vector<int64_t>& iterations) {
  for (int64_t it : iterations) {
    const std::string dir = iteration_dir(root, it), gone = dir + ".deleted";
    std::error_code ec;
    if (!fs::exists(dir, ec) || fs::is_symlink(dir, ec)) continue;  // as Megatron, never through a symbolic link
    // Renamed first: a crash mid-deletion leaves no directory that looks like a checkpoint.
    fs::remove_all(gone, ec);
    fs::rename(dir, gone, ec);
    MOE_CHECK(!ec, "cannot move {} aside to delete it: {}", dir, ec.message());
    fs::remove_all(gone, ec);
    MOE_CHECK(!ec, "cannot delete {}: {}", gone, ec.message());
  }
  if (!iterations.empty()) fsync_dir(root);
}

namespace {
FoundCheckpoint read_found(const std::string& dir) {
  FoundCheckpoint f{dir, {}, false, {}};
  const std::string sp = dir + "/" + kStateFile;
  MOE_CHECK(fs::exists(sp), "{} has no {}: the checkpoint is incomplete (its save did not finish)", dir, kStateFile);
  f.state = read_metadata(sp, "checkpoint state", {kTrainStateFormat, kTrainStateFormatV1}, &f.legacy);
  validate_train_state(f.state, dir);
  validate_state_against_index(f.state, read_model_index(dir), dir);
  if (f.state.contains("files")) {
    const Fields files = Fields(f.state, sp).object("files");
    for (auto it = files.json().begin(); it != files.json().end(); ++it) {
      const std::string want = files.string(it.key().c_str()), path = dir + "/" + it.key();
      MOE_CHECK(it.key().find('/') == std::string::npos && fs::exists(path),
                "{}: field 'files.{}' names a file that is not in {}; {}", sp, it.key(), dir, kMetadataFix);
      const std::string bytes = moecore::read_file(path, "checkpoint file");
      const std::string got = fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
      MOE_CHECK(got == want, "{}: checksum mismatch (recorded in {} as {}, computed {}): {}", path, sp, want, got,
                kMetadataFix);
    }
  }
  if (f.legacy)
    f.note = fmt::format(
        "{} is in the older format {} (no checksum): its fields were validated; the next save "
        "writes {}",
        sp, kTrainStateFormatV1, kTrainStateFormat);
  return f;
}

// Refuses a directory that only looks like a checkpoint: a save's temporary directory or one whose save did not
// finish.
void refuse_partial(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  const std::string parent = fs::path(path).parent_path().string();
  MOE_CHECK(name.size() < 4 || name.substr(name.size() - 4) != ".tmp",
            "--load {} is the temporary directory of a checkpoint save that did not finish and is never loaded; point "
            "--load at {} (its latest complete checkpoint) or pick one with --ckpt-step N (complete there: {})",
            path, parent, names_of(complete_checkpoints(parent)));
  static const std::regex iter_like(R"((iter_\d{7,}|release)(\.old)?)");
  bool partial = std::regex_match(name, iter_like) || fs::exists(path + "/" + kStateFile);
  std::error_code ec;
  if (fs::is_directory(path, ec))
    for (const auto& e : fs::directory_iterator(path, ec))
      partial = partial || e.path().filename().string().rfind("model_rank", 0) == 0 ||
                e.path().filename().string().rfind("index_rank", 0) == 0;
  MOE_CHECK(!partial,
            "--load {} is an incomplete checkpoint (no index.json: its save did not finish); point --load at {} or "
            "pick a complete iteration with --ckpt-step N (complete there: {})",
            path, parent, names_of(complete_checkpoints(parent)));
}
}  // namespace

std::optional<FoundCheckpoint> find_checkpoint(const std::string& given, int64_t step) {
  const std::string path = strip_slashes(given);
  refuse_foreign_checkpoint(path);  // Megatron's formats, named, before they read as broken or incomplete
  if (path.size() >= 4 && path.substr(path.size() - 4) == ".tmp") refuse_partial(path);
  if (step >= 0) {
    MOE_CHECK(!fs::exists(path + "/index.json"),
              "--ckpt-step {}: --load {} is itself a checkpoint directory; point --load at the directory holding its "
              "iter_NNNNNNN directories",
              step, path);
    const std::string dir = iteration_dir(path, step);
    MOE_CHECK(complete(dir), "--ckpt-step {}: {} is {}; complete checkpoints in {}: {}", step, dir,
              fs::exists(dir) ? "incomplete (its save did not finish)" : "not there", path,
              names_of(complete_checkpoints(path)));
    return read_found(dir);
  }
  std::string dir, note;
  const std::string marker = path + "/" + kLatestFile;
  if (fs::exists(marker)) {
    const std::string text = trimmed_marker(marker);
    const int64_t it = parse_marker(text, marker);
    dir = iteration_dir(path, it);
    // A crash while re-saving the same iteration can leave only the previous copy, moved aside.
    if (!fs::exists(dir + "/index.json") && fs::exists(dir + ".old/index.json")) dir += ".old";
    MOE_CHECK(fs::exists(dir + "/index.json"),
              "{} names {}, which is missing or incomplete; restore it, or pick a complete iteration with "
              "--ckpt-step N (complete there: {})",
              marker, dir, names_of(complete_checkpoints(path)));
    // The sidecar says which marker text moecore wrote last: anything else was edited by hand or by another tool.
    const std::string sidecar = path + "/" + kMarkerSidecar;
    if (fs::exists(sidecar)) {
      const nlohmann::json j = read_metadata(sidecar, "checkpoint marker sidecar", {kMarkerFormat});
      const Fields f(j, sidecar);
      const std::string wrote = f.string("marker");
      if (text != wrote) {
        const int64_t recorded = parse_marker(wrote, sidecar);
        // Interrupted between the marker and its sidecar: the marker names the newer, complete checkpoint.
        const bool interrupted = it > recorded && complete(dir);
        MOE_CHECK(interrupted,
                  "{} says '{}' but {} records that moecore last wrote '{}': the marker was edited or replaced "
                  "after the save; restore it, or pick the iteration to load with --ckpt-step N (complete there: {})",
                  marker, text, sidecar, wrote, names_of(complete_checkpoints(path)));
        note = fmt::format("{} is one save behind {} (a save interrupted after its checkpoint was complete)", sidecar,
                           marker);
      }
    }
  } else if (fs::exists(path + "/index.json")) {
    dir = path;
  } else {
    refuse_partial(path);
    const auto cks = complete_checkpoints(path);
    MOE_CHECK(cks.empty(),
              "--load {} has no {} but holds complete checkpoints: {}; choose one with --ckpt-step N (e.g. "
              "--ckpt-step {} for the newest), or restore the marker",
              path, kLatestFile, names_of(cks), cks.empty() ? 0 : cks.back().first);
    return std::nullopt;
  }
  FoundCheckpoint f = read_found(dir);
  if (!note.empty()) f.note = note + (f.note.empty() ? "" : "\n" + f.note);
  return f;
}

void check_save_overwrites(const std::string& root, int64_t start_iteration, const std::string& loaded_dir) {
  std::error_code ec;
  const fs::path loaded = loaded_dir.empty() ? fs::path() : fs::weakly_canonical(loaded_dir, ec);
  std::vector<std::pair<int64_t, std::string>> at_risk;
  for (const auto& [it, dir] : complete_checkpoints(root)) {
    if (start_iteration >= 0 && it < start_iteration) continue;  // older: never saved again by this run
    if (it == start_iteration && !loaded.empty() && fs::weakly_canonical(dir, ec) == loaded) continue;
    at_risk.push_back({it, dir});
  }
  if (at_risk.empty()) return;
  MOE_CHECK(start_iteration >= 0,
            "--save {} already holds complete checkpoints ({}) and this run loads none of them: its saves would "
            "replace them. Pass --load {} to resume the newest (or --ckpt-step N for another), or choose another "
            "--save directory",
            root, names_of(at_risk), root);
  MOE_CHECK(false,
            "--save {} holds complete checkpoints at or after iteration {} that this run did not load ({}): training "
            "on from iteration {} would replace them. Choose another --save directory, or load the newest with "
            "--load {}",
            root, start_iteration, names_of(at_risk), start_iteration, root);
}

namespace {
// The iteration the marker of `root` names when moecore wrote that marker last (its sidecar records the same
// text); nothing when either file is missing, unreadable or they disagree (find_checkpoint names those problems).
std::optional<int64_t> committed_marker(const std::string& root) {
  const std::string marker = root + "/" + kLatestFile, sidecar = root + "/" + kMarkerSidecar;
  std::error_code ec;
  if (!fs::exists(marker, ec) || !fs::exists(sidecar, ec)) return std::nullopt;
  try {
    const std::string text = trimmed_marker(marker);
    const nlohmann::json j = read_metadata(sidecar, "checkpoint marker sidecar", {kMarkerFormat});
    if (Fields(j, sidecar).string("marker") != text) return std::nullopt;
    return parse_marker(text, marker);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Renames `dir` to <dir>.uncommitted-<k> for the first k whose name is free; the rename itself refuses to replace
// anything (RENAME_NOREPLACE), so two runs doing this at once cannot overwrite each other's.
std::string set_aside(const std::string& dir) {
  for (int k = 1;; k++) {
    const std::string to = fmt::format("{}.uncommitted-{}", dir, k);
    int rc = ::renameat2(AT_FDCWD, dir.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
    std::error_code ec;
    if (rc != 0 && errno == EINVAL && !fs::exists(to, ec)) rc = ::rename(dir.c_str(), to.c_str());  // no NOREPLACE
    if (rc == 0) return to;
    MOE_CHECK(errno == EEXIST || errno == ENOTEMPTY, "cannot set aside the uncommitted save {} as {}: {}", dir, to,
              std::strerror(errno));
  }
}

// Whether every rank of `world` passes the same `text` (one all-reduce of its hash, as a maximum and a minimum).
bool ranks_agree(const std::string& text, const comm::ProcessGroup* world) {
  if (!world || world->size() <= 1) return true;
  const auto h = static_cast<int64_t>(XXH3_64bits(text.data(), text.size()) >> 2);
  Tensor t = Tensor::empty({2}, DType::I64);
  t.data<int64_t>()[0] = h;
  t.data<int64_t>()[1] = -h;
  world->all_reduce(t, comm::ReduceOp::Max);
  return t.data<int64_t>()[0] == -t.data<int64_t>()[1];
}
}  // namespace

std::vector<std::pair<int64_t, std::string>> uncommitted_saves(const std::string& root, int64_t start_iteration,
                                                               const std::string& loaded_dir) {
  const std::optional<int64_t> marked = committed_marker(root);
  if (!marked || *marked < 0 || *marked != start_iteration || loaded_dir.empty()) return {};
  std::error_code ec;
  if (fs::weakly_canonical(loaded_dir, ec) != fs::weakly_canonical(iteration_dir(root, *marked), ec)) return {};
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& ck : complete_checkpoints(root))
    if (ck.first > *marked) out.push_back(ck);
  return out;
}

std::vector<std::string> set_aside_uncommitted_saves(const std::string& root, int64_t start_iteration,
                                                     const std::string& loaded_dir, const comm::ProcessGroup* world) {
  const auto saves = uncommitted_saves(root, start_iteration, loaded_dir);
  MOE_CHECK(ranks_agree(names_of(saves), world),
            "--save {}: the ranks see different saves there that the marker never committed (this rank: {}); put "
            "--save on a file system every rank shares",
            root, names_of(saves));
  if (saves.empty()) return {};
  std::vector<std::string> lines;
  std::exception_ptr failure;
  if (!world || world->rank() == 0) {
    try {
      for (const auto& [it, dir] : saves) {
        const std::string to = set_aside(dir);
        lines.push_back(fmt::format(
            "set aside {} as {}: its save was never committed ({} names iteration {}: the run that wrote it ended "
            "before moving the marker); training goes on from iteration {}",
            dir, fs::path(to).filename().string(), kLatestFile, start_iteration, start_iteration));
      }
      fsync_dir(root);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Every rank learns whether rank 0's renames failed, so none trains on while another throws.
  const bool all_done = ranks_agree(failure ? "failed" : "done", world);
  if (failure) std::rethrow_exception(failure);
  MOE_CHECK(all_done,
            "--save {}: setting aside its uncommitted saves failed on rank 0 (its message names the directory)", root);
  return lines;
}

void check_save_directory(const std::string& root, int64_t bytes, int64_t rank) {
  std::error_code ec;
  fs::create_directories(root, ec);
  MOE_CHECK(!ec, "--save {}: cannot create the directory: {}", root, ec.message());
  const std::string probe = fmt::format("{}/.moecore-write-probe.{}.{}", root, rank, ::getpid());
  try {
    write_file_durable(probe, "moecore checks that --save is writable\n");
  } catch (const Error& e) {
    fs::remove(probe, ec);
    MOE_CHECK(false, "--save {} is not writable: {}", root, e.what());
  }
  MOE_CHECK(fs::remove(probe, ec) && !ec, "--save {}: cannot remove the probe file {}: {}", root, probe, ec.message());
  struct statvfs st {};
  MOE_CHECK(::statvfs(root.c_str(), &st) == 0, "--save {}: cannot read its free space: {}", root, std::strerror(errno));
  const int64_t avail = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  MOE_CHECK(avail >= bytes,
            "--save {}: a checkpoint of this model needs {} bytes ({:.2f} GiB: parameters and Adam moments) but its "
            "file system has {} bytes ({:.2f} GiB) available; free space or choose another --save directory",
            root, bytes, static_cast<double>(bytes) / gib, avail, static_cast<double>(avail) / gib);
}

}  // namespace moecore::ckpt

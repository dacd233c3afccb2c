// Stop requests by signal, so a preempted or interrupted run ends at a step boundary with a checkpoint instead of
// losing the steps since the last save. While a StopSignals is alive its signals only set a flag (the trainer
// agrees on it over all ranks at the next step boundary, saves and exits 0); a second SIGINT exits at once
// (status 130) without touching any checkpoint. SIGUSR1 and SIGUSR2 are among them because Open MPI's mpirun
// forwards those to every rank (it turns SIGTERM and SIGINT into a kill of the job; `moecore launch` turns them
// into SIGUSR1). Not the save itself, nor the agreement: those are the trainer's.
//
// A kill sequence is a stop request too: Open MPI's mpirun answers SIGTERM or SIGINT (and Slurm a cancel) by
// sending every rank SIGCONT, then SIGTERM, then SIGKILL, with odls_base_sigkill_timeout seconds (default 1)
// between them. A SIGCONT that resumes nothing (the process was not stopped just before it) is therefore taken as
// the first step of such a sequence, so the ranks start their stop at once instead of a second later. A SIGCONT
// after a real stop (Ctrl-Z then fg through mpirun, which forwards SIGTSTP and SIGCONT; a scheduler's suspend
// and resume) resumes training: a ticker thread sees the process's clock jump across the stop.
#pragma once

#include <csignal>
#include <memory>
#include <string>
#include <vector>

namespace moecore::train {

class KillSequenceWatch;

class StopSignals {
 public:
  // Handles `signals` until destroyed (with `kill_sequence`, also SIGCONT as described above), then restores the
  // previous handlers. Clears any earlier request.
  explicit StopSignals(const std::vector<int>& signals, bool kill_sequence = false);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (0: none).
  static int requested();
  // The signal number requested() gives for a kill sequence (see above): SIGCONT.
  static constexpr int kKillSequence = SIGCONT;
  // What a signal would do (tests, and ranks told by another rank).
  static void request(int signal);
  // "SIGTERM", "SIGUSR1", ... for the signals moecore handles; "signal N" otherwise.
  static std::string name(int signal);
  // --exit-signal values: the catchable signals a handler can return from, by name (SIGTERM, SIGINT, SIGUSR1,
  // SIGUSR2, SIGHUP, SIGQUIT, SIGALRM, ...; 0 for anything else). kExitSignalChoices lists them.
  static const char* const kExitSignalChoices;
  static int parse(const std::string& name);

 private:
  std::vector<std::pair<int, struct sigaction>> previous_;
  std::unique_ptr<KillSequenceWatch> kill_watch_;  // when SIGCONT is taken as a kill sequence
};

}  // namespace moecore::train

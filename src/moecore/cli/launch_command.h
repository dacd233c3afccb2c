// `moecore launch`: the job launcher in front of mpirun, as torchrun is in front of PyTorch ranks. Open MPI's
// mpirun answers SIGTERM and SIGINT by killing every rank within about a second, too soon to save; the launcher
// runs mpirun in its own session (so a terminal's Ctrl-C reaches only the launcher), turns the first SIGTERM or
// SIGINT into SIGUSR1, which mpirun forwards to every rank (they stop at the next step boundary, save and exit 0),
// and a second one into SIGTERM to mpirun (the job ends at once; checkpoints are atomic, the last good one stays).
#pragma once

namespace moecore::cli {

// argv: the whole command line, argv[1] == "launch". Returns the job's exit status.
int run_launch(int argc, char** argv);

}  // namespace moecore::cli

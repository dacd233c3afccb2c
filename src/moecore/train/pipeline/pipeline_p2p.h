// Point-to-point transport between neighbouring pipeline stages: the hidden state [S/TP, B, H] a model chunk hands
// to the next stage in forward, and its gradient handed back in backward, as non-blocking MPI sends and receives
// on the pipeline group (every wait polled by the watchdog). The shape is fixed for the run (with sequence
// parallelism the scattered shape); receives are posted ahead and waited for when their pass starts; sends are
// waited for at the end of the step. Not the schedule (pipeline_schedule.h decides the order of passes).
//
// Who talks to whom (Megatron's interleaved wiring; v = 1 is plain 1F1B): chunk c of stage r feeds chunk c of
// stage r+1, and the last stage's chunk c feeds the first stage's chunk c+1. A message's tag is the receiving
// chunk (×2, +1 for gradients); MPI keeps messages of one tag between two ranks in order, and both ends run a
// chunk's micro-batches in increasing order, so each receive matches its micro-batch.
#pragma once

#include <deque>
#include <tuple>
#include <utility>

#include "moecore/comm/process_group.h"

namespace moecore::train {

class PipelineP2P {
 public:
  PipelineP2P(const comm::ProcessGroup& pp, int64_t virtual_stages, const Shape& hidden, DType dtype);

  // Whether chunk c on this rank receives its input from another stage (not the embedding chunk), and whether its
  // output goes to another stage (not the loss chunk).
  bool receives_input(int64_t c) const { return !(rank_ == 0 && c == 0); }
  bool sends_output(int64_t c) const { return !(rank_ == size_ - 1 && c == v_ - 1); }

  // Posts the receive of chunk c's next input (forward) or of its output's next gradient (backward).
  void post_recv(int64_t c, bool backward);
  // Waits for the oldest posted receive of (c, backward) and returns its tensor.
  Tensor wait_recv(int64_t c, bool backward);
  // Sends chunk c's output forward, or the gradient of its input backward (non-blocking; `t` is kept alive).
  void send(int64_t c, bool backward, const Tensor& t);
  // Waits for every send of the step (their buffers are then free).
  void finish_sends();

  int64_t sent_bytes() const { return sent_bytes_; }  // since construction
  const Shape& shape() const { return shape_; }
  // Where the stages' activations live: messages travel between host buffers (host-staged MPI) and are handed to
  // the stage on this device.
  void set_device(Device d) { device_ = d; }

 private:
  struct Pending {
    comm::Work work;
    Tensor t;
  };
  // The peer and tag of a message of chunk c: its input's sender / its output's receiver.
  std::pair<int64_t, int> input_peer(int64_t c, bool backward) const;
  std::pair<int64_t, int> output_peer(int64_t c, bool backward) const;
  const comm::ProcessGroup& pp_;
  int64_t rank_, size_, v_;
  Shape shape_;
  Device device_ = Device::cpu();
  DType dtype_;
  std::vector<std::deque<Pending>> recvs_;  // per (chunk, direction)
  std::deque<Pending> sends_;
  int64_t sent_bytes_ = 0;
};

}  // namespace moecore::train

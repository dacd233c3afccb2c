// Pipeline point-to-point transport (see pipeline_p2p.h).
#include "moecore/train/pipeline/pipeline_p2p.h"

#include "moecore/core/error.h"

namespace moecore::train {

PipelineP2P::PipelineP2P(const comm::ProcessGroup& pp, int64_t virtual_stages, const Shape& hidden, DType dtype)
    : pp_(pp),
      rank_(pp.rank()),
      size_(pp.size()),
      v_(virtual_stages),
      shape_(hidden),
      dtype_(dtype),
      recvs_(static_cast<size_t>(2 * virtual_stages)) {
  MOE_CHECK(2 * v_ <= 32767, "{} virtual stages need more message tags than MPI guarantees", v_);
}

// Forward: chunk c's input comes from stage r−1's chunk c (the last stage's chunk c−1 on the first stage); in
// backward the gradient of chunk c's output comes from the stage its output went to.
std::pair<int64_t, int> PipelineP2P::input_peer(int64_t c, bool backward) const {
  MOE_ASSERT(!backward && receives_input(c));
  return {rank_ > 0 ? rank_ - 1 : size_ - 1, static_cast<int>(2 * c)};
}

std::pair<int64_t, int> PipelineP2P::output_peer(int64_t c, bool backward) const {
  MOE_ASSERT(sends_output(c));
  const int64_t peer = rank_ < size_ - 1 ? rank_ + 1 : 0;
  const int64_t peer_chunk = rank_ < size_ - 1 ? c : c + 1;
  // Forward: the receiver's chunk is the tag. Backward: this chunk receives the gradient, tagged by itself.
  return {peer, static_cast<int>(backward ? 2 * c + 1 : 2 * peer_chunk)};
}

void PipelineP2P::post_recv(int64_t c, bool backward) {
  const auto [peer, tag] = backward ? output_peer(c, true) : input_peer(c, false);
  Pending p{comm::Work(), Tensor::empty(shape_, dtype_)};
  p.work = pp_.recv(p.t, peer, tag, /*async=*/true);
  recvs_[static_cast<size_t>(2 * c + (backward ? 1 : 0))].push_back(std::move(p));
}

Tensor PipelineP2P::wait_recv(int64_t c, bool backward) {
  auto& q = recvs_[static_cast<size_t>(2 * c + (backward ? 1 : 0))];
  MOE_ASSERT_MSG(!q.empty(), "no receive posted for chunk {} ({})", c, backward ? "backward" : "forward");
  Pending p = std::move(q.front());
  q.pop_front();
  p.work.wait();
  return p.t.to(device_);
}

void PipelineP2P::send(int64_t c, bool backward, const Tensor& t) {
  MOE_ASSERT_MSG(t.shape() == shape_ && t.dtype() == dtype_, "pipeline message {} {}, planned {} {}", t.shape().str(),
                 dtype_name(t.dtype()), shape_.str(), dtype_name(dtype_));
  int64_t peer;
  int tag;
  if (backward) {  // the gradient of chunk c's input goes back to where the input came from
    MOE_ASSERT(receives_input(c));
    peer = rank_ > 0 ? rank_ - 1 : size_ - 1;
    const int64_t from_chunk = rank_ > 0 ? c : c - 1;
    tag = static_cast<int>(2 * from_chunk + 1);
  } else {
    std::tie(peer, tag) = output_peer(c, false);
  }
  // A copy: a module may hand out a buffer it reuses in its next call (the sequence-parallel reduce-scatter's),
  // which would change under a send still in flight. A GPU's message is copied to the host (host-staged MPI).
  Tensor keep = Tensor::empty(t.shape(), t.dtype());
  keep.copy_from(t);
  Pending p{comm::Work(), keep};
  p.work = pp_.send(p.t, peer, tag, /*async=*/true);
  sends_.push_back(std::move(p));
  sent_bytes_ += static_cast<int64_t>(keep.nbytes());
  while (!sends_.empty() && sends_.front().work.test()) sends_.pop_front();  // completed sends free their buffers
}

void PipelineP2P::finish_sends() {
  for (auto& s : sends_) s.work.wait();
  sends_.clear();
}

}  // namespace moecore::train

// SideStream (see side_stream.h).
#include "moecore/device/side_stream.h"

#include <optional>

#include "moecore/core/error.h"
#ifdef MOECORE_HAVE_CUDA
#include "moecore/device/stream.h"
#endif

namespace moecore::device {

#ifdef MOECORE_HAVE_CUDA
struct SideStream::Impl {
  moecore::device::Stream side;
  moecore::device::Event forked, done;
  std::optional<moecore::device::StreamGuard> guard;
  bool pending = false;  // side work queued since the last join()
};
#else
struct SideStream::Impl {};
#endif

SideStream::SideStream(bool on) : on_(on) {}
SideStream::~SideStream() = default;

void SideStream::fork(Device d) {
#ifdef MOECORE_HAVE_CUDA
  if (!on_ || !d.is_cuda()) return;
  if (!impl_) impl_ = std::make_unique<Impl>();
  MOE_ASSERT_MSG(!impl_->guard, "SideStream::fork inside a fork");
  impl_->forked.record(moecore::device::current_stream());
  impl_->forked.wait_on(impl_->side.get());
  impl_->guard.emplace(impl_->side.get());
  impl_->pending = true;
#else
  (void)d;
#endif
}

void SideStream::end() {
#ifdef MOECORE_HAVE_CUDA
  if (!impl_ || !impl_->guard) return;
  impl_->done.record(impl_->side.get());
  impl_->guard.reset();
#endif
}

void SideStream::join() {
#ifdef MOECORE_HAVE_CUDA
  if (!impl_ || !impl_->pending) return;
  MOE_ASSERT_MSG(!impl_->guard, "SideStream::join before end");
  impl_->done.wait_on(moecore::device::current_stream());
  impl_->pending = false;
#endif
}

}  // namespace moecore::device

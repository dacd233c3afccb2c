// NCCL in a build without CUDA or without NCCL (see nccl_comm.h): no communicator is ever created, so GPU tensors
// travel by host-staged MPI (comm/gpu_transport.h never chooses NCCL here); a launch reached anyway is a bug.
#include "moecore/comm/nccl_comm.h"
#include "moecore/core/error.h"

namespace moecore::comm {

class NcclComm {};
class NcclPending {};

namespace {
[[noreturn]] void no_nccl(const char* what) {
  MOE_ASSERT_MSG(false, "{}: this moecore was built without NCCL (GPU tensors go through host-staged MPI)", what);
  std::abort();
}
}  // namespace

bool built_with_nccl() {
  return false;
}
std::shared_ptr<NcclComm> nccl_comm_create(MPI_Comm, const std::string&) {
  no_nccl("nccl_comm_create");
}
std::shared_ptr<NcclPending> nccl_all_reduce(const std::shared_ptr<NcclComm>&, void*, size_t, DType, bool, NcclSite) {
  no_nccl("nccl_all_reduce");
}
std::shared_ptr<NcclPending> nccl_all_gather(const std::shared_ptr<NcclComm>&, const void*, void*, size_t, DType,
                                             NcclSite) {
  no_nccl("nccl_all_gather");
}
std::shared_ptr<NcclPending> nccl_reduce_scatter(const std::shared_ptr<NcclComm>&, const void*, void*, size_t, DType,
                                                 bool, NcclSite) {
  no_nccl("nccl_reduce_scatter");
}
std::shared_ptr<NcclPending> nccl_broadcast(const std::shared_ptr<NcclComm>&, void*, size_t, DType, int, NcclSite) {
  no_nccl("nccl_broadcast");
}
std::shared_ptr<NcclPending> nccl_send_recv(const std::shared_ptr<NcclComm>&, const std::vector<NcclPeerBuffer>&,
                                            const std::vector<NcclPeerBuffer>&, DType, NcclSite) {
  no_nccl("nccl_send_recv");
}
void nccl_wait(const NcclPending&) {
  no_nccl("nccl_wait");
}
bool nccl_done(const NcclPending&) {
  no_nccl("nccl_done");
}
void nccl_shutdown() {}

}  // namespace moecore::comm

// Loading cuDNN's backend API with dlopen (attention_cudnn_api.h): once per process, its answer kept.
#include "moecore/kernels/cuda/attention_cudnn_api.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "moecore/kernels/attention_backend.h"

namespace moecore::kernels::cuda {

#ifdef MOECORE_HAVE_CUDNN_HEADERS
namespace {

struct CudnnLibraryLoad {
  CudnnApi api;
  bool ok = false;
  std::string why;
};

// libcudnn.so.9 is cuDNN 9's front library: it exports the whole API and loads its sub-libraries (graph, engines)
// from its own folder. The unversioned name is a development symlink, tried last.
CudnnLibraryLoad load_cudnn_library() {
  CudnnLibraryLoad r;
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      r.api.path = name;
      break;
    }
    const char* e = dlerror();
    tried += fmt::format("{}{}", tried.empty() ? "" : "; ", e ? e : name);
  }
  if (!lib) {
    r.why = fmt::format("libcudnn is not loadable ({}); put cuDNN 9's lib folder on LD_LIBRARY_PATH", tried);
    return r;
  }
  auto sym = [&](const char* name, auto& fn) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && r.why.empty()) r.why = fmt::format("{} has no {}", r.api.path, name);
  };
  CudnnApi& a = r.api;
  sym("cudnnGetVersion", a.GetVersion);
  sym("cudnnGetErrorString", a.GetErrorString);
  sym("cudnnGetLastErrorString", a.GetLastErrorString);
  sym("cudnnCreate", a.Create);
  sym("cudnnDestroy", a.Destroy);
  sym("cudnnSetStream", a.SetStream);
  sym("cudnnBackendCreateDescriptor", a.CreateDescriptor);
  sym("cudnnBackendDestroyDescriptor", a.DestroyDescriptor);
  sym("cudnnBackendFinalize", a.Finalize);
  sym("cudnnBackendSetAttribute", a.SetAttribute);
  sym("cudnnBackendGetAttribute", a.GetAttribute);
  sym("cudnnBackendExecute", a.Execute);
  if (!r.why.empty()) return r;  // the library stays loaded: harmless, and unloading cuDNN is not supported
  a.version = static_cast<int64_t>(a.GetVersion());
  if (a.version < kMinCudnnVersion || a.version / 10000 != CUDNN_MAJOR) {
    r.why = fmt::format("{} is cuDNN {}; the fused attention path needs cuDNN {}.x at least {}", a.path,
                        cudnn_version_str(a.version), CUDNN_MAJOR, cudnn_version_str(kMinCudnnVersion));
    return r;
  }
  r.ok = true;
  return r;
}

const CudnnLibraryLoad& cudnn_library() {
  static const CudnnLibraryLoad load = load_cudnn_library();
  return load;
}

}  // namespace

const CudnnApi* cudnn_api(std::string* why) {
  const CudnnLibraryLoad& l = cudnn_library();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.api : nullptr;
}

std::string cudnn_error_text(const CudnnApi& api, const char* call, cudnnStatus_t st) {
  char last[512] = {0};
  if (api.GetLastErrorString) api.GetLastErrorString(last, sizeof(last));
  return fmt::format("{}: {}{}{}", call, api.GetErrorString ? api.GetErrorString(st) : "cuDNN error",
                     last[0] ? ": " : "", last);
}

int64_t cudnn_loaded_version() {
  const CudnnApi* a = cudnn_api(nullptr);
  return a ? a->version : 0;
}
#else
bool cudnn_attention_available(std::string* why) {
  if (why) *why = "this moecore was built without cuDNN's headers (cudnn_graph.h)";
  return false;
}
int64_t cudnn_loaded_version() {
  return 0;
}
#endif

}  // namespace moecore::kernels::cuda

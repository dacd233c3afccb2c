// The GPU attention backend's host decisions on any machine (kernels/attention_backend.h): the selector, which calls
// cuDNN's path covers, its plan key; in a CUDA build also cuDNN's graphs themselves, whose every tensor and operation
// descriptor cuDNN finalizes on the host without a GPU (kernels/cuda/attention_cudnn_graph.h), and the fallback when
// cuDNN cannot run (no GPU here).
#include <gtest/gtest.h>

#include <string>
#include <unordered_set>

#include "moecore/core/error.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/attention_backend.h"
#include "moecore/kernels/cuda/attention_cudnn.h"
#include "moecore/kernels/cuda/attention_cudnn_api.h"
#ifdef MOECORE_HAVE_CUDA
#include "moecore/kernels/cuda/attention_cudnn_graph.h"
#endif

namespace moecore::kernels {
namespace {

TEST(AttentionBackend, ParsesTheThreeNamesAndRefusesOthersByName) {
  EXPECT_EQ(parse_attention_backend(""), AttentionBackend::kAuto);
  EXPECT_EQ(parse_attention_backend("auto"), AttentionBackend::kAuto);
  EXPECT_EQ(parse_attention_backend("cudnn"), AttentionBackend::kCudnn);
  EXPECT_EQ(parse_attention_backend("native"), AttentionBackend::kNative);
  for (AttentionBackend b : {AttentionBackend::kAuto, AttentionBackend::kCudnn, AttentionBackend::kNative})
    EXPECT_EQ(parse_attention_backend(attention_backend_name(b)), b);
  try {
    parse_attention_backend("flash");
    FAIL() << "flash accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'flash'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, cudnn, native"), std::string::npos) << e.what();
  }
}

TEST(AttentionBackend, SetOverridesTheEnvironmentsChoice) {
  const AttentionBackend before = attention_backend();
  set_attention_backend(AttentionBackend::kNative);
  EXPECT_EQ(attention_backend(), AttentionBackend::kNative);
  set_attention_backend(AttentionBackend::kCudnn);
  EXPECT_EQ(attention_backend(), AttentionBackend::kCudnn);
  set_attention_backend(before);
}

SdpaKey key_of(int64_t Nq, int64_t Nkv, int64_t D, int64_t Dv, bool backward = false) {
  return SdpaKey{2, Nq, Nkv, 256, D, Dv, true, true, backward};
}

TEST(AttentionBackend, PlanKeysTellEveryFieldApart) {
  const SdpaKey base{1, 32, 4, 4096, 128, 128, true, true, false};
  std::vector<SdpaKey> keys{base};
  auto vary = [&](auto edit) {
    SdpaKey k = base;
    edit(k);
    keys.push_back(k);
  };
  vary([](SdpaKey& k) { k.B = 2; });
  vary([](SdpaKey& k) { k.Nq = 16; });
  vary([](SdpaKey& k) { k.Nkv = 8; });
  vary([](SdpaKey& k) { k.S = 2048; });
  vary([](SdpaKey& k) { k.D = 192; });
  vary([](SdpaKey& k) { k.Dv = 64; });
  vary([](SdpaKey& k) { k.causal = false; });
  vary([](SdpaKey& k) { k.bf16 = false; });
  vary([](SdpaKey& k) { k.backward = true; });
  std::unordered_set<SdpaKey, SdpaKeyHash> set(keys.begin(), keys.end());
  EXPECT_EQ(set.size(), keys.size());
  for (size_t i = 0; i < keys.size(); i++)
    for (size_t j = 0; j < keys.size(); j++) EXPECT_EQ(keys[i] == keys[j], i == j) << i << " " << j;
  const SdpaKey copy = base;
  EXPECT_EQ(SdpaKeyHash()(copy), SdpaKeyHash()(base));
  EXPECT_TRUE(set.count(copy));
  EXPECT_EQ(base.str(), "forward B=1 heads=32/4 S=4096 D=128 Dv=128 causal bf16");
}

TEST(AttentionBackend, CudnnCoversCausalBf16WithoutDropoutAtTheHeadDimsWeTrain) {
  for (const SdpaKey& k : {key_of(16, 16, 128, 128), key_of(32, 4, 128, 128), key_of(8, 8, 64, 64),
                           key_of(16, 16, 192, 128), key_of(16, 16, 192, 192), key_of(32, 4, 128, 128, true)}) {
    const SdpaCoverage c = cudnn_sdpa_covers({k, false, false});
    EXPECT_TRUE(c.covered) << k.str() << ": " << c.why;
  }
  auto refused = [](const SdpaCall& call, const char* reason) {
    const SdpaCoverage c = cudnn_sdpa_covers(call);
    EXPECT_FALSE(c.covered) << call.key.str();
    EXPECT_NE(c.why.find(reason), std::string::npos) << c.why;
  };
  const SdpaKey k = key_of(16, 16, 128, 128);
  refused({k, true, false}, "dropout");
  refused({k, false, true}, "context-parallel");
  SdpaKey f32 = k;
  f32.bf16 = false;
  refused({f32, false, false}, "bf16");
  SdpaKey full = k;
  full.causal = false;
  refused({full, false, false}, "causal");
  refused({key_of(16, 16, 100, 100), false, false}, "head dim 100");
  refused({key_of(16, 16, 264, 264), false, false}, "head dim 264");
  refused({key_of(16, 16, 128, 192), false, false}, "value head dim 192");
  refused({key_of(16, 5, 128, 128), false, false}, "heads 16/5");
}

TEST(AttentionBackend, VersionText) {
  EXPECT_EQ(cudnn_version_str(91900), "9.19.0");
  EXPECT_EQ(cudnn_version_str(90102), "9.1.2");
}

// Without a usable GPU (this build machine) cuDNN's path reports why and the callers fall back: no crash, no throw.
TEST(CudnnAttention, WithoutAGpuItIsUnavailableWithAReason) {
  std::string none;
  if (moecore::device::visible_devices(&none) > 0) GTEST_SKIP() << "a GPU is visible: tests/cuda covers this machine";
  std::string why;
  EXPECT_FALSE(cuda::cudnn_attention_available(&why));
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(cuda::cudnn_attention_counts().forward, 0);
}

#ifdef MOECORE_HAVE_CUDNN_HEADERS
// cuDNN finalizes each tensor and operation descriptor as it is built, checking attribute types, dims and strides:
// the graphs' every operation is accepted (forward and backward; MHA and GQA; D 64, 128, MLA's 192/128), and a
// group that does not divide is refused with cuDNN's reason. Needs libcudnn on this machine, not a GPU.
TEST(CudnnAttentionGraph, OperationsFinalizeOnTheHost) {
  std::string why;
  const cuda::CudnnApi* api = cuda::cudnn_api(&why);
  if (!api) GTEST_SKIP() << "libcudnn not loadable here: " << why;
  for (bool backward : {false, true})
    for (const SdpaKey& k :
         {key_of(16, 16, 128, 128, backward), key_of(32, 4, 128, 128, backward), key_of(8, 8, 64, 64, backward),
          key_of(16, 16, 192, 128, backward), key_of(16, 4, 192, 128, backward)}) {
      why.clear();
      EXPECT_TRUE(cuda::sdpa_graph_operations_finalize(*api, k, &why)) << k.str() << ": " << why;
    }
  for (bool backward : {false, true}) {
    why.clear();
    EXPECT_FALSE(cuda::sdpa_graph_operations_finalize(*api, key_of(16, 5, 128, 128, backward), &why));
    EXPECT_NE(why.find("matmul"), std::string::npos) << why;
  }
}
#endif

}  // namespace
}  // namespace moecore::kernels

// safetensors: round trip of every dtype with metadata, byte layout as the format defines it, and clear errors
// naming the file for corrupt, truncated or inconsistent files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "moecore/ckpt/safetensors.h"
#include "test_util.h"

namespace moecore {
namespace {

std::string tmp(const std::string& name) {
  return testing::process_temp_path("st_" + name);
}

std::string safetensors_error(const std::string& path) {
  try {
    ckpt::SafetensorsFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; i++) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << data;
}

TEST(Safetensors, RoundTripEveryDtypeWithMetadata) {
  std::vector<ckpt::NamedTensor> ts;
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64}) {
    Tensor t = Tensor::empty({2, 3}, dt);
    for (int64_t i = 0; i < 6; i++)
      t.set_item(i, static_cast<double>(i) - 2.5 * (dt == DType::I32 || dt == DType::I64 ? 0 : 1));
    ts.push_back({std::string("t.") + ckpt::safetensors_dtype(dt), t});
  }
  ts.push_back({"empty", Tensor::empty({0, 4}, DType::F32)});
  const std::string p = tmp("roundtrip.safetensors");
  ckpt::write_safetensors(p, ts, {{"format", "pt"}});
  const ckpt::SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), ts.size());
  for (const auto& t : ts) {
    const Tensor r = f.read(t.name);
    ASSERT_EQ(r.shape(), t.tensor.shape()) << t.name;
    ASSERT_EQ(r.dtype(), t.tensor.dtype()) << t.name;
    EXPECT_EQ(std::memcmp(r.raw(), t.tensor.raw(), r.nbytes()), 0) << t.name;
  }
  // Layout: 8-byte length, JSON header padded to 8 bytes, data in the given order.
  std::ifstream in(p, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= static_cast<uint64_t>(len[i]) << (8 * i);
  EXPECT_EQ(hl % 8, 0u);
  EXPECT_EQ(f.entries().at("t.F32").begin, 0);
  EXPECT_EQ(f.entries().at("t.F64").begin, 24);
  std::remove(p.c_str());
}

TEST(Safetensors, BrokenFilesAreNamedWithTheProblem) {
  const std::string p = tmp("broken.safetensors");
  EXPECT_NE(safetensors_error(tmp("does_not_exist")).find("cannot open"), std::string::npos);
  {
    std::ofstream f(p, std::ios::binary);
    f << "abc";
  }
  EXPECT_NE(safetensors_error(p).find("too short"), std::string::npos);
  write_raw(p, "{\"a\": 1", "");
  EXPECT_NE(safetensors_error(p).find("not valid JSON"), std::string::npos);
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "1234");
  EXPECT_NE(safetensors_error(p).find("truncated"), std::string::npos);
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678");
  EXPECT_NE(safetensors_error(p).find("needs 12"), std::string::npos);
  write_raw(p, R"({"a": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}})", "12");
  EXPECT_NE(safetensors_error(p).find("unsupported dtype F8_E5M2"), std::string::npos);
  write_raw(p, R"({"a": {"dtype": "F8_E4M3", "shape": [3], "data_offsets": [0, 2]}})", "12");
  EXPECT_NE(safetensors_error(p).find("but [3] x F8_E4M3 needs 3"), std::string::npos) << safetensors_error(p);
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
            "12345678");
  EXPECT_NE(safetensors_error(p).find("overlap"), std::string::npos);
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "1234");
  EXPECT_NE(safetensors_error(p).find("invalid dimension"), std::string::npos);
  // Header length beyond the file.
  {
    std::ofstream f(p, std::ios::binary);
    const char b[8] = {static_cast<char>(0xff), 0x10, 0, 0, 0, 0, 0, 0};
    f.write(b, 8);
  }
  EXPECT_NE(safetensors_error(p).find("corrupt or truncated"), std::string::npos);
  EXPECT_NE(safetensors_error(p).find(p), std::string::npos);  // the file is named
  std::remove(p.c_str());
}

// DeepSeek-V3's FP8 weights: float8 e4m3fn bytes read back as their exact f32 values (normals, subnormals, signed
// zero, the largest finite 448, NaN), one byte per element.
TEST(Safetensors, ReadsFloat8E4M3AsExactF32) {
  const std::string p = testing::fresh_temp_path("f8") + ".safetensors";
  const std::string bytes = {'\x38', '\x7e', '\x01', '\x80', '\xb8', '\x7f', '\x0f', '\x4d'};
  write_raw(p, R"({"w": {"dtype": "F8_E4M3", "shape": [2, 4], "data_offsets": [0, 8]}})", bytes);
  ckpt::SafetensorsFile f(p);
  ASSERT_TRUE(f.entries().at("w").f8_e4m3);
  const Tensor w = f.read("w");
  ASSERT_EQ(w.dtype(), DType::F32);
  ASSERT_EQ(w.shape(), Shape({2, 4}));
  const float* x = w.data<float>();
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 448.0f);
  EXPECT_EQ(x[2], std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(x[3], 0.0f);
  EXPECT_TRUE(std::signbit(x[3]));
  EXPECT_EQ(x[4], -1.0f);
  EXPECT_TRUE(std::isnan(x[5]));
  EXPECT_EQ(x[6], 15.0f / 512);  // 0x0f: exponent 1, mantissa 7: (1 + 7/8) · 2^−6
  EXPECT_EQ(x[7], 1.625f * 4);   // 0x4d: exponent 9, mantissa 5
  std::remove(p.c_str());
}

}  // namespace
}  // namespace moecore

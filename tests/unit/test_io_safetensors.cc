// Safetensors parsing, mmap and writing on valid files.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {
using testing::TempDir;

TEST(Safetensors, DtypeNamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(dtype_name(DType::F8_E8M0), "F8_E8M0");
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
  EXPECT_EQ(dtype_size(DType::I16), 2u);
  EXPECT_EQ(dtype_size(DType::U32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
}

TEST(Safetensors, WriteThenOpenRoundTrips) {
  TempDir d;
  const float a[6] = {1, 2, 3, 4, 5, 6};                 // [2, 3]
  const uint16_t b[4] = {0x3f80, 0x4000, 0xbf80, 0};     // BF16 [4]
  const int64_t ids[3] = {7, -1, 1LL << 40};              // I64 [3]
  const uint8_t e[1] = {127};                             // F8_E8M0 [1, 1]
  const std::string path = d / "model.safetensors";
  write_safetensors(path,
                    {{"x.weight", DType::F32, {2, 3}, a, sizeof a},
                     {"b", DType::BF16, {4}, b, sizeof b},
                     {"ids", DType::I64, {3}, ids, sizeof ids},
                     {"empty", DType::F32, {0, 5}, nullptr, 0},
                     {"s", DType::F8_E8M0, {1, 1}, e, 1}},
                    {{"format", "pt"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->path(), path);
  const TensorView* x = f->find("x.weight");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->dtype, DType::F32);
  EXPECT_EQ(x->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(x->numel(), 6);
  EXPECT_EQ(x->nbytes, sizeof a);
  EXPECT_EQ(std::memcmp(x->data, a, sizeof a), 0);
  EXPECT_EQ(*x->file, path);
  const TensorView* i = f->find("ids");
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(std::memcmp(i->data, ids, sizeof ids), 0);
  EXPECT_EQ(f->find("empty")->numel(), 0);
  EXPECT_EQ(f->find("empty")->nbytes, 0u);
  EXPECT_EQ(f->find("s")->data[0], 127);
  EXPECT_EQ(f->find("nope"), nullptr);

  // The data section starts 8-byte aligned (header padded), and metadata survives.
  std::ifstream in(path, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t hl = 0;
  for (int k = 7; k >= 0; --k) hl = (hl << 8) | len[k];
  EXPECT_EQ(hl % 8, 0u);
  std::string header(hl, '\0');
  in.read(header.data(), hl);
  auto h = parse_safetensors_header(header, std::filesystem::file_size(path) - 8 - hl, path);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  // Tensors come back in offset order.
  for (size_t k = 1; k < h.tensors.size(); ++k) EXPECT_LE(h.tensors[k - 1].begin, h.tensors[k].begin);
}

TEST(Safetensors, WriteReplacesExistingFile) {
  TempDir d;
  const std::string path = d / "out.safetensors";
  const float one = 1, two[2] = {2, 3};
  write_safetensors(path, {{"a", DType::F32, {1}, &one, 4}});
  write_safetensors(path, {{"b", DType::F32, {2}, two, 8}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->find("a"), nullptr);
  ASSERT_NE(f->find("b"), nullptr);
}

TEST(Safetensors, WriteRejectsInconsistentInput) {
  TempDir d;
  const float v[2] = {1, 2};
  testing::expect_error([&] { write_safetensors(d / "w.safetensors", {{"a", DType::F32, {3}, v, 8}}); },
                        {"w.safetensors", "'a'"});
  testing::expect_error(
      [&] { write_safetensors(d / "w.safetensors", {{"a", DType::F32, {2}, v, 8}, {"a", DType::F32, {2}, v, 8}}); },
      {"'a'", "twice"});
  EXPECT_FALSE(std::filesystem::exists(d / "w.safetensors"));
}

TEST(Safetensors, ParsesHandWrittenHeader) {
  // Extra whitespace padding and unknown per-tensor fields are accepted.
  std::string h = R"({"__metadata__":{"k":"v"},"b":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[4,8]},)"
                  R"("a":{"dtype":"U16","shape":[2],"data_offsets":[0,4],"extra":1}}      )";
  auto img = testing::raw_image(h, 8);
  auto p = parse_safetensors_image(img.data(), img.size(), "mem");
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[0].name, "a");
  EXPECT_EQ(p.tensors[0].dtype, DType::U16);
  EXPECT_EQ(p.tensors[1].name, "b");
  EXPECT_EQ(p.tensors[1].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p.metadata.at("k"), "v");
}

TEST(Safetensors, ScalarAndEmptyTensorsAreValid) {
  // A 0-d tensor has one element; zero-size tensors may share an offset with anything.
  std::string h = R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                  R"("z":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                  R"("t":{"dtype":"BOOL","shape":[3],"data_offsets":[4,7]}})";
  auto p = parse_safetensors_header(h, 7, "mem");
  EXPECT_EQ(p.tensors.size(), 3u);
}

TEST(Safetensors, MessageNamesFileTensorAndOffsets) {
  std::string h = R"({"layers.0.attn.wq_a.weight":{"dtype":"U8","shape":[99989],"data_offsets":[10,99999]}})";
  testing::expect_error([&] { parse_safetensors_header(h, 4096, "model-00001.safetensors"); },
                        {"model-00001.safetensors: tensor 'layers.0.attn.wq_a.weight': data_offsets [10, 99999] "
                         "past the end of the data section (4096 bytes)"});
}

}  // namespace
}  // namespace deepinfer

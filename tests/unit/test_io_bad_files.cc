// Every kind of broken safetensors file / model directory must raise deepinfer::Error naming the
// file (and the tensor where there is one), never crash or read out of bounds.
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {
using testing::expect_error;
using testing::raw_image;
using testing::TempDir;
using testing::write_bytes;
using testing::write_text;

// Writes `bytes` as <dir>/bad.safetensors and expects open() to fail with all of `parts`.
void expect_bad_file(const std::vector<uint8_t>& bytes, std::vector<std::string> parts) {
  TempDir d;
  const std::string path = d / "bad.safetensors";
  write_bytes(path, bytes);
  parts.insert(parts.begin(), "bad.safetensors");
  expect_error([&] { SafetensorsFile::open(path); }, parts);
  // The same bytes through the pure parser give the same verdict.
  expect_error([&] { parse_safetensors_image(bytes.data(), bytes.size(), "bad.safetensors"); }, parts);
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b,
                  uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

TEST(BadFiles, EmptyAndTruncatedFiles) {
  expect_bad_file({}, {"truncated"});
  expect_bad_file({1, 0, 0}, {"truncated"});
  // A valid file cut in the middle of its data: the header's offsets now run past the end.
  auto img = raw_image("{" + entry("w", "F32", "[4]", 0, 16) + "}", 16);
  img.resize(img.size() - 5);
  expect_bad_file(img, {"'w'", "past the end of the data section (11 bytes)"});
  // Cut inside the header.
  img.resize(12);
  expect_bad_file(img, {"past the end of the file"});
}

TEST(BadFiles, HeaderLength) {
  expect_bad_file(raw_image("{}", 0, 0, true), {"header length is 0"});
  expect_bad_file(raw_image("{}", 0, 3, true), {"header length 3 past the end of the file"});
  expect_bad_file(raw_image("{}", 0, ~uint64_t{0}, true), {"exceeds the 100 MB limit"});
  expect_bad_file(raw_image("{}", 0, uint64_t{1} << 63, true), {"exceeds"});
}

TEST(BadFiles, HeaderNotJsonOrNotObject) {
  expect_bad_file(raw_image("{\"a\":", 0), {"not valid JSON"});
  expect_bad_file(raw_image("\xff\xfe garbage", 0), {"not valid JSON"});
  expect_bad_file(raw_image("[1,2,3]", 0), {"array, not an object"});
  expect_bad_file(raw_image("42", 0), {"not an object"});
  expect_bad_file(raw_image(std::string(5000, '['), 0), {"not valid JSON"});  // deep nesting, no crash
  expect_bad_file(raw_image(R"({"__metadata__":[1]})", 0), {"__metadata__"});
  expect_bad_file(raw_image(R"({"__metadata__":{"a":1}})", 0), {"__metadata__", "'a'"});
  expect_bad_file(raw_image(R"({"t":7})", 0), {"'t'", "not a JSON object"});
}

TEST(BadFiles, DuplicateTensorInHeader) {
  expect_bad_file(raw_image("{" + entry("w", "U8", "[1]", 0, 1) + "," + entry("w", "U8", "[1]", 1, 2) + "}", 2),
                  {"'w'", "twice"});
}

TEST(BadFiles, UnknownOrMissingDtype) {
  expect_bad_file(raw_image("{" + entry("w", "F4", "[1]", 0, 1) + "}", 1), {"'w'", "unknown dtype 'F4'"});
  expect_bad_file(raw_image("{" + entry("w", "bf16", "[1]", 0, 2) + "}", 2), {"'w'", "unknown dtype"});
  expect_bad_file(raw_image(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1), {"'w'", "dtype"});
  expect_bad_file(raw_image(R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,1]}})", 1), {"'w'", "dtype"});
}

TEST(BadFiles, BadShapes) {
  expect_bad_file(raw_image("{" + entry("w", "U8", "[-1]", 0, 0) + "}", 0), {"'w'", "negative"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[1.5]", 0, 1) + "}", 1), {"'w'", "not an integer"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[\"2\"]", 0, 2) + "}", 2), {"'w'", "not an integer"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "2", 0, 2) + "}", 2), {"'w'", "shape"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[18446744073709551615]", 0, 0) + "}", 0), {"'w'", "too large"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[4294967296,4294967296]", 0, 0) + "}", 0),
                  {"'w'", "more elements than fit"});
  // numel fits but numel * 8 bytes does not.
  expect_bad_file(raw_image("{" + entry("w", "F64", "[4611686018427387904]", 0, 0) + "}", 0), {"'w'", "needs"});
}

TEST(BadFiles, OffsetsOutOfRangeOrMalformed) {
  expect_bad_file(raw_image("{" + entry("w", "U8", "[8]", 0, 8) + "}", 4),
                  {"'w'", "data_offsets [0, 8] past the end of the data section (4 bytes)"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[0]", 5, 5) + "}", 4), {"'w'", "past the end"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[1]", 3, 2) + "}", 4), {"'w'", "begin is after end"});
  expect_bad_file(raw_image("{" + entry("w", "U8", "[1]", 18446744073709551615ull, 0) + "}", 4), {"'w'"});
  expect_bad_file(raw_image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 4), {"'w'", "data_offsets"});
  expect_bad_file(raw_image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 4), {"'w'", "data_offsets"});
  expect_bad_file(raw_image(R"({"w":{"dtype":"U8","shape":[1]}})", 4), {"'w'", "data_offsets"});
}

TEST(BadFiles, OverlappingTensors) {
  expect_bad_file(raw_image("{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[4]", 4, 8) + "}", 8),
                  {"overlap", "'a'", "'b'"});
  // b lies inside a; c starts after b but still inside a.
  expect_bad_file(raw_image("{" + entry("a", "U8", "[10]", 0, 10) + "," + entry("b", "U8", "[2]", 1, 3) + "," +
                                entry("c", "U8", "[2]", 5, 7) + "}",
                            10),
                  {"overlap"});
  // Two tensors on the same bytes.
  expect_bad_file(raw_image("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "I8", "[4]", 0, 4) + "}", 4),
                  {"overlap"});
}

TEST(BadFiles, SizeDoesNotMatchShapeTimesDtype) {
  expect_bad_file(raw_image("{" + entry("w", "F32", "[2,3]", 0, 20) + "}", 24),
                  {"'w'", "hold 20 bytes but F32 [2, 3] needs 24"});
  expect_bad_file(raw_image("{" + entry("w", "BF16", "[3]", 0, 3) + "}", 24), {"'w'", "needs 6"});
}

TEST(BadFiles, NotARegularFileOrMissing) {
  TempDir d;
  expect_error([&] { SafetensorsFile::open(d / "missing.safetensors"); }, {"missing.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(d.str()); }, {"not a regular file"});
}

// ---- model directories ----

void write_tensor_file(const std::string& path, const std::vector<std::string>& names) {
  static const float v[2] = {1, 2};
  std::vector<TensorToWrite> ts;
  for (const auto& n : names) ts.push_back({n, DType::F32, {2}, v, sizeof v});
  write_safetensors(path, ts);
}

TEST(BadCheckpoints, MissingDirectoryOrConfig) {
  TempDir d;
  expect_error([&] { Checkpoint::open(d / "nope"); }, {"nope", "does not exist"});
  write_text(d / "file", "x");
  expect_error([&] { Checkpoint::open(d / "file"); }, {"file", "not a directory"});
  write_tensor_file(d / "model.safetensors", {"embed.weight"});
  expect_error([&] { Checkpoint::open(d.str()); }, {"config.json", "missing"});
}

TEST(BadCheckpoints, BadConfigJson) {
  TempDir d;
  write_tensor_file(d / "model.safetensors", {"embed.weight"});
  write_text(d / "config.json", "{\"hidden_size\": 64,");
  expect_error([&] { Checkpoint::open(d.str()); }, {"config.json", "not valid JSON"});
  write_text(d / "config.json", "[]");
  expect_error([&] { Checkpoint::open(d.str()); }, {"config.json", "not a JSON object"});
}

TEST(BadCheckpoints, NoWeights) {
  TempDir d;
  write_text(d / "config.json", "{}");
  expect_error([&] { Checkpoint::open(d.str()); }, {d.str(), "no model.safetensors"});
}

TEST(BadCheckpoints, BadShardInSingleFileNamesIt) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_bytes(d / "model.safetensors", raw_image("{" + entry("w", "F32", "[4]", 0, 16) + "}", 8));
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors", "'w'", "past the end"});
}

void write_index(const std::string& path, const std::vector<std::pair<std::string, std::string>>& map) {
  nlohmann::json j = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [t, f] : map) j["weight_map"][t] = f;
  write_text(path, j.dump());
}

TEST(BadCheckpoints, DuplicateTensorAcrossShards) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_tensor_file(d / "model-00001-of-00002.safetensors", {"embed.weight", "norm.weight"});
  write_tensor_file(d / "model-00002-of-00002.safetensors", {"norm.weight", "head.weight"});
  write_index(d / "model.safetensors.index.json", {{"embed.weight", "model-00001-of-00002.safetensors"},
                                                   {"norm.weight", "model-00001-of-00002.safetensors"},
                                                   {"head.weight", "model-00002-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(d.str()); }, {"model-00002-of-00002.safetensors", "'norm.weight'", "two shards"});
  // Without an index (all *.safetensors opened) the same holds.
  std::filesystem::remove(d / "model.safetensors.index.json");
  expect_error([&] { Checkpoint::open(d.str()); }, {"'norm.weight'", "two shards"});
}

TEST(BadCheckpoints, TwoNamingsOfOneTensor) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_tensor_file(d / "model.safetensors", {"embed.weight", "model.embed_tokens.weight"});
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors", "'embed.weight'", "model.embed_tokens.weight"});
}

TEST(BadCheckpoints, IndexNamesMissingShard) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_tensor_file(d / "model-00001-of-00002.safetensors", {"embed.weight"});
  write_index(d / "model.safetensors.index.json", {{"embed.weight", "model-00001-of-00002.safetensors"},
                                                   {"head.weight", "model-00002-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(d.str()); },
               {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "does not exist"});
}

TEST(BadCheckpoints, IndexNamesTensorTheShardLacks) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_tensor_file(d / "model-00001-of-00002.safetensors", {"embed.weight"});
  write_tensor_file(d / "model-00002-of-00002.safetensors", {"head.weight"});
  write_index(d / "model.safetensors.index.json", {{"embed.weight", "model-00001-of-00002.safetensors"},
                                                   {"head.weight", "model-00002-of-00002.safetensors"},
                                                   {"norm.weight", "model-00002-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(d.str()); },
               {"model.safetensors.index.json", "'norm.weight'", "model-00002-of-00002.safetensors", "does not contain"});
  // Mapped to the wrong shard.
  write_index(d / "model.safetensors.index.json", {{"embed.weight", "model-00002-of-00002.safetensors"},
                                                   {"head.weight", "model-00002-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(d.str()); }, {"'embed.weight'", "does not contain"});
}

TEST(BadCheckpoints, IndexShardNamesWithPathsRejected) {
  TempDir d;
  write_text(d / "config.json", "{}");
  for (const std::string bad : {"../model.safetensors", "sub/model.safetensors", "/etc/passwd", "..", ""}) {
    write_index(d / "model.safetensors.index.json", {{"embed.weight", bad}});
    expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors.index.json", "'embed.weight'", "plain file name"});
  }
}

TEST(BadCheckpoints, MalformedIndex) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_text(d / "model.safetensors.index.json", "{\"weight_map\": ");
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors.index.json", "not valid JSON"});
  write_text(d / "model.safetensors.index.json", "{\"metadata\": {}}");
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors.index.json", "weight_map"});
  write_text(d / "model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors.index.json", "'a'", "not a string"});
}

TEST(BadCheckpoints, TakeMissingTensor) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_tensor_file(d / "model.safetensors", {"embed.weight"});
  auto ck = Checkpoint::open(d.str());
  expect_error([&] { ck->take("head.weight"); }, {"missing tensor head.weight in " + d.str()});
}

}  // namespace
}  // namespace deepinfer

// Name normalisation: transformers-saved (mixed) names and HF module names -> native names.
// The saved name lists come from scripts/dump_hf_saved_names.py (transformers 5.17.0).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {
using testing::TempDir;

struct Listed {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

std::vector<Listed> read_list(const std::string& file) {
  std::ifstream in(std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/io/" + file);
  EXPECT_TRUE(in) << file;
  std::vector<Listed> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    Listed l;
    std::string shape;
    std::getline(ls, l.name, '\t');
    std::getline(ls, l.dtype, '\t');
    std::getline(ls, shape);
    for (char& c : shape)
      if (c == '[' || c == ']' || c == ',') c = ' ';
    std::istringstream ss(shape);
    for (int64_t d; ss >> d;) l.shape.push_back(d);
    out.push_back(l);
  }
  return out;
}

// Native names of the dump script's model (spec §2.2 inventory): layer 0 sliding + hash MoE,
// layer 1 CSA, layer 2 HCA, 4 routed experts.
std::set<std::string> expected_native() {
  std::set<std::string> s = {"embed.weight", "head.weight", "norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale"};
  for (int l = 0; l < 3; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* n : {"attn_norm.weight", "ffn_norm.weight", "hc_attn_fn", "hc_attn_base", "hc_attn_scale",
                          "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", "attn.attn_sink", "attn.wq_a.weight",
                          "attn.q_norm.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.kv_norm.weight",
                          "attn.wo_a.weight", "attn.wo_b.weight", "ffn.gate.weight", "ffn.shared_experts.w1.weight",
                          "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight"})
      s.insert(p + n);
    s.insert(p + (l == 0 ? "ffn.gate.tid2eid" : "ffn.gate.bias"));
    for (int e = 0; e < 4; ++e)
      for (const char* w : {"w1", "w2", "w3"}) s.insert(p + "ffn.experts." + std::to_string(e) + "." + w + ".weight");
    if (l > 0)
      for (const char* n : {"attn.compressor.wkv.weight", "attn.compressor.wgate.weight", "attn.compressor.ape",
                            "attn.compressor.norm.weight"})
        s.insert(p + n);
    if (l == 1)
      for (const char* n : {"attn.indexer.wq_b.weight", "attn.indexer.weights_proj.weight",
                            "attn.indexer.compressor.wkv.weight", "attn.indexer.compressor.wgate.weight",
                            "attn.indexer.compressor.ape", "attn.indexer.compressor.norm.weight"})
        s.insert(p + n);
  }
  return s;
}

TEST(Names, ExpectedInventorySize) { EXPECT_EQ(expected_native().size(), 119u); }

TEST(Names, NativeNamesAreFixedPoints) {
  for (const auto& n : expected_native()) EXPECT_EQ(Checkpoint::to_native_name(n), n);
  for (const char* n : {"mtp.0.e_proj.weight", "mtp.0.e_proj.scale", "mtp.0.h_proj.weight", "mtp.0.enorm.weight",
                        "mtp.0.hnorm.weight", "mtp.0.norm.weight", "mtp.0.hc_head_fn", "mtp.0.attn.kv_norm.weight",
                        "mtp.0.ffn.experts.255.w2.scale", "layers.42.attn.indexer.wq_b.scale"})
    EXPECT_EQ(Checkpoint::to_native_name(n), n);
}

TEST(Names, HandPickedMixedNames) {
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.0.attn.norm.weight"), "layers.0.attn.kv_norm.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.embed_tokens.weight"), "embed.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.hc_head.hc_fn"), "hc_head_fn");
  EXPECT_EQ(Checkpoint::to_native_name("model.norm.weight"), "norm.weight");
  EXPECT_EQ(Checkpoint::to_native_name("head.weight"), "head.weight");
  EXPECT_EQ(Checkpoint::to_native_name("lm_head.weight"), "head.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.7.attn.compressor.norm.weight"),
            "layers.7.attn.compressor.norm.weight");
  // FP8 scales as transformers' quantizer names them.
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.0.attn.wq_a.weight_scale_inv"), "layers.0.attn.wq_a.scale");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.0.self_attn.q_a_proj.weight_scale_inv"), "layers.0.attn.wq_a.scale");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.2.mlp.shared_experts.down_proj.weight_scale_inv"),
            "layers.2.ffn.shared_experts.w2.scale");
  // HF module names.
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.self_attn.q_a_proj.weight"), "layers.1.attn.wq_a.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.self_attn.kv_norm.weight"), "layers.1.attn.kv_norm.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.self_attn.compressor.kv_norm.weight"),
            "layers.1.attn.compressor.norm.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"),
            "layers.1.attn.indexer.weights_proj.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"),
            "layers.1.attn.indexer.wq_b.weight");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.self_attn.compressor.indexer.position_bias"),
            "layers.1.attn.indexer.compressor.ape");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.attn_hc.fn"), "layers.1.hc_attn_fn");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.mlp.gate.e_score_correction_bias"), "layers.1.ffn.gate.bias");
  EXPECT_EQ(Checkpoint::to_native_name("model.layers.1.mlp.experts.gate_up_proj"), "layers.1.ffn.experts.gate_up_proj");
}

// Every name transformers 5.17 wrote maps onto the native inventory, one to one.
void check_list_maps_to_native(const std::vector<Listed>& list, bool stacked_experts) {
  std::set<std::string> got;
  for (const auto& l : list) {
    std::string n = Checkpoint::to_native_name(l.name);
    if (stacked_experts && n.find(".ffn.experts.") != std::string::npos) continue;  // split by Checkpoint::open
    EXPECT_TRUE(got.insert(n).second) << "two names map to " << n;
    EXPECT_TRUE(expected_native().count(n)) << l.name << " -> " << n << " is not a native name";
  }
  if (!stacked_experts) {
    EXPECT_EQ(got, expected_native());
  }
}

TEST(Names, TransformersSavedListMapsToNative) {
  auto list = read_list("hf_saved_names.txt");
  ASSERT_EQ(list.size(), 119u);
  check_list_maps_to_native(list, false);
}

TEST(Names, HfModuleListMapsToNative) { check_list_maps_to_native(read_list("hf_module_names.txt"), true); }

// Writes a file with exactly the listed names/dtypes/shapes; element k of every tensor holds k.
void write_listed(const std::string& path, const std::vector<Listed>& list, std::vector<std::vector<uint8_t>>& keep) {
  std::vector<TensorToWrite> ts;
  for (const auto& l : list) {
    int64_t n = 1;
    for (int64_t d : l.shape) n *= d;
    const bool i64 = l.dtype == "I64" || l.dtype == "int64";
    keep.emplace_back(n * (i64 ? 8 : 4));
    for (int64_t k = 0; k < n; ++k) {
      if (i64) std::memcpy(keep.back().data() + 8 * k, &k, 8);
      else {
        float f = float(k);
        std::memcpy(keep.back().data() + 4 * k, &f, 4);
      }
    }
    ts.push_back({l.name, i64 ? DType::I64 : DType::F32, l.shape, keep.back().data(), keep.back().size()});
  }
  write_safetensors(path, ts);
}

TEST(Names, CheckpointOfTransformersSavedFile) {
  TempDir d;
  testing::write_text(d / "config.json", "{}");
  std::vector<std::vector<uint8_t>> keep;
  auto list = read_list("hf_saved_names.txt");
  write_listed(d / "model.safetensors", list, keep);
  auto ck = Checkpoint::open(d.str());
  auto names = ck->names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_native());
  EXPECT_EQ(ck->file_tensor_name("layers.1.attn.kv_norm.weight"), "model.layers.1.attn.norm.weight");
  EXPECT_EQ(ck->find("hc_head_fn")->shape, (std::vector<int64_t>{4, 256}));
}

// Stacked experts (HF module naming) are exposed as per-expert native views over the same bytes.
TEST(Names, CheckpointSplitsStackedExperts) {
  TempDir d;
  testing::write_text(d / "config.json", "{}");
  std::vector<std::vector<uint8_t>> keep;
  write_listed(d / "model.safetensors", read_list("hf_module_names.txt"), keep);
  auto ck = Checkpoint::open(d.str());
  auto names = ck->names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_native());
  // gate_up_proj [4, 128, 64]: expert e's w1 = rows [0, 64), w3 = rows [64, 128); value = flat index.
  for (int e = 0; e < 4; ++e) {
    const std::string p = "layers.2.ffn.experts." + std::to_string(e) + ".";
    const TensorView& w1 = ck->take(p + "w1.weight");
    const TensorView& w3 = ck->take(p + "w3.weight");
    const TensorView& w2 = ck->take(p + "w2.weight");
    EXPECT_EQ(w1.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(w3.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(w2.shape, (std::vector<int64_t>{64, 64}));
    float a, b, c;
    std::memcpy(&a, w1.data, 4);
    std::memcpy(&b, w3.data + 4 * 65, 4);  // w3[1][1] = gate_up[e][65][1]
    std::memcpy(&c, w2.data + w2.nbytes - 4, 4);
    EXPECT_EQ(a, float(e * 128 * 64));
    EXPECT_EQ(b, float(e * 128 * 64 + 65 * 64 + 1));
    EXPECT_EQ(c, float((e + 1) * 64 * 64 - 1));
    EXPECT_EQ(ck->file_tensor_name(p + "w1.weight"), "model.layers.2.mlp.experts.gate_up_proj");
  }
}

TEST(Names, StackedFp8ScalesSplitToo) {
  TempDir d;
  testing::write_text(d / "config.json", "{}");
  // 2 experts, I = 256, D = 128: gate_up [2, 512, 128] fp8 + scale [2, 4, 1]; down [2, 128, 256] + [2, 1, 2].
  std::vector<uint8_t> gu(2 * 512 * 128), dn(2 * 128 * 256);
  std::vector<float> gus = {1, 2, 3, 4, 5, 6, 7, 8}, dns = {1, 2, 3, 4};
  write_safetensors(d / "model.safetensors",
                    {{"model.layers.0.mlp.experts.gate_up_proj", DType::F8_E4M3, {2, 512, 128}, gu.data(), gu.size()},
                     {"model.layers.0.mlp.experts.gate_up_proj_scale_inv", DType::F32, {2, 4, 1}, gus.data(), 32},
                     {"model.layers.0.mlp.experts.down_proj", DType::F8_E4M3, {2, 128, 256}, dn.data(), dn.size()},
                     {"model.layers.0.mlp.experts.down_proj_scale_inv", DType::F32, {2, 1, 2}, dns.data(), 16}});
  auto ck = Checkpoint::open(d.str());
  const TensorView& s3 = ck->take("layers.0.ffn.experts.1.w3.scale");
  EXPECT_EQ(s3.shape, (std::vector<int64_t>{2, 1}));
  float v;
  std::memcpy(&v, s3.data, 4);
  EXPECT_EQ(v, 7.0f);
  EXPECT_EQ(ck->take("layers.0.ffn.experts.1.w2.scale").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ck->take("layers.0.ffn.experts.0.w1.weight").shape, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(ck->names().size(), 12u);
}

}  // namespace
}  // namespace deepinfer

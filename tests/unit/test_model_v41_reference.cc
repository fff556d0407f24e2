// DeepSeek-V4.1 on the CPU backend against the float64 reference of scripts/make_v41_fixtures.py
// (an independent numpy implementation of the spec: no transformers release contains
// deepseek_v41), on the committed fixtures under tests/fixtures/v41. Full forward, token-by-token
// decode and chunked prefill (splits inside ratio-2 groups included) must each stay within the V4
// tolerances (median per-position relative L2 ≤ 1e-5, max ≤ 1e-3, argmax agreement ≥ 0.99), be
// bitwise equal to each other, and several sequences in one batch must give bitwise the logits
// each gives alone. Also: the Engram constants, config validation and refused inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/safetensors.h"
#include "model/model.h"
#include "model/v41_debug.h"
#include "ops/cpu/cpu_backend.h"
#include "util/error.h"
#include "util/json.h"
#include "reference_fixtures.h"
#include "v41_flips.h"

using namespace deepinfer;
namespace fs = std::filesystem;
using testref::RefSeq, testref::ErrStats, testref::compare, testref::read_refs;

namespace {

std::vector<std::string> fixture_dirs() {
  return testref::fixture_dirs(fs::path(DEEPINFER_SOURCE_DIR) / "tests/fixtures/v41", "DEEPINFER_V41_FIXTURES");
}

bool is_optional_extra(const std::string& n) {  // DSpark and vision tensors of a published checkpoint
  return n.rfind("mtp.", 0) == 0 || n.rfind("vision.", 0) == 0 || n.rfind("aligner.", 0) == 0 ||
         n.rfind("image_", 0) == 0;
}

}  // namespace

TEST(V41Reference, FixturesExist) { ASSERT_GE(fixture_dirs().size(), 3u) << "no fixtures under tests/fixtures/v41"; }

TEST(V41Reference, FullDecodeAndChunkedMatchReference) {
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    CpuBackend be(2);
    LoadedModel m = load_model(dir + "/model", be);
    ASSERT_TRUE(m.v41) << "not dispatched to the V4.1 architecture";
    EXPECT_TRUE(m.unused.empty()) << "unused tensor, e.g. " << (m.unused.empty() ? "" : m.unused[0]);
    for (const auto& n : m.ignored) EXPECT_TRUE(is_optional_extra(n)) << n;
    if (dir.find("published") != std::string::npos) {
      EXPECT_EQ(m.ignored.size(), 3u) << "mtp, vision, image_newline";
    }
    const int64_t V = m.vocab_size();
    auto refs = read_refs(dir);
    ASSERT_FALSE(refs.empty());
    for (size_t k = 0; k < refs.size(); ++k) {
      const auto& r = refs[k];
      const int64_t T = (int64_t)r.ids.size();
      ASSERT_EQ((int64_t)r.logits.size(), T * V);
      struct Mode {
        const char* name;
        int64_t first, step;
      };
      std::vector<float> full;
      for (Mode mode : {Mode{"full", T, T}, Mode{"decode", 13, 1}, Mode{"chunked", 5, 7}, Mode{"chunked", 1, 4}}) {
        SCOPED_TRACE(std::string(mode.name) + " seq " + std::to_string(k));
        auto out = sequence_logits(m, r.ids, mode.first, mode.step);
        if (full.empty()) full = out;
        else EXPECT_EQ(0, std::memcmp(full.data(), out.data(), out.size() * sizeof(float))) << "not bitwise equal to full";
        ErrStats e = compare(out, r.logits, V);
        std::printf("[v41] %s seq %zu %s(%lld,%lld): median rel %.3g, max rel %.3g, max abs %.3g, argmax %.4f\n",
                    fs::path(dir).filename().c_str(), k, mode.name, (long long)mode.first, (long long)mode.step,
                    e.median, e.max, e.max_abs, e.argmax_agree);
        EXPECT_LE(e.median, 1e-5) << "max " << e.max;
        EXPECT_LE(e.max, 1e-3);
        EXPECT_GE(e.argmax_agree, 0.99);
      }
    }
  }
}

TEST(V41Reference, BatchedSequencesAreBitwiseEqualToAlone) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(2);
  LoadedModel m = load_model(dirs.front() + "/model", be);
  ASSERT_TRUE(m.v41);
  DeepseekV41Model& model = *m.v41;
  const int64_t V = m.vocab_size();
  auto refs = read_refs(dirs.front());
  std::vector<std::vector<int32_t>> seqs;
  for (auto& r : refs) seqs.push_back(r.ids);
  seqs.push_back(std::vector<int32_t>(refs[0].ids.begin(), refs[0].ids.begin() + 29));
  struct Sched {
    int64_t first, step;
  };
  std::vector<Sched> sched{{9, 4}, {1, 1}, {30, 11}, {17, 3}};
  sched.resize(seqs.size(), {5, 2});

  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < seqs.size(); ++i) alone.push_back(sequence_logits(m, seqs[i], sched[i].first, sched[i].step));

  std::vector<V41SeqState> states;
  for (size_t i = 0; i < seqs.size(); ++i) states.push_back(model.new_state());
  std::vector<int64_t> done(seqs.size(), 0);
  std::vector<std::vector<float>> batched(seqs.size());
  for (;;) {
    std::vector<V41SeqChunk> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      int64_t T = (int64_t)seqs[i].size();
      if (done[i] >= T) continue;
      int64_t n = done[i] == 0 ? std::min(sched[i].first, T) : std::min(sched[i].step, T - done[i]);
      batch.push_back({&states[i], std::span<const int32_t>(seqs[i].data() + done[i], n), true});
      who.push_back(i);
      done[i] += n;
    }
    if (batch.empty()) break;
    auto l = model.forward(batch);
    size_t off = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      size_t n = batch[b].tokens.size() * V;
      batched[who[b]].insert(batched[who[b]].end(), l.begin() + off, l.begin() + off + n);
      off += n;
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(alone[i].size(), batched[i].size());
    EXPECT_EQ(0, std::memcmp(alone[i].data(), batched[i].data(), alone[i].size() * sizeof(float)))
        << "sequence " << i << " differs between batched and alone";
  }
}

// Why a float32 engine can leave these fixtures where the float64 reference passes (issue #9 item
// 6, docs/deepseek-v41.md): report.json lists every QAT rounding whose input lies within 1e-5
// (relative) of its rounding midpoint ("fragile") with what flipping it alone does to the
// reference's logits. Nudging the engine's input at the same place across the midpoint (test-only
// hook, model/v41_debug.h) must do the same to the CPU's logits: a sliding-KV FP8 flip leaves every
// position before it bitwise alone and jumps at the recorded first position by the recorded
// amount; an index-q FP4 flip changes nothing here (it moves index scores by far less than the
// top-k gaps). The nudge the other way changes nothing.
TEST(V41Reference, FragileRoundingsFlipLikeTheReference) {
  int checked = 0;
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    std::ifstream rf(dir + "/report.json");
    ASSERT_TRUE(rf.good());
    const auto report = nlohmann::json::parse(rf);
    if (!report.contains("fragile")) continue;  // an older report: nothing to check
    CpuBackend be(2);
    LoadedModel m = load_model(dir + "/model", be);
    ASSERT_TRUE(m.v41);
    const int64_t V = m.vocab_size();
    auto refs = read_refs(dir);
    for (size_t k = 0; k < refs.size(); ++k) {
      const auto& ids = refs[k].ids;
      const auto base = testref::v41_logits_nudged(m, ids, {});
      // per kind, closest first: the 4 closest sliding-KV roundings, 2 listed only for their
      // margin relative to the block (relative margin ≥ 1e-5: small values), 2 index-q ones
      int taken_kv = 0, taken_kvb = 0, taken_iq = 0;
      for (const auto& f : report["fragile"]) {
        if (f["seq"].get<size_t>() != k) continue;
        const std::string kind = f["kind"];
        const bool small = f["relative_margin"].get<double>() >= 1e-5;
        const bool kv = kind == "sliding_kv_fp8", iq = kind == "index_fp4" && f["site"] == "index q";
        if (kv && !small && taken_kv < 4) ++taken_kv;
        else if (kv && small && taken_kvb < 2) ++taken_kvb;
        else if (iq && taken_iq < 2) ++taken_iq;
        else continue;
        ++checked;
        const auto& flip = f["flip"];
        const int64_t pos = f["pos"];
        testref::V41Nudge n;
        std::vector<float> out;
        ASSERT_TRUE(testref::v41_flip_entry(m, ids, f, {}, base, n, out));
        if (iq && flip["max_rel"].get<double>() == 0) {
          EXPECT_TRUE(out.empty()) << "an index-q flip at layer " << n.layer << " pos " << pos << " changed the logits";
          continue;
        }
        ASSERT_FALSE(out.empty()) << kind << " layer " << n.layer << " pos " << pos << ": no nudge flips it";
        auto away = n;
        away.factor = 2 - n.factor;
        const auto same = testref::v41_logits_nudged(m, ids, {away});
        EXPECT_EQ(0, std::memcmp(same.data(), base.data(), base.size() * sizeof(float)))
            << "the nudge away from the midpoint changed the logits";
        const auto rel = testref::v41_rel_per_position(out, base, V);
        for (int64_t t = 0; t < pos; ++t) EXPECT_EQ(rel[t], 0.0) << "position " << t << " before the flip changed";
        const int64_t first = testref::v41_first_above(rel, 1e-4);
        const double mx = *std::max_element(rel.begin(), rel.end());
        std::printf("[v41] %s seq %zu %s layer %d pos %lld ch %lld (margin %.3g rel, nudged by %.3g): CPU flip first "
                    ">1e-4 at %lld, max %.3g; reference flip %s, max %.3g\n",
                    fs::path(dir).filename().c_str(), k, kind.c_str(), n.layer, (long long)pos, (long long)n.col,
                    f["relative_margin"].get<double>(), std::fabs(n.factor - 1), (long long)first, mx,
                    flip["first_pos_above_1e-4"].dump().c_str(), flip["max_rel"].get<double>());
        const double ref_max = flip["max_rel"];
        if (ref_max > 1e-3) {  // a jump: at the same place and of the same size as in the reference
          EXPECT_EQ(flip["first_pos_above_1e-4"].get<int64_t>(), first);
          EXPECT_GT(mx, 0.5 * ref_max);
          EXPECT_LT(mx, 2.0 * ref_max);
        }
      }
    }
  }
  std::printf("[v41] %d fragile roundings nudged\n", checked);
}

// The GPU parity check's fallback (tests/cuda/test_model_cuda.cc): a difference made of listed
// flips is explained flip by flip, and anything else is not. Simulated on the CPU: "other
// backend" = the CPU with two listed tiny_hf seq-1 flips (layer 2 at positions 67 and 115), then
// the same with an unrelated error at position 30.
TEST(V41Reference, ExplainsListedFlipsAndNothingElse) {
  std::string dir;
  for (const auto& d : fixture_dirs())
    if (d.find("tiny_hf") != std::string::npos) dir = d;
  ASSERT_FALSE(dir.empty());
  std::ifstream rf(dir + "/report.json");
  const auto report = nlohmann::json::parse(rf);
  if (!report.contains("fragile")) GTEST_SKIP() << "report.json without a fragile list";
  CpuBackend be(2);
  LoadedModel m = load_model(dir + "/model", be);
  ASSERT_TRUE(m.v41);
  const int64_t V = m.vocab_size();
  auto refs = read_refs(dir);
  ASSERT_GE(refs.size(), 2u);
  const auto& ids = refs[1].ids;
  const auto plain = testref::v41_logits_nudged(m, ids, {});
  std::vector<testref::V41Nudge> sim;
  for (const auto& f : report["fragile"]) {
    if (f["seq"] != 1 || f["kind"] != "sliding_kv_fp8" || f["layer"] != 2) continue;
    if (f["pos"] != 67 && f["pos"] != 115) continue;
    testref::V41Nudge n;
    std::vector<float> o;
    ASSERT_TRUE(testref::v41_flip_entry(m, ids, f, {}, plain, n, o));
    ASSERT_FALSE(o.empty());
    sim.push_back(n);
  }
  if (sim.size() != 2) GTEST_SKIP() << "the regenerated fixture has other fragile roundings";
  const auto other = testref::v41_logits_nudged(m, ids, sim);
  auto ex = testref::v41_explain(m, report, 1, ids, other, plain);
  for (const auto& s : ex.flips) std::printf("[v41] explained: %s\n", s.c_str());
  EXPECT_EQ(ex.unexplained_from, -1);
  EXPECT_EQ(ex.flips.size(), 2u);
  EXPECT_EQ(0, std::memcmp(ex.cpu.data(), other.data(), other.size() * sizeof(float)));

  auto bug = other;  // an error that no listed flip makes: 1e-3 relative at position 30
  for (int64_t v = 0; v < V; ++v) bug[30 * V + v] *= 1.001f;
  ex = testref::v41_explain(m, report, 1, ids, bug, plain);
  EXPECT_EQ(ex.unexplained_from, 30);
  EXPECT_TRUE(ex.flips.empty());
}

TEST(V41Reference, ForwardRejectsBadInputAndImages) {
  std::string dir;
  for (const auto& d : fixture_dirs())
    if (d.find("tiny_hf") != std::string::npos) dir = d;
  ASSERT_FALSE(dir.empty());
  CpuBackend be(1);
  LoadedModel m = load_model(dir + "/model", be);
  ASSERT_TRUE(m.v41);
  DeepseekV41Model& model = *m.v41;
  V41SeqState st = model.new_state();
  std::vector<int32_t> bad{0, model.config().vocab_size};
  V41SeqChunk c{&st, bad, true};
  EXPECT_THROW(model.forward(std::span<const V41SeqChunk>(&c, 1)), Error);
  std::vector<int32_t> ok{1, 2};
  V41SeqChunk twice[2] = {{&st, ok, true}, {&st, ok, true}};
  EXPECT_THROW(model.forward(std::span<const V41SeqChunk>(twice, 2)), Error);
  // Image placeholders need the vision tower: a clear error, never a crash.
  ASSERT_GE(model.config().image_token_id, 0);
  std::vector<int32_t> img{0, 5, model.config().image_token_id, 7};
  V41SeqChunk ci{&st, img, true};
  try {
    model.forward(std::span<const V41SeqChunk>(&ci, 1));
    ADD_FAILURE() << "image token accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("image inputs are not supported"), std::string::npos) << e.what();
  }
  V41SeqState foreign;  // not made by new_state()
  V41SeqChunk cf{&foreign, ok, true};
  EXPECT_THROW(model.forward(std::span<const V41SeqChunk>(&cf, 1)), Error);
  EXPECT_EQ(st.pos, 0) << "a rejected step must not advance the state";
}

// The published Engram constants (spec §3.1 step 5) follow from the config alone.
TEST(V41Engram, MultipliersAndPrimesMatchThePublishedConstants) {
  EXPECT_EQ(engram_multipliers(1, 99092, 4),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(engram_multipliers(14, 99092, 4),
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  V41Config c;
  c.engram_layers = {1, 14};
  auto p = engram_primes(c);
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(p[0].size(), 24u);
  EXPECT_EQ(p[0][0], 16000057);
  EXPECT_EQ(p[0][23], 16000463);
  EXPECT_EQ(p[1][0], 16000477);
  EXPECT_EQ(p[1][23], 16000889);
  int64_t s0 = 0, s1 = 0, off8 = 0;
  for (int i = 0; i < 24; ++i) {
    s0 += p[0][i];
    s1 += p[1][i];
    if (i < 8) off8 += p[0][i];
  }
  EXPECT_EQ(s0, 384006168);
  EXPECT_EQ(s1, 384016682);
  EXPECT_EQ(off8, 128000880);  // column 8's offset
}

namespace {
nlohmann::json flash_config() {
  // The released V4.1-Flash config.json's text fields (spec §1.1), composite form.
  nlohmann::json t = {
      {"model_type", "deepseek_v41_text"}, {"vocab_size", 129280}, {"hidden_size", 5120}, {"num_hidden_layers", 40},
      {"num_attention_heads", 64}, {"num_key_value_heads", 1}, {"head_dim", 512}, {"qk_rope_head_dim", 64},
      {"q_lora_rank", 1280}, {"o_groups", 8}, {"o_lora_rank", 1024}, {"sliding_window", 128},
      {"kv_source_layer_ids", {2, 8, 14, 20}}, {"index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}},
      {"candidate_source_layer_id", 20}, {"candidate_topk_blocks", 2048}, {"candidate_block_size", 8},
      {"index_n_heads", 32}, {"index_head_dim", 128}, {"index_topk", 512}, {"rope_theta", 10000},
      {"compress_rope_theta", 160000},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                        {"beta_fast", 32}, {"beta_slow", 1}}},
      {"max_position_embeddings", 1048576}, {"rms_norm_eps", 1e-20}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6}, {"n_routed_experts", 384}, {"n_shared_experts", 1}, {"num_experts_per_tok", 6},
      {"moe_intermediate_size", 2304}, {"scoring_func", "sqrtsoftplus"}, {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true}, {"routed_scaling_factor", 1.5}, {"swiglu_limit", 10.0}, {"hidden_act", "silu"},
      {"engram_layer_ids", {1, 14}}, {"engram_num_embeddings", {384006168, 384016682}},
      {"engram_max_ngram_size", 4}, {"engram_n_heads", 8}, {"engram_head_dim", 256},
      {"engram_vocab_size", 16000000}, {"engram_pad_token_id", 2}, {"engram_compressed_vocab_size", 99092},
      {"num_nextn_predict_layers", 3}};
  std::vector<int> ratios{0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);
  t["compress_ratios"] = ratios;
  return {{"architectures", {"DeepseekV41ForCausalLM"}},
          {"model_type", "deepseek_v41"},
          {"image_token_id", 129264},
          {"quantization_config",
           {{"quant_method", "fp8"}, {"weight_block_size", {32, 32}}, {"scale_fmt", "ue8m0"}, {"expert_dtype", "fp4"}}},
          {"text_config", t},
          {"vision_config", {{"model_type", "deepseek_v41_vision"}}}};
}
}  // namespace

TEST(V41Config, ParsesTheFlashConfigAndItsLayerRoles) {
  auto j = flash_config();
  ASSERT_TRUE(is_v41_config(j));
  V41Config c = parse_v41_config(j);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.fp8_block_rows, 32);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.kv_source_of[3], 2);
  EXPECT_EQ(c.kv_source_of[19], 14);
  EXPECT_EQ(c.kv_source_of[39], 20);
  EXPECT_EQ(c.index_source_of[25], 24);
  EXPECT_EQ(c.index_source_of[39], 36);
  EXPECT_EQ(c.kv_source_of[1], -1);
  EXPECT_FALSE(is_v41_config(nlohmann::json{{"model_type", "deepseek_v4"}}));
}

TEST(V41Config, MalformedConfigsGiveClearErrors) {
  auto expect_error = [](nlohmann::json j, const std::string& what) {
    try {
      parse_v41_config(j);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto j = flash_config();
  j["text_config"]["compress_ratios"][5] = 4;
  expect_error(j, "compress_ratios");
  j = flash_config();
  j["text_config"].erase("kv_source_layer_ids");
  expect_error(j, "kv_source_layer_ids");
  j = flash_config();
  j["text_config"]["kv_source_layer_ids"] = {2, 8, 14};  // layer 20.. (ratio 1) would read a ratio-2 source
  expect_error(j, "compress_ratios");
  j = flash_config();
  j["text_config"]["index_source_layer_ids"] = {2, 14, 20};
  expect_error(j, "index_source_layer_ids");
  j = flash_config();
  j["text_config"]["candidate_source_layer_id"] = 21;
  expect_error(j, "candidate_source_layer_id");
  j = flash_config();
  j["text_config"]["engram_num_embeddings"] = {384006168};
  expect_error(j, "engram_num_embeddings");
  j = flash_config();
  j["text_config"]["head_dim"] = 500;
  expect_error(j, "head_dim");
  j = flash_config();
  j["text_config"]["scoring_func"] = "sigmoid";
  expect_error(j, "scoring_func");
  j = flash_config();
  j["text_config"] = 3;
  expect_error(j, "text_config");
}

TEST(V41Config, AcceptsTheReferenceCodesFlatNames) {
  // inference/config.json spelling (spec §1.1 names in brackets).
  nlohmann::json j = {{"model_type", "deepseek_v41"}, {"vocab_size", 1000}, {"dim", 64}, {"n_layers", 4},
                      {"n_heads", 4}, {"head_dim", 64}, {"rope_head_dim", 16}, {"q_lora_rank", 32}, {"o_groups", 2},
                      {"o_lora_rank", 16}, {"window_size", 8}, {"compress_ratios", {0, 2, 1, 1, 0}},
                      {"kv_source_layers", {1, 2}}, {"index_source_layers", {1, 2, 3}}, {"candidate_source_layer", 2},
                      {"index_n_heads", 8}, {"index_head_dim", 32}, {"norm_eps", 1e-20}, {"n_routed_experts", 4},
                      {"n_activated_experts", 2}, {"moe_inter_dim", 32}, {"score_func", "sqrtsoftplus"},
                      {"route_scale", 2.5}, {"rope_factor", 16}, {"original_seq_len", 4096}, {"beta_fast", 32},
                      {"beta_slow", 1}, {"engram_layer_ids", {1}}, {"engram_num_embeddings", {420}},
                      {"engram_pad_id", 2}};
  V41Config c = parse_v41_config(j);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.rope_compress.original_max_position, 4096);
  EXPECT_EQ(c.candidate_source_layer, 2);
  EXPECT_EQ(c.index_source_of[3], 3);
  EXPECT_EQ(c.kv_source_of[3], 2);
}

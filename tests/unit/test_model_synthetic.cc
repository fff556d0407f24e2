// Synthetic V4 checkpoints (the benchmark's weights): the published storage formats reproduce the
// released V4-Flash byte count, and a synthetic checkpoint loads through the normal loader with every
// tensor used and gives finite logits; V4Cache's bench helpers fast-forward a sequence.
#include <gtest/gtest.h>

#include <cmath>

#include "io/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/v4_inventory.h"
#include "ops/cpu/cpu_backend.h"
#include "util/error.h"

using namespace deepinfer;

TEST(SyntheticV4, FlashStoredBytesMatchThePublishedIndex) {
  nlohmann::json cfg = v4_flash_config_json();
  cfg["num_nextn_predict_layers"] = 1;
  const V4Config c = parse_v4_config(cfg);
  int64_t total = 0, count = 0;
  for (const auto& t : v4_tensor_inventory(c, true))
    for (const auto& s : v4_stored_tensors(c, t)) {
      total += s.nbytes();
      ++count;
    }
  EXPECT_EQ(count, 69187);
  // spec §2.2: 46 shards, 159,609,485,896 bytes of tensor data
  EXPECT_EQ(total, 159609485896) << "difference " << total - 159609485896;
}

TEST(SyntheticV4, SliceConfigKeepsTheScheduleHead) {
  nlohmann::json s = v4_slice_config(v4_flash_config_json(), 3);
  const V4Config c = parse_v4_config(s);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.layer_types[0], AttnType::Sliding);
  EXPECT_EQ(c.layer_types[2], AttnType::CSA);
  EXPECT_TRUE(c.hash_layers[2]);
  EXPECT_EQ(c.num_mtp_layers, 0);
  EXPECT_THROW(v4_slice_config(v4_flash_config_json(), 44), Error);
  EXPECT_THROW(v4_slice_config(v4_flash_config_json(), 0), Error);
}

TEST(SyntheticV4, TinyLoadsThroughTheLoaderAndRuns) {
  const nlohmann::json cfg = v4_tiny_config_json();
  const V4Config c = parse_v4_config(cfg);
  auto ck = make_synthetic_v4_checkpoint(cfg, 3);
  const TensorView* w = ck->find("layers.1.ffn.experts.0.w1.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::I8);  // packed fp4, two a byte
  EXPECT_EQ(w->shape, (std::vector<int64_t>{c.moe_intermediate_size, c.hidden_size / 2}));
  EXPECT_EQ(ck->find("layers.1.attn.wq_a.weight")->dtype, DType::F8_E4M3);
  EXPECT_EQ(ck->find("layers.1.attn.wq_a.scale")->dtype, DType::F8_E8M0);
  EXPECT_EQ(ck->find("layers.0.ffn.gate.tid2eid")->dtype, DType::I64);
  for (const auto& n : ck->names()) {  // never an E4M3 NaN byte
    const TensorView* t = ck->find(n);
    if (t->dtype != DType::F8_E4M3) continue;
    for (size_t i = 0; i < t->nbytes; ++i) ASSERT_NE(t->data[i] & 0x7f, 0x7f) << n;
  }
  CpuBackend be(1);
  DeepseekV4Model m(c, *ck, be);
  EXPECT_TRUE(ck->unused().empty()) << ck->unused()[0];
  // Deterministic in the seed.
  auto ck2 = make_synthetic_v4_checkpoint(cfg, 3);
  const TensorView* w2 = ck2->find("layers.1.ffn.experts.0.w1.weight");
  EXPECT_EQ(std::vector<uint8_t>(w->data, w->data + w->nbytes), std::vector<uint8_t>(w2->data, w2->data + w2->nbytes));

  // A fast-forwarded sequence with random cache contents decodes to finite logits.
  V4Cache cache(c, 2, 8);
  cache.fill_random_for_bench(5);
  V4SeqState s;
  ASSERT_TRUE(cache.open(&s));
  ASSERT_TRUE(cache.fast_forward_for_bench(&s, 100, 4));
  EXPECT_EQ(s.pos, 100);
  EXPECT_EQ((int64_t)s.pages.size(), V4CacheLayout::make(c).pages_for(104));
  std::vector<int32_t> tok{7};
  V4SeqChunk ch{&s, tok, false};
  auto logits = m.forward(std::span<const V4SeqChunk>(&ch, 1), cache);
  ASSERT_EQ((int64_t)logits.size(), c.vocab_size);
  double ss = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    ss += (double)v * v;
  }
  EXPECT_GT(ss, 0);
  EXPECT_EQ(s.pos, 101);
  V4SeqState t;
  ASSERT_TRUE(cache.open(&t));
  EXPECT_FALSE(cache.fast_forward_for_bench(&t, 100000, 0));  // pages run out: unchanged
  EXPECT_EQ(t.pos, 0);
  EXPECT_TRUE(t.pages.empty());
}

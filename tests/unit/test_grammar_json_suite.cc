// JSON-Schema-Test-Suite (draft2020-12, vendored from the jsonschema 4.26.0 sdist): each valid
// instance must be accepted and each invalid one rejected. Instances are serialized the way
// Python's json.dumps does (compact and with ", "/": " separators) and fed both byte by byte and
// as a token sequence checked against the mask at every step. Unsupported keywords must be a
// compile error. Zero false positives is a hard requirement; pass counts are ratcheted.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "grammar/grammar.h"
#include "grammar/testing.h"
#include "util/error.h"

using namespace deepinfer::grammar;
using ojson = nlohmann::ordered_json;

namespace {

struct Counts {
  int cases = 0, compile_error = 0, pass_valid = 0, pass_invalid = 0, false_negative = 0, false_positive = 0;
  int skipped_instances = 0;
};

// Accepted via the token path: every token must be in the mask; then EOS must be allowed.
bool accept_tokens(const std::shared_ptr<const Grammar>& g, const std::string& text, bool* mask_agrees) {
  const Vocabulary& v = g->vocab();
  Matcher bytes(g), toks(g);
  bool by_bytes = bytes.accept_bytes(text) && bytes.can_end();
  auto ids = testkit::greedy_tokenize(v, text);
  std::vector<uint32_t> mask(v.mask_words());
  bool by_mask = !ids.empty() || text.empty();
  for (int32_t id : ids) {
    toks.fill_mask(mask.data());
    if (!(mask[id >> 5] >> (id & 31) & 1)) { by_mask = false; break; }
    if (!toks.accept_token(id)) { by_mask = false; break; }
  }
  if (by_mask) {
    toks.fill_mask(mask.data());
    by_mask = mask[v.eos_id() >> 5] >> (v.eos_id() & 31) & 1;
  }
  *mask_agrees = by_mask == by_bytes;
  return by_bytes;
}

TEST(GrammarJsonSuite, Draft2020_12) {
  auto v = load_vocab_from_tokenizer_json(DEEPINFER_SOURCE_DIR "/tests/data/grammar/deepseek-v3/tokenizer.json", 129280);
  std::string dir = DEEPINFER_SOURCE_DIR "/tests/data/grammar/json-schema-test-suite";
  std::vector<std::filesystem::path> files;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  for (auto& e : std::filesystem::directory_iterator(dir + "/optional/format"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 40u);
  std::map<std::string, Counts> per;
  Counts total, total_opt;
  int mask_disagreements = 0;
  std::vector<std::string> fp_list, fn_list, unclear;
  for (auto& path : files) {
    std::ifstream f(path);
    ojson cases = ojson::parse(f);
    bool optional = path.parent_path().filename() == "format";
    std::string key = (optional ? "format/" : "") + path.stem().string();
    Counts& c = per[key];
    for (auto& tc : cases) {
      ++c.cases;
      std::shared_ptr<const Grammar> g;
      try {
        g = compile({SpecKind::JsonSchema, tc["schema"].dump()}, v);
      } catch (const deepinfer::Error& e) {
        ++c.compile_error;
        // An unsupported keyword is a clear error that names it (quoted), never a silent drop.
        std::string msg = e.what();
        bool names_one = false;
        std::function<void(const ojson&)> scan = [&](const ojson& s) {
          if (!s.is_structured()) return;
          if (s.is_object())
            for (auto& [k, sub] : s.items()) {
              if (msg.find("'" + k + "'") != std::string::npos || msg.find(k) != std::string::npos) names_one = true;
              scan(sub);
            }
          else
            for (auto& sub : s) scan(sub);
        };
        scan(tc["schema"]);
        if (!names_one) unclear.push_back(key + ": " + tc["description"].get<std::string>() + ": " + msg);
        continue;
      }
      for (auto& t : tc["tests"]) {
        bool valid = t["valid"].get<bool>();
        bool acc = false;
        for (bool spaced : {false, true}) {
          bool agrees = true;
          bool a = accept_tokens(g, testkit::dump_python(t["data"], spaced), &agrees);
          if (!agrees) ++mask_disagreements;
          if (!spaced) acc = a;
          else if (!valid) acc = acc || a;
        }
        if (valid && acc) ++c.pass_valid;
        else if (valid) {
          ++c.false_negative;
          fn_list.push_back(key + ": " + tc["description"].get<std::string>() + " / " + t["description"].get<std::string>());
        }
        else if (!acc) ++c.pass_invalid;
        else {
          ++c.false_positive;
          fp_list.push_back(key + ": " + tc["description"].get<std::string>() + " / " + t["description"].get<std::string>());
        }
      }
    }
    Counts& tot = optional ? total_opt : total;
    tot.cases += c.cases; tot.compile_error += c.compile_error; tot.pass_valid += c.pass_valid;
    tot.pass_invalid += c.pass_invalid; tot.false_negative += c.false_negative; tot.false_positive += c.false_positive;
  }
  // The per-keyword table goes to the build directory for the report.
  std::ofstream out(DEEPINFER_BINARY_DIR "/grammar_json_suite.tsv");
  out << "keyword\tcases\tcompile_error\tvalid_accepted\tinvalid_rejected\tfalse_negative\tfalse_positive\n";
  for (auto& [k, c] : per)
    out << k << '\t' << c.cases << '\t' << c.compile_error << '\t' << c.pass_valid << '\t' << c.pass_invalid << '\t'
        << c.false_negative << '\t' << c.false_positive << '\n';
  std::ofstream fn(DEEPINFER_BINARY_DIR "/grammar_json_suite_false_negatives.txt");
  for (auto& s : fn_list) fn << s << '\n';
  auto line = [](const char* name, const Counts& c) {
    return std::string(name) + ": cases " + std::to_string(c.cases) + ", compile errors " + std::to_string(c.compile_error) +
           ", valid accepted " + std::to_string(c.pass_valid) + ", invalid rejected " + std::to_string(c.pass_invalid) +
           ", false negatives " + std::to_string(c.false_negative) + ", false positives " + std::to_string(c.false_positive);
  };
  std::cout << line("required", total) << "\n" << line("optional/format", total_opt) << "\n";
  for (auto& s : fp_list) ADD_FAILURE() << "false positive: " << s;
  EXPECT_EQ(total.false_positive, 0);
  for (auto& u : unclear) ADD_FAILURE() << "compile error that names no keyword of its schema: " << u;
  EXPECT_EQ(mask_disagreements, 0) << "token path and byte path disagree";
  // Ratchet: these only go up (measured when this test was written).
  EXPECT_GE(total.pass_valid, 306);
  EXPECT_GE(total.pass_invalid, 217);
}

}  // namespace

#pragma once
// Grammar IR shared by the regex, JSON Schema and GBNF front-ends: a DAG of byte-level
// expression nodes plus named rules. Rules that are not recursive are inlined at compile time,
// so most grammars end up as a single DFA; recursive rules become call edges of a pushdown machine.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::grammar {

enum class NodeKind : uint8_t { Empty, Bytes, Seq, Alt, Repeat, Ref, And, Graph };

struct GraphEdge {
  int from, to, node;  // node < 0: epsilon
};

struct Node {
  NodeKind kind = NodeKind::Empty;
  std::vector<std::pair<uint8_t, uint8_t>> ranges;  // Bytes: inclusive ranges; none = matches nothing
  std::vector<int> kids;                            // Seq, Alt, And (2 kids), Repeat (1 kid)
  int min = 0, max = 0;                             // Repeat; max < 0 = unbounded
  int rule = -1;                                    // Ref
  // Graph: a small NFA whose edges are sub-expressions (object members with optional commas).
  int g_states = 0, g_start = 0;
  std::vector<int> g_finals;
  std::vector<GraphEdge> g_edges;
};

// Builder for the IR. Every front-end returns a start rule; all helpers return node ids.
class Ir {
 public:
  explicit Ir(const Limits& limits) : limits_(limits) {}

  int empty();
  int nothing();  // the empty language
  int bytes(std::vector<std::pair<uint8_t, uint8_t>> ranges);
  int byte(uint8_t b) { return bytes({{b, b}}); }
  int literal(std::string_view s);
  int seq(std::vector<int> kids);
  int alt(std::vector<int> kids);
  int repeat(int kid, int min, int max);
  int opt(int kid) { return repeat(kid, 0, 1); }
  int star(int kid) { return repeat(kid, 0, -1); }
  int plus(int kid) { return repeat(kid, 1, -1); }
  int and_(int a, int b);
  int ref(int rule);
  int graph(Node g);
  // Unicode code point ranges (inclusive) as UTF-8 byte sequences. json_string: encode the
  // characters that JSON requires to be escaped as their escapes (used inside JSON strings).
  int codepoints(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, bool json_string = false);

  int new_rule(std::string name);
  void set_rule(int rule, int node) { rule_body_[rule] = node; }
  int rule_body(int rule) const { return rule_body_[rule]; }
  size_t num_rules() const { return rule_body_.size(); }
  const std::string& rule_name(int rule) const { return rule_name_[rule]; }

  const Node& node(int id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }
  const Limits& limits() const { return limits_; }

 private:
  int add(Node n);
  Limits limits_;
  std::vector<Node> nodes_;
  std::vector<int> rule_body_;
  std::vector<std::string> rule_name_;
};

// Compiled pushdown machine: one DFA per kept rule, states numbered globally.
struct Machine {
  struct Call {
    int callee_start;  // global state where the callee begins
    int ret;           // global state of the caller after the callee returns
  };
  std::vector<uint32_t> class_base;  // state -> offset of its rule's 256-byte class map
  std::vector<uint8_t> classes;      // concatenated class maps, one per rule
  std::vector<uint32_t> row_base;    // state -> offset of its row in trans
  std::vector<int32_t> trans;        // -1 = dead
  std::vector<uint8_t> final_;       // state may return (pop its frame)
  std::vector<std::vector<Call>> calls;
  std::vector<uint8_t> pop_matters;  // state's rule is called from somewhere
  int start = -1;                    // -1: the grammar accepts nothing

  int step(int s, uint8_t b) const { return trans[row_base[s] + classes[class_base[s] + b]]; }
  size_t num_states() const { return final_.size(); }
};

Machine build_machine(const Ir& ir, int start_rule);

// Front-ends (each throws deepinfer::Error on bad or unsupported input).
int parse_regex(Ir& ir, std::string_view pattern, bool json_string, bool search);
int compile_json_schema(Ir& ir, std::string_view schema_text, const JsonOptions& opt);
int compile_gbnf(Ir& ir, std::string_view text);
// Builds the generic-JSON rules (value) and returns the value rule; reused by the schema compiler.
int json_value_rule(Ir& ir, const JsonOptions& opt);
int json_number(Ir& ir);
int json_ws(Ir& ir, const JsonOptions& opt);
int json_string_char(Ir& ir);
// Strict JSON text -> ordered_json, same values as ordered_json::parse (fast_json.cc). The caller
// bounds the nesting depth first (recursive descent). Throws Error for invalid JSON.
nlohmann::ordered_json parse_json_fast(std::string_view text);

}  // namespace deepinfer::grammar

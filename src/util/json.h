#pragma once
// JSON through nlohmann-json (Debian: nlohmann-json3-dev).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <string_view>

namespace deepinfer {

// Appends `s` as Python's json.dumps(..., ensure_ascii=False) spells a string: the reference chat
// encoders and the grammar tests serialize with it, so byte identity depends on this exact form
// (short escapes for " \\ \n \r \t \b \f, \u00XX for other controls, all other bytes as is).
inline void append_python_json_string(std::string_view s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}
inline std::string python_json_string(std::string_view s) {
  std::string out;
  append_python_json_string(s, out);
  return out;
}

}  // namespace deepinfer

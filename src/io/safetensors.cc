// Safetensors parsing, validation, mmap and writing. Everything read from a file is untrusted:
// sizes are overflow-checked and every offset is bounded before a pointer is formed.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "util/error.h"
#include "util/json.h"
#include "util/numeric.h"

namespace deepinfer {
namespace {

struct DTypeInfo {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1},       {DType::U8, "U8", 1},     {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},         {DType::U16, "U16", 2},   {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},         {DType::I64, "I64", 8},   {DType::U64, "U64", 8},
    {DType::F16, "F16", 2},         {DType::BF16, "BF16", 2}, {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},         {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E5M2, "F8_E5M2", 1}, {DType::F8_E8M0, "F8_E8M0", 1},
};

// The reference implementation caps headers at 100 MB; a bigger claim is corruption, and the cap
// keeps a hostile length from making us parse (or allocate) gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

bool parse_dtype(std::string_view s, DType* out) {
  for (const auto& d : kDTypes)
    if (s == d.name) {
      *out = d.t;
      return true;
    }
  return false;
}

// Printable, bounded rendering of an untrusted string for error messages.
std::string printable(std::string_view s) {
  std::string r = "'";
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) r += static_cast<char>(c);
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    }
  }
  if (s.size() > 200) r += "...";
  return r + "'";
}

[[noreturn]] void fail(const std::string& file, const std::string& msg) { throw Error(file + ": " + msg); }
[[noreturn]] void fail_tensor(const std::string& file, std::string_view tensor, const std::string& msg) {
  throw Error(file + ": tensor " + printable(tensor) + ": " + msg);
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorEntry parse_entry(const std::string& file, const std::string& name, const nlohmann::json& v,
                        uint64_t data_size) {
  TensorEntry e;
  e.name = name;
  // Unknown extra fields are ignored (as other readers do); the three we need are checked.
  if (!v.is_object()) fail_tensor(file, name, "entry is not a JSON object");

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) fail_tensor(file, name, "missing or non-string \"dtype\"");
  const auto& dts = dt->get_ref<const std::string&>();
  if (!parse_dtype(dts, &e.dtype)) fail_tensor(file, name, "unknown dtype " + printable(dts));

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) fail_tensor(file, name, "missing or non-array \"shape\"");
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    // Only exact non-negative integers; JSON floats and negative numbers are rejected.
    // (Never dump() untrusted values: dumping is recursive and a nested value can be deep.)
    if (!d.is_number_integer())
      fail_tensor(file, name, std::string("shape entry is a JSON ") + d.type_name() + ", not an integer");
    if (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(INT64_MAX) : d.get<int64_t>() < 0)
      fail_tensor(file, name, "shape entry " + (d.is_number_unsigned() ? std::to_string(d.get<uint64_t>())
                                                                       : std::to_string(d.get<int64_t>())) +
                                  " is negative or too large");
    int64_t n = d.is_number_unsigned() ? static_cast<int64_t>(d.get<uint64_t>()) : d.get<int64_t>();
    if (!checked_mul(numel, static_cast<uint64_t>(n), &numel) || numel > uint64_t(INT64_MAX))
      fail_tensor(file, name, "shape " + shape_str(e.shape) + ", " + std::to_string(n) + ", ... has more elements than fit in 64 bits");
    e.shape.push_back(n);
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    fail_tensor(file, name, "\"data_offsets\" must be two non-negative integers [begin, end]");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  const std::string offs = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) fail_tensor(file, name, offs + ": begin is after end");
  if (e.end > data_size)
    fail_tensor(file, name,
                offs + " past the end of the data section (" + std::to_string(data_size) + " bytes)");
  uint64_t nbytes;
  if (!checked_mul(numel, dtype_size(e.dtype), &nbytes) || nbytes != e.end - e.begin)
    fail_tensor(file, name,
                offs + " hold " + std::to_string(e.end - e.begin) + " bytes but " + dts + " " +
                    shape_str(e.shape) + " needs " +
                    (checked_mul(numel, dtype_size(e.dtype), &nbytes) ? std::to_string(nbytes) : "> 2^64"));
  return e;
}

}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.size;
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at parse time: cannot overflow
  return n;
}

ParsedHeader parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                      const std::string& file_for_errors) {
  const std::string& file = file_for_errors;
  // Reject duplicate top-level names (nlohmann would silently keep the last one).
  std::set<std::string, std::less<>> seen;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) duplicate = k;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header_json.begin(), header_json.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    fail(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(file, std::string("header is a JSON ") + j.type_name() + ", not an object");
  if (!duplicate.empty()) fail_tensor(file, duplicate, "appears twice in the header");

  ParsedHeader out;
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) fail(file, "\"__metadata__\" is not an object");
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) fail(file, "\"__metadata__\" value for " + printable(mk) + " is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (key.empty()) fail(file, "a tensor has an empty name");
    out.tensors.push_back(parse_entry(file, key, v, data_size));
  }

  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin, so an overlap is always with the furthest-reaching earlier non-empty tensor.
  const TensorEntry* reach = nullptr;
  for (const auto& t : out.tensors) {
    if (t.begin == t.end) continue;  // empty tensors occupy no bytes
    if (reach && t.begin < reach->end)
      fail_tensor(file, t.name,
                  "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] overlap tensor " + printable(reach->name) + " [" + std::to_string(reach->begin) + ", " +
                      std::to_string(reach->end) + "]");
    if (!reach || t.end > reach->end) reach = &t;
  }
  return out;
}

ParsedHeader parse_safetensors_image(const uint8_t* bytes, size_t size, const std::string& file_for_errors) {
  const std::string& file = file_for_errors;
  if (size < 8) fail(file, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t hlen = read_le64(bytes);
  if (hlen == 0) fail(file, "header length is 0");
  if (hlen > kMaxHeaderBytes)
    fail(file, "header length " + std::to_string(hlen) + " exceeds the 100 MB limit (corrupt file?)");
  if (hlen > size - 8)
    fail(file, "header length " + std::to_string(hlen) + " past the end of the file (" + std::to_string(size) +
                   " bytes): truncated?");
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), hlen);
  return parse_safetensors_header(header, size - 8 - hlen, file);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(err));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  const auto* bytes = static_cast<const uint8_t*>(map);
  ParsedHeader h = parse_safetensors_image(bytes, size, path);  // throws; ~SafetensorsFile unmaps
  const uint8_t* data = bytes + 8 + read_le64(bytes);
  f->tensors_.reserve(h.tensors.size());
  for (auto& e : h.tensors) {
    TensorView v;
    v.name = std::move(e.name);
    v.dtype = e.dtype;
    v.shape = std::move(e.shape);
    v.data = data + e.begin;
    v.nbytes = static_cast<size_t>(e.end - e.begin);
    v.file = &f->path_;
    f->tensors_.push_back(std::move(v));
  }
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail(path, "cannot write a tensor named " + printable(t.name));
    if (!names.insert(t.name).second) fail_tensor(path, t.name, "given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || !checked_mul(numel, static_cast<uint64_t>(d), &numel))
        fail_tensor(path, t.name, "bad shape " + shape_str(t.shape));
    }
    uint64_t nbytes;
    if (!checked_mul(numel, dtype_size(t.dtype), &nbytes) || nbytes != t.nbytes)
      fail_tensor(path, t.name,
                  std::to_string(t.nbytes) + " bytes given for " + std::string(dtype_name(t.dtype)) + " " +
                      shape_str(t.shape));
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data section starts 8-byte aligned

  // Write next to the target and rename, so a reader never sees a half-written file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(tmp, std::string("cannot create: ") + std::strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(h.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors)
      if (t.nbytes) out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail(tmp, "write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    fail(path, std::string("cannot rename temp file into place: ") + std::strerror(err));
  }
}

}  // namespace deepinfer

// Test-only hook into DeepSeek-V4.1's KV QAT (not part of the engine's behaviour: null by default,
// and then the model pays one pointer test per QAT call). tests/unit/test_model_v41_reference.cc
// uses it to nudge single QAT inputs across their rounding midpoints and show that the engine's
// logits move exactly like the float64 reference's recorded flips (report.json "fragile"): the
// evidence that the tiny fixtures' GPU–CPU differences are QAT rounding flips (issue #9 item 6).
#pragma once

#include <cstdint>

namespace deepinfer {

// Called with every QAT input right before its kv_qdq, in the backend's memory (host memory on the
// CPU backend): sites "sliding kv" ([rows, d], rows = the step's tokens in batch order) and
// "index q" ([rows, hI·dI]) of every layer, "index keys" ([rows, dI]) and "compressed kv"
// ([rows, d], rows = the entries one sequence closes in the step) of the KV sources. For a full
// forward of one sequence from position 0, row = position (sliding kv, index q) or entry number.
using V41QatHook = void (*)(int layer, const char* site, float* x, int64_t rows, int64_t cols);
extern V41QatHook g_v41_qat_hook;

}  // namespace deepinfer

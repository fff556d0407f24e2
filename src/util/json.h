#pragma once
// JSON through nlohmann-json (Debian: nlohmann-json3-dev).
#include <nlohmann/json.hpp>

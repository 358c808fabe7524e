// The one error of the src/runtime/*_none.cpp implementations (a build without CUDA) for a call
// that needs a GPU, so every such message gives the same advice.
#pragma once

namespace dsv4::rt {

// Throws dsv4::Error "<where>: CUDA backend not built (configure with DSV4_CUDA=ON ...)".
[[noreturn]] void fail_not_built(const char* where);

}  // namespace dsv4::rt

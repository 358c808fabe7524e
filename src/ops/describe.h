// The backend tables in words: what `dsv4 info --ops` prints.
#pragma once

#include <string>

namespace dsv4::ops {

// The op × backend matrix (one line per op of op_table.h; per backend "yes", "n/b" — declared
// but not built into this library —, or "-" — no row), then each backend's rows: dtypes,
// layouts, shapes, graph-capturable, notes.
std::string describe_op_matrix();

}  // namespace dsv4::ops

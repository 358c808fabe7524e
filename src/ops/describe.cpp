#include "ops/describe.h"

#include <cstdio>
#include <string>

#include "ops/backend.h"

namespace dsv4::ops {

namespace {

void append_format(std::string& out, const char* fmt, auto... args) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, fmt, args...);
  out += buf;
}

// Ends a matrix line without the padding of its last column.
void end_line(std::string& out) {
  out.erase(out.find_last_not_of(' ') + 1);
  out += "\n";
}

const char* mark(const BackendDecl& b, OpId op) {
  if (find_row(b, op) == nullptr) return "-";
  return b.built ? "yes" : "n/b";
}

}  // namespace

std::string describe_op_matrix() {
  std::string out;
  out += "Ops x backends (yes: implemented; n/b: declared, not built into this library; -: none)\n";
  append_format(out, "  %-28s", "op");
  for (const BackendDecl* b : backends()) append_format(out, " %-7s", b->name);
  end_line(out);
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    append_format(out, "  %-28s", op_name(op));
    for (const BackendDecl* b : backends()) append_format(out, " %-7s", mark(*b, op));
    end_line(out);
  }
  for (const BackendDecl* b : backends()) {
    append_format(out, "\nbackend %s (%s): %s; %s%s\n", b->name, b->title, b->selected_by,
                b->built ? "built" : "not built: ", b->built ? "" : b->not_built_hint);
    for (const OpRow& r : b->rows) {
      const OpFeatures& f = r.features;
      append_format(out, "  %s\n", op_name(r.op));
      append_format(out, "    dtypes   %s\n", f.dtypes);
      if (*f.layouts) append_format(out, "    layouts  %s\n", f.layouts);
      if (*f.shapes) append_format(out, "    shapes   %s\n", f.shapes);
      append_format(out, "    graph    %s\n", f.graph_capturable ? "capturable" : "no");
      if (*f.notes) append_format(out, "    notes    %s\n", f.notes);
    }
  }
  return out;
}

}  // namespace dsv4::ops

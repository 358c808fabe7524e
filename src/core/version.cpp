// The library's version: the DSV4_VERSION_STRING it was built with.
#include "dsv4/version.h"

namespace dsv4 {

const char* version() noexcept { return DSV4_VERSION_STRING; }

}  // namespace dsv4

# The CUTLASS/CuTe headers the CUDA kernels are written against, at the version pinned in
# cmake/cutlass_version.txt (that of the `nvidia-cutlass` wheel on PyPI, which ships the headers
# as cutlass_library/source/include). Looked for, in order:
#   1. DSV4_CUTLASS_DIR, when given (any version: a mismatch is only a warning);
#   2. third_party/cutlass/include: what `make setup` fetches (and what
#      scripts/stage_device_deps.sh stages for machines without registry access);
#   3. the nvidia-cutlass package of the Python environment: `pip install .` asks for it as a
#      build requirement (python/backend/dsv4attn_backend.py) whenever CUDA is built, and looks
#      there before third_party/.
# Sets DSV4_CUTLASS_INCLUDE_DIR; stops the configure step with a message naming these three ways
# when none has the headers, as the kernels cannot be built without them.

file(READ "${PROJECT_SOURCE_DIR}/cmake/cutlass_version.txt" DSV4_CUTLASS_PIN)
string(STRIP "${DSV4_CUTLASS_PIN}" DSV4_CUTLASS_PIN)
# The wheel's version has a fourth component of its own; the headers carry the first three.
string(REGEX MATCH "^[0-9]+\\.[0-9]+\\.[0-9]+" DSV4_CUTLASS_HEADER_VERSION "${DSV4_CUTLASS_PIN}")

set(DSV4_CUTLASS_DIR "" CACHE PATH
    "CUTLASS/CuTe include directory (default: third_party/cutlass/include, else the Python environment's nvidia-cutlass)")

# The version a CUTLASS include directory declares (cutlass/version.h), or "" if it has none.
function(_dsv4_cutlass_version dir out)
  set(version "")
  if(EXISTS "${dir}/cute/tensor.hpp" AND EXISTS "${dir}/cutlass/version.h")
    file(STRINGS "${dir}/cutlass/version.h" defs REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) ")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "CUTLASS_${part} +([0-9]+)" _ "${defs}")
      list(APPEND version "${CMAKE_MATCH_1}")
    endforeach()
    list(JOIN version "." version)
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

set(_dsv4_cutlass_found "")
# third_party/cutlass/include, if it has the headers (at the pinned version: else stop).
macro(_dsv4_cutlass_from_third_party)
  set(_dsv4_third_party "${PROJECT_SOURCE_DIR}/third_party/cutlass/include")
  _dsv4_cutlass_version("${_dsv4_third_party}" _dsv4_cutlass_found)
  if(_dsv4_cutlass_found)
    if(NOT _dsv4_cutlass_found VERSION_EQUAL DSV4_CUTLASS_HEADER_VERSION)
      message(FATAL_ERROR "third_party/cutlass holds CUTLASS ${_dsv4_cutlass_found}, the pin is "
                          "${DSV4_CUTLASS_HEADER_VERSION}: run `make setup` to fetch it")
    endif()
    set(DSV4_CUTLASS_INCLUDE_DIR "${_dsv4_third_party}")
  endif()
endmacro()
# The Python environment's nvidia-cutlass, if it has one (pip's isolated build environment is on
# the interpreter's path); find_spec locates the package without importing it.
macro(_dsv4_cutlass_from_python)
  find_package(Python 3.9 COMPONENTS Interpreter QUIET)
  set(_dsv4_cutlass_pkg "")
  if(Python_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
              "import importlib.util as u; s = u.find_spec('cutlass_library'); print(s.submodule_search_locations[0] if s else '')"
      OUTPUT_VARIABLE _dsv4_cutlass_pkg OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(_dsv4_cutlass_pkg)
    _dsv4_cutlass_version("${_dsv4_cutlass_pkg}/source/include" _dsv4_cutlass_found)
  endif()
  if(_dsv4_cutlass_found)
    if(NOT _dsv4_cutlass_found VERSION_EQUAL DSV4_CUTLASS_HEADER_VERSION)
      message(FATAL_ERROR "${Python_EXECUTABLE} has nvidia-cutlass with CUTLASS "
                          "${_dsv4_cutlass_found}; the kernels need ${DSV4_CUTLASS_HEADER_VERSION} "
                          "(pip install nvidia-cutlass==${DSV4_CUTLASS_PIN}, or pass DSV4_CUTLASS_DIR)")
    endif()
    set(DSV4_CUTLASS_INCLUDE_DIR "${_dsv4_cutlass_pkg}/source/include")
  endif()
endmacro()

if(DSV4_CUTLASS_DIR)
  _dsv4_cutlass_version("${DSV4_CUTLASS_DIR}" _dsv4_cutlass_found)
  if(NOT _dsv4_cutlass_found)
    message(FATAL_ERROR "DSV4_CUTLASS_DIR=${DSV4_CUTLASS_DIR} holds no CUTLASS headers "
                        "(expected cute/tensor.hpp and cutlass/version.h under it)")
  endif()
  if(NOT _dsv4_cutlass_found VERSION_EQUAL DSV4_CUTLASS_HEADER_VERSION)
    message(WARNING "DSV4_CUTLASS_DIR holds CUTLASS ${_dsv4_cutlass_found}; the kernels are "
                    "built and tested with ${DSV4_CUTLASS_HEADER_VERSION}")
  endif()
  set(DSV4_CUTLASS_INCLUDE_DIR "${DSV4_CUTLASS_DIR}")
elseif(SKBUILD)
  # `pip install .`: the build requirement first, so that a wheel builds the same with or
  # without a third_party/ left in the checkout.
  _dsv4_cutlass_from_python()
  if(NOT _dsv4_cutlass_found)
    _dsv4_cutlass_from_third_party()
  endif()
else()
  _dsv4_cutlass_from_third_party()
  if(NOT _dsv4_cutlass_found)
    _dsv4_cutlass_from_python()
  endif()
endif()
if(NOT _dsv4_cutlass_found)
  message(FATAL_ERROR
    "The CUDA kernels need the CUTLASS/CuTe ${DSV4_CUTLASS_HEADER_VERSION} headers, and none were "
    "found. Any one of these provides them:\n"
    "  make setup                                 (fetches them into third_party/cutlass)\n"
    "  pip install nvidia-cutlass==${DSV4_CUTLASS_PIN}   (into the environment of ${Python_EXECUTABLE})\n"
    "  -DDSV4_CUTLASS_DIR=/path/to/cutlass/include\n"
    "or build without CUDA: -DDSV4_CUDA=OFF (pip: -C cmake.define.DSV4_CUDA=OFF).")
endif()
message(STATUS "dsv4attn: CUTLASS ${_dsv4_cutlass_found} headers in ${DSV4_CUTLASS_INCLUDE_DIR}")

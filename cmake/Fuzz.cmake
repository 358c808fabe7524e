# The op fuzzer (tests/fuzz, issue 16 item 7).
#
#   dsv4_fuzz            against the library as built (CUDA tensors when a device is present):
#                        ctest Fuzz.OpsCuda (label gpu, skipped without a device).
#   dsv4_fuzz_sanitized  against a CPU-only copy of the library's host sources compiled with
#                        AddressSanitizer + UndefinedBehaviorSanitizer (-O1: fast enough to fuzz,
#                        small enough to compile on a 2-core CI machine): ctest Fuzz.Ops (label
#                        cpu), a seeded 30-second run. Without sanitizer support (DSV4_FUZZ_SANITIZE
#                        OFF), Fuzz.Ops runs dsv4_fuzz instead.
# Longer runs: ./build/dsv4_fuzz_sanitized --seconds 600 --seed 7 (README, "Testing").
# CI cost (measured at 71d7a89, GCC 12, no ccache hits): the sanitized library and fuzzer are 41
# objects, 124 CPU-seconds to compile (about a minute of wall time on 2 cores), plus the 30 s run;
# the plain dsv4_fuzz adds 8 objects. With ccache, rebuilds cost only what changed.
file(GLOB DSV4_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/fuzz/*.cpp)

add_executable(dsv4_fuzz ${DSV4_FUZZ_SOURCES})
target_link_libraries(dsv4_fuzz PRIVATE dsv4attn)
target_compile_options(dsv4_fuzz PRIVATE ${DSV4_CXX_WARNINGS})

include(CheckCXXSourceCompiles)
set(DSV4_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=address,undefined")
set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=address,undefined")
check_cxx_source_compiles("int main() { return 0; }" DSV4_HAVE_SANITIZERS)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
option(DSV4_FUZZ_SANITIZE "Build the ctest fuzz run under ASan + UBSan" ${DSV4_HAVE_SANITIZERS})

set(DSV4_FUZZ_ENV OMP_NUM_THREADS=1)
if(DSV4_FUZZ_SANITIZE)
  # The sources the ops are made of (not the layer, the weights or the JSON config reader: less to
  # compile), without DSV4_WITH_CUDA: every op's CPU path and its validation, as a CPU-only build
  # has them.
  set(DSV4_FUZZ_LIB_SOURCES ${DSV4_CPU_SOURCES})
  list(FILTER DSV4_FUZZ_LIB_SOURCES EXCLUDE REGEX "/src/(layer|weights)/|/config_json\\.cpp$")
  # A CUDA build drops the no-device runtime from DSV4_CPU_SOURCES; this copy is CPU-only.
  list(APPEND DSV4_FUZZ_LIB_SOURCES ${DSV4_RUNTIME_NONE_SOURCES})
  list(REMOVE_DUPLICATES DSV4_FUZZ_LIB_SOURCES)
  add_library(dsv4attn_sanitized STATIC EXCLUDE_FROM_ALL ${DSV4_FUZZ_LIB_SOURCES})
  target_include_directories(dsv4attn_sanitized
    PUBLIC ${PROJECT_SOURCE_DIR}/include ${DSV4_GENERATED_INCLUDE_DIR}
    PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_BINARY_DIR}/generated)
  target_include_directories(dsv4attn_sanitized SYSTEM PRIVATE
    $<TARGET_PROPERTY:nlohmann_json::nlohmann_json,INTERFACE_INCLUDE_DIRECTORIES>)
  target_link_libraries(dsv4attn_sanitized PUBLIC OpenMP::OpenMP_CXX Threads::Threads)
  target_compile_options(dsv4attn_sanitized PUBLIC ${DSV4_SANITIZE_FLAGS} -O1 -g1
                         PRIVATE ${DSV4_CXX_WARNINGS})
  target_link_options(dsv4attn_sanitized PUBLIC -fsanitize=address,undefined)

  add_executable(dsv4_fuzz_sanitized ${DSV4_FUZZ_SOURCES})
  target_link_libraries(dsv4_fuzz_sanitized PRIVATE dsv4attn_sanitized)
  target_compile_options(dsv4_fuzz_sanitized PRIVATE ${DSV4_CXX_WARNINGS})
  set(DSV4_FUZZ_CPU_TARGET dsv4_fuzz_sanitized)
  list(APPEND DSV4_FUZZ_ENV
       ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
else()
  set(DSV4_FUZZ_CPU_TARGET dsv4_fuzz)
endif()

add_test(NAME Fuzz.Ops COMMAND ${DSV4_FUZZ_CPU_TARGET} --seconds 30 --seed 1)
set_tests_properties(Fuzz.Ops PROPERTIES LABELS cpu TIMEOUT 300 ENVIRONMENT "${DSV4_FUZZ_ENV}")
if(DSV4_WITH_CUDA)
  add_test(NAME Fuzz.OpsCuda COMMAND dsv4_fuzz --seconds 30 --seed 1 --require-cuda)
  set_tests_properties(Fuzz.OpsCuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT OMP_NUM_THREADS=1)
endif()

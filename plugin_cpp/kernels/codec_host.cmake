# tq_codec_host: the kernel library's host-only part, plain C++ (no CUDA toolkit needed):
# tq_codec_init and its helpers (codec.cpp, the rule width -> groups of FORMAT.md section 2) and
# tq_last_error (last_error.cpp). libtq_kernels contains its objects; the plugin's CPU unit tests
# link it beside tests/fake_tq_kernels.cpp, so they run the library's rule, not a copy.
# Included by plugin_cpp/CMakeLists.txt (whatever TQ_BUILD_CUDA says), kernels/CMakeLists.txt and
# a standalone plugin build (plugin_cpp/plugin); the first inclusion defines the targets.
if(TARGET tq_codec_host)
  return()
endif()
add_library(tq_codec_host OBJECT "${CMAKE_CURRENT_LIST_DIR}/codec.cpp" "${CMAKE_CURRENT_LIST_DIR}/last_error.cpp")
target_include_directories(tq_codec_host PUBLIC "${CMAKE_CURRENT_LIST_DIR}/../include")
set_target_properties(tq_codec_host PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)

# Its CPU unit test: the groups, codebook entries and token bytes of every width at head_dim 64
# and 128 against FORMAT.md section 2's table, and each bad input's status and message
# (tests/test_codec_init.py also compiles and runs it).
if((BUILD_TESTING OR NOT DEFINED BUILD_TESTING) AND NOT SKBUILD)  # not in a wheel build
  add_executable(tq_codec_init_test "${CMAKE_CURRENT_LIST_DIR}/tests/codec_init_test.cpp")
  target_link_libraries(tq_codec_init_test PRIVATE tq_codec_host)
  set_target_properties(tq_codec_init_test PROPERTIES CXX_STANDARD 17)
  add_test(NAME tq_codec_init_test COMMAND tq_codec_init_test)  # a no-op unless testing is enabled
endif()

# Included from tests/CMakeLists.txt (after the fixtures): the conformance suite
# run on the cpu plugin and on the opaque fixture, plus proof that it reports a
# deliberately wrong plugin (the skewed fixture) as failing.
# ctest names: "conformance.<family or area>: <behaviour>".
bp_add_fixture(skewed CXX ${CMAKE_CURRENT_LIST_DIR}/skewed_plugin.cpp)
target_include_directories(bp_fixture_skewed PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/fixtures)

add_executable(backplane_conformance_tests ${CMAKE_CURRENT_LIST_DIR}/test_conformance.cpp)
target_link_libraries(backplane_conformance_tests PRIVATE backplane_conformance backplane_doctest_main)
target_compile_definitions(backplane_conformance_tests PRIVATE
  BP_TEST_FIXTURE_DIR="${BP_TEST_FIXTURE_DIR}"
  BP_TEST_PLUGIN_DIR="${BP_TEST_PLUGIN_DIR}")
add_dependencies(backplane_conformance_tests backplane_test_fixtures)
if(TARGET backplane_cpu)
  add_dependencies(backplane_conformance_tests backplane_cpu)
endif()
doctest_discover_tests(backplane_conformance_tests TEST_PREFIX "conformance." PROPERTIES TIMEOUT 300)

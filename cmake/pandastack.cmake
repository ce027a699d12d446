# One folder = one library target (pandastack_<name>, alias pandastack::<name>) + one test binary.
#
#   pandastack_module(NAME vmm_driver
#     SOURCES vm.cc qmp.cc ...           library sources
#     DEPS pandastack::wire spdlog::spdlog
#     TESTS vm_test.cc ...               unit tests, linked into <name>_test
#     TEST_DEPS ...)
function(pandastack_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;DEPS;TESTS;TEST_DEPS" ${ARGN})
  add_library(pandastack_${M_NAME} STATIC ${M_SOURCES})
  add_library(pandastack::${M_NAME} ALIAS pandastack_${M_NAME})
  target_include_directories(pandastack_${M_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(pandastack_${M_NAME} PUBLIC ${M_DEPS})
  if(M_TESTS)
    add_executable(${M_NAME}_test ${M_TESTS})
    target_link_libraries(${M_NAME}_test PRIVATE pandastack::${M_NAME} ${M_TEST_DEPS}
                          GTest::gtest pandastack::test_main)
    gtest_discover_tests(${M_NAME}_test DISCOVERY_TIMEOUT 60
                         PROPERTIES LABELS unit)
  endif()
endfunction()

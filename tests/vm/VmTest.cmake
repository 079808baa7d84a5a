# gs_add_vm_test(NAME <name> COMMAND <cmd> [<arg>...]
#                [WORKING_DIRECTORY <dir>] [TIMEOUT <seconds>] [LABELS <label>...]
#                [ENVIRONMENT <VAR=value>...])
#
# Registers a ctest test that runs COMMAND inside the Soft-RoCE test VM (tests/vm/run.sh): a
# QEMU guest with two rxe devices, rxe0 and rxe1 (see tests/vm/README.md). COMMAND may use
# generator expressions ($<TARGET_FILE:tgt>); host-built binaries run unchanged in the guest.
# The test carries the label "rdma" (plus LABELS), is skipped (exit 77, with the reason in its
# output) where the VM cannot run, runs alone (RUN_SERIAL: the guest uses both cores), and gets
# a ctest TIMEOUT of TIMEOUT + 60 s; TIMEOUT (default 300, guest boot of ~10 s included) is
# enforced by run.sh itself, which kills QEMU and exits 124. ENVIRONMENT reaches the guest for
# GS_* variables and the others run.sh passes (or names listed in GS_VM_PASS_ENV).
include_guard(GLOBAL)
set_property(GLOBAL PROPERTY GS_VM_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(gs_add_vm_test)
  cmake_parse_arguments(VM "" "NAME;WORKING_DIRECTORY;TIMEOUT" "COMMAND;LABELS;ENVIRONMENT"
                        ${ARGN})
  if(NOT VM_NAME OR NOT VM_COMMAND)
    message(FATAL_ERROR "gs_add_vm_test: NAME and COMMAND are required")
  endif()
  if(VM_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "gs_add_vm_test(${VM_NAME}): unknown arguments ${VM_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT VM_TIMEOUT)
    set(VM_TIMEOUT 300)
  endif()
  if(NOT VM_WORKING_DIRECTORY)
    set(VM_WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  get_property(vm_dir GLOBAL PROPERTY GS_VM_DIR)
  add_test(NAME ${VM_NAME}
           COMMAND "${vm_dir}/run.sh" --cwd "${VM_WORKING_DIRECTORY}" --timeout ${VM_TIMEOUT}
                   -- ${VM_COMMAND}
           WORKING_DIRECTORY "${VM_WORKING_DIRECTORY}")
  math(EXPR ctest_timeout "${VM_TIMEOUT} + 60")
  set_tests_properties(${VM_NAME} PROPERTIES
    LABELS "rdma;${VM_LABELS}"
    SKIP_RETURN_CODE 77
    TIMEOUT ${ctest_timeout}
    RUN_SERIAL TRUE)
  if(VM_ENVIRONMENT)
    set_tests_properties(${VM_NAME} PROPERTIES ENVIRONMENT "${VM_ENVIRONMENT}")
  endif()
endfunction()

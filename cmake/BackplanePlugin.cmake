# backplane_add_plugin(<name> [ALLOW_UNDEFINED] [OUTPUT_DIRECTORY <dir>] [CONFIG <backend name>] <sources>...)
#
# A backplane plugin: a MODULE library lib<name>.so that links only the plugin
# SDK (never the core), exports only bp_plugin_entry, and resolves every symbol
# at link time (the host loads it RTLD_NOW). ALLOW_UNDEFINED lifts the last
# rule (for tests that need a plugin which fails to load). Shipped with the
# package: out-of-tree plugins get it from find_package(backplane).
function(backplane_add_plugin name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "ALLOW_UNDEFINED" "OUTPUT_DIRECTORY;CONFIG" "")
  set(exports ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/backplane_plugin_exports.map)
  add_library(${name} MODULE ${arg_UNPARSED_ARGUMENTS})
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(arg_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${arg_OUTPUT_DIRECTORY})
  endif()
  target_link_libraries(${name} PRIVATE backplane::plugin_sdk)
  # -fvisibility=hidden alone still exports std template instances and the
  # dispatchers of target_clones functions; the version script hides them.
  target_link_options(${name} PRIVATE "LINKER:--version-script=${exports}")
  set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS ${exports})
  if(NOT arg_ALLOW_UNDEFINED)
    target_link_options(${name} PRIVATE "LINKER:--no-undefined")
  endif()
  # CONFIG <backend name>: a backends.json beside the plugin that loads it
  # under that name (`backplane check --config <that folder>/backends.json`).
  if(arg_CONFIG)
    file(GENERATE OUTPUT "$<TARGET_FILE_DIR:${name}>/backends.json" CONTENT "{
  \"schema_version\": 1,
  \"plugin_dirs\": [\".\"],
  \"default_backend\": \"${arg_CONFIG}\",
  \"backends\": [
    {\"name\": \"${arg_CONFIG}\", \"library\": \"${name}\", \"required\": true}
  ]
}
")
  endif()
endfunction()

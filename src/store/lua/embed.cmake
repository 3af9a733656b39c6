# Turns a Lua file into a C++ header with a raw string literal (build time).
file(READ "${IN}" body)
file(WRITE "${OUT}" "// Generated from ${NAME}.lua by src/store/lua/embed.cmake. Do not edit.\n#pragma once\n#include <string_view>\nnamespace ratelimit::store {\ninline constexpr std::string_view ${VAR} = R\"lua(${body})lua\";\n}  // namespace ratelimit::store\n")

// Demo: the page at / (web/index.html, embedded at build time) and the demo
// API answer of /api/ping. Only served when server.demo is set (the
// embedded default config).
//
// Thread-safety: pure functions over constant data.
#pragma once

#include <string_view>

#include "server/reply.h"

namespace ratelimit::server {

extern const std::string_view kDemoPage;  // generated from web/index.html

Reply DemoPage();  // 200 text/html
Reply Pong();      // 200 {"pong": true}

}  // namespace ratelimit::server

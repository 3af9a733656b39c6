#include "server/demo.h"

namespace ratelimit::server {

Reply DemoPage() {
  Reply r;
  r.content_type = "text/html; charset=utf-8";
  r.body.assign(kDemoPage);
  r.Add("Cache-Control", "no-cache");
  return r;
}

Reply Pong() {
  Reply r;
  r.content_type = "application/json";
  r.body = "{\"pong\":true}";
  return r;
}

}  // namespace ratelimit::server

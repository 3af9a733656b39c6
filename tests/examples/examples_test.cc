// Every file in examples/ started as a user would start it (issue 16): each
// YAML with ratelimitd and the servers it names (redis-server, a Redis
// Cluster, an upstream) on free loopback ports, a request through every face
// it opens (decision API, gateway, /v1/auth, admin /healthz, /readyz,
// /metrics), then SIGTERM and exit 0. The nginx conf runs with its YAML,
// behind a real nginx; the systemd unit passes `systemd-analyze verify` and
// its ExecStart and ExecReload lines are run.
//
//   ctest --test-dir build -R "^examples$" --output-on-failure
//
// Only this is changed in a file before it runs:
//   - the listeners: --listen and --admin-listen 127.0.0.1:0 (flags win over the file);
//   - server.upstream's host:port: the test upstream;
//   - store.url's hosts and store.nodes: the test Redis (Cluster); a user and
//     password in the URL are made an ACL user of the test Redis;
//   - a path named by a `# user-supplied: <path> (<what it is>)` comment: a
//     test file made for the key (or flag) that names it (MakeUserFile);
//   - the nginx conf's {{PLACEHOLDERS}} (its header lists them);
//   - the unit's ExecStart binary: the built ratelimitd.
// Any other path or address is used as written, so an example that names a
// file a user cannot have fails here as it would for the user.
//
// The directory is listed when the binary runs, one case per file
// (ExampleTest.Starts/<file>): any other kind of file must be named by an
// example (a keys file, a certificate) and is tested with it, else it fails.
// kKnownFailures names cases that fail for a known reason; they still fail
// (the reason is printed), and an entry whose case passes fails until it is
// removed.
//
// Thread-safety: GoogleTest's main thread only.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../e2e/nginx.h"
#include "harness.h"
#include "support/redis_cluster.h"
#include "support/redis_server.h"
#include "support/subprocess.h"
#include "support/test_certificates.h"

namespace rltest {
namespace {

namespace fs = std::filesystem;
using ratelimit::testing::FindExecutable;
using ratelimit::testing::MakeTestCertificates;
using ratelimit::testing::RedisCluster;
using ratelimit::testing::RedisServer;
using ratelimit::testing::RunCommand;

const std::string kExamples = RL_EXAMPLES_DIR;
const std::string kToken = "examples-test-admin-token";

// Case (file under examples/) -> why it fails today. Keep it empty.
const std::map<std::string, std::string> kKnownFailures = {};

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<std::string> ListExamples() {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(kExamples)) {
    if (e.is_regular_file()) files.push_back(fs::relative(e.path(), kExamples).string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

// A temporary directory (0755: nginx's workers read it), removed at the end
// of the case unless RL_KEEP_TEST_DIRS=1 (as in tests/support).
struct TempDir {
  TempDir() { ::chmod(path.c_str(), 0755); }
  ~TempDir() {
    if (std::getenv("RL_KEEP_TEST_DIRS") == nullptr) fs::remove_all(path);
  }
  const std::string path = MakeTempDir();
};

// --- user-supplied paths ------------------------------------------------------

struct UserSupplied {
  std::string path;
  std::string what;
};

std::vector<UserSupplied> FindUserSupplied(const std::string& text) {
  static const std::regex marker(R"(#\s*user-supplied:\s*(\S+)(?:\s*\(([^)\n]*)\))?)");
  std::vector<UserSupplied> found;
  for (std::sregex_iterator it(text.begin(), text.end(), marker), end; it != end; ++it) {
    found.push_back({(*it)[1], (*it)[2]});
  }
  return found;
}

// The key (`admin_token_file:`) or flag (`--config`) right before the first
// use of `path` outside a comment, or "".
std::string KeyOf(const std::string& text, const std::string& path) {
  static const std::regex key(R"(-{0,2}([A-Za-z0-9_.-]+)\s*[:= ]\s*["']?$)");
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t at = line.find(path);
    if (at == std::string::npos) continue;
    const size_t hash = line.find('#');
    if (hash != std::string::npos && hash < at) continue;  // the marker comment itself
    std::smatch m;
    const std::string before = line.substr(0, at);
    if (std::regex_search(before, m, key)) return m[1];
  }
  return "";
}

// A file standing in for what the user supplies. Returns its path, or "" and
// *error when no test knows what such a file holds.
std::string MakeUserFile(const std::string& key, const std::string& dir, const YAML::Node& config,
                         std::string* error) {
  if (key.find("token") != std::string::npos) {  // admin_token_file, a systemd credential
    WriteFile(dir + "/admin.token", kToken + "\n");
    ::chmod((dir + "/admin.token").c_str(), 0600);
    return dir + "/admin.token";
  }
  if (key == "api_keys_file") {
    std::string plan = config["default_plan"] ? config["default_plan"].as<std::string>() : "";
    if (plan.empty() && config["plans"] && config["plans"].size() > 0) {
      plan = config["plans"].begin()->first.as<std::string>();
    }
    WriteFile(dir + "/api_keys.txt", "examples-test-key " + plan + "\n");
    return dir + "/api_keys.txt";
  }
  if (key.find("tls") != std::string::npos || key.find("cert") != std::string::npos) {
    const auto certs = MakeTestCertificates(dir);
    if (key.find("key") != std::string::npos) return certs.server_key;
    if (key.find("ca") != std::string::npos) return certs.ca_cert;
    return certs.server_cert;
  }
  if (key == "config") {  // the systemd unit's --config: a config as the unit's header describes
    WriteFile(dir + "/admin.token", kToken + "\n");
    ::chmod((dir + "/admin.token").c_str(), 0600);
    WriteFile(
        dir + "/ratelimit.yaml",
        "server: {admin_token_file: " + dir +
            "/admin.token}\n"
            "limits: {burst: {algorithm: token_bucket, capacity: 5, refill_per_second: 1}}\n");
    return dir + "/ratelimit.yaml";
  }
  *error = "no test file is known for '" + key +
           "': teach MakeUserFile in tests/examples/examples_test.cc";
  return "";
}

// Replaces every user-supplied path of `text` by a test file. "" on success.
std::string ReplaceUserSupplied(std::string& text, const std::string& dir,
                                const YAML::Node& config) {
  for (const auto& u : FindUserSupplied(text)) {
    // A path only comments mention needs no file (a wrong marker shows all the
    // same: the path actually used stays, and cannot be read).
    const std::string key = KeyOf(text, u.path);
    if (key.empty()) continue;
    std::string error;
    const std::string file = MakeUserFile(key, dir, config, &error);
    if (file.empty()) return error;
    // Only uses of the path (the marker comment keeps it, harmlessly).
    std::string out;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      const size_t hash = line.find('#');
      std::string code = hash == std::string::npos ? line : line.substr(0, hash);
      const std::string comment = hash == std::string::npos ? "" : line.substr(hash);
      out += Replace(code, u.path, file) + comment + "\n";
    }
    text = out;
  }
  return "";
}

// --- the servers a config names ----------------------------------------------

struct Servers {
  std::unique_ptr<RedisServer> redis;
  std::unique_ptr<RedisCluster> cluster;
  std::unique_ptr<TestUpstream> upstream;
  int grpc_port = 0;  // server.grpc_listen rewritten to it (0: none)
};

// config[section][key], or an undefined node when either is missing (yaml-cpp
// throws on indexing a missing section of a const node).
YAML::Node Get(const YAML::Node& config, const char* section, const char* key) {
  const YAML::Node n = config[section];
  return n && n.IsMap() ? n[key] : YAML::Node(YAML::NodeType::Undefined);
}

std::string Str(const YAML::Node& n, const std::string& fallback = "") {
  return n && n.IsScalar() ? n.as<std::string>() : fallback;
}

// Points store.url (and store.nodes) at the test Redis, and makes the URL's
// credentials an ACL user there. "" on success.
std::string RewriteRedis(std::string& text, const YAML::Node& config, Servers& s) {
  const std::string url = Str(Get(config, "store", "url"));
  static const std::regex parts(
      R"(^(rediss?(\+cluster)?://)(([^:@/]*)(:([^@/]*))?@)?([^/?]*)(.*)$)");
  std::smatch m;
  if (!std::regex_match(url, m, parts)) return "store.url '" + url + "' is not a Redis URL";
  if (url.rfind("rediss", 0) == 0) return "TLS Redis URLs are not started by this test yet";
  const bool cluster = m[2].matched;
  std::vector<std::string> hosts;
  if (cluster) {
    s.cluster = std::make_unique<RedisCluster>();
    for (size_t i = 0; i < s.cluster->size(); ++i) {
      hosts.push_back("127.0.0.1:" + std::to_string(s.cluster->node(i).port()));
    }
  } else {
    s.redis = std::make_unique<RedisServer>();
    hosts.push_back("127.0.0.1:" + std::to_string(s.redis->port()));
  }
  if (m[3].matched) {  // credentials: the same user and password on the test Redis
    const std::string user = m[4].str().empty() ? "default" : m[4].str();
    auto acl = [&](RedisServer& r) {
      r.Cli("ACL", "SETUSER", user, "on", ">" + m[6].str(), "~*", "&*", "+@all");
    };
    if (s.redis) acl(*s.redis);
    for (size_t i = 0; s.cluster && i < s.cluster->size(); ++i) acl(s.cluster->node(i));
  }
  std::string new_url = m[1].str() + m[3].str();
  if (!m[7].str().empty()) {
    std::string joined;
    for (const auto& h : cluster ? hosts : std::vector<std::string>{hosts[0]}) {
      joined += (joined.empty() ? "" : ",") + h;
    }
    new_url += joined;
  }
  new_url += m[8].str();
  text = Replace(text, url, new_url);
  if (Get(config, "store", "nodes")) {
    static const std::regex nodes(R"(nodes:\s*\[[^\]]*\])");
    std::string list;
    for (const auto& h : hosts) list += (list.empty() ? "\"" : ", \"") + h + "\"";
    text = std::regex_replace(text, nodes, "nodes: [" + list + "]");
  }
  return "";
}

// A copy of examples/ in `dir` (relative paths keep working) with `rel`
// rewritten as the file's header says. Returns its path, or "" and *error.
std::string Prepare(const std::string& rel, const std::string& dir, Servers& s,
                    std::string* error) {
  fs::copy(kExamples, dir + "/examples", fs::copy_options::recursive);
  std::string text = ReadFile(kExamples + "/" + rel);
  YAML::Node config;
  try {
    config = YAML::Load(text);
  } catch (const std::exception& e) {
    *error = std::string("not YAML: ") + e.what();
    return "";
  }
  if (*error = ReplaceUserSupplied(text, dir, config); !error->empty()) return "";
  const std::string upstream = Str(Get(config, "server", "upstream"));
  if (!upstream.empty()) {
    s.upstream = std::make_unique<TestUpstream>();
    static const std::regex authority(R"(^(https?://)([^/]*)(.*)$)");
    std::smatch m;
    if (!std::regex_match(upstream, m, authority)) {
      *error = "server.upstream '" + upstream + "' is not an http:// URL";
      return "";
    }
    text = Replace(text, upstream,
                   m[1].str() + "127.0.0.1:" + std::to_string(s.upstream->port()) + m[3].str());
  }
  if (Str(Get(config, "store", "type")) == "redis") {
    if (*error = RewriteRedis(text, config, s); !error->empty()) return "";
  }
  if (const std::string grpc = Str(Get(config, "server", "grpc_listen")); !grpc.empty()) {
    s.grpc_port = FreePort();
    text = Replace(text, "grpc_listen: " + grpc,
                   "grpc_listen: 127.0.0.1:" + std::to_string(s.grpc_port));
  }
  const std::string path = dir + "/examples/" + rel;
  WriteFile(path, text);
  return path;
}

// --- the faces ------------------------------------------------------------------

std::string Describe(const HttpResponse& r) {
  return std::to_string(r.status) + "\n" + r.raw_head + r.body;
}

// The token of the file the config names (Start made its path absolute):
// the test's own where the example marks it user-supplied, else the
// example's (examples/admin-token.sample).
Headers AdminAuth(const YAML::Node& config) {
  const std::string file = Str(Get(config, "server", "admin_token_file"));
  if (file.empty()) return {};
  std::string token = ReadFile(file);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  return {{"Authorization", "Bearer " + token}};
}

void CheckAdmin(const Daemon& d, const YAML::Node& config) {
  ASSERT_GT(d.admin_port(), 0) << "the admin API is off";
  HttpResponse r = Http(d.admin_port(), "GET", "/healthz");
  EXPECT_EQ(r.status, 200) << Describe(r);
  EXPECT_EQ(nlohmann::json::parse(r.body, nullptr, false).value("status", ""), "ok") << r.body;
  r = Http(d.admin_port(), "GET", "/readyz");
  EXPECT_EQ(r.status, 200) << Describe(r);
  const auto ready = nlohmann::json::parse(r.body, nullptr, false);
  EXPECT_EQ(ready.value("ready", false), true) << r.body;
  if (Str(Get(config, "store", "type")) == "redis") {
    EXPECT_EQ(ready.value("reachable", false), true) << "Redis not reached: " << r.body;
  }
  r = Http(d.admin_port(), "GET", "/metrics", AdminAuth(config));
  EXPECT_EQ(r.status, 200) << Describe(r);
  EXPECT_NE(r.body.find("ratelimit_decisions_total"), std::string::npos) << r.body;
}

// What /v1/check must answer as `limit` for a configured limit.
int64_t ConfiguredLimit(const YAML::Node& l) {
  for (const char* field : {"capacity", "limit", "depth"}) {
    if (l[field]) return l[field].as<int64_t>();
  }
  return -1;
}

void CheckDecisionApi(const Daemon& d, const YAML::Node& config) {
  std::vector<std::pair<std::string, nlohmann::json>> asks;
  for (const auto& l : config["limits"]) {
    const std::string name = l.first.as<std::string>();
    asks.push_back({name, {{"key", "examples-test:" + name}, {"limits", {name}}}});
  }
  if (asks.empty()) {  // no named limits: an inline one
    asks.push_back({"", nlohmann::json::parse(R"({"key": "examples-test", "limit":
        {"algorithm": "token_bucket", "capacity": 5, "refill_per_second": 1}})")});
  }
  for (const auto& [name, body] : asks) {
    HttpResponse r = Http(d.port(), "POST", "/v1/check", {}, body.dump());
    EXPECT_EQ(r.status, 200) << body.dump() << "\n" << Describe(r);
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    EXPECT_EQ(j.value("allowed", false), true) << r.body;
    if (!name.empty() && j.contains("limits") && !j["limits"].empty()) {
      EXPECT_EQ(j["limits"][0].value("limit", int64_t{-1}), ConfiguredLimit(config["limits"][name]))
          << "limit '" << name << "': " << r.body;
    }
  }
}

struct Request {
  std::string method;
  std::string path;
  bool rate_limited = true;  // some limit (not only a concurrency one) applies
};

// One request each route matches.
std::vector<std::pair<std::string, Request>> RouteRequests(const YAML::Node& config) {
  std::vector<std::pair<std::string, Request>> out;
  static const std::regex param(R"(\{[^}]*\})");
  const bool everywhere = (config["global"] && config["global"].size() > 0) ||
                          config["default_plan"] || config["plans"];
  for (const auto& route : config["routes"]) {
    Request req{"GET", std::regex_replace(Str(route["path"], "/"), param, "1")};
    req.rate_limited = everywhere || (route["limits"] && route["limits"].size() > 0);
    if (route["methods"] && route["methods"].size() > 0)
      req.method = route["methods"][0].as<std::string>();
    out.push_back({Str(route["name"]), req});
  }
  if (out.empty()) out.push_back({"(no route)", {"GET", "/examples-test", everywhere}});
  return out;
}

// Whether the answer carries the rate limit headers of the configured dialect.
void CheckRateLimitHeaders(const HttpResponse& r, const YAML::Node& config,
                           const std::string& what) {
  const std::string dialect = Str(Get(config, "server", "headers"), "draft06");
  const std::map<std::string, std::string> expected = {{"draft06", "RateLimit-Limit"},
                                                       {"structured", "RateLimit-Policy"},
                                                       {"legacy", "X-RateLimit-Limit"}};
  if (dialect == "none") {
    for (const auto& [name, value] : r.headers) {
      EXPECT_EQ(name.find("RateLimit"), std::string::npos)
          << what << ": headers: none, got " << name;
    }
    return;
  }
  ASSERT_TRUE(expected.count(dialect)) << "unknown headers dialect " << dialect;
  EXPECT_TRUE(r.Has(expected.at(dialect))) << what << ": no " << expected.at(dialect) << "\n"
                                           << Describe(r);
}

// Each route through the gateway, from its own client address (127.0.1.n
// for route n: what one route's request costs, e.g. a metered route's max
// when the test upstream reports no usage, is not taken from the next's).
void CheckGateway(const Daemon& d, const YAML::Node& config, const TestUpstream& upstream) {
  int n = 0;
  for (const auto& [route, req] : RouteRequests(config)) {
    const int before = upstream.requests();
    HttpResponse r =
        Http(d.port(), req.method, req.path, {}, "", "127.0.1." + std::to_string(++n % 250));
    const std::string what = "gateway, route " + route + ": " + req.method + " " + req.path;
    EXPECT_EQ(r.status, 200) << what << "\n" << Describe(r);
    EXPECT_EQ(r.Header("X-Upstream"), "yes") << what << ": not forwarded\n" << Describe(r);
    EXPECT_EQ(upstream.requests(), before + 1) << what;
    if (req.rate_limited) CheckRateLimitHeaders(r, config, what);
  }
}

// Each route through /v1/auth (nginx's auth_request), from its own client address.
void CheckAuth(const Daemon& d, const YAML::Node& config) {
  int n = 0;
  for (const auto& [route, req] : RouteRequests(config)) {
    HttpResponse r = Http(d.port(), "GET", "/v1/auth",
                          {{"X-Original-Method", req.method}, {"X-Original-URI", req.path}}, "",
                          "127.0.2." + std::to_string(++n % 250));
    const std::string what = "/v1/auth, route " + route + ": " + req.method + " " + req.path;
    EXPECT_TRUE(r.status == 200 || r.status == 204) << what << "\n" << Describe(r);
    if (req.rate_limited) CheckRateLimitHeaders(r, config, what);
  }
}

// A lease on each route's concurrency limit through /v1/acquire, renewed for
// the route's lease_ttl, given back.
void CheckConcurrencyApi(const Daemon& d, const YAML::Node& config) {
  for (const auto& route : config["routes"]) {
    if (!route["concurrency"]) continue;
    const nlohmann::json ask = {{"key", "examples-test"}, {"route", Str(route["name"])}};
    HttpResponse r = Http(d.port(), "POST", "/v1/acquire", {}, ask.dump());
    EXPECT_EQ(r.status, 200) << ask.dump() << "\n" << Describe(r);
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    EXPECT_EQ(j.value("acquired", false), true) << r.body;
    const nlohmann::json give = {{"key", "examples-test"},
                                 {"route", Str(route["name"])},
                                 {"lease_id", j.value("lease_id", "")}};
    r = Http(d.port(), "POST", "/v1/renew", {}, give.dump());
    EXPECT_EQ(r.status, 200) << give.dump() << "\n" << Describe(r);
    const auto renewed = nlohmann::json::parse(r.body, nullptr, false);
    EXPECT_EQ(renewed.value("renewed", false), true) << r.body;
    EXPECT_EQ(renewed.value("lease_ttl_ms", -1), j.value("lease_ttl_ms", -2)) << r.body;
    r = Http(d.port(), "POST", "/v1/release", {}, give.dump());
    EXPECT_EQ(r.status, 200) << give.dump() << "\n" << Describe(r);
    EXPECT_EQ(nlohmann::json::parse(r.body, nullptr, false).value("released", false), true)
        << r.body;
  }
}

// The demo page, when the config turns it on.
void CheckDemo(const Daemon& d, const YAML::Node& config) {
  if (Str(Get(config, "server", "demo")) != "true") return;
  HttpResponse r = Http(d.port(), "GET", "/");
  EXPECT_EQ(r.status, 200) << Describe(r);
  EXPECT_NE(r.Header("Content-Type").find("text/html"), std::string::npos) << Describe(r);
}

void Stop(Daemon& d) {
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(std::chrono::seconds(15)), 0) << "SIGTERM did not end it with 0\n" << d.Log();
  EXPECT_EQ(d.Log().find(R"("level":"error")"), std::string::npos) << d.Log();
}

// --- the cases -------------------------------------------------------------------

// A YAML of examples/, prepared (Prepare) and started with its servers.
struct Started {
  TempDir dir;  // first: removed after the daemon and the servers are gone
  Servers servers;
  YAML::Node config;
  std::unique_ptr<Daemon> daemon;
};

// The gRPC face (Envoy's rate limit service): health, and one ShouldRateLimit
// per domain of its config directory, asked by the client built from Envoy's
// own rls.proto (tests/envoy/client; npm packages from scripts/install-deps.sh).
void CheckGrpc(int port, const YAML::Node& config) {
  const std::string client = std::string(RL_ENVOY_CLIENT_DIR) + "/scenario.cjs";
  std::string out;
  EXPECT_EQ(RunCommand({"node", client, "health", std::to_string(port)}, &out), 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  const std::string dir = Str(Get(config, "envoy", "config_dir"));
  ASSERT_FALSE(dir.empty()) << "server.grpc_listen without envoy.config_dir";
  for (const auto& entry : fs::directory_iterator(kExamples + "/envoy/" + dir)) {
    const YAML::Node domain = YAML::LoadFile(entry.path().string());
    const YAML::Node first = domain["descriptors"][0];
    nlohmann::json req = {{"domain", domain["domain"].as<std::string>()},
                          {"descriptors",
                           {{{"entries",
                              {{{"key", first["key"].as<std::string>()},
                                {"value", first["value"] ? first["value"].as<std::string>()
                                                         : std::string("v")}}}}}}}};
    EXPECT_EQ(RunCommand({"node", client, "call", std::to_string(port), req.dump()}, &out), 0)
        << out;
    const auto answer = nlohmann::json::parse(out, nullptr, false);
    EXPECT_EQ(answer.value("overall_code", ""), "OK") << req.dump() << " -> " << out;
  }
}

void Start(const std::string& rel, Started& s) {
  std::string error;
  const std::string path = Prepare(rel, s.dir.path, s.servers, &error);
  ASSERT_TRUE(error.empty()) << rel << ": " << error;
  s.config = YAML::LoadFile(path);
  // As the daemon reads it: relative to the config file's folder.
  if (const std::string token = Str(Get(s.config, "server", "admin_token_file"));
      !token.empty() && token[0] != '/') {
    s.config["server"]["admin_token_file"] = (fs::path(path).parent_path() / token).string();
  }
  s.daemon = std::make_unique<Daemon>(std::vector<std::string>{"--config", path});
  ASSERT_TRUE(s.daemon->started()) << "ratelimitd --config " << rel << " did not start:\n"
                                   << ReadFile(path) << "\n"
                                   << s.daemon->Log();
}

void RunYaml(const std::string& rel) {
  Started s;
  ASSERT_NO_FATAL_FAILURE(Start(rel, s));
  Daemon& d = *s.daemon;
  CheckAdmin(d, s.config);
  CheckDecisionApi(d, s.config);
  CheckConcurrencyApi(d, s.config);
  CheckAuth(d, s.config);
  if (s.servers.upstream) CheckGateway(d, s.config, *s.servers.upstream);
  CheckDemo(d, s.config);
  if (s.servers.grpc_port > 0) CheckGrpc(s.servers.grpc_port, s.config);
  Stop(d);
}

// The conf with its YAML (same name): nginx -> auth_request -> ratelimitd,
// then the upstream. Every route answers 200 with a RateLimit header at the
// client; the route that runs out first, asked until it does, answers
// nginx's 429 with Retry-After.
void RunNginx(const std::string& rel) {
  ASSERT_EQ(::access("/usr/sbin/nginx", X_OK), 0) << "nginx is required (scripts/install-deps.sh)";
  const std::string yaml_rel = rel.substr(0, rel.size() - 5) + ".yaml";
  ASSERT_TRUE(fs::exists(kExamples + "/" + yaml_rel)) << rel << " has no " << yaml_rel;
  Started s;
  ASSERT_NO_FATAL_FAILURE(Start(yaml_rel, s));
  Daemon& d = *s.daemon;
  const YAML::Node& config = s.config;
  TestUpstream upstream;
  const TempDir prefix;
  const std::string& dir = prefix.path;
  const int port = FreePort();
  std::string conf = ReadFile(kExamples + "/" + rel);
  conf = Replace(conf, "{{PREFIX}}", dir);
  conf = Replace(conf, "{{LISTEN}}", "127.0.0.1:" + std::to_string(port));
  conf = Replace(conf, "{{RATELIMITD}}", "127.0.0.1:" + std::to_string(d.port()));
  conf = Replace(conf, "{{UPSTREAM}}", "127.0.0.1:" + std::to_string(upstream.port()));
  // Only the header's placeholder list may still hold {{...}}.
  std::string body = conf.substr(conf.find("\nworker_processes"));
  ASSERT_EQ(body.find("{{"), std::string::npos) << "a placeholder no test fills:\n" << body;
  WriteFile(dir + "/nginx.conf", conf);
  Nginx nginx(dir, port);
  ASSERT_TRUE(nginx.running()) << ReadFile(dir + "/error.log");

  for (const auto& [route, req] : RouteRequests(config)) {
    const std::string what = "nginx, route " + route + ": " + req.method + " " + req.path;
    HttpResponse r = Http(port, req.method, req.path, {}, "");
    EXPECT_EQ(r.status, 200) << what << "\n" << Describe(r) << ReadFile(dir + "/error.log");
    EXPECT_EQ(r.Header("X-Upstream"), "yes") << what;
    bool rate_limit_header = false;
    for (const auto& [name, value] : r.headers) {
      rate_limit_header = rate_limit_header || (name.find("RateLimit") != std::string::npos &&
                                                name != "X-RateLimit-Degraded" && !value.empty());
    }
    EXPECT_TRUE(rate_limit_header) << what << ": no RateLimit header reaches the client\n"
                                   << Describe(r);
  }
  // The route that runs out first (fewest requests to its inline limit):
  // asked that often again, the client must meet nginx's 429.
  int64_t fewest = 51;
  std::string tightest;
  for (const auto& route : config["routes"]) {
    const int64_t cost = route["cost"] ? route["cost"].as<int64_t>() : 1;
    for (const auto& l : route["limits"]) {
      if (l.IsMap() && cost > 0 && ConfiguredLimit(l) > 0 && ConfiguredLimit(l) / cost < fewest) {
        fewest = ConfiguredLimit(l) / cost;
        tightest = Str(route["name"]);
      }
    }
  }
  ASSERT_FALSE(tightest.empty()) << "no route of " << rel << " runs out within 50 requests";
  const auto requests = RouteRequests(config);
  const auto it = std::find_if(requests.begin(), requests.end(),
                               [&](const auto& r) { return r.first == tightest; });
  ASSERT_NE(it, requests.end());
  HttpResponse r;
  for (int64_t i = 0; i <= fewest && r.status != 429; ++i) {
    r = Http(port, it->second.method, it->second.path);
  }
  EXPECT_EQ(r.status, 429) << "nginx, route " << it->first << " after " << fewest + 1
                           << " requests\n"
                           << Describe(r);
  EXPECT_FALSE(r.Header("Retry-After").empty()) << Describe(r);
  Stop(d);
}

// The unit: systemd-analyze verify (with ExecStart's binary the built one),
// then ExecStart run as written (user-supplied paths replaced), ExecReload
// run against it, and a stop within TimeoutStopSec.
void RunSystemdUnit(const std::string& rel) {
  ASSERT_FALSE(FindExecutable("systemd-analyze").empty())
      << "systemd-analyze is required (scripts/install-deps.sh: systemd)";
  std::string unit = ReadFile(kExamples + "/" + rel);
  static const std::regex exec_start(R"(\nExecStart=(\S+)([^\n]*))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(unit, m, exec_start)) << rel << " has no ExecStart";
  const std::string installed = m[1];
  const TempDir temp;
  const std::string& dir = temp.path;
  unit = Replace(unit, installed + " ", std::string(RATELIMITD_PATH) + " ");
  const std::string unit_path = dir + "/" + fs::path(rel).filename().string();
  WriteFile(unit_path, unit);
  std::string out;
  EXPECT_EQ(RunCommand({"systemd-analyze", "verify", unit_path}, &out), 0) << out;
  EXPECT_EQ(out, "") << "systemd-analyze verify " << rel << ":\n" << out;

  std::string error;
  ASSERT_EQ(error = ReplaceUserSupplied(unit, dir, YAML::Node()), "") << rel << ": " << error;
  ASSERT_TRUE(std::regex_search(unit, m, exec_start));
  std::vector<std::string> args;
  std::istringstream words(m[2].str());
  for (std::string w; words >> w;) args.push_back(w);
  Daemon d(args);
  ASSERT_TRUE(d.started()) << "ExecStart=" << RATELIMITD_PATH << m[2].str() << "\n" << d.Log();
  EXPECT_EQ(Http(d.admin_port(), "GET", "/healthz").status, 200);

  static const std::regex exec_reload(R"(\nExecReload=([^\n]*))");
  if (std::regex_search(unit, m, exec_reload)) {
    const std::string reload = Replace(m[1].str(), "$MAINPID", std::to_string(d.pid()));
    EXPECT_EQ(RunCommand({"sh", "-c", reload}, &out), 0) << reload << ": " << out;
    EXPECT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(5)))
        << "ExecReload=" << reload << "\n"
        << d.Log();
    EXPECT_EQ(Http(d.admin_port(), "GET", "/healthz").status, 200);
  }
  Stop(d);
}

// A YAML file that is not a ratelimitd config: envoyproxy/ratelimit's domain
// file (`domain:`) or Envoy's own config (`static_resources:`).
bool IsEnvoysOwnYaml(const std::string& rel) {
  const YAML::Node n = YAML::LoadFile(kExamples + "/" + rel);
  return n.IsMap() && (n["domain"] || n["static_resources"]);
}

// Any other file must be one an example names (a keys file, a certificate):
// it is tested with that example. Otherwise no case starts it: a failure.
void RunDataFile(const std::string& rel) {
  const std::string name = fs::path(rel).filename().string();
  const fs::path folder = fs::path(kExamples + "/" + rel).parent_path();
  for (const std::string& other : ListExamples()) {
    if (other == rel) continue;
    if (ReadFile(kExamples + "/" + other).find(name) != std::string::npos) {
      std::cout << "examples/" << rel << ": named by examples/" << other << ", tested with it\n";
      return;
    }
    // An Envoy domain file: in the envoy.config_dir of a ratelimitd example.
    if (!EndsWith(other, ".yaml") || IsEnvoysOwnYaml(other)) continue;
    const std::string dir =
        Str(Get(YAML::LoadFile(kExamples + "/" + other), "envoy", "config_dir"));
    if (!dir.empty() &&
        fs::equivalent(fs::path(kExamples + "/" + other).parent_path() / dir, folder)) {
      std::cout << "examples/" << rel << ": a domain of examples/" << other << ", tested with it\n";
      return;
    }
  }
  FAIL() << "examples/" << rel << ": no example names it and no case of " << __FILE__
         << " starts this kind of file; add one";
}

class ExampleTest : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override {
    const auto known = kKnownFailures.find(GetParam());
    if (known == kKnownFailures.end()) return;
    if (HasFailure()) {
      std::cout << "KNOWN FAILURE examples/" << GetParam() << ": " << known->second << "\n";
    } else {
      ADD_FAILURE() << "examples/" << GetParam() << " passes now: remove it from kKnownFailures in "
                    << __FILE__;
    }
  }
};

TEST_P(ExampleTest, Starts) {
  const std::string& rel = GetParam();
  if (EndsWith(rel, ".yaml") && !IsEnvoysOwnYaml(rel)) {
    RunYaml(rel);
  } else if (EndsWith(rel, ".conf")) {
    RunNginx(rel);
  } else if (EndsWith(rel, ".service")) {
    RunSystemdUnit(rel);
  } else {
    RunDataFile(rel);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleTest, ::testing::ValuesIn(ListExamples()), TestName);

}  // namespace
}  // namespace rltest

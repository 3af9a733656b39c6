#include "server/problem.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ratelimit::server {
namespace {

TEST(Problem, Body) {
  Reply r = ProblemReply(413, "request body exceeds 65536 bytes", "/v1/check");
  EXPECT_EQ(r.status, 413u);
  EXPECT_EQ(r.content_type, "application/problem+json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["type"], "about:blank");
  EXPECT_EQ(j["title"], "Content Too Large");
  EXPECT_EQ(j["status"], 413);
  EXPECT_EQ(j["detail"], "request body exceeds 65536 bytes");
  EXPECT_EQ(j["instance"], "/v1/check");
}

// RFC 9110 section 15 (and RFC 6585's 428, 429, 431, 511): the reason
// phrases of the client and server error statuses.
const std::map<unsigned, std::string_view>& ReasonPhrases() {
  static const std::map<unsigned, std::string_view> phrases = {
      {400, "Bad Request"},
      {401, "Unauthorized"},
      {402, "Payment Required"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {406, "Not Acceptable"},
      {407, "Proxy Authentication Required"},
      {408, "Request Timeout"},
      {409, "Conflict"},
      {410, "Gone"},
      {411, "Length Required"},
      {412, "Precondition Failed"},
      {413, "Content Too Large"},
      {414, "URI Too Long"},
      {415, "Unsupported Media Type"},
      {416, "Range Not Satisfiable"},
      {417, "Expectation Failed"},
      {421, "Misdirected Request"},
      {422, "Unprocessable Content"},
      {426, "Upgrade Required"},
      {428, "Precondition Required"},
      {429, "Too Many Requests"},
      {431, "Request Header Fields Too Large"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {502, "Bad Gateway"},
      {503, "Service Unavailable"},
      {504, "Gateway Timeout"},
      {505, "HTTP Version Not Supported"},
      {511, "Network Authentication Required"},
  };
  return phrases;
}

// The 4xx and 5xx numbers written in `text`.
void AddStatuses(std::string_view text, std::set<unsigned>& out) {
  for (size_t i = 0; i + 3 <= text.size(); ++i) {
    const auto digit = [&](size_t k) {
      return k < text.size() && text[k] >= '0' && text[k] <= '9';
    };
    const auto word = [&](size_t k) {
      return digit(k) || std::isalpha(static_cast<unsigned char>(text[k])) || text[k] == '_';
    };
    if ((text[i] != '4' && text[i] != '5') || !digit(i + 1) || !digit(i + 2)) continue;
    if ((i > 0 && word(i - 1)) || (i + 3 < text.size() && word(i + 3))) continue;
    out.insert(static_cast<unsigned>((text[i] - '0') * 100 + (text[i + 1] - '0') * 10 +
                                     (text[i + 2] - '0')));
  }
}

// The first argument of every call of `function` in `text`.
std::vector<std::string_view> FirstArguments(std::string_view text, std::string_view function) {
  std::vector<std::string_view> out;
  const std::string call = std::string(function) + "(";
  for (size_t at = text.find(call); at != std::string_view::npos; at = text.find(call, at + 1)) {
    if (at > 0 && (std::isalnum(static_cast<unsigned char>(text[at - 1])) || text[at - 1] == '_'))
      continue;
    const size_t start = at + call.size();
    int depth = 0;
    size_t end = start;
    for (; end < text.size(); ++end) {
      const char c = text[end];
      if (c == '(') ++depth;
      if ((c == ')' && depth-- == 0) || (c == ',' && depth == 0) || c == ';') break;
    }
    out.push_back(text.substr(start, end - start));
  }
  return out;
}

// Every status the server answers with a problem body has its reason phrase
// as the title (RFC 9457: an about:blank problem's title is the status
// phrase), never the fallback "Error" (/v1/settle's 409s had it). The
// statuses are found in the server's sources: the first argument of what
// makes a problem (ProblemReply, UndecidedReply, a batch's ErrorEntry, a
// session's Refuse, the gateway's Fail), and every line that names a status
// (the admin API's `404 : 400`, auth_request's deny_status 401/403/429,
// store.closed_status 429/503).
TEST(Problem, EveryStatusTheServerAnswersHasItsReasonPhraseAsTitle) {
  std::set<unsigned> used;
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(RL_SERVER_SOURCE_DIR)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".cc") || name.ends_with("_test.cc")) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string source = text.str();
    ++files;
    for (std::string_view f :
         {"ProblemReply", "UndecidedReply", "ErrorEntry", "Refuse", "Fail", "Problem"}) {
      for (std::string_view arg : FirstArguments(source, f)) AddStatuses(arg, used);
    }
    std::istringstream lines(source);
    for (std::string line; std::getline(lines, line);) {
      std::string lower = line;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower.find("status") != std::string::npos) AddStatuses(line, used);
    }
  }
  ASSERT_GT(files, 20u) << RL_SERVER_SOURCE_DIR;
  // The walk finds what it must: the settlement's 409, the session's 413 and
  // 431, the gateway's 502 and 504, auth_request's 401 and 403.
  for (unsigned s : {401u, 403u, 409u, 413u, 429u, 431u, 502u, 503u, 504u}) {
    EXPECT_TRUE(used.count(s)) << s;
  }
  for (unsigned s : used) {
    auto it = ReasonPhrases().find(s);
    ASSERT_NE(it, ReasonPhrases().end()) << s << " is no RFC 9110 status: add it to the table";
    EXPECT_EQ(StatusTitle(s), it->second) << s;
    EXPECT_EQ(nlohmann::json::parse(ProblemReply(s, "x", "").body)["title"], it->second) << s;
  }
}

TEST(Problem, InvalidUtf8DoesNotThrow) {
  Reply r = ProblemReply(400, "bad \xff key", "");
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j.contains("instance"));
}

TEST(Reply, FindIgnoresCase) {
  Reply r;
  r.Add("Retry-After", "3");
  ASSERT_NE(r.Find("retry-after"), nullptr);
  EXPECT_EQ(*r.Find("RETRY-AFTER"), "3");
  EXPECT_EQ(r.Find("Retry"), nullptr);
}

}  // namespace
}  // namespace ratelimit::server

// Replays fuzz/corpus/<target>/* and fuzz/regressions/<target>/* through the
// fuzz entry points (fuzz/targets.h): every seed and every crash the fuzzers
// ever found runs on each build, with GCC and under ASan/UBSan and TSan like
// any unit test. A broken invariant aborts with "fuzz invariant failed at
// ..."; the test name says which input (target, folder, file name).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "fuzz/targets.h"

namespace ratelimit::fuzz {
namespace {

namespace fs = std::filesystem;

struct Target {
  const char* name;  // folder name under fuzz/corpus and fuzz/regressions
  int (*fn)(const uint8_t*, size_t);
};

constexpr Target kTargets[] = {
    {"config", FuzzConfig},
    {"path", FuzzPath},
    {"client_ip", FuzzClientIp},
    {"duration", FuzzDuration},
    {"redis_reply", FuzzRedisReply},
    {"redis_url", FuzzRedisUrl},
    {"decision_api", FuzzDecisionApi},
    {"http", FuzzHttp},
    {"gateway", FuzzGateway},
    {"grpc", FuzzGrpc},
};

struct Input {
  const Target* target;
  std::string kind;  // "corpus" or "regressions"
  fs::path path;
  std::string test_name;
};

std::vector<Input> ListInputs() {
  std::vector<Input> out;
  std::set<std::string> names;
  for (const Target& t : kTargets) {
    for (const char* kind : {"corpus", "regressions"}) {
      const fs::path dir = fs::path(RL_FUZZ_DIR) / kind / t.name;
      if (!fs::is_directory(dir)) continue;
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        std::string name = std::string(t.name) + "_" + kind + "_" + f.filename().string();
        for (char& c : name) {
          if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
        }
        const std::string base = name;
        for (int i = 2; !names.insert(name).second; ++i) name = base + "_" + std::to_string(i);
        out.push_back({&t, kind, f, name});
      }
    }
  }
  return out;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class FuzzReplay : public ::testing::TestWithParam<Input> {};

TEST_P(FuzzReplay, RunsCleanly) {
  const Input& in = GetParam();
  const std::string bytes = ReadFile(in.path);
  ASSERT_TRUE(fs::exists(in.path)) << in.path;
  EXPECT_EQ(in.target->fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0)
      << in.path;
}

INSTANTIATE_TEST_SUITE_P(Inputs, FuzzReplay, ::testing::ValuesIn(ListInputs()),
                         [](const ::testing::TestParamInfo<Input>& info) {
                           return info.param.test_name;
                         });

// No silent skips: every target has seeds, so the replay above really runs each entry point.
TEST(FuzzCorpus, EveryTargetHasSeeds) {
  for (const Target& t : kTargets) {
    const fs::path dir = fs::path(RL_FUZZ_DIR) / "corpus" / t.name;
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    EXPECT_FALSE(fs::is_empty(dir)) << dir;
  }
}

// The empty input is the first thing libFuzzer tries; keep it covered here too.
TEST(FuzzCorpus, EmptyInput) {
  for (const Target& t : kTargets) EXPECT_EQ(t.fn(nullptr, 0), 0) << t.name;
}

}  // namespace
}  // namespace ratelimit::fuzz

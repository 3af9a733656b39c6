// ParseFlags: the `--name=value` flags of the bench drivers (http_load,
// redis_decisions_bench), declared once as a table of names and where each
// value goes. Whole numbers go to int64_t, decimals to double (neither may be
// negative), text to std::string; a bool is a switch without a value. A bad
// or unknown flag prints the usage and exits 2 (Fail).
//
//   const bench::Usage usage{"http_load", "--host --port --rate"};
//   // LoadFlags(f) (--duration-ms, --rate, ...) and the driver's own:
//   bench::ParseLoadFlags(argc, argv, usage, f, {{"host", &f.host}, {"port", &f.port}});
//   if (f.port == 0) usage.Fail("--port");
//
// Thread-safety: for main() only.
#pragma once

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace bench {

struct Usage {
  const char* program;
  const char* flags;
  [[noreturn]] void Fail(const char* bad) const {
    std::fprintf(stderr, "%s: bad flag '%s'\nflags: %s\n", program, bad, flags);
    std::exit(2);
  }
};

struct Flag {
  std::string_view name;
  std::variant<int64_t*, double*, std::string*, bool*> out;
};

// Sets `flag` from `value` (nullopt: given without '='); false if malformed.
inline bool SetFlag(const Flag& flag, const std::string_view* value) {
  if (bool* const* sw = std::get_if<bool*>(&flag.out)) {
    if (value != nullptr) return false;
    **sw = true;
    return true;
  }
  if (value == nullptr) return false;
  const std::string v(*value);
  if (std::string* const* s = std::get_if<std::string*>(&flag.out)) {
    **s = v;
    return true;
  }
  if (int64_t* const* n = std::get_if<int64_t*>(&flag.out)) {
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), **n);
    return ec == std::errc() && p == v.data() + v.size() && **n >= 0;
  }
  double* d = std::get<double*>(flag.out);
  char* end = nullptr;
  *d = std::strtod(v.c_str(), &end);
  return end != v.c_str() && *end == '\0' && *d >= 0;
}

// The flags every driver has, for a `Flags` struct with these members.
template <typename Flags>
std::vector<Flag> LoadFlags(Flags& f) {
  return {{"duration-ms", &f.duration_ms},
          {"warmup-ms", &f.warmup_ms},
          {"connections", &f.connections},
          {"keys", &f.keys},
          {"rate", &f.rate}};
}

// `flags`: LoadFlags(f) and the driver's own.
inline void ParseFlags(int argc, char** argv, const Usage& usage, std::vector<Flag> flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.substr(0, 2) != "--") usage.Fail(argv[i]);
    const size_t eq = a.find('=');
    const std::string_view name = a.substr(2, eq == a.npos ? a.npos : eq - 2);
    const std::string_view value = eq == a.npos ? std::string_view() : a.substr(eq + 1);
    bool ok = false;
    for (const Flag& f : flags) {
      if (f.name == name) {
        ok = SetFlag(f, eq == a.npos ? nullptr : &value);
        break;
      }
    }
    if (!ok) usage.Fail(argv[i]);
  }
}

// ParseFlags over LoadFlags(f) followed by the driver's `own` flags.
template <typename Flags>
void ParseLoadFlags(int argc, char** argv, const Usage& usage, Flags& f,
                    std::initializer_list<Flag> own) {
  std::vector<Flag> flags = LoadFlags(f);
  flags.insert(flags.end(), own);
  ParseFlags(argc, argv, usage, std::move(flags));
}

}  // namespace bench

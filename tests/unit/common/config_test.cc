// Config: defaults, the GS_* environment table, parse errors and validate() ranges.
#include "common/config.h"

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"

namespace gs {
namespace {

// Clears every GS_* variable of the table for the test and restores the caller's values after,
// so the tests neither see nor leak environment.
class ConfigEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const ConfigVariable& v : configVariables()) {
      const char* old = getenv(v.name);
      saved_[v.name] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(v.name);
    }
  }
  void TearDown() override {
    for (auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }
  static void set(const char* name, const char* value) { ASSERT_EQ(setenv(name, value, 1), 0); }

  // Applies the environment to a default Config; returns the error it threw, if any.
  static std::optional<Error> applyError(Config& c) {
    try {
      c.applyEnvironment();
    } catch (const Error& e) {
      return e;
    }
    return std::nullopt;
  }

  // Expects `name=value` to be rejected with kInvalidArgument naming the variable.
  static void expectRejected(const char* name, const char* value) {
    set(name, value);
    Config c;
    auto err = applyError(c);
    ASSERT_TRUE(err.has_value()) << name << "=" << value << " was accepted";
    EXPECT_EQ(err->code(), Errc::kInvalidArgument) << name << "=" << value;
    EXPECT_NE(std::string(err->what()).find(name), std::string::npos)
        << "message does not name " << name << ": " << err->what();
    unsetenv(name);
  }

  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(ConfigEnv, DefaultsAreTheDocumentedOnes) {
  Config c;
  EXPECT_EQ(c.transport, "auto");
  EXPECT_EQ(c.timeoutMs, 60000);
  EXPECT_EQ(c.chunkBytes, 1024 * 1024);
  EXPECT_EQ(c.slotsPerPeer, 8);
  EXPECT_EQ(c.socketsPerPeer, 2);
  EXPECT_EQ(c.codec, "raw");
  EXPECT_EQ(c.metricsAddress, "");
  EXPECT_EQ(c.socketIfname, "");
  EXPECT_EQ(c.secret, "");
  EXPECT_EQ(c.logLevel, LogLevel::kWarn);
  EXPECT_NO_THROW(c.validate());

  // With no GS_* set, applyEnvironment changes nothing.
  c.applyEnvironment();
  EXPECT_EQ(c.transport, "auto");
  EXPECT_EQ(c.timeoutMs, 60000);
  EXPECT_EQ(c.chunkBytes, 1024 * 1024);
  EXPECT_EQ(c.logLevel, LogLevel::kWarn);
}

TEST_F(ConfigEnv, DocumentedDefaultsParseToTheStructDefaults) {
  // The documentation table's default strings, fed back through the environment, must give
  // the same Config as the defaults in the struct.
  for (const ConfigVariable& v : configVariables()) {
    if (*v.defaultValue != '\0')
      set(v.name, v.defaultValue);
  }
  Config fromDocs;
  fromDocs.applyEnvironment();
  Config defaults;
  EXPECT_EQ(fromDocs.transport, defaults.transport);
  EXPECT_EQ(fromDocs.timeoutMs, defaults.timeoutMs);
  EXPECT_EQ(fromDocs.chunkBytes, defaults.chunkBytes);
  EXPECT_EQ(fromDocs.slotsPerPeer, defaults.slotsPerPeer);
  EXPECT_EQ(fromDocs.socketsPerPeer, defaults.socketsPerPeer);
  EXPECT_EQ(fromDocs.codec, defaults.codec);
  EXPECT_EQ(fromDocs.logLevel, defaults.logLevel);
}

TEST_F(ConfigEnv, TableListsEveryVariableOnce) {
  std::map<std::string, int> seen;
  for (const ConfigVariable& v : configVariables()) {
    ASSERT_NE(v.name, nullptr);
    EXPECT_EQ(std::string(v.name).rfind("GS_", 0), 0u) << v.name;
    EXPECT_NE(std::string(v.help), "") << v.name;
    ++seen[v.name];
  }
  for (const char* name :
       {"GS_TRANSPORT", "GS_TIMEOUT_MS", "GS_CHUNK_BYTES", "GS_SLOTS_PER_PEER", "GS_TCP_SOCKETS",
        "GS_CODEC", "GS_SOCKET_IFNAME", "GS_SECRET", "GS_DEBUG"}) {
    EXPECT_EQ(seen[name], 1) << name;
  }
}

TEST_F(ConfigEnv, OverridesApply) {
  set("GS_TRANSPORT", "loopback");
  set("GS_TIMEOUT_MS", "1234");
  set("GS_CHUNK_BYTES", "8192");
  set("GS_SLOTS_PER_PEER", "16");
  set("GS_TCP_SOCKETS", "4");
  set("GS_SOCKET_IFNAME", "eth7");
  set("GS_SECRET", "hunter2");
  set("GS_METRICS_ADDR", "127.0.0.1:9400");
  set("GS_DEBUG", "info");
  Config c;
  c.applyEnvironment();
  EXPECT_EQ(c.transport, "loopback");
  EXPECT_EQ(c.timeoutMs, 1234);
  EXPECT_EQ(c.chunkBytes, 8192);
  EXPECT_EQ(c.slotsPerPeer, 16);
  EXPECT_EQ(c.socketsPerPeer, 4);
  EXPECT_EQ(c.socketIfname, "eth7");
  EXPECT_EQ(c.secret, "hunter2");
  EXPECT_EQ(c.metricsAddress, "127.0.0.1:9400");
  EXPECT_EQ(c.logLevel, LogLevel::kInfo);
  EXPECT_NO_THROW(c.validate());
}

TEST_F(ConfigEnv, EnvironmentWinsOverCallerValues) {
  Config c;
  c.timeoutMs = 5;
  c.chunkBytes = 65536;
  set("GS_TIMEOUT_MS", "777");
  c.applyEnvironment();
  EXPECT_EQ(c.timeoutMs, 777);
  EXPECT_EQ(c.chunkBytes, 65536);  // not in the environment: the caller's value stays
}

TEST_F(ConfigEnv, EmptyValueIsIgnored) {
  set("GS_CHUNK_BYTES", "");
  set("GS_DEBUG", "");
  Config c;
  c.chunkBytes = 8192;
  EXPECT_NO_THROW(c.applyEnvironment());
  EXPECT_EQ(c.chunkBytes, 8192);
  EXPECT_EQ(c.logLevel, LogLevel::kWarn);
}

TEST_F(ConfigEnv, SizeSuffixesAreBinaryUnits) {
  struct Case {
    const char* text;
    int64_t bytes;
  } cases[] = {{"4K", 4096},         {"4k", 4096},          {"64K", 65536},    {"1M", 1 << 20},
               {"1m", 1 << 20},      {"3M", 3 << 20},       {"64M", 64 << 20}, {"4096", 4096},
               {"1048576", 1 << 20}, {"67108864", 64 << 20}};
  for (const Case& k : cases) {
    set("GS_CHUNK_BYTES", k.text);
    Config c;
    ASSERT_NO_THROW(c.applyEnvironment()) << k.text;
    EXPECT_EQ(c.chunkBytes, k.bytes) << k.text;
  }
  set("GS_TIMEOUT_MS", "2K");
  Config c;
  c.applyEnvironment();
  EXPECT_EQ(c.timeoutMs, 2048);
}

TEST_F(ConfigEnv, BadIntegersNameTheVariable) {
  for (const char* v : {"abc", "1", "4095", "-4096", "4096x", "4KB", "4 K", "K", "65M", "67108865",
                        "1G", "99999999999999999999999", "1.5M", "0"}) {
    expectRejected("GS_CHUNK_BYTES", v);
  }
  for (const char* v : {"0", "-1", "soon", "1X"})
    expectRejected("GS_TIMEOUT_MS", v);
  for (const char* v : {"1", "65", "0", "many"})
    expectRejected("GS_SLOTS_PER_PEER", v);
  for (const char* v : {"0", "17", "two"})
    expectRejected("GS_TCP_SOCKETS", v);
  for (const char* v : {"loud", "6", "-1", "verbose"})
    expectRejected("GS_DEBUG", v);
}

TEST_F(ConfigEnv, RangeBoundsAreInclusive) {
  auto accepted = [&](const char* name, const char* value) {
    set(name, value);
    Config c;
    auto err = applyError(c);
    unsetenv(name);
    return !err.has_value();
  };
  EXPECT_TRUE(accepted("GS_SLOTS_PER_PEER", "2"));
  EXPECT_TRUE(accepted("GS_SLOTS_PER_PEER", "64"));
  EXPECT_TRUE(accepted("GS_TCP_SOCKETS", "1"));
  EXPECT_TRUE(accepted("GS_TCP_SOCKETS", "16"));
  EXPECT_TRUE(accepted("GS_TIMEOUT_MS", "1"));
  EXPECT_TRUE(accepted("GS_CHUNK_BYTES", "4096"));
  EXPECT_TRUE(accepted("GS_CHUNK_BYTES", "67108864"));
}

// Library bug (reported): parseInt checks a suffixed value against lo / mult, which rounds
// down, so "0M" or "0K" pass the range check and yield 0 (GS_CHUNK_BYTES=0M -> chunkBytes 0,
// GS_TIMEOUT_MS=0K -> timeoutMs 0, GS_SLOTS_PER_PEER=0K -> 0). Enable once fixed.
TEST_F(ConfigEnv, SuffixedValuesBelowTheMinimumAreRejected) {
  expectRejected("GS_CHUNK_BYTES", "0M");
  expectRejected("GS_CHUNK_BYTES", "0K");
  expectRejected("GS_CHUNK_BYTES", "0G");
  expectRejected("GS_TIMEOUT_MS", "0K");
  expectRejected("GS_SLOTS_PER_PEER", "0K");
  expectRejected("GS_TCP_SOCKETS", "0M");
}

TEST_F(ConfigEnv, LogLevelNamesAndNumbers) {
  struct Case {
    const char* text;
    LogLevel level;
  } cases[] = {{"none", LogLevel::kNone},   {"error", LogLevel::kError},
               {"warn", LogLevel::kWarn},   {"WARNING", LogLevel::kWarn},
               {"Info", LogLevel::kInfo},   {"DEBUG", LogLevel::kDebug},
               {"trace", LogLevel::kTrace}, {"0", LogLevel::kNone},
               {"5", LogLevel::kTrace},     {"3", LogLevel::kInfo}};
  for (const Case& k : cases) {
    EXPECT_EQ(parseLogLevel(k.text), k.level) << k.text;
    set("GS_DEBUG", k.text);
    Config c;
    c.applyEnvironment();
    EXPECT_EQ(c.logLevel, k.level) << k.text;
  }
  try {
    parseLogLevel("loud");
    ADD_FAILURE() << "parseLogLevel accepted 'loud'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("GS_DEBUG"), std::string::npos) << e.what();
  }
}

TEST_F(ConfigEnv, FirstBadVariableStopsApplication) {
  set("GS_CHUNK_BYTES", "abc");
  Config c;
  auto err = applyError(c);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(std::string(err->what()).find("abc"), std::string::npos)
      << "message should quote the value";
}

// validate(): each field just outside its range throws kInvalidArgument naming the field;
// the bounds themselves pass.
TEST(ConfigValidate, Ranges) {
  auto rejects = [](auto mutate, const char* field) {
    Config c;
    mutate(c);
    try {
      c.validate();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument) << field;
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
          << "message does not name " << field << ": " << e.what();
      return true;
    }
    return false;
  };
  auto accepts = [](auto mutate) {
    Config c;
    mutate(c);
    try {
      c.validate();
    } catch (const Error&) {
      return false;
    }
    return true;
  };
  EXPECT_TRUE(rejects([](Config& c) { c.timeoutMs = 0; }, "timeout"));
  EXPECT_TRUE(rejects([](Config& c) { c.timeoutMs = -5; }, "timeout"));
  EXPECT_TRUE(accepts([](Config& c) { c.timeoutMs = 1; }));
  EXPECT_TRUE(rejects([](Config& c) { c.chunkBytes = 4095; }, "chunk"));
  EXPECT_TRUE(rejects([](Config& c) { c.chunkBytes = 0; }, "chunk"));
  EXPECT_TRUE(rejects([](Config& c) { c.chunkBytes = (64 << 20) + 1; }, "chunk"));
  EXPECT_TRUE(accepts([](Config& c) { c.chunkBytes = 4096; }));
  EXPECT_TRUE(accepts([](Config& c) { c.chunkBytes = 64 << 20; }));
  EXPECT_TRUE(rejects([](Config& c) { c.slotsPerPeer = 1; }, "slots"));
  EXPECT_TRUE(rejects([](Config& c) { c.slotsPerPeer = 65; }, "slots"));
  EXPECT_TRUE(accepts([](Config& c) { c.slotsPerPeer = 2; }));
  EXPECT_TRUE(accepts([](Config& c) { c.slotsPerPeer = 64; }));
  EXPECT_TRUE(rejects([](Config& c) { c.socketsPerPeer = 0; }, "sockets"));
  EXPECT_TRUE(rejects([](Config& c) { c.socketsPerPeer = 17; }, "sockets"));
  EXPECT_TRUE(accepts([](Config& c) { c.socketsPerPeer = 16; }));
  EXPECT_TRUE(rejects([](Config& c) { c.transport = "carrier-pigeon"; }, "carrier-pigeon"));
  EXPECT_TRUE(rejects([](Config& c) { c.transport = ""; }, "transport"));
  for (const char* t : {"auto", "tcp", "loopback"}) {
    EXPECT_TRUE(accepts([t](Config& c) { c.transport = t; })) << t;
  }
  // Codec names are checked where codecs are known (codecs::CodecSpec::parse at communicator
  // set-up; tests/unit/capi CodecConfig.UnknownCodecIsRejectedByName), not in common/.
  EXPECT_TRUE(accepts([](Config& c) { c.codec = "raw"; }));
}

TEST(ErrorTypes, CodeAndMessageTravel) {
  try {
    GS_CHECK(1 + 1 == 3, Errc::kRemote, "peer %d sent %s", 7, "junk");
    FAIL() << "GS_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kRemote);
    EXPECT_STREQ(e.what(), "peer 7 sent junk");
  }
  EXPECT_NO_THROW(GS_CHECK(true, Errc::kInternal, "never"));
  // Every code has a distinct, non-empty name.
  std::map<std::string, int> names;
  for (Errc c :
       {Errc::kOk, Errc::kInProgress, Errc::kInvalidArgument, Errc::kUnsupported, Errc::kNoMemory,
        Errc::kSystem, Errc::kRemote, Errc::kTimeout, Errc::kAborted, Errc::kInternal}) {
    std::string n = errcName(c);
    EXPECT_FALSE(n.empty());
    EXPECT_EQ(++names[n], 1) << n;
  }
  // formatString handles output longer than any small internal buffer.
  std::string big(5000, 'x');
  EXPECT_EQ(formatString("<%s>", big.c_str()), "<" + big + ">");
  EXPECT_EQ(formatString("%s", ""), "");
}

}  // namespace
}  // namespace gs

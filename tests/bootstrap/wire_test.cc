// The parsers every incoming bootstrap byte goes through: any split of the bytes gives the same result, headers are
// checked as soon as they are complete, and the root's registration book tells strangers from faults of the job.
#include "bootstrap/wire.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>

namespace topocoll::bootstrap {
namespace {

std::vector<uint8_t> message(const Header& h, const std::string& body) {
  std::vector<uint8_t> out(sizeof(h));
  std::memcpy(out.data(), &h, sizeof(h));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

TEST(MessageParser, AnySplitGivesTheSameMessage) {
  auto bytes = message(Header{42, 1, 7, 3}, "abc");
  bytes.push_back('X');  // the stream's next message: never consumed
  for (size_t chunk = 1; chunk <= bytes.size(); ++chunk) {
    MessageParser p({42, 2, 100});
    size_t used = 0;
    for (size_t off = 0; off < bytes.size() && !p.done(); off += chunk) {
      EXPECT_LE(p.wanted(), sizeof(Header));
      used += p.feed(bytes.data() + off, std::min(chunk, bytes.size() - off));
    }
    ASSERT_TRUE(p.done()) << chunk;
    EXPECT_EQ(used, bytes.size() - 1);
    EXPECT_EQ(p.header().rank, 1);
    EXPECT_EQ(p.header().tag, 7);
    EXPECT_EQ(std::string(p.body().begin(), p.body().end()), "abc");
    EXPECT_EQ(p.feed(bytes.data(), 1), 0u);  // done: nothing more is consumed
  }
}

TEST(MessageParser, RejectsAtTheHeader) {
  auto check = [](const Header& h, MessageParser::Rules rules, const std::string& why, bool foreign) {
    MessageParser p(rules);
    auto bytes = message(h, "");
    p.feed(bytes.data(), bytes.size());
    EXPECT_TRUE(p.rejected());
    EXPECT_EQ(p.foreignMagic(), foreign);
    EXPECT_NE(p.why().find(why), std::string::npos) << p.why();
  };
  check(Header{43, 1, 7, 3}, {42, 2, 100}, "wrong magic", true);
  check(Header{42, 2, 7, 3}, {42, 2, 100}, "sender rank 2 out of range", false);
  check(Header{42, -2, 7, 0}, {42, 0, 100}, "sender rank -2 out of range", false);
  check(Header{42, 1, 7, 101}, {42, 2, 100}, "over the limit", false);
}

TEST(MessageParser, ResetReadsTheNextMessage) {
  auto a = message(Header{42, -1, kTagReady, 0}, "");
  auto b = message(Header{42, -1, kTagAbort, 2}, "no");
  a.insert(a.end(), b.begin(), b.end());
  MessageParser p({42, 0, 100});
  size_t used = p.feed(a.data(), a.size());
  ASSERT_TRUE(p.done());
  EXPECT_EQ(p.header().tag, kTagReady);
  p.reset();
  p.feed(a.data() + used, a.size() - used);
  ASSERT_TRUE(p.done());
  EXPECT_EQ(p.header().tag, kTagAbort);
}

std::vector<uint8_t> registration(int nRanks, uint16_t family = AF_INET, uint16_t port = 1234, int64_t timeoutMs = 1000) {
  Registration r;
  r.listen.family = family;
  r.listen.port = port;
  r.nRanks = nRanks;
  r.timeoutMs = timeoutMs;
  std::vector<uint8_t> out(sizeof(r));
  std::memcpy(out.data(), &r, sizeof(r));
  return out;
}

TEST(RegistrationBook, StrangersAreDroppedFaultsOfTheJobFailIt) {
  using V = RegistrationBook::Verdict;
  RegistrationBook book;
  std::string why;
  EXPECT_EQ(book.add(Header{1, 0, kTagRing, 32}, registration(3), &why), V::kDropped);  // not a registration
  EXPECT_EQ(book.add(Header{1, 0, kTagRegister, 32}, registration(0), &why), V::kDropped);
  EXPECT_EQ(book.add(Header{1, 3, kTagRegister, 32}, registration(3), &why), V::kDropped);
  EXPECT_EQ(book.add(Header{1, 0, kTagRegister, 32}, registration(3, 0), &why), V::kDropped);  // no address
  EXPECT_NE(why.find("family 0"), std::string::npos);
  EXPECT_EQ(book.add(Header{1, 0, kTagRegister, 32}, registration(3, AF_INET, 1234, -5), &why), V::kDropped);
  EXPECT_EQ(book.registered(), 0);
  EXPECT_EQ(book.add(Header{1, 2, kTagRegister, 32}, registration(3), &why), V::kAccepted);
  EXPECT_EQ(book.nRanks(), 3);
  EXPECT_EQ(book.add(Header{1, 0, kTagRegister, 32}, registration(4), &why), V::kJobFails);
  EXPECT_EQ(why, "rank 0 was started with WORLD_SIZE=4, rank 2 with 3");
  EXPECT_EQ(book.add(Header{1, 2, kTagRegister, 32}, registration(3), &why), V::kJobFails);
  EXPECT_NE(why.find("rank 2 registered twice"), std::string::npos);
  EXPECT_EQ(book.add(Header{1, 0, kTagRegister, 32}, registration(3), &why), V::kAccepted);
  EXPECT_FALSE(book.complete());
  EXPECT_EQ(book.missingText(), "rank(s) 1 of 3 never registered with the root");
  EXPECT_EQ(book.add(Header{1, 1, kTagRegister, 32}, registration(3), &why), V::kAccepted);
  EXPECT_TRUE(book.complete());
}

TEST(RegistrationBook, ARootThatKnowsTheSizeNamesItself) {
  RegistrationBook book(4);
  std::string why;
  EXPECT_EQ(book.add(Header{1, 3, kTagRegister, 32}, registration(5), &why), RegistrationBook::Verdict::kJobFails);
  EXPECT_EQ(why, "rank 3 was started with WORLD_SIZE=5, the root with 4");
  EXPECT_EQ(book.missingText(), "rank(s) 0, 1, 2, 3 of 4 never registered with the root");
}

}  // namespace
}  // namespace topocoll::bootstrap

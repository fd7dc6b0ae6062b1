// What the Gloo worker does in the trainers' arenas (worker_arenas.h): the
// average it writes equals the daemon's division bit for bit (also where a
// power-of-two divisor becomes a multiply), is copied to every other arena
// and flags NaN and Inf; an arena is mapped only as the very object the
// daemon mapped, and one cut short under the worker is reported by name.
#include "daemon/backends/worker_arenas.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_code.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/shared_segment.h"
#include "tests/ipc/segment_names.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Sums that cover every regime: normal, tiny (subnormal once divided),
// huge, negative, zero.
template <typename T>
std::vector<T> Sums(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> exponent(std::numeric_limits<T>::min_exponent - 3,
                                              std::numeric_limits<T>::max_exponent - 3);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  }
  v[0] = T(0);
  v[1] = std::numeric_limits<T>::denorm_min();
  return v;
}

template <typename T>
void ExpectAverageIsTheDaemonsDivision(DType dtype) {
  for (int divisor : {1, 2, 3, 4, 6, 8, 12, 64}) {
    const std::vector<T> sums = Sums<T>(5000, 17 + divisor);
    std::vector<T> work = sums, copy1(sums.size(), T(7)), copy2(sums.size(), T(9));
    const bool non_finite =
        WriteAverage(reinterpret_cast<char*>(work.data()), work.size(), dtype, divisor,
                     {reinterpret_cast<char*>(copy1.data()), reinterpret_cast<char*>(copy2.data())},
                     /*check=*/true);
    EXPECT_FALSE(non_finite) << "divisor " << divisor;
    for (size_t i = 0; i < sums.size(); ++i) {
      const T expected = sums[i] / static_cast<T>(divisor);  // the daemon's write-back
      ASSERT_EQ(std::memcmp(&work[i], &expected, sizeof(T)), 0)
          << "element " << i << " = " << sums[i] << " / " << divisor << ": got " << work[i]
          << ", expected " << expected;
      ASSERT_EQ(std::memcmp(&copy1[i], &expected, sizeof(T)), 0) << "copy 1, element " << i;
      ASSERT_EQ(std::memcmp(&copy2[i], &expected, sizeof(T)), 0) << "copy 2, element " << i;
    }
  }
}

TEST(WriteAverageTest, Float32AverageEqualsTheDaemonsDivisionBitForBitInEveryCopy) {
  ExpectAverageIsTheDaemonsDivision<float>(DType::kFloat32);
}

TEST(WriteAverageTest, Float64AverageEqualsTheDaemonsDivisionBitForBitInEveryCopy) {
  ExpectAverageIsTheDaemonsDivision<double>(DType::kFloat64);
}

TEST(WriteAverageTest, ANanOrAnInfInTheAverageIsFlaggedOnlyWhenChecking) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> sums(4097, 1.0f);
    sums[4096] = bad;  // the last element of a second chunk
    std::vector<float> again = sums;
    EXPECT_TRUE(WriteAverage(reinterpret_cast<char*>(sums.data()), sums.size(), DType::kFloat32, 3,
                             {}, /*check=*/true))
        << bad;
    EXPECT_FALSE(WriteAverage(reinterpret_cast<char*>(again.data()), again.size(), DType::kFloat32,
                              3, {}, /*check=*/false))
        << bad;
  }
  std::vector<double> finite(100, std::numeric_limits<double>::max());
  EXPECT_FALSE(WriteAverage(reinterpret_cast<char*>(finite.data()), finite.size(), DType::kFloat64,
                            2, {}, /*check=*/true));
}

class WorkerArenasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = cleanup_.Add(testing::UniqueSegmentName("warena"));
    absl::StatusOr<ipc::SharedSegment> segment = ipc::SharedSegment::Create(name_, kBytes);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
  }

  // The arena [offset, offset + bytes) of the test's segment, as the daemon
  // describes it.
  google::protobuf::RepeatedPtrField<v1::GlooWorkerArena> Describe(uint64_t offset,
                                                                   uint64_t bytes) const {
    google::protobuf::RepeatedPtrField<v1::GlooWorkerArena> arenas;
    v1::GlooWorkerArena* arena = arenas.Add();
    arena->set_segment(name_);
    arena->set_device(static_cast<uint64_t>(segment_.device()));
    arena->set_inode(static_cast<uint64_t>(segment_.inode()));
    arena->set_offset(offset);
    arena->set_bytes(bytes);
    return arenas;
  }

  static constexpr size_t kBytes = 4 * 4096;
  testing::SegmentCleanup cleanup_;
  std::string name_;
  ipc::SharedSegment segment_;
};

TEST_F(WorkerArenasTest, AMappedArenaIsTheDaemonsMemoryAndNothingOutsideItIsGiven) {
  WorkerArenas arenas;
  ASSERT_TRUE(arenas.Map(Describe(4096, 2 * 4096)).ok());
  char* at = arenas.At(0, 8, 16);
  ASSERT_NE(at, nullptr);
  std::memcpy(at, "written by the worker", 16);
  EXPECT_EQ(
      std::memcmp(static_cast<char*>(segment_.data()) + 4096 + 8, "written by the worker", 16), 0);
  EXPECT_EQ(arenas.At(0, 2 * 4096 - 8, 16), nullptr);  // past the arena's end
  EXPECT_EQ(arenas.At(1, 0, 1), nullptr);              // no such arena
  EXPECT_EQ(arenas.At(-1, 0, 1), nullptr);
  EXPECT_TRUE(arenas.CheckWhole(0).ok());
}

TEST_F(WorkerArenasTest, ASegmentThatIsNotTheDaemonsObjectIsRefusedNamingIt) {
  google::protobuf::RepeatedPtrField<v1::GlooWorkerArena> arenas = Describe(0, 4096);
  arenas[0].set_inode(arenas[0].inode() + 1);  // another object took the name
  WorkerArenas mapped;
  const absl::Status st = mapped.Map(arenas);
  EXPECT_EQ(CodeOf(st), v1::INTERNAL) << st;
  EXPECT_THAT(st.message(), HasSubstr(name_));
  EXPECT_THAT(st.message(), HasSubstr("another object took the name"));
  EXPECT_EQ(mapped.At(0, 0, 1), nullptr);
}

TEST_F(WorkerArenasTest, AnArenaLargerThanItsSegmentIsRefusedNamingIt) {
  WorkerArenas mapped;
  const absl::Status st = mapped.Map(Describe(4096, kBytes));
  EXPECT_EQ(CodeOf(st), v1::INTERNAL) << st;
  EXPECT_THAT(st.message(), HasSubstr(name_));
}

TEST_F(WorkerArenasTest, ASegmentCutShortUnderTheWorkerReadsZerosAndIsReportedByName) {
  WorkerArenas arenas;
  ASSERT_TRUE(arenas.Map(Describe(0, kBytes)).ok());
  ASSERT_EQ(truncate(absl::StrCat("/dev/shm/", name_).c_str(), 4096), 0);
  char* tail = arenas.At(0, 2 * 4096, 8);
  ASSERT_NE(tail, nullptr);
  volatile char read = tail[0];  // past the object's end now: SIGBUS, caught
  EXPECT_EQ(read, 0);
  const absl::Status st = arenas.CheckWhole(0);
  EXPECT_EQ(CodeOf(st), v1::INVALID_ARGUMENT) << st;
  EXPECT_THAT(st.message(), HasSubstr(name_));
  EXPECT_THAT(st.message(), HasSubstr("cut short"));
}

}  // namespace
}  // namespace gradsync

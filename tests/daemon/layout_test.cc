// Registration validation, the layout hash, and mismatch descriptions.
#include "common/layout.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

google::protobuf::RepeatedPtrField<v1::TensorSpec> Specs(
    std::initializer_list<std::tuple<std::string, int, uint64_t>> list) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> out;
  for (const auto& [name, dtype, numel] : list) {
    v1::TensorSpec* s = out.Add();
    s->set_name(name);
    s->set_dtype(static_cast<v1::DType>(dtype));
    s->set_numel(numel);
    s->set_device(-1);
  }
  return out;
}

TEST(Layout, AcceptsAValidLayout) {
  auto layout = LayoutFromProto(Specs({{"w", 0, 10}, {"b", 1, 1}}));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ((*layout)[1].bytes(), 8u);
}

TEST(Layout, RejectsBadRegistrationsNamingTheTensor) {
  EXPECT_FALSE(LayoutFromProto(Specs({})).ok());
  auto dup = LayoutFromProto(Specs({{"w", 0, 10}, {"w", 0, 10}}));
  EXPECT_NE(dup.status().message().find("'w': the name is registered twice"), std::string::npos);
  auto zero = LayoutFromProto(Specs({{"w", 0, 0}}));
  EXPECT_NE(zero.status().message().find("bad element count"), std::string::npos);
  auto dtype = LayoutFromProto(Specs({{"w", 9, 1}}));
  EXPECT_NE(dtype.status().message().find("unknown dtype 9"), std::string::npos);
  auto empty_name = LayoutFromProto(Specs({{"", 0, 1}}));
  EXPECT_FALSE(empty_name.ok());
  auto huge =
      LayoutFromProto(Specs({{"a", 1, kMaxLayoutBytes / 8}, {"b", 1, kMaxLayoutBytes / 8}}));
  EXPECT_NE(huge.status().message().find("larger than"), std::string::npos) << huge.status();
}

TEST(Layout, AcceptsCudaTensors) {
  auto specs = Specs({{"w", 0, 10}, {"b", 0, 1}});
  specs[0].set_device(0);
  specs[1].set_device(0);
  auto layout = LayoutFromProto(specs);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ((*layout)[0].device, 0);
}

TEST(Layout, RefusesMixingCpuAndCudaNamingOneOfEach) {
  auto specs = Specs({{"w", 0, 10}, {"b", 0, 1}, {"c", 0, 1}});
  specs[1].set_device(0);
  auto layout = LayoutFromProto(specs);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("tensor 0 'w' is on the CPU and tensor 1 'b' on cuda:0"),
            std::string::npos)
      << layout.status();
}

TEST(Layout, HashIsStableAndSensitive) {
  Layout a = {{"w", DType::kFloat32, 10, -1}, {"b", DType::kFloat32, 1, -1}};
  Layout b = a;
  EXPECT_EQ(LayoutHash(a), LayoutHash(b));
  b[1].numel = 2;
  EXPECT_NE(LayoutHash(a), LayoutHash(b));
  b = a;
  b[0].name = "v";
  EXPECT_NE(LayoutHash(a), LayoutHash(b));
  b = a;
  b[0].dtype = DType::kBFloat16;
  EXPECT_NE(LayoutHash(a), LayoutHash(b));
}

TEST(Layout, FirstDifferenceNamesTheTensor) {
  Layout a = {{"w", DType::kFloat32, 10, -1}, {"b", DType::kFloat32, 1, -1}};
  Layout b = a;
  EXPECT_FALSE(FirstDifference(a, b).has_value());
  b[1].numel = 3;
  EXPECT_EQ(*FirstDifference(a, b), "tensor 1: 'b' float32[1] vs 'b' float32[3]");
  b = a;
  b.push_back({"extra", DType::kFloat64, 4, -1});
  EXPECT_NE(FirstDifference(a, b)->find("'extra' float64[4]"), std::string::npos);
}

}  // namespace
}  // namespace gradsync

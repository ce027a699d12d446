// AWS Signature Version 4 against the examples AWS publishes for S3 ("Signature Calculations for
// the Authorization Header: Transferring Payload in a Single Chunk"): an independent check of the
// signing that a server which does not verify signatures (the test suite's s3rver) cannot give.
#include "storage/sigv4.h"

#include <gtest/gtest.h>

namespace pandastack::storage {
namespace {

const AwsCredentials kExample{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
const char* kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

SigV4Request get_object() {
  SigV4Request r;
  r.method = "GET";
  r.path = "/test.txt";
  r.headers = {{"host", "examplebucket.s3.amazonaws.com"},
               {"range", "bytes=0-9"},
               {"x-amz-content-sha256", kEmpty},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmpty;
  return r;
}

TEST(SigV4, TheGetObjectExample) {
  auto r = get_object();
  EXPECT_EQ(sigv4_canonical_request(r),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:" +
                std::string(kEmpty) + "\nx-amz-date:20130524T000000Z\n\n" +
                "host;range;x-amz-content-sha256;x-amz-date\n" + kEmpty);
  EXPECT_EQ(sigv4_string_to_sign(r, "20130524T000000Z", "us-east-1", "s3"),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(sigv4_authorization(r, kExample, "20130524T000000Z", "us-east-1", "s3"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4, ThePutObjectExample) {
  SigV4Request r;
  r.method = "PUT";
  r.path = "/" + aws_uri_encode("test$file.text", false);
  EXPECT_EQ(r.path, "/test%24file.text");
  const char* body_hash = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072";
  r.headers = {{"date", "Fri, 24 May 2013 00:00:00 GMT"},
               {"host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-content-sha256", body_hash},
               {"x-amz-date", "20130524T000000Z"},
               {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  r.payload_sha256 = body_hash;
  EXPECT_EQ(sigv4_signature(r, kExample, "20130524T000000Z", "us-east-1", "s3"),
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4, TheListObjectsExample) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/";
  r.query = {{"prefix", "J"}, {"max-keys", "2"}};  // (sorted when signed)
  EXPECT_EQ(canonical_query(r.query), "max-keys=2&prefix=J");
  r.headers = {{"host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-content-sha256", kEmpty},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmpty;
  EXPECT_EQ(sigv4_signature(r, kExample, "20130524T000000Z", "us-east-1", "s3"),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4, EncodingAndTime) {
  EXPECT_EQ(aws_uri_encode("a b/c~d*é", false), "a%20b/c~d%2A%C3%A9");
  EXPECT_EQ(aws_uri_encode("a/b", true), "a%2Fb");
  EXPECT_EQ(canonical_query({{"list-type", "2"}, {"continuation-token", "x/y="}}),
            "continuation-token=x%2Fy%3D&list-type=2");
  EXPECT_EQ(amz_date(std::chrono::system_clock::from_time_t(1369353600)), "20130524T000000Z");
  // Header values are trimmed, inner runs of spaces become one.
  auto r = get_object();
  r.headers["range"] = "  bytes=0-9   ";
  EXPECT_EQ(sigv4_signature(r, kExample, "20130524T000000Z", "us-east-1", "s3"),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

}  // namespace
}  // namespace pandastack::storage

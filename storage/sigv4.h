// AWS Signature Version 4 (the S3 protocol's request signing; AWS S3, Ceph RGW, MinIO and R2 all
// check it): the canonical request, the string to sign, the derived key and the Authorization
// header. Pure: the caller gives the time. Checked against AWS's published examples
// (sigv4_test.cc).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pandastack::storage {

struct AwsCredentials {
  std::string access_key_id, secret_access_key;
};

struct SigV4Request {
  std::string method;  // GET, PUT, HEAD, DELETE
  std::string path;    // as sent: each segment already URI-encoded (aws_uri_encode(.., false))
  std::vector<std::pair<std::string, std::string>> query;  // names and values, not encoded
  // Every header signed, names lower-case (host and x-amz-content-sha256 at least).
  std::map<std::string, std::string> headers;
  std::string payload_sha256;  // hex; or "UNSIGNED-PAYLOAD"
};

// RFC 3986 unreserved characters kept, everything else %XX (upper-case hex); '/' kept unless
// `encode_slash`.
std::string aws_uri_encode(const std::string& s, bool encode_slash);
// The query as sent and as signed: names then values encoded, sorted, joined with '&'.
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query);
// YYYYMMDD'T'HHMMSS'Z' (UTC).
std::string amz_date(std::chrono::system_clock::time_point t);

std::string sigv4_canonical_request(const SigV4Request& r);
std::string sigv4_string_to_sign(const SigV4Request& r, const std::string& amz_date,
                                 const std::string& region, const std::string& service);
// The signature (64 hex digits).
std::string sigv4_signature(const SigV4Request& r, const AwsCredentials& c,
                            const std::string& amz_date, const std::string& region,
                            const std::string& service);
// "AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=..."
std::string sigv4_authorization(const SigV4Request& r, const AwsCredentials& c,
                                const std::string& amz_date, const std::string& region,
                                const std::string& service);

}  // namespace pandastack::storage

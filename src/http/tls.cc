#include "http/tls.h"

#include <arpa/inet.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/status.h"

namespace gpulet::http {
namespace {

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using PKey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

std::string BioString(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n);
}

}  // namespace

bool CertificateExpiresWithin(const std::string& cert_pem, std::chrono::seconds within,
                              const Clock& clock) {
  Bio b(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  Cert cert(PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr));
  if (!cert) return true;
  time_t deadline = static_cast<time_t>(clock.UnixSeconds() + within.count());
  // X509_cmp_time: -1 when notAfter is before the deadline (or on error, 0).
  return X509_cmp_time(X509_get0_notAfter(cert.get()), &deadline) <= 0;
}

bool CertificateCovers(const std::string& cert_pem, const std::vector<std::string>& names) {
  Bio b(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  Cert cert(PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr));
  if (!cert) return false;
  for (const std::string& n : names) {
    unsigned char ip[16];
    bool is_ip = inet_pton(AF_INET, n.c_str(), ip) == 1 || inet_pton(AF_INET6, n.c_str(), ip) == 1;
    int ok = is_ip ? X509_check_ip_asc(cert.get(), n.c_str(), 0)
                   : X509_check_host(cert.get(), n.c_str(), n.size(), 0, nullptr);
    if (ok != 1) return false;
  }
  return true;
}

struct CertReloader::Pair {
  std::string cert_pem, key_pem;
  Cert cert;
  PKey key;
};

namespace {

// A new certificate for `key`, issued by `issuer` (signed with `issuer_key`; both null: self-
// signed), with the given extensions.
absl::StatusOr<Cert> Issue(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                           int valid_days,
                           const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(valid_days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (!ext) return absl::InvalidArgumentError(absl::StrCat("bad certificate extension: ", value));
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0) {
    return absl::InternalError("OpenSSL: cannot sign the certificate");
  }
  return cert;
}

std::string CertPem(X509* cert) {
  Bio b(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(b.get(), cert);
  return BioString(b.get());
}

}  // namespace

int NoPassphrase(char*, int, int, void*) { return -1; }

absl::StatusOr<PemPair> SelfIssuedCertificate(const std::vector<std::string>& names, int valid_days,
                                              const std::string& usage) {
  if (names.empty()) return absl::InvalidArgumentError("certificate needs at least one name");
  PKey ca_key(EVP_EC_gen("P-256"));
  PKey key(EVP_EC_gen("P-256"));
  if (!ca_key || !key) return absl::InternalError("OpenSSL: cannot generate an EC key");
  std::string san;
  for (const std::string& n : names) {
    unsigned char buf[16];
    bool ip = inet_pton(AF_INET, n.c_str(), buf) == 1 || inet_pton(AF_INET6, n.c_str(), buf) == 1;
    absl::StrAppend(&san, san.empty() ? "" : ",", ip ? "IP:" : "DNS:", n);
  }
  // The CA only signs this one leaf (pathlen 0) and its key is dropped right after; the leaf may
  // not sign anything (CA:FALSE), so a stolen serving key cannot mint certificates the API server
  // would trust.
  ASSIGN_OR_RETURN(Cert ca,
                   Issue(ca_key.get(), "gpulet self-issued CA", nullptr, nullptr, valid_days + 1,
                         {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                          {NID_key_usage, "critical,keyCertSign,cRLSign"},
                          {NID_subject_key_identifier, "hash"}}));
  auto leaf = Issue(key.get(), names[0], ca.get(), ca_key.get(), valid_days,
                    {{NID_subject_alt_name, san},
                     {NID_basic_constraints, "critical,CA:FALSE"},
                     {NID_key_usage, "critical,digitalSignature"},
                     {NID_ext_key_usage, usage},
                     {NID_authority_key_identifier, "keyid:always"}});
  if (!leaf.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad certificate name list: ", san));
  }
  PemPair out;
  out.cert_pem = CertPem(leaf->get());
  out.ca_pem = CertPem(ca.get());
  Bio kb(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(kb.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  out.key_pem = BioString(kb.get());
  return out;
}

absl::StatusOr<std::shared_ptr<const CertReloader::Pair>> CertReloader::Parse(
    const std::string& cert_file, const std::string& key_file) {
  auto pair = std::make_shared<Pair>();
  ASSIGN_OR_RETURN(pair->cert_pem, ReadFileToString(cert_file));
  ASSIGN_OR_RETURN(pair->key_pem, ReadFileToString(key_file));
  Bio cb(BIO_new_mem_buf(pair->cert_pem.data(), static_cast<int>(pair->cert_pem.size())));
  pair->cert.reset(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  if (!pair->cert) return absl::InvalidArgumentError(cert_file + ": no PEM certificate");
  Bio kb(BIO_new_mem_buf(pair->key_pem.data(), static_cast<int>(pair->key_pem.size())));
  pair->key.reset(PEM_read_bio_PrivateKey(kb.get(), nullptr, &NoPassphrase, nullptr));
  if (!pair->key) {
    return absl::InvalidArgumentError(
        pair->key_pem.find("ENCRYPTED") != std::string::npos
            ? key_file + ": the key is passphrase-protected; give an unencrypted key"
            : key_file + ": no PEM private key");
  }
  if (X509_check_private_key(pair->cert.get(), pair->key.get()) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat(key_file, " does not hold the private key of ", cert_file));
  return std::shared_ptr<const Pair>(std::move(pair));
}

CertReloader::CertReloader(std::string cert_file, std::string key_file,
                           std::chrono::milliseconds interval, Clock* clock)
    : cert_file_(std::move(cert_file)),
      key_file_(std::move(key_file)),
      interval_(interval),
      clock_(clock) {}
CertReloader::~CertReloader() = default;

absl::StatusOr<std::unique_ptr<CertReloader>> CertReloader::Load(
    std::string cert_file, std::string key_file, std::chrono::milliseconds check_interval,
    Clock* clock) {
  ASSIGN_OR_RETURN(auto pair, Parse(cert_file, key_file));
  std::unique_ptr<CertReloader> r(
      new CertReloader(std::move(cert_file), std::move(key_file), check_interval, clock));
  {
    absl::MutexLock lock(&r->mu_);
    r->current_ = std::move(pair);
    r->checked_ = r->clock_->Now();
  }
  return r;
}

absl::StatusOr<bool> CertReloader::ReloadIfChanged() {
  absl::MutexLock lock(&mu_);
  checked_ = clock_->Now();
  auto cert = ReadFileToString(cert_file_);
  auto key = ReadFileToString(key_file_);
  if (cert.ok() && key.ok() && *cert == current_->cert_pem && *key == current_->key_pem) {
    last_error_.clear();
    return false;
  }
  auto pair = Parse(cert_file_, key_file_);
  if (!pair.ok()) {
    last_error_ = std::string(pair.status().message());
    return pair.status();
  }
  current_ = *std::move(pair);
  ++reloads_;
  last_error_.clear();
  return true;
}

int CertReloader::OnHandshake(ssl_st* ssl, void* arg) {
  auto* self = static_cast<CertReloader*>(arg);
  std::shared_ptr<const Pair> pair;
  bool check;
  {
    absl::MutexLock lock(&self->mu_);
    check = self->clock_->Now() - self->checked_ >= self->interval_;
  }
  if (check) (void)self->ReloadIfChanged();  // a refused pair is in last_error(); keep serving
  {
    absl::MutexLock lock(&self->mu_);
    pair = self->current_;
  }
  // The connection takes its own references: a later rotation cannot free them under it.
  return SSL_use_certificate(ssl, pair->cert.get()) == 1 &&
                 SSL_use_PrivateKey(ssl, pair->key.get()) == 1
             ? 1
             : 0;
}

void CertReloader::Install(ssl_ctx_st* ctx) {
  SSL_CTX_set_cert_cb(ctx, &CertReloader::OnHandshake, this);
}

std::string CertReloader::cert_pem() const {
  absl::MutexLock lock(&mu_);
  return current_->cert_pem;
}
int CertReloader::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}
std::string CertReloader::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

}  // namespace gpulet::http

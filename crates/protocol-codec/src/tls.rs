//! TLS configuration for both ends, on rustls with the `ring` provider.
//!
//! Server side: [`server_config`] loads a PEM certificate chain and key. A server with a
//! configuration answers SSLRequest with `'S'`, otherwise `'N'`; before `'S'` it must check
//! that no plaintext bytes were pipelined after the SSLRequest
//! ([`crate::messages::ensure_nothing_pipelined`]). Starting the handshake is the caller's.
//!
//! Client side: [`client_config`] builds the configuration for a libpq `sslmode`:
//!
//! | sslmode | TLS | server certificate checked |
//! |---|---|---|
//! | disable | never | – |
//! | allow | only if plaintext is refused | as prefer |
//! | prefer (default) | tried first, plaintext if the server says `'N'` | no (yes with a root certificate) |
//! | require | always | no (yes, chain only, with a root certificate, as libpq does) |
//! | verify-ca | always | chain up to `sslrootcert`, not the host name |
//! | verify-full | always | chain and host name |
//!
//! libpq falls back to `~/.postgresql/root.crt`; here the root certificate file must be given.
//!
//! File I/O: [`server_config`] reads its certificate and key files, and [`client_config`]
//! reads `sslrootcert` when one is given (without one it touches no file). Both block on the
//! file system: an async caller runs them on its blocking pool, or before its event loop
//! starts. Everything else here is in memory.
//! Client certificates (`sslcert`/`sslkey`) are not supported yet.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the client sends SSLRequest on its first attempt (allow tries plaintext
    /// first and TLS only if the server refuses it).
    pub fn tries_tls_first(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Allow)
    }

    /// Whether a server's `'N'` ends the attempt.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("could not read {what} from \"{path}\": {source}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("no certificates found in \"{0}\"")]
    NoCertificates(PathBuf),
    #[error("sslmode {0} requires sslrootcert (a root certificate file)")]
    RootCertRequired(SslMode),
    #[error("invalid server name \"{0}\"")]
    InvalidServerName(String),
    #[error("could not build the certificate verifier: {0}")]
    Verifier(String),
    #[error("TLS configuration error: {0}")]
    Rustls(#[from] rustls::Error),
}

pub type Result<T, E = TlsError> = std::result::Result<T, E>;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = |source| TlsError::Pem {
        what: "certificates",
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificates(path.to_path_buf()));
    }
    Ok(certs)
}

/// The server's configuration from PEM files: the certificate chain (leaf first) and its
/// private key (PKCS#8, PKCS#1 or SEC1). Reads both files (blocking file I/O).
pub fn server_config(cert_pem_path: &Path, key_pem_path: &Path) -> Result<Arc<ServerConfig>> {
    let certs = load_certs(cert_pem_path)?;
    let key = PrivateKeyDer::from_pem_file(key_pem_path).map_err(|source| TlsError::Pem {
        what: "a private key",
        path: key_pem_path.to_path_buf(),
        source,
    })?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(Arc::new(config))
}

/// The client's configuration for `sslmode` (see the module docs), or `None` for
/// `disable`. `sslrootcert` is a PEM file of trusted root certificates, read here (blocking
/// file I/O); without it nothing is read.
pub fn client_config(
    sslmode: SslMode,
    sslrootcert: Option<&Path>,
) -> Result<Option<Arc<ClientConfig>>> {
    if sslmode == SslMode::Disable {
        return Ok(None);
    }
    let verifier: Arc<dyn ServerCertVerifier> = match sslrootcert {
        None if matches!(sslmode, SslMode::VerifyCa | SslMode::VerifyFull) => {
            return Err(TlsError::RootCertRequired(sslmode))
        }
        None => Arc::new(AnyServerCert {
            provider: provider(),
        }),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(path)? {
                roots.add(cert)?;
            }
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
            if sslmode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly { inner: webpki })
            }
        }
    };
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(Arc::new(config)))
}

/// The name to give rustls for `host` (a DNS name or an IP address), for SNI and for
/// verify-full's host name check.
pub fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::InvalidServerName(host.into()))
}

/// The tls-server-end-point channel binding data (RFC 5929) of a server certificate: its DER
/// hashed with the hash of its signature algorithm, SHA-256 for MD5, SHA-1 and SHA-256
/// signatures. This is what SCRAM-SHA-256-PLUS binds to; PostgreSQL computes the same on its
/// side. Certificates signed with SHA-384 or SHA-512 (RSA or ECDSA) use those hashes; any
/// other or unreadable algorithm falls back to SHA-256 (PostgreSQL refuses to bind to
/// Ed25519 and RSASSA-PSS certificates at all, so the fallback is never accepted for them).
pub fn tls_server_end_point(cert_der: &[u8]) -> Vec<u8> {
    bindable_end_point(cert_der).unwrap_or_else(|| {
        use sha2::{Digest, Sha256};
        Sha256::digest(cert_der).to_vec()
    })
}

/// The tls-server-end-point data of a certificate signed with an algorithm whose hash
/// PostgreSQL and libpq can name (RSA or ECDSA with MD5, SHA-1, SHA-256, SHA-384 or SHA-512):
/// `None` for others (Ed25519, RSASSA-PSS), where libpq could not compute the same data, so a
/// server must not offer SCRAM-SHA-256-PLUS with such a certificate.
pub fn bindable_end_point(cert_der: &[u8]) -> Option<Vec<u8>> {
    use sha2::{Digest, Sha256, Sha384, Sha512};
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    let oid = signature_algorithm_oid(cert_der)?;
    let (family, last) = oid.split_at(oid.len().checked_sub(1)?);
    match (family, last[0]) {
        // md5WithRSAEncryption (4), sha1WithRSAEncryption (5), sha256WithRSAEncryption (11):
        // RFC 5929 binds MD5 and SHA-1 signatures with SHA-256.
        (RSA, 4 | 5 | 11) => Some(Sha256::digest(cert_der).to_vec()),
        (RSA, 12) => Some(Sha384::digest(cert_der).to_vec()),
        (RSA, 13) => Some(Sha512::digest(cert_der).to_vec()),
        _ if oid == ECDSA_SHA1 => Some(Sha256::digest(cert_der).to_vec()),
        (ECDSA_SHA2, 2) => Some(Sha256::digest(cert_der).to_vec()),
        (ECDSA_SHA2, 3) => Some(Sha384::digest(cert_der).to_vec()),
        (ECDSA_SHA2, 4) => Some(Sha512::digest(cert_der).to_vec()),
        _ => None,
    }
}

/// The channel binding data of the server certificate in a PEM file (its first, the leaf),
/// for [`crate::auth::ScramServer::with_channel_binding`]: `None` when its signature algorithm
/// cannot be bound ([`bindable_end_point`]). Reads the file (blocking file I/O).
pub fn server_end_point(cert_pem_path: &Path) -> Result<Option<Vec<u8>>> {
    let certs = load_certs(cert_pem_path)?;
    Ok(certs.first().and_then(|leaf| bindable_end_point(leaf)))
}

/// The OID of a certificate's outer signatureAlgorithm:
/// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm SEQUENCE { OID, .. }, .. }`.
fn signature_algorithm_oid(cert: &[u8]) -> Option<&[u8]> {
    let (cert, _) = der_expect(cert, 0x30)?;
    let (_tbs, rest) = der_expect(cert, 0x30)?;
    let (alg, _) = der_expect(rest, 0x30)?;
    let (oid, _) = der_expect(alg, 0x06)?;
    Some(oid)
}

/// One DER element with tag `tag` at the start of `input`: its contents and what follows.
fn der_expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if *input.first()? != tag {
        return None;
    }
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return None;
        }
        let bytes = input.get(2..2 + n)?;
        (
            bytes.iter().fold(0usize, |acc, b| acc << 8 | *b as usize),
            2 + n,
        )
    };
    let contents = input.get(header..header.checked_add(len)?)?;
    Some((contents, &input[header + len..]))
}

/// verify-ca: the webpki chain check, with only a host name mismatch forgiven. webpki checks
/// the chain first and the name last, so a name error means the chain was good.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// require/prefer/allow without a root certificate: encryption without authentication, as
/// libpq does. The handshake signatures are still checked, so the peer must hold the key of
/// the certificate it shows.
#[derive(Debug)]
struct AnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use pg_testkit::{PkiFiles, TestPki};
    use rcgen::{CertificateParams, KeyPair};
    use rustls::{ClientConnection, ServerConnection};

    use super::*;

    /// A CA and a server certificate for `localhost`, and an unrelated CA, as files.
    struct Pki {
        dir: tempfile::TempDir,
        files: PkiFiles,
        other_root: PathBuf,
    }

    impl Pki {
        fn new() -> Pki {
            let dir = tempfile::tempdir().unwrap();
            let files = TestPki::new(&["localhost"]).write_to(dir.path());
            let other_root = dir.path().join("other.crt");
            std::fs::write(&other_root, TestPki::new(&["localhost"]).root_pem).unwrap();
            Pki {
                dir,
                files,
                other_root,
            }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn server(&self) -> Arc<ServerConfig> {
            server_config(&self.files.cert, &self.files.key).unwrap()
        }
    }

    /// Runs a handshake in memory, then sends a few bytes through; the error is the client's
    /// or the server's. The loop is bounded by the number of handshake flights.
    fn handshake(
        client: Arc<ClientConfig>,
        server: Arc<ServerConfig>,
        host: &str,
    ) -> Result<(), rustls::Error> {
        let mut c = ClientConnection::new(client, server_name(host).unwrap())?;
        let mut s = ServerConnection::new(server)?;
        c.writer().write_all(b"hello").unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).unwrap();
                s.process_new_packets()?;
            }
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets()?;
            }
            let mut got = [0u8; 5];
            if !c.is_handshaking() && s.reader().read_exact(&mut got).is_ok() {
                assert_eq!(&got, b"hello");
                return Ok(());
            }
        }
        panic!("handshake did not finish");
    }

    #[test]
    fn sslmodes() {
        let pki = Pki::new();
        let root = pki.files.root.clone();
        let other = pki.other_root.clone();
        let cfg = |mode, root: Option<&Path>| client_config(mode, root).unwrap().unwrap();

        assert!(client_config(SslMode::Disable, None).unwrap().is_none());
        // require without a root certificate encrypts but does not authenticate.
        handshake(
            cfg(SslMode::Require, None),
            pki.server(),
            "anything.example",
        )
        .unwrap();
        handshake(cfg(SslMode::Prefer, None), pki.server(), "localhost").unwrap();
        // verify-ca checks the chain but not the name.
        handshake(
            cfg(SslMode::VerifyCa, Some(&root)),
            pki.server(),
            "localhost",
        )
        .unwrap();
        handshake(
            cfg(SslMode::VerifyCa, Some(&root)),
            pki.server(),
            "wrong.example",
        )
        .unwrap();
        assert!(handshake(
            cfg(SslMode::VerifyCa, Some(&other)),
            pki.server(),
            "localhost"
        )
        .is_err());
        // require with a root certificate behaves like verify-ca, as in libpq.
        assert!(handshake(
            cfg(SslMode::Require, Some(&other)),
            pki.server(),
            "localhost"
        )
        .is_err());
        // verify-full checks both.
        handshake(
            cfg(SslMode::VerifyFull, Some(&root)),
            pki.server(),
            "localhost",
        )
        .unwrap();
        let wrong_host = handshake(
            cfg(SslMode::VerifyFull, Some(&root)),
            pki.server(),
            "wrong.example",
        );
        assert!(
            matches!(
                wrong_host,
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                ))
            ),
            "{wrong_host:?}"
        );
        assert!(handshake(
            cfg(SslMode::VerifyFull, Some(&other)),
            pki.server(),
            "localhost"
        )
        .is_err());
        // verify-* without a root certificate is a configuration error.
        assert!(matches!(
            client_config(SslMode::VerifyFull, None),
            Err(TlsError::RootCertRequired(SslMode::VerifyFull))
        ));
    }

    #[test]
    fn server_end_point_hash_follows_the_signature_algorithm() {
        use rcgen::{PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384};
        use sha2::Digest;
        let cert = |alg| {
            let key = KeyPair::generate_for(alg).unwrap();
            CertificateParams::new(vec!["localhost".to_string()])
                .unwrap()
                .self_signed(&key)
                .unwrap()
                .der()
                .to_vec()
        };
        let p256 = cert(&PKCS_ECDSA_P256_SHA256);
        assert_eq!(
            tls_server_end_point(&p256),
            sha2::Sha256::digest(&p256).to_vec()
        );
        let p384 = cert(&PKCS_ECDSA_P384_SHA384);
        assert_eq!(
            tls_server_end_point(&p384),
            sha2::Sha384::digest(&p384).to_vec()
        );
        // Garbage is hashed with SHA-256 rather than refused.
        assert_eq!(
            tls_server_end_point(b"\x30\x84"),
            sha2::Sha256::digest(b"\x30\x84").to_vec()
        );
        assert_eq!(signature_algorithm_oid(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        // A server binds only what libpq can compute too: not Ed25519, not garbage.
        assert_eq!(bindable_end_point(&p384), Some(tls_server_end_point(&p384)));
        assert_eq!(bindable_end_point(&cert(&rcgen::PKCS_ED25519)), None);
        assert_eq!(bindable_end_point(b"\x30\x84"), None);
    }

    #[test]
    fn bad_files() {
        let pki = Pki::new();
        assert!(server_config(&pki.path("missing.crt"), &pki.path("server.key")).is_err());
        assert!(matches!(
            server_config(&pki.path("server.key"), &pki.path("server.key")),
            Err(TlsError::NoCertificates(_))
        ));
        assert!(server_config(&pki.path("server.crt"), &pki.path("server.crt")).is_err());
        assert!(client_config(SslMode::VerifyCa, Some(&pki.path("nope.crt"))).is_err());
        assert!(SslMode::Require.requires_tls() && !SslMode::Prefer.requires_tls());
        assert!(SslMode::Prefer.tries_tls_first() && !SslMode::Allow.tries_tls_first());
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("bad name!").is_err());
    }
}

//! [`Security`]: how the client checks etcd and proves who it is, TLS and a user's password,
//! in the words of etcd's own flags (`--cacert`, `--cert`, `--key`, `--user`).
//!
//! TLS is rustls on the `ring` provider, through awc's rustls connector. The trust anchors are
//! the CA file's certificates alone: the client trusts no system store, since etcd's
//! certificates are nearly always signed by a cluster's own CA, and trusting every public CA
//! too would let any certificate for the same name in. The name checked is the endpoint's host
//! (a DNS name or an IP address), as etcd's own clients check it.
//!
//! A failed handshake is told by what went wrong, because the fix differs: etcd's certificate
//! not signed by the CA given, a certificate for another name, or etcd refusing ours (none
//! sent where it requires one, or one it does not trust). With TLS 1.3 the client finishes its
//! side of the handshake before the server has checked the client's certificate, so etcd's
//! refusal arrives as an alert after the request went out; it is told the same way
//! ([`Error::Tls`]), and the request was not applied, since etcd never read it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// TLS files and credentials for etcd. The default is plain HTTP without authentication.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// PEM file of the CA certificates that sign etcd's server certificates. Needed for
    /// `https://` endpoints; with it a `host:port` endpoint is spoken to over TLS.
    pub cacert: Option<PathBuf>,
    /// PEM file of this client's certificate chain, for etcd's `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    /// PEM file of the private key of `cert`.
    pub key: Option<PathBuf>,
    /// The etcd user to authenticate as (etcd's `auth enable`); needs `password`.
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl Security {
    /// Whether a `host:port` endpoint (no scheme) is spoken to over TLS.
    pub fn uses_tls(&self) -> bool {
        self.cacert.is_some()
    }

    /// The user name and password, both or neither.
    pub(crate) fn credentials(&self) -> Result<Option<(String, String)>> {
        match (&self.username, &self.password) {
            (None, None) => Ok(None),
            (Some(user), Some(password)) => Ok(Some((user.clone(), password.clone()))),
            (Some(_), None) => Err(setup("a user name without a password")),
            (None, Some(_)) => Err(setup("a password without a user name")),
        }
    }

    /// The rustls configuration, `None` without a CA file. Reads the PEM files (blocking file
    /// I/O of a few kilobytes, done once when a client is made).
    pub(crate) fn client_config(&self) -> Result<Option<Arc<ClientConfig>>> {
        let Some(cacert) = &self.cacert else {
            if self.cert.is_some() || self.key.is_some() {
                return Err(setup(
                    "a client certificate without a CA file: give the CA that signs etcd's certificate too",
                ));
            }
            return Ok(None);
        };
        let mut roots = RootCertStore::empty();
        for cert in load_certs(cacert)? {
            roots
                .add(cert)
                .map_err(|e| setup(format!("{}: {e}", cacert.display())))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = load_certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    setup(format!(
                        "cannot read a private key from {}: {e}",
                        key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| setup(format!("{}: {e}", cert.display())))?
            }
            (Some(_), None) => return Err(setup("a client certificate without its key")),
            (None, Some(_)) => return Err(setup("a client key without its certificate")),
        };
        // HTTP/1.1 only: the gateway's streams are read as chunked HTTP/1.1 bodies, and etcd
        // sends HTTP/2 over TLS to its gRPC server.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(config)))
    }
}

fn setup(reason: impl Into<String>) -> Error {
    Error::TlsSetup(reason.into())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let read = |e: rustls_pki_types::pem::Error| {
        setup(format!(
            "cannot read certificates from {}: {e}",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(setup(format!("no certificate in {}", path.display())));
    }
    Ok(certs)
}

/// The TLS error inside an error, if there is one (tokio-rustls wraps it in an `io::Error`,
/// which awc may wrap again).
pub(crate) fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut inner = Some(e);
    while let Some(error) = inner {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        inner = match error.downcast_ref::<io::Error>() {
            Some(io) => io.get_ref().map(|i| i as _),
            None => error.source(),
        };
    }
    None
}

/// What a TLS failure means for whoever configured the client, which connected to `host`
/// with or without a client certificate.
pub(crate) fn describe(e: &rustls::Error, host: &str, client_cert: bool) -> String {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "etcd's certificate is not signed by the CA given (unknown issuer)".into()
        }
        // A CA of the same name as the one that signed it.
        E::InvalidCertificate(CertificateError::BadSignature) => {
            "etcd's certificate is not signed by the CA given (bad signature)".into()
        }
        E::AlertReceived(
            AlertDescription::CertificateRequired | AlertDescription::BadCertificate,
        ) if !client_cert => "etcd requires a client certificate, and none was given".into(),
        E::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!("etcd's certificate is for another name, not for {host}"),
        E::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "etcd's certificate has expired".into(),
        E::InvalidCertificate(other) => format!("etcd's certificate was refused: {other:?}"),
        E::AlertReceived(
            alert @ (AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::AccessDenied),
        ) => format!("etcd refused this client's certificate (TLS alert {alert:?})"),
        other => format!("TLS failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_not_shown() {
        let s = Security {
            username: Some("walserver".into()),
            password: Some("s3cret".into()),
            ..Security::default()
        };
        let shown = format!("{s:?}");
        assert!(
            shown.contains("walserver") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn half_settings_are_refused() {
        let only_user = Security {
            username: Some("u".into()),
            ..Security::default()
        };
        assert!(only_user.credentials().is_err());
        let cert_without_ca = Security {
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
            ..Security::default()
        };
        let e = cert_without_ca.client_config().unwrap_err().to_string();
        assert!(e.contains("without a CA"), "{e}");
        let missing = Security {
            cacert: Some("/nonexistent/ca.pem".into()),
            ..Security::default()
        };
        let e = missing.client_config().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn a_tls_error_is_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let wrapped = io::Error::other(io::Error::new(io::ErrorKind::InvalidData, tls));
        let found = tls_error(&wrapped).expect("found");
        assert!(describe(found, "h", true).contains("not signed by the CA"));
        let alert = rustls::Error::AlertReceived(AlertDescription::BadCertificate);
        assert!(describe(&alert, "h", false).contains("none was given"));
        assert!(describe(&alert, "h", true).contains("refused this client's certificate"));
        assert!(tls_error(&io::Error::other("plain")).is_none());
        assert!(tls_error(&io::Error::from(io::ErrorKind::ConnectionRefused)).is_none());
    }
}

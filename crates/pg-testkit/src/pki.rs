//! Throwaway certificates for TLS tests: a CA and a server certificate it signed, made with
//! rcgen (ECDSA P-256), as PEM in memory and, on request, as files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

/// A test CA and a server certificate for the given names, signed by it.
pub struct TestPki {
    /// The CA certificate, for `sslrootcert`.
    pub root_pem: String,
    /// The server certificate (leaf only).
    pub cert_pem: String,
    /// The server certificate's private key (PKCS#8).
    pub key_pem: String,
}

impl TestPki {
    /// A new CA and a server certificate valid for `names` (DNS names or IP addresses).
    pub fn new(names: &[&str]) -> TestPki {
        let ca_key = KeyPair::generate().expect("generate a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "walserver test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("self-sign the CA");
        let key = KeyPair::generate().expect("generate a server key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut leaf =
            CertificateParams::new(names.clone()).expect("server certificate parameters");
        // An IP address also as a DNS name: pgBackRest 2.45 compares the host it connects to,
        // as text, with the DNS names only.
        for name in names
            .iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        {
            let dns = rcgen::Ia5String::try_from(name.as_str()).expect("an ASCII name");
            leaf.subject_alt_names.push(SanType::DnsName(dns));
        }
        let leaf = leaf
            .signed_by(&key, &ca_cert, &ca_key)
            .expect("sign the server certificate");
        TestPki {
            root_pem: ca_cert.pem(),
            cert_pem: leaf.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes `root.crt`, `server.crt` and `server.key` into `dir`.
    pub fn write_to(&self, dir: &Path) -> PkiFiles {
        let files = PkiFiles {
            root: dir.join("root.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        };
        for (path, pem) in [
            (&files.root, &self.root_pem),
            (&files.cert, &self.cert_pem),
            (&files.key, &self.key_pem),
        ] {
            std::fs::write(path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
        files
    }
}

/// Where [`TestPki::write_to`] put the files.
#[derive(Debug)]
pub struct PkiFiles {
    pub root: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

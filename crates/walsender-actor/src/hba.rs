//! Host-based access rules, in the spirit of PostgreSQL's `pg_hba.conf`.
//!
//! A rule names a client address (a single address or a CIDR block, or `all`), a user (or
//! `all`), whether TLS is required or refused, and a method. The first rule that matches the
//! connection decides; a connection that matches no rule is refused, as PostgreSQL does. With
//! no rules configured at all, loopback clients are trusted and everyone else is refused, which
//! is what a freshly initialised PostgreSQL cluster allows.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::Deserialize;

/// How a matching client must prove who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMethod {
    /// Accept without a password.
    Trust,
    /// SCRAM-SHA-256 against the user's stored verifier.
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// MD5 challenge; PostgreSQL also answers it with SCRAM when the stored secret is a SCRAM
    /// verifier, and so do we.
    Md5,
    /// Cleartext password, checked against the stored verifier. Only sensible over TLS.
    Password,
    /// Refuse the connection.
    Reject,
}

/// Which transport a rule applies to: PostgreSQL's `host`, `hostssl` and `hostnossl`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionType {
    #[default]
    Host,
    Hostssl,
    Hostnossl,
}

/// One rule as written in the configuration file (a `*Settings` type: what the operator said;
/// [`HbaRules`] is what the walsenders check). An unknown key is an error: a misspelt `type`
/// would otherwise make a `hostssl` rule a plain `host` one.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HbaRuleSettings {
    #[serde(default, rename = "type")]
    pub conn_type: ConnectionType,
    /// `all`, an address (`127.0.0.1`, `::1`) or a CIDR block (`10.0.0.0/8`).
    pub address: String,
    /// `all` or a user name.
    pub user: String,
    pub method: AuthMethod,
}

/// The name [`HbaRuleSettings`] had before the workspace named what an operator says
/// `*Settings`; kept so that embedding code building [`HbaRules`] goes on compiling.
#[deprecated(note = "renamed HbaRuleSettings")]
pub type HbaRuleConfig = HbaRuleSettings;

/// An address pattern, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressPattern {
    All,
    Cidr { network: IpAddr, prefix_len: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HbaError {
    #[error("invalid address {0:?} in an access rule: expected \"all\", an IP address or a CIDR block like 10.0.0.0/8")]
    BadAddress(String),
}

impl FromStr for AddressPattern {
    type Err = HbaError;

    fn from_str(s: &str) -> Result<Self, HbaError> {
        let bad = || HbaError::BadAddress(s.to_string());
        if s.eq_ignore_ascii_case("all") {
            return Ok(AddressPattern::All);
        }
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let network: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix_len = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|&n| n <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(AddressPattern::Cidr {
            network,
            prefix_len,
        })
    }
}

impl AddressPattern {
    pub fn matches(&self, ip: IpAddr) -> bool {
        let (network, prefix_len) = match self {
            AddressPattern::All => return true,
            AddressPattern::Cidr {
                network,
                prefix_len,
            } => (*network, *prefix_len),
        };
        // An IPv4 client that arrives on an IPv6 socket shows as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), prefix_len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), prefix_len),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix_len: u8) -> bool {
    let full = usize::from(prefix_len / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rest = prefix_len % 8;
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    a[full] & mask == b[full] & mask
}

/// A parsed rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HbaRule {
    pub conn_type: ConnectionType,
    pub address: AddressPattern,
    pub user: String,
    pub method: AuthMethod,
}

/// A rule as an operator would write it on one line, in `pg_hba.conf`'s order (without its
/// database column): `host all 10.0.0.0/8 reject`.
impl fmt::Display for HbaRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {}",
            self.conn_type, self.user, self.address, self.method
        )
    }
}

impl fmt::Display for ConnectionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConnectionType::Host => "host",
            ConnectionType::Hostssl => "hostssl",
            ConnectionType::Hostnossl => "hostnossl",
        })
    }
}

/// The configuration's spelling: `scram-sha-256`, `md5`, ...
impl fmt::Display for AuthMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthMethod::Trust => "trust",
            AuthMethod::ScramSha256 => "scram-sha-256",
            AuthMethod::Md5 => "md5",
            AuthMethod::Password => "password",
            AuthMethod::Reject => "reject",
        })
    }
}

/// `all` or a CIDR block such as `10.0.0.0/8`.
impl fmt::Display for AddressPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressPattern::All => f.write_str("all"),
            AddressPattern::Cidr {
                network,
                prefix_len,
            } => write!(f, "{network}/{prefix_len}"),
        }
    }
}

/// The ordered rule list. `HbaRules::default()` is the built-in loopback-only policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HbaRules {
    rules: Vec<HbaRule>,
    /// The built-in policy, not rules from the configuration: the log says so.
    builtin: bool,
}

impl Default for HbaRules {
    fn default() -> Self {
        let loopback = |cidr: &str| HbaRule {
            conn_type: ConnectionType::Host,
            address: cidr.parse().expect("built-in loopback CIDR parses"),
            user: "all".to_string(),
            method: AuthMethod::Trust,
        };
        HbaRules {
            rules: vec![loopback("127.0.0.0/8"), loopback("::1/128")],
            builtin: true,
        }
    }
}

/// What the rules decided for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HbaDecision {
    Allow(AuthMethod),
    /// A `reject` rule matched: the `rule`th (from 1, as an operator counts them).
    Rejected {
        rule: usize,
    },
    /// No rule matched.
    NoEntry,
}

impl HbaRules {
    /// [`HbaRules::from_settings`], under the name it had before.
    #[deprecated(note = "renamed HbaRules::from_settings")]
    pub fn from_config(rules: &[HbaRuleSettings]) -> Result<HbaRules, HbaError> {
        HbaRules::from_settings(rules)
    }

    /// Builds the rule list from the configuration file's rules; an empty list means the
    /// built-in default.
    pub fn from_settings(rules: &[HbaRuleSettings]) -> Result<HbaRules, HbaError> {
        if rules.is_empty() {
            return Ok(HbaRules::default());
        }
        let rules = rules
            .iter()
            .map(|r| {
                Ok(HbaRule {
                    conn_type: r.conn_type,
                    address: r.address.parse()?,
                    user: r.user.clone(),
                    method: r.method,
                })
            })
            .collect::<Result<_, HbaError>>()?;
        Ok(HbaRules {
            rules,
            builtin: false,
        })
    }

    /// The `number`th rule (from 1), for the log.
    pub fn rule(&self, number: usize) -> Option<&HbaRule> {
        number.checked_sub(1).and_then(|i| self.rules.get(i))
    }

    /// Whether these are the built-in loopback-only rules (no `[[hba]]` was configured).
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    /// The first rule that matches decides.
    pub fn check(&self, addr: IpAddr, user: &str, tls: bool) -> HbaDecision {
        let hit = self.rules.iter().enumerate().find(|(_, r)| {
            let type_ok = match r.conn_type {
                ConnectionType::Host => true,
                ConnectionType::Hostssl => tls,
                ConnectionType::Hostnossl => !tls,
            };
            type_ok && (r.user == "all" || r.user == user) && r.address.matches(addr)
        });
        match hit {
            Some((i, r)) if r.method == AuthMethod::Reject => HbaDecision::Rejected { rule: i + 1 },
            Some((_, r)) => HbaDecision::Allow(r.method),
            None => HbaDecision::NoEntry,
        }
    }
}

/// The words PostgreSQL uses for a connection's encryption in its hba messages.
pub struct EncryptionWords(pub bool);

impl fmt::Display for EncryptionWords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 {
            "SSL encryption"
        } else {
            "no encryption"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(specs: &[(&str, &str, AuthMethod)]) -> HbaRules {
        let cfg: Vec<_> = specs
            .iter()
            .map(|(a, u, m)| HbaRuleSettings {
                conn_type: ConnectionType::Host,
                address: a.to_string(),
                user: u.to_string(),
                method: *m,
            })
            .collect();
        HbaRules::from_settings(&cfg).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn default_trusts_loopback_only() {
        let r = HbaRules::default();
        assert_eq!(
            r.check(ip("127.0.0.1"), "x", false),
            HbaDecision::Allow(AuthMethod::Trust)
        );
        assert_eq!(
            r.check(ip("127.8.0.1"), "x", false),
            HbaDecision::Allow(AuthMethod::Trust)
        );
        assert_eq!(
            r.check(ip("::1"), "x", false),
            HbaDecision::Allow(AuthMethod::Trust)
        );
        assert_eq!(
            r.check(ip("::ffff:127.0.0.1"), "x", false),
            HbaDecision::Allow(AuthMethod::Trust)
        );
        assert_eq!(r.check(ip("10.0.0.1"), "x", false), HbaDecision::NoEntry);
        assert_eq!(r.check(ip("::2"), "x", false), HbaDecision::NoEntry);
    }

    #[test]
    fn first_match_wins() {
        let r = rules(&[
            ("10.0.0.0/8", "bad", AuthMethod::Reject),
            ("10.0.0.0/8", "all", AuthMethod::ScramSha256),
            ("all", "all", AuthMethod::Md5),
        ]);
        assert_eq!(
            r.check(ip("10.1.2.3"), "bad", false),
            HbaDecision::Rejected { rule: 1 }
        );
        assert_eq!(
            r.check(ip("10.1.2.3"), "good", false),
            HbaDecision::Allow(AuthMethod::ScramSha256)
        );
        assert_eq!(
            r.check(ip("11.0.0.1"), "bad", false),
            HbaDecision::Allow(AuthMethod::Md5)
        );
    }

    #[test]
    fn cidr_edges() {
        let p: AddressPattern = "192.168.1.128/25".parse().unwrap();
        assert!(p.matches(ip("192.168.1.128")));
        assert!(p.matches(ip("192.168.1.255")));
        assert!(!p.matches(ip("192.168.1.127")));
        let p: AddressPattern = "0.0.0.0/0".parse().unwrap();
        assert!(p.matches(ip("8.8.8.8")));
        assert!(
            !p.matches(ip("::1")),
            "an IPv4 block never matches a real IPv6 client"
        );
        let p: AddressPattern = "fe80::/10".parse().unwrap();
        assert!(p.matches(ip("fe80::1")));
        assert!(p.matches(ip("febf::1")));
        assert!(!p.matches(ip("fec0::1")));
    }

    #[test]
    fn bad_addresses_are_errors() {
        for bad in [
            "",
            "localhost",
            "10.0.0.0/33",
            "::/129",
            "1.2.3.4/x",
            "1.2.3/8",
        ] {
            assert!(bad.parse::<AddressPattern>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn ssl_types() {
        let cfg = vec![
            HbaRuleSettings {
                conn_type: ConnectionType::Hostssl,
                address: "all".into(),
                user: "all".into(),
                method: AuthMethod::ScramSha256,
            },
            HbaRuleSettings {
                conn_type: ConnectionType::Hostnossl,
                address: "all".into(),
                user: "all".into(),
                method: AuthMethod::Reject,
            },
        ];
        let r = HbaRules::from_settings(&cfg).unwrap();
        assert_eq!(
            r.check(ip("10.0.0.1"), "u", true),
            HbaDecision::Allow(AuthMethod::ScramSha256)
        );
        assert_eq!(
            r.check(ip("10.0.0.1"), "u", false),
            HbaDecision::Rejected { rule: 2 }
        );
    }

    #[test]
    fn rules_read_as_an_operator_writes_them() {
        let r = rules(&[
            ("10.0.0.0/8", "bad", AuthMethod::Reject),
            ("all", "all", AuthMethod::ScramSha256),
        ]);
        assert!(!r.is_builtin());
        assert_eq!(r.rule(1).unwrap().to_string(), "host bad 10.0.0.0/8 reject");
        assert_eq!(r.rule(2).unwrap().to_string(), "host all all scram-sha-256");
        assert!(r.rule(0).is_none() && r.rule(3).is_none());
        let d = HbaRules::default();
        assert!(d.is_builtin());
        assert_eq!(d.rule(1).unwrap().to_string(), "host all 127.0.0.0/8 trust");
    }

    /// Embedding code written against the names before the `*Settings` rule still builds
    /// the rules it meant.
    #[test]
    #[allow(deprecated)]
    fn the_old_names_still_build_the_rules() {
        let old = [HbaRuleConfig {
            conn_type: ConnectionType::Host,
            address: "10.0.0.0/8".into(),
            user: "all".into(),
            method: AuthMethod::ScramSha256,
        }];
        let r = HbaRules::from_config(&old).unwrap();
        assert_eq!(
            r.rule(1).unwrap().to_string(),
            "host all 10.0.0.0/8 scram-sha-256"
        );
        assert!(r.rule(2).is_none());
    }

    #[test]
    fn a_rule_with_an_unknown_key_is_refused() {
        use serde::de::value::{Error, MapDeserializer};
        let parse = |pairs: &[(&'static str, &'static str)]| {
            HbaRuleSettings::deserialize(MapDeserializer::<_, Error>::new(pairs.iter().copied()))
        };
        let rule = [("address", "all"), ("user", "all"), ("method", "trust")];
        let ok = parse(&[&rule[..], &[("type", "hostssl")]].concat()).unwrap();
        assert_eq!(ok.conn_type, ConnectionType::Hostssl);
        // A misspelt `type` must not quietly leave the rule a plain `host` one.
        let e = parse(&[&rule[..], &[("typ", "hostssl")]].concat()).unwrap_err();
        assert!(e.to_string().contains("unknown field `typ`"), "{e}");
    }
}

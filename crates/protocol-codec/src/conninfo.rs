//! libpq connection strings, as `primary_conninfo` and the walreceiver take them.
//!
//! Two forms, as libpq accepts them:
//! ```text
//! host=127.0.0.1 port=5433 user=repl password='a b\'c' sslmode=verify-full
//! postgresql://repl:secret@[::1]:5433/dbname?sslmode=require&application_name=s1
//! ```
//! In the key=value form values may be single-quoted; a backslash escapes the next character
//! inside or outside quotes; spaces around `=` are allowed. The URI form (`postgresql://` or
//! `postgres://`) percent-decodes every part. A later setting of a key wins.
//!
//! Keys walserver uses become typed fields. The other keys libpq knows (`gssencmode`,
//! `target_session_attrs`, ...) are kept in [`ConnInfo::other`] rather than refused, because
//! a `primary_conninfo` copied from a PostgreSQL standby often carries some; the caller should
//! warn that they are ignored ([`ConnInfo::ignored_options`]). A key libpq does not know is an
//! error, as it is in libpq.
//!
//! A host list (`host=a,b port=5432,5433`, or `postgresql://a:5432,b:5433/`) names upstreams
//! to try in order, as libpq tries them ([`ConnInfo::targets`]): one port for all hosts or one
//! per host, an empty entry meaning the default; `hostaddr` gives numeric addresses to connect
//! to instead of looking the hosts up; `target_session_attrs` says which server to settle on
//! ([`TargetSessionAttrs`]).

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use crate::auth::ChannelBinding;
use crate::client_settings::TcpKeepalives;
use crate::tls::SslMode;

/// PostgreSQL's default port.
pub const DEFAULT_PORT: u16 = 5432;

/// A parsed connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// Host names or IP addresses, comma-separated, as given; `None` means libpq's default,
    /// which for walserver (no Unix sockets) is `localhost`. See [`ConnInfo::targets`].
    pub host: Option<String>,
    /// Numeric addresses to connect to instead of looking the hosts up, comma-separated, one
    /// per host (an empty entry looks its host up); with no `host`, they are the hosts.
    pub hostaddr: Option<String>,
    /// Ports: none (5432 for every host), one for every host, or one per host; 5432 where an
    /// entry was empty.
    pub port: Vec<u16>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub dbname: Option<String>,
    pub application_name: Option<String>,
    pub sslmode: SslMode,
    pub sslrootcert: Option<PathBuf>,
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    /// Whether SCRAM binds to the server's certificate: `disable`, `prefer` (the default) or
    /// `require`.
    pub channel_binding: ChannelBinding,
    /// Seconds; libpq treats 0 (or absent) as "wait forever" and 1 as 2.
    pub connect_timeout: Option<u32>,
    /// Command-line options for the server (`-c name=value ...`).
    pub options: Option<String>,
    /// Which of the hosts to settle on.
    pub target_session_attrs: TargetSessionAttrs,
    /// TCP keepalives on the connection.
    pub keepalives: Keepalives,
    /// The password file to read when no password is given; `None` means libpq's default
    /// (`PGPASSFILE`, else `~/.pgpass`). See [`crate::passfile`].
    pub passfile: Option<PathBuf>,
    /// Other keys libpq knows but walserver does not use, in the order given.
    pub other: Vec<(String, String)>,
}

impl Default for ConnInfo {
    fn default() -> ConnInfo {
        ConnInfo {
            host: None,
            hostaddr: None,
            port: Vec::new(),
            user: None,
            password: None,
            dbname: None,
            application_name: None,
            sslmode: SslMode::Prefer,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            channel_binding: ChannelBinding::Prefer,
            connect_timeout: None,
            options: None,
            target_session_attrs: TargetSessionAttrs::Any,
            keepalives: Keepalives::default(),
            passfile: None,
            other: Vec::new(),
        }
    }
}

/// libpq's TCP keepalive settings: on unless `keepalives=0`, the system's timing unless
/// `keepalives_idle`, `keepalives_interval` (seconds) or `keepalives_count` say otherwise, and
/// `tcp_user_timeout` (milliseconds; how long sent data may go unacknowledged before the
/// connection is dropped), which applies with keepalives on, as in libpq. The timing is the
/// same four a server's `tcp_keepalives_*` and `tcp_user_timeout` set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalives {
    pub on: bool,
    pub timing: TcpKeepalives,
}

impl Default for Keepalives {
    fn default() -> Keepalives {
        Keepalives {
            on: true,
            timing: TcpKeepalives::default(),
        }
    }
}

/// One upstream of a connection string: a host and its port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The host's name: what TLS verifies and the password file matches (the `hostaddr`
    /// entry when no `host` entry names it, `localhost` when neither is given).
    pub host: String,
    pub port: u16,
    /// The address to connect to (`hostaddr`), instead of looking `host` up.
    pub addr: Option<IpAddr>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            Some(a) if a.to_string() != self.host => {
                write!(f, "{} ({a}):{}", self.host, self.port)
            }
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// libpq's `target_session_attrs`: which server of a host list a connection settles on. The
/// hosts are tried in order and the first that suits is kept; `prefer-standby` takes the
/// first standby, else the first server that answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    /// The first server that accepts the connection (the default).
    #[default]
    Any,
    /// A server that accepts writes: not in hot standby, `default_transaction_read_only` off.
    ReadWrite,
    /// A server in hot standby or read-only by default.
    ReadOnly,
    /// A server not in hot standby.
    Primary,
    /// A server in hot standby.
    Standby,
    /// A standby if any host is one, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// Every value, so that the names are spelled once ([`TargetSessionAttrs::as_str`]).
    const ALL: [TargetSessionAttrs; 6] = [
        TargetSessionAttrs::Any,
        TargetSessionAttrs::ReadWrite,
        TargetSessionAttrs::ReadOnly,
        TargetSessionAttrs::Primary,
        TargetSessionAttrs::Standby,
        TargetSessionAttrs::PreferStandby,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a server that reported `in_hot_standby` and `default_transaction_read_only`
    /// (ParameterStatus; absent counts as `off`) suits; if not, libpq's words for why. With
    /// `prefer-standby`, `standby_pass` is the first pass over the hosts, which takes only
    /// standbys.
    pub fn check(
        &self,
        in_hot_standby: Option<&str>,
        default_read_only: Option<&str>,
        standby_pass: bool,
    ) -> Result<(), &'static str> {
        let on = |v: Option<&str>| v == Some("on");
        let standby = on(in_hot_standby);
        let read_only = standby || on(default_read_only);
        match self {
            TargetSessionAttrs::Any => Ok(()),
            TargetSessionAttrs::ReadWrite if read_only => Err("session is read-only"),
            TargetSessionAttrs::ReadOnly if !read_only => Err("session is not read-only"),
            TargetSessionAttrs::Primary if standby => Err("server is in hot standby mode"),
            TargetSessionAttrs::Standby if !standby => Err("server is not in hot standby mode"),
            TargetSessionAttrs::PreferStandby if standby_pass && !standby => {
                Err("server is not in hot standby mode")
            }
            _ => Ok(()),
        }
    }
}

impl FromStr for TargetSessionAttrs {
    type Err = ConnInfoError;

    fn from_str(s: &str) -> Result<Self, ConnInfoError> {
        TargetSessionAttrs::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| ConnInfoError::InvalidTargetSessionAttrs(s.to_string()))
    }
}

/// Why a connection string is not valid. Each message names the bad part, in libpq's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    #[error("invalid connection option \"{0}\"")]
    InvalidOption(String),
    /// A default from the environment that does not read: the variable, and why.
    #[error("{1} (from the environment variable {0})")]
    Environment(String, Box<ConnInfoError>),
    #[error("missing \"=\" after \"{0}\" in connection info string")]
    MissingEquals(String),
    #[error("unterminated quoted string in connection info string")]
    UnterminatedQuote,
    #[error("invalid port number: \"{0}\"")]
    InvalidPort(String),
    #[error("invalid integer value \"{value}\" for connection option \"{key}\"")]
    InvalidInteger { key: String, value: String },
    #[error("invalid sslmode value: \"{0}\"")]
    InvalidSslMode(String),
    #[error("invalid channel_binding value: \"{0}\"")]
    InvalidChannelBinding(String),
    #[error("could not match {hosts} host names to {addrs} hostaddr values")]
    HostsDoNotMatchHostaddrs { hosts: usize, addrs: usize },
    #[error("could not parse network address \"{0}\": not a numeric IP address")]
    InvalidHostAddr(String),
    #[error("could not match {ports} port numbers to {hosts} hosts")]
    PortsDoNotMatchHosts { ports: usize, hosts: usize },
    #[error("invalid target_session_attrs value: \"{0}\"")]
    InvalidTargetSessionAttrs(String),
    #[error("invalid URI query parameter: \"{0}\"")]
    InvalidUriParameter(String),
    #[error("missing key/value separator \"=\" in URI query parameter: \"{0}\"")]
    MissingUriSeparator(String),
    #[error("invalid percent-encoded token: \"{0}\"")]
    InvalidPercentEncoding(String),
    #[error("end of string reached when looking for matching \"]\" in IPv6 host address in URI: \"{0}\"")]
    UnterminatedIpv6(String),
    #[error("unexpected character \"{ch}\" at position {position} in URI (expected \":\" or \"/\"): \"{uri}\"")]
    UnexpectedUriCharacter {
        ch: char,
        position: usize,
        uri: String,
    },
}

/// libpq's keywords that walserver keeps without using (PostgreSQL 15 to 17).
/// The options walserver uses that libpq defaults from the environment, with their variables
/// (libpq's `PQconninfoOptions`). `dbname` (`PGDATABASE`) is left out: a physical replication
/// connection's database is `replication` whatever the environment says.
pub const ENV_DEFAULTS: [(&str, &str); 15] = [
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("application_name", "PGAPPNAME"),
    ("options", "PGOPTIONS"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("channel_binding", "PGCHANNELBINDING"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
];

const OTHER_LIBPQ_KEYS: &[&str] = &[
    "service",
    "client_encoding",
    "fallback_application_name",
    "replication",
    "gssencmode",
    "sslcompression",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "require_auth",
    "sslcertmode",
    "load_balance_hosts",
    "sslnegotiation",
];

impl ConnInfo {
    /// Parses either form.
    pub fn parse(s: &str) -> Result<ConnInfo, ConnInfoError> {
        ConnInfo::parse_with_env(s, |_| None)
    }

    /// [`ConnInfo::parse`] with libpq's defaults from the environment: each option the string
    /// leaves out takes the value of its variable in `env` ([`ENV_DEFAULTS`]: `PGHOST`,
    /// `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGSSLMODE`, ...), read as the string's values are; an
    /// option the string gives, even empty, is the string's. `env` is `std::env::var` for a
    /// server; this crate reads no environment itself.
    pub fn parse_with_env(
        s: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ConnInfo, ConnInfoError> {
        let mut info = ConnInfo::default();
        for (key, var) in ENV_DEFAULTS {
            if let Some(value) = env(var) {
                info.set(key, value)
                    .map_err(|e| ConnInfoError::Environment(var.to_string(), Box::new(e)))?;
            }
        }
        if let Some(rest) = s
            .strip_prefix("postgresql://")
            .or_else(|| s.strip_prefix("postgres://"))
        {
            info.parse_uri(s, rest)?;
        } else {
            for (k, v) in parse_key_values(s)? {
                info.set(&k, v)?;
            }
        }
        info.targets()?;
        Ok(info)
    }

    /// The upstreams to try, in order: each host with its port, `localhost` for a host left
    /// empty and 5432 for a port left empty; an error when there are several ports and not one
    /// per host, as libpq refuses that.
    pub fn targets(&self) -> Result<Vec<Target>, ConnInfoError> {
        let list = |v: &Option<String>| -> Option<Vec<String>> {
            v.as_deref()
                .filter(|t| !t.is_empty())
                .map(|t| t.split(',').map(str::to_string).collect())
        };
        let names = list(&self.host);
        let addrs = list(&self.hostaddr);
        let count = match (&names, &addrs) {
            (Some(n), Some(a)) if n.len() != a.len() => {
                return Err(ConnInfoError::HostsDoNotMatchHostaddrs {
                    hosts: n.len(),
                    addrs: a.len(),
                })
            }
            (_, Some(a)) => a.len(),
            (Some(n), None) => n.len(),
            (None, None) => 1,
        };
        let port = |i: usize| match self.port.len() {
            0 => Ok(DEFAULT_PORT),
            1 => Ok(self.port[0]),
            n if n == count => Ok(self.port[i]),
            n => Err(ConnInfoError::PortsDoNotMatchHosts {
                ports: n,
                hosts: count,
            }),
        };
        (0..count)
            .map(|i| {
                let name = names.as_ref().map_or("", |n| n[i].as_str());
                let addr = addrs.as_ref().map_or("", |a| a[i].as_str());
                let ip = if addr.is_empty() {
                    None
                } else {
                    Some(
                        addr.parse::<IpAddr>()
                            .map_err(|_| ConnInfoError::InvalidHostAddr(addr.to_string()))?,
                    )
                };
                let host = [name, addr]
                    .into_iter()
                    .find(|h| !h.is_empty())
                    .unwrap_or("localhost");
                Ok(Target {
                    host: host.to_string(),
                    port: port(i)?,
                    addr: ip,
                })
            })
            .collect()
    }

    /// The libpq keys given that walserver ignores, for a warning.
    pub fn ignored_options(&self) -> impl Iterator<Item = &str> {
        self.other.iter().map(|(k, _)| k.as_str())
    }

    fn set(&mut self, key: &str, value: String) -> Result<(), ConnInfoError> {
        let path = |v: String| (!v.is_empty()).then(|| PathBuf::from(v));
        let text = |v: String| (!v.is_empty()).then_some(v);
        match key {
            "host" => self.host = text(value),
            "hostaddr" => self.hostaddr = text(value),
            "port" => {
                self.port = if value.is_empty() {
                    Vec::new()
                } else {
                    value.split(',').map(parse_port).collect::<Result<_, _>>()?
                }
            }
            "target_session_attrs" => self.target_session_attrs = value.parse()?,
            "user" => self.user = text(value),
            "password" => self.password = Some(value),
            "dbname" => self.dbname = text(value),
            "application_name" => self.application_name = Some(value),
            "sslmode" => self.sslmode = value.parse()?,
            "sslrootcert" => self.sslrootcert = path(value),
            "sslcert" => self.sslcert = path(value),
            "sslkey" => self.sslkey = path(value),
            "passfile" => self.passfile = path(value),
            "channel_binding" => self.channel_binding = value.parse()?,
            "connect_timeout" => self.connect_timeout = integer(key, &value)?,
            "keepalives" => self.keepalives.on = integer(key, &value)? != Some(0),
            "keepalives_idle" => self.keepalives.timing.idle = integer(key, &value)?,
            "keepalives_interval" => self.keepalives.timing.interval = integer(key, &value)?,
            "keepalives_count" => self.keepalives.timing.count = integer(key, &value)?,
            "tcp_user_timeout" => self.keepalives.timing.user_timeout = integer(key, &value)?,
            "options" => self.options = text(value),
            k if OTHER_LIBPQ_KEYS.contains(&k) => {
                self.other.retain(|(o, _)| o != k);
                self.other.push((k.to_string(), value));
            }
            other => return Err(ConnInfoError::InvalidOption(other.to_string())),
        }
        Ok(())
    }

    fn parse_uri(&mut self, uri: &str, rest: &str) -> Result<(), ConnInfoError> {
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match main.find('/') {
            Some(i) if !main[..i].contains('[') || main[..i].contains(']') => {
                (&main[..i], Some(&main[i + 1..]))
            }
            _ => match main.find(']') {
                // An IPv6 address may not hold '/', but find the path after the bracket.
                Some(close) => match main[close..].find('/') {
                    Some(j) => (&main[..close + j], Some(&main[close + j + 1..])),
                    None => (main, None),
                },
                None => (main, None),
            },
        };
        let hostport = match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                let (user, password) = match userinfo.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (userinfo, None),
                };
                if !user.is_empty() {
                    self.set("user", percent_decode(user)?)?;
                }
                if let Some(p) = password {
                    self.set("password", percent_decode(p)?)?;
                }
                &authority[at + 1..]
            }
            None => authority,
        };
        // A host list, `h1:p1,h2:p2`, becomes `host=h1,h2 port=p1,p2` as in libpq.
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for element in hostport.split(',') {
            let (host, port) = uri_host(uri, element)?;
            hosts.push(host);
            ports.push(port.map(percent_decode).transpose()?.unwrap_or_default());
        }
        if hosts.iter().any(|h| !h.is_empty()) {
            self.set("host", hosts.join(","))?;
        }
        if ports.iter().any(|p| !p.is_empty()) {
            self.set("port", ports.join(","))?;
        }
        if let Some(db) = path.filter(|p| !p.is_empty()) {
            self.set("dbname", percent_decode(db)?)?;
        }
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            if param.is_empty() {
                continue;
            }
            let (k, v) = param
                .split_once('=')
                .ok_or_else(|| ConnInfoError::MissingUriSeparator(param.to_string()))?;
            let (k, v) = (percent_decode(k)?, percent_decode(v)?);
            if k == "ssl" && v == "true" {
                // libpq's JDBC-compatible spelling.
                self.sslmode = SslMode::Require;
                continue;
            }
            match self.set(&k, v) {
                Err(ConnInfoError::InvalidOption(k)) => {
                    return Err(ConnInfoError::InvalidUriParameter(k))
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// The settings in key=value form without the password, for status displays and logs.
    /// Parsing the result gives the same settings, less the password.
    pub fn to_string_without_password(&self) -> String {
        let mut parts: Vec<(&str, String)> = Vec::new();
        let mut add = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                parts.push((k, v));
            }
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        add("host", self.host.clone());
        add("hostaddr", self.hostaddr.clone());
        let ports: Vec<String> = self.port.iter().map(u16::to_string).collect();
        add("port", (!ports.is_empty()).then(|| ports.join(",")));
        add("user", self.user.clone());
        add("dbname", self.dbname.clone());
        add("application_name", self.application_name.clone());
        add("sslmode", Some(self.sslmode.to_string()));
        add("sslrootcert", path(&self.sslrootcert));
        add("sslcert", path(&self.sslcert));
        add("sslkey", path(&self.sslkey));
        add("passfile", path(&self.passfile));
        if self.channel_binding != ChannelBinding::Prefer {
            add(
                "channel_binding",
                Some(self.channel_binding.as_str().to_string()),
            );
        }
        add(
            "connect_timeout",
            self.connect_timeout.map(|t| t.to_string()),
        );
        add("options", self.options.clone());
        if !self.keepalives.on {
            add("keepalives", Some("0".into()));
        }
        let timing = self.keepalives.timing.values();
        let keys = [
            "keepalives_idle",
            "keepalives_interval",
            "keepalives_count",
            "tcp_user_timeout",
        ];
        for (key, value) in keys.into_iter().zip(timing) {
            add(key, value.map(|n| n.to_string()));
        }
        if self.target_session_attrs != TargetSessionAttrs::Any {
            add(
                "target_session_attrs",
                Some(self.target_session_attrs.as_str().to_string()),
            );
        }
        let mut out: Vec<String> = parts
            .into_iter()
            .map(|(k, v)| format!("{k}={}", quote_value(&v)))
            .collect();
        out.extend(
            self.other
                .iter()
                .map(|(k, v)| format!("{k}={}", quote_value(v))),
        );
        out.join(" ")
    }
}

impl FromStr for ConnInfo {
    type Err = ConnInfoError;
    fn from_str(s: &str) -> Result<ConnInfo, ConnInfoError> {
        ConnInfo::parse(s)
    }
}

/// sslmode as libpq spells it; the error is the connection string's.
impl FromStr for SslMode {
    type Err = ConnInfoError;
    fn from_str(s: &str) -> Result<SslMode, ConnInfoError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(ConnInfoError::InvalidSslMode(other.to_string())),
        })
    }
}

/// channel_binding as libpq spells it; the error is the connection string's.
impl FromStr for ChannelBinding {
    type Err = ConnInfoError;
    fn from_str(s: &str) -> Result<ChannelBinding, ConnInfoError> {
        Ok(match s {
            "disable" => ChannelBinding::Disable,
            "prefer" => ChannelBinding::Prefer,
            "require" => ChannelBinding::Require,
            other => return Err(ConnInfoError::InvalidChannelBinding(other.to_string())),
        })
    }
}

/// A value for the key=value form, quoted when it must be.
fn quote_value(v: &str) -> String {
    if !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
        return v.to_string();
    }
    let mut q = String::with_capacity(v.len() + 2);
    q.push('\'');
    for c in v.chars() {
        if c == '\'' || c == '\\' {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('\'');
    q
}

/// One `host[:port]` of a URI's host list, `element` a slice of `uri`: the host
/// percent-decoded (an IPv6 address in brackets taken as it is) and the port's text.
fn uri_host<'a>(uri: &str, element: &'a str) -> Result<(String, Option<&'a str>), ConnInfoError> {
    let Some(v6) = element.strip_prefix('[') else {
        return Ok(match element.split_once(':') {
            Some((h, p)) => (percent_decode(h)?, Some(p)),
            None => (percent_decode(element)?, None),
        });
    };
    let close = v6
        .find(']')
        .ok_or_else(|| ConnInfoError::UnterminatedIpv6(uri.to_string()))?;
    let after = &v6[close + 1..];
    let port = match after.strip_prefix(':') {
        Some(p) => Some(p),
        None if after.is_empty() => None,
        None => {
            // libpq counts positions from 1.
            let at = element.as_ptr() as usize - uri.as_ptr() as usize;
            return Err(ConnInfoError::UnexpectedUriCharacter {
                ch: after.chars().next().unwrap_or(' '),
                position: at + close + 3,
                uri: uri.to_string(),
            });
        }
    };
    Ok((v6[..close].to_string(), port.filter(|p| !p.is_empty())))
}

/// An integer setting as libpq reads one (white space around it allowed); empty means unset.
fn integer(key: &str, value: &str) -> Result<Option<u32>, ConnInfoError> {
    let t = value.trim();
    if t.is_empty() {
        return Ok(None);
    }
    t.parse()
        .map(Some)
        .map_err(|_| ConnInfoError::InvalidInteger {
            key: key.to_string(),
            value: value.to_string(),
        })
}

fn parse_port(value: &str) -> Result<u16, ConnInfoError> {
    if value.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    value
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0 && value.trim().bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| ConnInfoError::InvalidPort(value.to_string()))
}

/// libpq's key=value scanner (`conninfo_parse`).
fn parse_key_values(s: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|&c| c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConnInfoError::MissingEquals(key));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(ConnInfoError::UnterminatedQuote),
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(ConnInfoError::UnterminatedQuote),
                    },
                    Some('\'') => break,
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

/// Decodes `%XX` escapes. A bad escape, `%00`, or a result that is not UTF-8 is an error.
fn percent_decode(s: &str) -> Result<String, ConnInfoError> {
    let bad = || ConnInfoError::InvalidPercentEncoding(s.to_string());
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or_else(bad)?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            let byte = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
            if byte == 0 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(s: &str, expected: ConnInfo) {
        assert_eq!(ConnInfo::parse(s), Ok(expected), "{s:?}");
    }

    fn check_err(s: &str, message: &str) {
        assert_eq!(
            ConnInfo::parse(s).map_err(|e| e.to_string()),
            Err(message.to_string()),
            "{s:?}"
        );
    }

    #[test]
    fn key_value_form() {
        check(
            "host=127.0.0.1 port=5433 user=repl password=secret application_name=s1 sslmode=verify-full sslrootcert=/r.crt connect_timeout=10",
            ConnInfo {
                host: Some("127.0.0.1".into()),
                port: vec![5433],
                user: Some("repl".into()),
                password: Some("secret".into()),
                application_name: Some("s1".into()),
                sslmode: SslMode::VerifyFull,
                sslrootcert: Some("/r.crt".into()),
                connect_timeout: Some(10),
                ..ConnInfo::default()
            },
        );
        check(
            "  user = 'a b\\'c'  password='x\\\\y' dbname=d\\ e options='-c wal_sender_timeout=0'",
            ConnInfo {
                user: Some("a b'c".into()),
                password: Some("x\\y".into()),
                dbname: Some("d e".into()),
                options: Some("-c wal_sender_timeout=0".into()),
                ..ConnInfo::default()
            },
        );
        check("", ConnInfo::default());
        check(
            "password=''",
            ConnInfo {
                password: Some(String::new()),
                ..ConnInfo::default()
            },
        );
        check(
            "port=1 port=2",
            ConnInfo {
                port: vec![2],
                ..ConnInfo::default()
            },
        );
        let info = ConnInfo::parse("host=h channel_binding=require gssencmode=disable").unwrap();
        assert_eq!(info.ignored_options().collect::<Vec<_>>(), ["gssencmode"]);
        assert_eq!(info.channel_binding, ChannelBinding::Require);
        assert!(info
            .to_string_without_password()
            .contains("channel_binding=require"));
        assert_eq!(ConnInfo::default().channel_binding, ChannelBinding::Prefer);
        assert_eq!(
            ConnInfo::default().targets(),
            Ok(vec![Target {
                host: "localhost".into(),
                port: 5432,
                addr: None
            }])
        );
        assert_eq!(ConnInfo::default().sslmode, SslMode::Prefer);
    }

    fn targets(s: &str) -> Vec<String> {
        ConnInfo::parse(s)
            .expect("parses")
            .targets()
            .expect("targets")
            .iter()
            .map(Target::to_string)
            .collect()
    }

    #[test]
    fn the_environment_fills_in_what_the_string_leaves_out_as_in_libpq() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let vars = env(&[
            ("PGHOST", "envhost"),
            ("PGPORT", "5433"),
            ("PGUSER", "repl"),
            ("PGPASSWORD", "s3cret"),
            ("PGSSLMODE", "disable"),
            ("PGAPPNAME", "from_env"),
            ("PGTARGETSESSIONATTRS", "read-write"),
            ("PGDATABASE", "ignored"),
        ]);
        let info = ConnInfo::parse_with_env("host=a,b user=me", vars).unwrap();
        assert_eq!(info.host.as_deref(), Some("a,b"));
        assert_eq!(info.port, vec![5433]);
        assert_eq!(info.user.as_deref(), Some("me"));
        assert_eq!(info.password.as_deref(), Some("s3cret"));
        assert_eq!(info.sslmode, SslMode::Disable);
        assert_eq!(info.application_name.as_deref(), Some("from_env"));
        assert_eq!(info.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(
            info.dbname, None,
            "a physical connection's database is not PGDATABASE"
        );
        // A URI without a host keeps the environment's; one with a port replaces it.
        let info = ConnInfo::parse_with_env("postgresql://:6000", vars).unwrap();
        assert_eq!(
            (info.host.as_deref(), info.port.clone()),
            (Some("envhost"), vec![6000])
        );
        // An option the string gives empty is the string's: no password at all.
        let info = ConnInfo::parse_with_env("password=''", vars).unwrap();
        assert_eq!(info.password.as_deref(), Some(""));
        // A bad value names its variable.
        let e = ConnInfo::parse_with_env("host=a", env(&[("PGSSLMODE", "sometimes")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid sslmode value: \"sometimes\" (from the environment variable PGSSLMODE)"
        );
        // Without an environment, parse is parse_with_env of nothing.
        assert_eq!(
            ConnInfo::parse("host=a").unwrap(),
            ConnInfo::parse_with_env("host=a", |_| None).unwrap()
        );
    }

    #[test]
    fn passfile_is_kept_and_printed() {
        let info = ConnInfo::parse("host=h passfile=/home/x/.pgpass").unwrap();
        assert_eq!(info.passfile, Some("/home/x/.pgpass".into()));
        assert_eq!(info.ignored_options().count(), 0);
        assert_eq!(
            ConnInfo::parse(&info.to_string_without_password()).unwrap(),
            info
        );
    }

    #[test]
    fn keepalives_are_read_as_libpq_reads_them() {
        assert_eq!(ConnInfo::default().keepalives, Keepalives::default());
        assert!(ConnInfo::default().keepalives.on);
        let info = ConnInfo::parse(
            "keepalives=1 keepalives_idle=' 5 ' keepalives_interval=2 keepalives_count=3 tcp_user_timeout=9000",
        )
        .unwrap();
        assert_eq!(
            info.keepalives,
            Keepalives {
                on: true,
                timing: TcpKeepalives {
                    idle: Some(5),
                    interval: Some(2),
                    count: Some(3),
                    user_timeout: Some(9000)
                }
            }
        );
        assert_eq!(info.ignored_options().count(), 0);
        assert_eq!(
            ConnInfo::parse(&info.to_string_without_password()).unwrap(),
            info
        );
        let off = ConnInfo::parse("keepalives=0").unwrap();
        assert!(!off.keepalives.on);
        assert_eq!(
            ConnInfo::parse(&off.to_string_without_password()).unwrap(),
            off
        );
        assert!(ConnInfo::parse("keepalives=2").unwrap().keepalives.on);
        check_err(
            "keepalives_idle=abc",
            "invalid integer value \"abc\" for connection option \"keepalives_idle\"",
        );
    }

    #[test]
    fn host_lists_are_tried_as_libpq_tries_them() {
        assert_eq!(targets("host=a,b"), ["a:5432", "b:5432"]);
        assert_eq!(targets("host=a,b port=5433"), ["a:5433", "b:5433"]);
        assert_eq!(
            targets("host=a,,c port=1,,3"),
            ["a:1", "localhost:5432", "c:3"]
        );
        assert_eq!(targets("port=7"), ["localhost:7"]);
        assert_eq!(
            targets("postgresql://a:1,[::1]:2,c/db"),
            ["a:1", "::1:2", "c:5432"]
        );
        assert_eq!(targets("postgresql://a,b/?port=9"), ["a:9", "b:9"]);
        assert_eq!(
            targets("host=db1,db2 hostaddr=10.0.0.5, port=6000"),
            ["db1 (10.0.0.5):6000", "db2:6000"]
        );
        assert_eq!(
            targets("hostaddr=127.0.0.1,::1 port=1,2"),
            ["127.0.0.1:1", "::1:2"]
        );
        let t = ConnInfo::parse("host=db1 hostaddr=10.0.0.5")
            .unwrap()
            .targets()
            .unwrap();
        assert_eq!(t[0].host, "db1");
        assert_eq!(t[0].addr, Some("10.0.0.5".parse().unwrap()));
        let info = ConnInfo::parse("host=a,b port=1,2 target_session_attrs=read-write").unwrap();
        assert_eq!(info.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(info.ignored_options().count(), 0);
        let shown = info.to_string_without_password();
        assert_eq!(
            shown,
            "host=a,b port=1,2 sslmode=prefer target_session_attrs=read-write"
        );
        assert_eq!(ConnInfo::parse(&shown).unwrap(), info);
    }

    #[test]
    fn target_session_attrs_decide_as_libpq_does() {
        use TargetSessionAttrs::*;
        let primary = (Some("off"), Some("off"));
        let read_only_primary = (Some("off"), Some("on"));
        let standby = (Some("on"), Some("off"));
        let silent = (None, None);
        let ok = |t: TargetSessionAttrs, (h, r): (Option<&str>, Option<&str>), first: bool| {
            t.check(h, r, first).is_ok()
        };
        for (t, on_primary, on_read_only, on_standby) in [
            (Any, true, true, true),
            (ReadWrite, true, false, false),
            (ReadOnly, false, true, true),
            (Primary, true, true, false),
            (Standby, false, false, true),
        ] {
            assert_eq!(ok(t, primary, false), on_primary, "{t:?}");
            assert_eq!(ok(t, read_only_primary, false), on_read_only, "{t:?}");
            assert_eq!(ok(t, standby, false), on_standby, "{t:?}");
            assert_eq!(ok(t, silent, false), on_primary, "{t:?}");
        }
        assert!(!ok(PreferStandby, primary, true));
        assert!(ok(PreferStandby, primary, false));
        assert!(ok(PreferStandby, standby, true));
        assert_eq!(
            ReadWrite.check(Some("on"), None, false),
            Err("session is read-only")
        );
        // Every value reads back from its name, exactly as libpq spells it.
        for t in TargetSessionAttrs::ALL {
            assert_eq!(t.as_str().parse::<TargetSessionAttrs>(), Ok(t));
        }
        assert_eq!(
            "Read-Write".parse::<TargetSessionAttrs>(),
            Err(ConnInfoError::InvalidTargetSessionAttrs(
                "Read-Write".into()
            ))
        );
    }

    #[test]
    fn uri_form() {
        check(
            "postgresql://repl:se%40cret@db.example:5433/mydb?sslmode=require&application_name=a%20b",
            ConnInfo {
                host: Some("db.example".into()),
                port: vec![5433],
                user: Some("repl".into()),
                password: Some("se@cret".into()),
                dbname: Some("mydb".into()),
                application_name: Some("a b".into()),
                sslmode: SslMode::Require,
                ..ConnInfo::default()
            },
        );
        check(
            "postgres://[::1]:6000",
            ConnInfo {
                host: Some("::1".into()),
                port: vec![6000],
                ..ConnInfo::default()
            },
        );
        check("postgresql://", ConnInfo::default());
        check(
            "postgresql:///?ssl=true&connect_timeout=5",
            ConnInfo {
                sslmode: SslMode::Require,
                connect_timeout: Some(5),
                ..ConnInfo::default()
            },
        );
        check(
            "postgresql://u@h/",
            ConnInfo {
                user: Some("u".into()),
                host: Some("h".into()),
                ..ConnInfo::default()
            },
        );
    }

    #[test]
    fn errors_name_the_bad_part() {
        check_err("foo=bar", "invalid connection option \"foo\"");
        check_err(
            "host",
            "missing \"=\" after \"host\" in connection info string",
        );
        check_err(
            "host 127.0.0.1",
            "missing \"=\" after \"host\" in connection info string",
        );
        check_err(
            "password='abc",
            "unterminated quoted string in connection info string",
        );
        check_err("port=abc", "invalid port number: \"abc\"");
        check_err("port=70000", "invalid port number: \"70000\"");
        check_err("port=0", "invalid port number: \"0\"");
        check_err(
            "connect_timeout=soon",
            "invalid integer value \"soon\" for connection option \"connect_timeout\"",
        );
        check_err("sslmode=sometimes", "invalid sslmode value: \"sometimes\"");
        check_err(
            "channel_binding=always",
            "invalid channel_binding value: \"always\"",
        );
        check_err(
            "host=a,b port=1,2,3",
            "could not match 3 port numbers to 2 hosts",
        );
        check_err(
            "host=a,b hostaddr=127.0.0.1",
            "could not match 2 host names to 1 hostaddr values",
        );
        check_err(
            "hostaddr=db.example",
            "could not parse network address \"db.example\": not a numeric IP address",
        );
        check_err(
            "target_session_attrs=leader",
            "invalid target_session_attrs value: \"leader\"",
        );
        check_err(
            "postgresql://h/?foo=1",
            "invalid URI query parameter: \"foo\"",
        );
        check_err(
            "postgresql://h/?sslmode",
            "missing key/value separator \"=\" in URI query parameter: \"sslmode\"",
        );
        check_err("postgresql://h:12x/", "invalid port number: \"12x\"");
        check_err(
            "postgresql://u%zz@h",
            "invalid percent-encoded token: \"u%zz\"",
        );
        check_err(
            "postgresql://u%00@h",
            "invalid percent-encoded token: \"u%00\"",
        );
        check_err(
            "postgresql://u%4@h",
            "invalid percent-encoded token: \"u%4\"",
        );
        assert!(matches!(
            ConnInfo::parse("postgresql://[::1"),
            Err(ConnInfoError::UnterminatedIpv6(_))
        ));
    }

    #[test]
    fn display_hides_the_password_and_parses_back() {
        let s = "host=h port=5433 user='we ird' password=topsecret application_name='x\\'y' sslmode=disable keepalives=0";
        let info = ConnInfo::parse(s).unwrap();
        let shown = info.to_string_without_password();
        assert!(!shown.contains("topsecret"), "{shown}");
        assert_eq!(
            shown,
            "host=h port=5433 user='we ird' application_name='x\\'y' sslmode=disable keepalives=0"
        );
        let mut expected = info.clone();
        expected.password = None;
        assert_eq!(ConnInfo::parse(&shown).unwrap(), expected);
    }
}
